#include "tests/reference_model.h"

#include <algorithm>
#include <set>

namespace pagealloc::testing {

ReferenceModel::ReferenceModel(int64_t num_pages, int64_t page_size,
                               bool sorted_policy)
    : num_pages_(num_pages), page_size_(page_size), sorted_(sorted_policy) {
  for (int64_t p = 1; p <= num_pages; ++p) free_.push_back(p);
}

void ReferenceModel::AddOwner(uint64_t owner, int64_t quota_pages) {
  owners_[owner] = Owner{quota_pages, std::nullopt};
}

uint64_t ReferenceModel::owner_of(int64_t page) const {
  auto it = page_owner_.find(page);
  return it == page_owner_.end() ? 0 : it->second;
}

int64_t ReferenceModel::pages_owned(uint64_t owner) const {
  int64_t n = 0;
  for (const auto& [page, o] : page_owner_) n += (o == owner);
  return n;
}

void ReferenceModel::ReturnPages(const std::vector<int64_t>& pages) {
  for (int64_t page : pages) page_owner_.erase(page);
  if (sorted_) {
    parked_.insert(parked_.end(), pages.begin(), pages.end());
  } else {
    free_.insert(free_.begin(), pages.begin(), pages.end());
  }
}

void ReferenceModel::RemoveOwner(uint64_t owner) {
  std::vector<int64_t> pages;
  for (const auto& [page, o] : page_owner_) {
    if (o == owner) pages.push_back(page);  // std::map: ascending
  }
  ReturnPages(pages);
  owners_.erase(owner);
}

std::vector<ReferenceModel::Outcome> ReferenceModel::Allocate(
    const std::vector<Request>& batch) {
  std::vector<Outcome> outcomes(batch.size());
  // Normalize to (prefix, seq, last) and find what is wrong with each request
  // on its own.
  std::vector<int64_t> prefix(batch.size()), need(batch.size(), 0);
  int64_t total_need = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Request& r = batch[i];
    absl::StatusCode& code = outcomes[i].code;
    int64_t last = r.last_loc;
    if (r.kind == Kind::kAlloc) {
      prefix[i] = 0;
      last = -1;
      if (r.seq_len < 0 || r.seq_len % page_size_ != 0 ||
          r.seq_len > num_pages_ * page_size_) {
        code = absl::StatusCode::kInvalidArgument;
      }
    } else {
      prefix[i] = r.kind == Kind::kDecode ? r.seq_len - 1 : r.prefix_len;
      const int64_t limit = (num_pages_ + 1) * page_size_;
      if (prefix[i] < 0 || r.seq_len < prefix[i] || r.seq_len > limit) {
        code = absl::StatusCode::kInvalidArgument;
      } else if (prefix[i] == 0 && last != -1) {
        code = absl::StatusCode::kInvalidArgument;
      } else if (prefix[i] > 0 &&
                 (last < page_size_ || last >= limit ||
                  (last + 1) % page_size_ != prefix[i] % page_size_)) {
        code = absl::StatusCode::kInvalidArgument;
      }
    }
    if (code != absl::StatusCode::kOk) continue;
    if (owners_.count(r.owner) == 0) {
      code = absl::StatusCode::kNotFound;
      continue;
    }
    if (prefix[i] % page_size_ != 0 && r.seq_len > prefix[i]) {
      const uint64_t o = owner_of(last / page_size_);
      if (o == 0)
        code = absl::StatusCode::kFailedPrecondition;
      else if (o != r.owner)
        code = absl::StatusCode::kPermissionDenied;
      if (code != absl::StatusCode::kOk) continue;
    }
    for (int64_t pos = prefix[i]; pos < r.seq_len; ++pos) {
      need[i] += (pos % page_size_ == 0);
    }
    total_need += need[i];
  }
  if (sorted_ && total_need > static_cast<int64_t>(free_.size()) &&
      !parked_.empty()) {
    std::vector<int64_t> all(free_.begin(), free_.end());
    all.insert(all.end(), parked_.begin(), parked_.end());
    std::sort(all.begin(), all.end());
    free_.assign(all.begin(), all.end());
    parked_.clear();
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const Request& r = batch[i];
    Outcome& outcome = outcomes[i];
    if (outcome.code != absl::StatusCode::kOk) continue;
    if (need[i] > static_cast<int64_t>(free_.size())) {
      outcome.code = absl::StatusCode::kResourceExhausted;
      continue;
    }
    Owner& owner = owners_[r.owner];
    if (owner.quota > 0 && pages_owned(r.owner) + need[i] > owner.quota) {
      outcome.code = absl::StatusCode::kResourceExhausted;
      continue;
    }
    int64_t previous = r.kind == Kind::kAlloc ? -1 : r.last_loc;
    for (int64_t pos = prefix[i]; pos < r.seq_len; ++pos) {
      int64_t slot;
      if (pos % page_size_ == 0) {
        const int64_t page = free_.front();
        free_.pop_front();
        page_owner_[page] = r.owner;
        if (owner.given) owner.given->push_back(page);
        slot = page * page_size_;
      } else {
        slot = previous + 1;
      }
      outcome.slots.push_back(slot);
      previous = slot;
    }
  }
  return outcomes;
}

absl::StatusCode ReferenceModel::Free(uint64_t owner,
                                      const std::vector<int64_t>& values,
                                      bool values_are_slots) {
  if (owners_.count(owner) == 0) return absl::StatusCode::kNotFound;
  std::vector<int64_t> pages;
  std::set<int64_t> seen;
  for (int64_t v : values) {
    const int64_t page = values_are_slots ? v / page_size_ : v;
    const bool in_range = values_are_slots ? (v >= page_size_ &&
                                              v < (num_pages_ + 1) * page_size_)
                                           : (v >= 1 && v <= num_pages_);
    if (!in_range) return absl::StatusCode::kInvalidArgument;
    if (!seen.insert(page).second) continue;
    const uint64_t o = owner_of(page);
    if (o == 0) return absl::StatusCode::kFailedPrecondition;
    if (o != owner) return absl::StatusCode::kPermissionDenied;
    pages.push_back(page);
  }
  ReturnPages(pages);
  return absl::StatusCode::kOk;
}

absl::StatusCode ReferenceModel::Checkpoint(uint64_t owner) {
  if (owners_.count(owner) == 0) return absl::StatusCode::kNotFound;
  owners_[owner].given.emplace();
  return absl::StatusCode::kOk;
}

absl::StatusCode ReferenceModel::Rollback(uint64_t owner) {
  if (owners_.count(owner) == 0) return absl::StatusCode::kNotFound;
  Owner& o = owners_[owner];
  if (!o.given) return absl::StatusCode::kFailedPrecondition;
  std::vector<int64_t> pages;
  std::set<int64_t> seen;
  for (int64_t page : *o.given) {
    if (owner_of(page) == owner && seen.insert(page).second) {
      pages.push_back(page);
    }
  }
  o.given.reset();
  for (int64_t page : pages) page_owner_.erase(page);
  free_.insert(free_.begin(), pages.begin(), pages.end());
  return absl::StatusCode::kOk;
}

}  // namespace pagealloc::testing
