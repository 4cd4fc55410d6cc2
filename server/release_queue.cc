#include "server/release_queue.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"

namespace pagealloc {

absl::Status ReleaseQueues::Attach(uint64_t owner, Word word) {
  if (word == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("session %d: no release word to attach", owner));
  }
  absl::MutexLock lock(&mu_);
  Owner& state = owners_[owner];
  if (state.word != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrFormat("session %d has a release word already", owner));
  }
  state.word = std::move(word);
  return absl::OkStatus();
}

bool ReleaseQueues::HasWord(uint64_t owner) const {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  return it != owners_.end() && it->second.word != nullptr;
}

absl::Status ReleaseQueues::CheckNotPending(
    uint64_t owner, absl::Span<const int64_t> pages) const {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  return it == owners_.end() ? absl::OkStatus()
                             : NonePending(it->second, pages);
}

absl::Status ReleaseQueues::NonePending(const Owner& owner,
                                        absl::Span<const int64_t> pages) {
  if (owner.pending.empty()) return absl::OkStatus();
  for (int64_t page : pages) {
    auto pending = owner.pending.find(page);
    if (pending != owner.pending.end()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "page %d was already freed (double free): it waits for the "
          "session's release word to reach %d (now %d)",
          page, pending->second, owner.passed));
    }
  }
  return absl::OkStatus();
}

absl::Status ReleaseQueues::Add(uint64_t owner, uint64_t release_value,
                                std::vector<int64_t> pages, absl::Time now) {
  if (release_value == 0) {
    return absl::InvalidArgumentError(
        "release_value 0 means no fence; a fenced free needs a value >= 1");
  }
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end() || it->second.word == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "session %d has no release word (it has no fast channel): a free "
        "with release_value %d cannot be fenced; free without one after "
        "the work that reads the pages is done",
        owner, release_value));
  }
  if (pages.empty()) return absl::OkStatus();
  Owner& state = it->second;
  if (absl::Status none = NonePending(state, pages); !none.ok()) return none;
  for (int64_t page : pages) state.pending.emplace(page, release_value);
  pending_pages_.fetch_add(static_cast<int64_t>(pages.size()),
                           std::memory_order_relaxed);
  state.entries.push_back({release_value, std::move(pages), now});
  waiting_.insert(owner);
  return absl::OkStatus();
}

uint64_t ReleaseQueues::Advance(Owner& owner) {
  // One plain load of the client's word; a value below what it showed
  // before is ignored.
  const uint64_t word = owner.word->load(std::memory_order_acquire);
  owner.passed = std::max(owner.passed, word);
  return owner.passed;
}

void ReleaseQueues::Unpend(Owner& owner, const Entry& entry) {
  for (int64_t page : entry.pages) owner.pending.erase(page);
  pending_pages_.fetch_sub(static_cast<int64_t>(entry.pages.size()),
                           std::memory_order_relaxed);
}

std::vector<ReleaseQueues::Released> ReleaseQueues::TakeReleased(
    absl::Time now) {
  std::vector<Released> released;
  if (!any_pending()) return released;
  absl::MutexLock lock(&mu_);
  for (auto waiting = waiting_.begin(); waiting != waiting_.end();) {
    const uint64_t id = *waiting;
    Owner& owner = owners_.find(id)->second;
    const uint64_t passed = Advance(owner);
    // Entries in arrival order; a client may queue values out of order, so
    // every entry is looked at (each holds at least one of the session's
    // pages, so they are bounded by its quota).
    for (auto entry = owner.entries.begin(); entry != owner.entries.end();) {
      if (entry->release_value > passed) {
        ++entry;
        continue;
      }
      Unpend(owner, *entry);
      released.push_back({id, std::move(entry->pages), now - entry->queued_at});
      entry = owner.entries.erase(entry);
    }
    if (owner.entries.empty()) {
      waiting_.erase(waiting++);
    } else {
      ++waiting;
    }
  }
  return released;
}

int64_t ReleaseQueues::Retain(uint64_t owner,
                              absl::FunctionRef<bool(int64_t)> still_owned) {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) return 0;
  Owner& state = it->second;
  int64_t dropped = 0;
  for (auto entry = state.entries.begin(); entry != state.entries.end();) {
    std::vector<int64_t>& pages = entry->pages;
    const auto kept = std::stable_partition(
        pages.begin(), pages.end(), [&](int64_t p) { return still_owned(p); });
    for (auto page = kept; page != pages.end(); ++page) {
      state.pending.erase(*page);
      ++dropped;
    }
    pages.erase(kept, pages.end());
    entry = pages.empty() ? state.entries.erase(entry) : entry + 1;
  }
  pending_pages_.fetch_sub(dropped, std::memory_order_relaxed);
  if (state.entries.empty()) waiting_.erase(owner);
  return dropped;
}

int64_t ReleaseQueues::Forget(uint64_t owner) {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) return 0;
  const int64_t pending = static_cast<int64_t>(it->second.pending.size());
  pending_pages_.fetch_sub(pending, std::memory_order_relaxed);
  owners_.erase(it);
  waiting_.erase(owner);
  return pending;
}

std::vector<ReleaseQueues::Released> ReleaseQueues::Detach(uint64_t owner,
                                                           absl::Time now) {
  std::vector<Released> released;
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) return released;
  for (Entry& entry : it->second.entries) {
    Unpend(it->second, entry);
    released.push_back({owner, std::move(entry.pages), now - entry.queued_at});
  }
  owners_.erase(it);
  waiting_.erase(owner);
  return released;
}

int64_t ReleaseQueues::pending_pages(uint64_t owner) const {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0
                             : static_cast<int64_t>(it->second.pending.size());
}

uint64_t ReleaseQueues::passed(uint64_t owner) const {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.passed;
}

}  // namespace pagealloc
