#include "tests/reference_model.h"

#include <algorithm>
#include <set>

namespace pagealloc::testing {

ReferenceModel::ReferenceModel(int64_t num_pages, int64_t page_size,
                               bool sorted_policy, bool sglang)
    : num_pages_(num_pages),
      page_size_(page_size),
      sorted_(sorted_policy),
      sglang_(sglang) {
  ResetFreeList();
}

void ReferenceModel::ResetFreeList() {
  free_.clear();
  parked_.clear();
  for (int64_t p = 1; p <= num_pages_; ++p) free_.push_back(p);
}

void ReferenceModel::AddOwner(uint64_t owner, int64_t quota_pages) {
  owners_[owner] = Owner{quota_pages, {}, 1};
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

uint64_t ReferenceModel::last_checkpoint_id(uint64_t owner) const {
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.next_id - 1;
}

int64_t ReferenceModel::checkpoints(uint64_t owner) const {
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.checkpoints.size();
}

void ReferenceModel::ReturnPages(std::vector<int64_t> pages) {
  for (int64_t page : pages) page_owner_.erase(page);
  if (sorted_) {
    parked_.insert(parked_.end(), pages.begin(), pages.end());
  } else if (sglang_ && page_size_ == 1) {
    free_.insert(free_.end(), pages.begin(), pages.end());
  } else {
    free_.insert(free_.begin(), pages.begin(), pages.end());
  }
}

void ReferenceModel::MergeParked(size_t keep) {
  std::vector<int64_t> rest(free_.begin() + keep, free_.end());
  rest.insert(rest.end(), parked_.begin(), parked_.end());
  std::sort(rest.begin(), rest.end());
  free_.erase(free_.begin() + keep, free_.end());
  free_.insert(free_.end(), rest.begin(), rest.end());
  parked_.clear();
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
    const std::vector<Request>& batch, const std::vector<Call>& given_calls) {
  std::vector<Outcome> outcomes(batch.size());
  std::vector<Call> calls = given_calls;
  if (calls.empty()) calls.push_back({static_cast<int64_t>(batch.size())});
  // Normalize to (prefix, seq, last) and find what is wrong with each request
  // on its own.
  std::vector<int64_t> prefix(batch.size()), need(batch.size(), 0);
  std::vector<bool> well_formed(batch.size(), false);
  int64_t total_need = 0;
  const int64_t usable = num_pages_ * page_size_;
  const int64_t limit = (num_pages_ + 1) * page_size_;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Request& r = batch[i];
    absl::StatusCode& code = outcomes[i].code;
    int64_t last = r.last_loc;
    if (r.kind == Kind::kAlloc) {
      prefix[i] = 0;
      last = -1;
      if (r.seq_len < 0 || r.seq_len % page_size_ != 0) {
        code = absl::StatusCode::kInvalidArgument;
      }
    } else {
      prefix[i] = r.kind == Kind::kDecode ? r.seq_len - 1 : r.prefix_len;
      if (prefix[i] < 0 || r.seq_len < prefix[i]) {
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
    well_formed[i] = true;
    if (owners_.count(r.owner) == 0) {
      code = absl::StatusCode::kNotFound;
      continue;
    }
    if (r.seq_len > usable) {
      code = absl::StatusCode::kResourceExhausted;
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
  if (!sglang_ && sorted_ && total_need > static_cast<int64_t>(free_.size()) &&
      !parked_.empty()) {
    MergeParked(0);
  }
  // Pages taken by the launch so far; they leave the free list at the end
  // (a merge keeps them at its front).
  size_t taken = 0;
  std::map<uint64_t, int64_t> taken_by;
  std::vector<std::vector<int64_t>> pages_of(batch.size());
  size_t begin = 0;
  for (const Call& call : calls) {
    const size_t end = begin + call.num_requests;
    if (sglang_ && sorted_ && !parked_.empty() && end > begin) {
      // SGLang's figures for its batch: every request of it counted; the
      // lengths of those past the pool clamped to (num_pages + 1) pages.
      int64_t tokens = 0, pages = 0;
      for (size_t i = begin; i < end; ++i) {
        if (!well_formed[i]) continue;
        const int64_t seq = std::min(batch[i].seq_len, limit);
        const int64_t pre = std::min(prefix[i], seq);
        tokens += seq - pre;
        pages += (seq + page_size_ - 1) / page_size_ -
                 (pre + page_size_ - 1) / page_size_;
      }
      const int64_t bs = end - begin;
      int64_t estimate = pages;
      if (page_size_ > 1 && batch[begin].kind == Kind::kExtend) {
        estimate = tokens / page_size_ + bs + 1;
      } else if (page_size_ > 1 && batch[begin].kind == Kind::kDecode) {
        estimate = bs;
      }
      if (estimate > static_cast<int64_t>(free_.size() - taken)) {
        MergeParked(taken);
      }
    }
    const size_t taken_at_start = taken;
    const std::map<uint64_t, int64_t> taken_by_at_start = taken_by;
    size_t decider = end;
    if (call.all_or_nothing) {
      // A request refused on its own decides first.
      for (size_t i = begin; i < end && decider == end; ++i) {
        if (outcomes[i].code != absl::StatusCode::kOk) decider = i;
      }
    }
    for (size_t i = begin; i < end && decider == end; ++i) {
      if (outcomes[i].code != absl::StatusCode::kOk) continue;
      const Request& r = batch[i];
      Owner& owner = owners_[r.owner];
      if (need[i] > static_cast<int64_t>(free_.size() - taken) ||
          (owner.quota > 0 &&
           pages_owned(r.owner) + taken_by[r.owner] + need[i] > owner.quota)) {
        outcomes[i].code = absl::StatusCode::kResourceExhausted;
        if (call.all_or_nothing) {
          decider = i;
          break;
        }
        continue;
      }
      for (int64_t k = 0; k < need[i]; ++k) {
        pages_of[i].push_back(free_[taken + k]);
      }
      taken += need[i];
      taken_by[r.owner] += need[i];
    }
    if (decider != end) {
      taken = taken_at_start;
      taken_by = taken_by_at_start;
      const absl::StatusCode code =
          outcomes[decider].code == absl::StatusCode::kResourceExhausted
              ? absl::StatusCode::kResourceExhausted
              : absl::StatusCode::kAborted;
      for (size_t i = begin; i < end; ++i) {
        pages_of[i].clear();
        if (i != decider && outcomes[i].code == absl::StatusCode::kOk) {
          outcomes[i].code = code;
        }
      }
    }
    begin = end;
  }
  // Hand out the pages and write the slots, token by token.
  for (size_t i = 0; i < batch.size(); ++i) {
    const Request& r = batch[i];
    Outcome& outcome = outcomes[i];
    if (outcome.code != absl::StatusCode::kOk) continue;
    Owner& owner = owners_[r.owner];
    size_t next_page = 0;
    int64_t previous = r.kind == Kind::kAlloc ? -1 : r.last_loc;
    for (int64_t pos = prefix[i]; pos < r.seq_len; ++pos) {
      int64_t slot;
      if (pos % page_size_ == 0) {
        const int64_t page = pages_of[i][next_page++];
        page_owner_[page] = r.owner;
        for (auto& [id, given] : owner.checkpoints) given.push_back(page);
        slot = page * page_size_;
      } else {
        slot = previous + 1;
      }
      outcome.slots.push_back(slot);
      previous = slot;
    }
  }
  free_.erase(free_.begin(), free_.begin() + taken);
  return outcomes;
}

absl::StatusCode ReferenceModel::Free(uint64_t owner,
                                      const std::vector<int64_t>& values,
                                      bool values_are_slots, Order order) {
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
  if (order == Order::kDefault) {
    order = values_are_slots && sglang_ && page_size_ > 1
                ? Order::kAscending
                : Order::kFirstAppearance;
  }
  if (order == Order::kAscending) std::sort(pages.begin(), pages.end());
  ReturnPages(pages);
  return absl::StatusCode::kOk;
}

uint64_t ReferenceModel::Checkpoint(uint64_t owner) {
  if (owners_.count(owner) == 0) return 0;
  Owner& o = owners_[owner];
  if (o.checkpoints.size() == kMaxCheckpoints) {
    o.checkpoints.erase(o.checkpoints.begin());
  }
  o.checkpoints.push_back({o.next_id, {}});
  return o.next_id++;
}

absl::StatusCode ReferenceModel::Rollback(uint64_t owner, uint64_t id) {
  if (owners_.count(owner) == 0) return absl::StatusCode::kNotFound;
  Owner& o = owners_[owner];
  if (o.checkpoints.empty()) return absl::StatusCode::kFailedPrecondition;
  size_t target = o.checkpoints.size() - 1;
  if (id != 0) {
    target = o.checkpoints.size();
    for (size_t k = 0; k < o.checkpoints.size(); ++k) {
      if (o.checkpoints[k].first == id) target = k;
    }
    if (target == o.checkpoints.size()) {
      return absl::StatusCode::kFailedPrecondition;
    }
  }
  // Each page still the owner's, at its latest give.
  const std::vector<int64_t>& given = o.checkpoints[target].second;
  std::vector<int64_t> pages;
  for (size_t k = 0; k < given.size(); ++k) {
    const bool latest =
        std::find(given.begin() + k + 1, given.end(), given[k]) == given.end();
    if (latest && owner_of(given[k]) == owner) pages.push_back(given[k]);
  }
  o.checkpoints.resize(id == 0 ? target : target + 1);
  if (id != 0) o.checkpoints.back().second.clear();
  for (int64_t page : pages) page_owner_.erase(page);
  free_.insert(free_.begin(), pages.begin(), pages.end());
  return absl::StatusCode::kOk;
}

absl::StatusCode ReferenceModel::ClearOwner(uint64_t owner) {
  if (owners_.count(owner) == 0) return absl::StatusCode::kNotFound;
  owners_[owner].checkpoints.clear();
  std::vector<int64_t> pages;
  for (const auto& [page, o] : page_owner_) {
    if (o == owner) pages.push_back(page);
  }
  ReturnPages(pages);
  if (page_owner_.empty()) ResetFreeList();
  return absl::StatusCode::kOk;
}

absl::StatusCode ReferenceModel::ClearPool(bool force) {
  if (!page_owner_.empty() && !force) {
    return absl::StatusCode::kFailedPrecondition;
  }
  page_owner_.clear();
  for (auto& [id, o] : owners_) o.checkpoints.clear();
  ResetFreeList();
  return absl::StatusCode::kOk;
}

}  // namespace pagealloc::testing
