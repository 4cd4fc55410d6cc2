#include "tests/workload.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"

namespace pagealloc::testing {

void CallArrays::Add(const ExtendShape& shape) {
  prefix_lens.push_back(shape.prefix_len);
  seq_lens.push_back(shape.seq_len);
  last_locs.push_back(shape.last_loc);
}

SequenceSet::SequenceSet(int64_t page_size) : page_size_(page_size) {}

int64_t SequenceSet::pages_held() const {
  int64_t pages = 0;
  for (const LiveSequence& s : sequences_) pages += s.pages.size();
  return pages;
}

size_t SequenceSet::Add(OwnerId owner, int64_t target_len) {
  LiveSequence s;
  s.id = next_id_++;
  s.owner = owner;
  s.target_len = target_len;
  sequences_.push_back(std::move(s));
  return sequences_.size() - 1;
}

absl::Status SequenceSet::Record(size_t i, const ExtendShape& call,
                                 absl::Span<const int64_t> slots,
                                 std::vector<int64_t>* new_pages) {
  LiveSequence& s = sequences_[i];
  const bool fresh = s.len == 0 && s.shared_len == 0;
  if (fresh && call.prefix_len > 0) {
    // A sequence continuing someone else's prefix: its first token opens a
    // page of its own, so the prefix must end at a page boundary.
    if (call.prefix_len % page_size_ != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a new sequence continues a %d-token prefix, not a whole number of "
          "%d-token pages",
          call.prefix_len, page_size_));
    }
  } else if (call.prefix_len != s.len || call.last_loc != s.last_loc) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "call (prefix_len %d, last_loc %d) does not continue sequence %d "
        "(len %d, last_loc %d)",
        call.prefix_len, call.last_loc, s.id, s.len, s.last_loc));
  }
  const int64_t count = call.seq_len - call.prefix_len;
  if (static_cast<int64_t>(slots.size()) != count) {
    return absl::DataLossError(
        absl::StrFormat("%d slots for %d tokens", slots.size(), count));
  }
  std::vector<int64_t> opened;
  int64_t previous = call.last_loc;
  for (int64_t t = 0; t < count; ++t) {
    const int64_t position = call.prefix_len + t;
    const int64_t slot = slots[t];
    if (position % page_size_ == 0) {
      if (slot % page_size_ != 0 || slot < page_size_) {
        return absl::DataLossError(absl::StrFormat(
            "token %d opens a page but got slot %d", position, slot));
      }
      opened.push_back(slot / page_size_);
    } else if (slot != previous + 1) {
      return absl::DataLossError(absl::StrFormat(
          "token %d got slot %d, expected %d", position, slot, previous + 1));
    }
    previous = slot;
  }
  if (fresh) s.shared_len = call.prefix_len;
  s.pages.insert(s.pages.end(), opened.begin(), opened.end());
  s.len = call.seq_len;
  s.last_loc = previous;
  if (new_pages != nullptr) {
    new_pages->insert(new_pages->end(), opened.begin(), opened.end());
  }
  return absl::OkStatus();
}

int64_t SequenceSet::SlotOf(size_t i, int64_t token) const {
  const LiveSequence& s = sequences_[i];
  return s.pages[(token - s.shared_len) / page_size_] * page_size_ +
         token % page_size_;
}

std::vector<int64_t> SequenceSet::SlotsOf(size_t i) const {
  const LiveSequence& s = sequences_[i];
  std::vector<int64_t> slots;
  slots.reserve(s.len - s.shared_len);
  for (int64_t t = s.shared_len; t < s.len; ++t) slots.push_back(SlotOf(i, t));
  return slots;
}

void SequenceSet::Remove(size_t i, std::vector<int64_t>* pages) {
  if (pages != nullptr) {
    pages->insert(pages->end(), sequences_[i].pages.begin(),
                  sequences_[i].pages.end());
  }
  sequences_.erase(sequences_.begin() + i);
}

void SequenceSet::RemoveAll(absl::Span<const size_t> indices,
                            std::vector<int64_t>* pages) {
  std::vector<bool> gone(sequences_.size(), false);
  for (size_t i : indices) {
    gone[i] = true;
    if (pages != nullptr) {
      pages->insert(pages->end(), sequences_[i].pages.begin(),
                    sequences_[i].pages.end());
    }
  }
  size_t kept = 0;
  for (size_t i = 0; i < sequences_.size(); ++i) {
    if (gone[i]) continue;
    // Never onto itself: a self-moved vector comes out empty.
    if (kept != i) sequences_[kept] = std::move(sequences_[i]);
    ++kept;
  }
  sequences_.resize(kept);
}

void SequenceSet::RemoveIf(absl::FunctionRef<bool(const LiveSequence&)> dead,
                           std::vector<int64_t>* pages) {
  std::vector<size_t> indices;
  for (size_t i = 0; i < sequences_.size(); ++i) {
    if (dead(sequences_[i])) indices.push_back(i);
  }
  RemoveAll(indices, pages);
}

SequenceSet::Mark SequenceSet::MarkCheckpoint() const {
  Mark mark;
  for (const LiveSequence& s : sequences_) mark.pages[s.id] = s.pages.size();
  return mark;
}

void SequenceSet::Rollback(const Mark& mark, std::vector<int64_t>* returned,
                           std::vector<int64_t>* orphaned) {
  std::vector<size_t> lost;
  for (size_t i = 0; i < sequences_.size(); ++i) {
    LiveSequence& s = sequences_[i];
    const auto it = mark.pages.find(s.id);
    const size_t before = it == mark.pages.end() ? 0 : it->second;
    if (s.pages.size() <= before) continue;
    returned->insert(returned->end(), s.pages.begin() + before, s.pages.end());
    s.pages.resize(before);
    lost.push_back(i);
  }
  RemoveAll(lost, orphaned);
}

}  // namespace pagealloc::testing
