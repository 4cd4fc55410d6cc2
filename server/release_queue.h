// ReleaseQueues: frees that wait for their session's release fence
// (docs/design.md, "The release fence"; the wire side is
// fast_channel/layout.h).
//
// A page a session frees may still be read by GPU work the session queued
// before the free. A fenced free names the value its client queued for the
// session's release word behind that work; its pages stay owned by the
// session in the pool (so every pool invariant holds: a page is free or
// owned by exactly one live session) and wait here, pending, until the word
// reaches the value. Then TakeReleased hands them back to be freed into the
// pool. Nothing here touches the pool: the call core checks a free with
// the pool before it queues it, and frees what is released.
//
// Trust. The word is memory the session's client writes. It is read with a
// plain load and kept as a monotonic maximum: a value lower than one seen
// before is ignored. A word that never advances keeps only its own
// session's pages pending; one that jumps ahead frees only its own pages
// early (its own hazard: one trust domain for the slab). No input makes
// this class touch another session's pages or grow without bound: a page
// is pending at most once, and only pages the pool found the session
// owning are queued.
//
// This class is thread-safe.

#ifndef PAGEALLOC_SERVER_RELEASE_QUEUE_H_
#define PAGEALLOC_SERVER_RELEASE_QUEUE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace pagealloc {

class ReleaseQueues {
 public:
  // A session's release word: a uint64 in memory its client writes (its
  // fast channel's header). The pointer keeps that memory mapped.
  using Word = std::shared_ptr<const std::atomic<uint64_t>>;

  // Pages whose fence has passed, to be freed into the pool by `owner`, in
  // this order.
  struct Released {
    uint64_t owner = 0;
    std::vector<int64_t> pages;
    // From the free's arrival to the pass of its fence being seen.
    absl::Duration waited;
  };

  // Gives `owner` its release word. ALREADY_EXISTS when it has one;
  // INVALID_ARGUMENT for a null word.
  absl::Status Attach(uint64_t owner, Word word) ABSL_LOCKS_EXCLUDED(mu_);
  bool HasWord(uint64_t owner) const ABSL_LOCKS_EXCLUDED(mu_);

  // Checks that none of `pages` (distinct page ids `owner` owns) is
  // pending already: FAILED_PRECONDITION naming the page and the release
  // value it waits for (a double free) otherwise.
  absl::Status CheckNotPending(uint64_t owner,
                               absl::Span<const int64_t> pages) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Queues `pages` of `owner` until its word reaches `release_value`.
  // REQUIRES: the pool found `owner` owning each page (distinct). Returns
  // FAILED_PRECONDITION, naming the session, when it has no word (no fast
  // channel), CheckNotPending's error when a page is pending already, and
  // INVALID_ARGUMENT for a release value of 0 (which means "no fence");
  // nothing is queued then.
  absl::Status Add(uint64_t owner, uint64_t release_value,
                   std::vector<int64_t> pages, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Reads the word of each session with pending pages once and takes the
  // frees whose release value it has reached, in the order they were
  // queued per session. Cheap when nothing is pending (one atomic load).
  std::vector<Released> TakeReleased(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets the pending pages of `owner` for which `still_owned` is false
  // (a rollback or ClearSession gave them back already); returns how many.
  int64_t Retain(uint64_t owner, absl::FunctionRef<bool(int64_t)> still_owned)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets `owner` (its session ended: its pages, pending ones included,
  // are reclaimed with the owner): its word and its pending pages. Returns
  // the pages that were pending.
  int64_t Forget(uint64_t owner) ABSL_LOCKS_EXCLUDED(mu_);

  // Detaches `owner`'s word (its session's fast channel was replaced, at
  // Resume) and takes all its pending pages, in the order they were
  // queued, as if their fences had passed: the process that would have
  // written the word is gone (or was taken over). The session may Attach
  // a new word afterwards. Empty when it had none pending.
  std::vector<Released> Detach(uint64_t owner, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Whether any page is pending (a relaxed load, for the hot path).
  bool any_pending() const {
    return pending_pages_.load(std::memory_order_relaxed) > 0;
  }
  // Pages pending now: all of them, and `owner`'s.
  int64_t pending_pages() const {
    return pending_pages_.load(std::memory_order_relaxed);
  }
  int64_t pending_pages(uint64_t owner) const ABSL_LOCKS_EXCLUDED(mu_);
  // The largest value `owner`'s word has shown (0 without a word).
  uint64_t passed(uint64_t owner) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    uint64_t release_value = 0;
    std::vector<int64_t> pages;
    absl::Time queued_at;
  };
  struct Owner {
    Word word;
    uint64_t passed = 0;  // the word's monotonic maximum
    std::deque<Entry> entries;
    // Each pending page and the release value it waits for.
    absl::flat_hash_map<int64_t, uint64_t> pending;
  };
  // CheckNotPending for one owner's state.
  static absl::Status NonePending(const Owner& owner,
                                  absl::Span<const int64_t> pages);
  // Reads the word, keeping the maximum.
  static uint64_t Advance(Owner& owner);
  // Removes `entry`'s pages from the owner's pending map and the count.
  void Unpend(Owner& owner, const Entry& entry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Owner> owners_ ABSL_GUARDED_BY(mu_);
  // The owners with pending pages.
  absl::flat_hash_set<uint64_t> waiting_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> pending_pages_{0};
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_RELEASE_QUEUE_H_
