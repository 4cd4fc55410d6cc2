// PagePool: one GPU's pool of KV-cache pages, with SGLang's paged-allocator
// semantics (alloc_extend / alloc_decode), per-page ownership, free
// policies, per-owner checkpoints and stats.
//
// Pages have ids 1..num_pages (page 0 is reserved for padding and never
// handed out); page p covers slots [p * page_size, (p + 1) * page_size).
//
// Invariants (CheckInvariants verifies them):
//   - every page is free (in the free list or, under kSorted, parked) xor
//     owned by exactly one registered owner; no page appears twice;
//   - each owner's page count equals the pages the owner table gives it;
//   - the executor's free-ring mirror equals the pool's ring.
// A refused request or call changes nothing.
//
// The free list is kept in a ring of capacity num_pages: allocation pops from
// the front (the head moves forward), kLifo frees push to the front (the head
// moves back). The executor mirrors every write to the ring, so a plan only
// needs the head position to find a batch's pages.
//
// This class is thread-safe.

#ifndef PAGEALLOC_ALLOCATOR_PAGE_POOL_H_
#define PAGEALLOC_ALLOCATOR_PAGE_POOL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "allocator/executor.h"
#include "allocator/requests.h"

namespace pagealloc {

enum class FreePolicy : uint8_t {
  // Freed pages go to the front of the free list in the order given, so the
  // hottest pages are reused first.
  kLifo,
  // Freed pages are parked; when an allocation does not fit, parked pages
  // are merged into the free list and the list is sorted ascending (SGLang's
  // need_sort).
  kSorted,
};

// Parses "lifo" or "sorted".
absl::StatusOr<FreePolicy> ParseFreePolicy(absl::string_view name);
absl::string_view FreePolicyName(FreePolicy policy);

struct PoolOptions {
  int64_t num_pages = 0;  // usable pages, >= 1
  int64_t page_size = 1;  // tokens per page, >= 1
  FreePolicy free_policy = FreePolicy::kLifo;
  // Remember each page's last owner and list, in each batch's plan
  // (BatchPlan.scrub_pages), the pages handed to an owner other than their
  // last one, for the executor to zero (--kv_scrub). A page never owned is
  // not listed (the slab starts zeroed).
  bool scrub = false;
};

// The outcome of one request of a batch.
struct AllocResult {
  absl::Status status;        // OK, or why the request was refused
  int64_t num_slots = 0;      // slots written to the request's destination
  int64_t num_new_pages = 0;  // pages the request took from the free list
};

// Per-owner figures.
struct OwnerStats {
  int64_t pages_owned = 0;
  int64_t quota_pages = 0;  // 0: no quota beyond the pool itself
  bool checkpoint_active = false;
};

// A snapshot of the pool, taken under its lock.
struct PoolStats {
  int64_t page_size = 0;
  int64_t total_pages = 0;   // usable pages (page 0 excluded)
  int64_t free_pages = 0;    // in the free list, ready to hand out
  int64_t parked_pages = 0;  // freed under kSorted, not yet merged back
  int64_t used_pages = 0;    // owned by some owner
  // Counters since start.
  int64_t slots_allocated = 0;
  int64_t pages_allocated = 0;
  int64_t pages_freed = 0;  // by Free, Rollback and ReleaseOwner together
  int64_t out_of_pages_refusals = 0;
  int64_t quota_refusals = 0;
  int64_t free_list_sorts = 0;
  int64_t batches_executed = 0;
  int64_t pages_scrubbed = 0;  // listed for scrubbing (PoolOptions.scrub)
  absl::flat_hash_map<OwnerId, OwnerStats> owners;
};

class PagePool {
 public:
  // Builds a pool whose free list is 1, 2, ..., num_pages and writes it to
  // the executor's mirror. `executor` must outlive the pool. Returns
  // INVALID_ARGUMENT for bad options, or the executor's error.
  static absl::StatusOr<std::unique_ptr<PagePool>> Create(
      const PoolOptions& options, PlanExecutor* executor);

  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  const PoolGeometry& geometry() const { return geometry_; }
  FreePolicy free_policy() const { return policy_; }
  PlanExecutor* executor() const { return executor_; }

  // Registers an owner. quota_pages 0 means no quota. Returns
  // INVALID_ARGUMENT for owner 0 or a negative quota, ALREADY_EXISTS for an
  // owner already registered.
  absl::Status AddOwner(OwnerId owner, int64_t quota_pages)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Frees every page `owner` holds (as Free does, under the pool's policy)
  // and forgets the owner. Returns the number of pages freed, or NOT_FOUND.
  absl::StatusOr<int64_t> RemoveOwner(OwnerId owner) ABSL_LOCKS_EXCLUDED(mu_);

  // Plans and executes a batch in one executor launch. Requests are admitted
  // in order, each all-or-nothing: a request that fails validation, would
  // take a page the pool does not have (RESOURCE_EXHAUSTED with pages needed
  // and pages free) or exceed its owner's quota is refused and changes
  // nothing; the rest of the batch proceeds. Under kSorted, parked pages are
  // merged and the free list sorted first when the batch as a whole would
  // not fit. Returns one result per request, in order.
  std::vector<AllocResult> Allocate(absl::Span<const AllocRequest> requests)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same, into `results` (resized to one per request). A caller that
  // allocates batch after batch keeps one vector and so reuses its storage.
  void Allocate(absl::Span<const AllocRequest> requests,
                std::vector<AllocResult>* results) ABSL_LOCKS_EXCLUDED(mu_);

  // Frees the distinct pages of `slots` (slot / page_size, first occurrence
  // order), all or nothing. Returns the number of pages freed, or
  // INVALID_ARGUMENT (a slot outside the usable range), FAILED_PRECONDITION
  // (a free page: "was never allocated", or "was already freed" for a double
  // free), PERMISSION_DENIED (a page of another owner) or NOT_FOUND (unknown
  // owner), naming slots[i].
  absl::StatusOr<int64_t> FreeSlots(OwnerId owner,
                                    absl::Span<const int64_t> slots)
      ABSL_LOCKS_EXCLUDED(mu_);

  // As FreeSlots, for page ids (messages name pages[i]).
  absl::StatusOr<int64_t> FreePages(OwnerId owner,
                                    absl::Span<const int64_t> pages)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Starts recording the pages `owner` is given, replacing any earlier
  // checkpoint of that owner. Returns NOT_FOUND for an unknown owner.
  absl::Status Checkpoint(OwnerId owner) ABSL_LOCKS_EXCLUDED(mu_);

  // Returns every page `owner` was given since its checkpoint and still owns
  // to the front of the free list, in the order they were given, under
  // either policy; with one owner and no frees since the checkpoint this
  // restores the free list exactly. Ends the checkpoint. Returns the pages
  // returned, FAILED_PRECONDITION without a checkpoint, or NOT_FOUND.
  absl::StatusOr<int64_t> Rollback(OwnerId owner) ABSL_LOCKS_EXCLUDED(mu_);

  // Frees every page and resets the free list to 1..num_pages. Owners stay
  // registered; checkpoints end.
  absl::Status Clear() ABSL_LOCKS_EXCLUDED(mu_);

  PoolStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // The free list in order (parked pages not included), and the parked
  // pages in the order they were freed.
  std::vector<int64_t> FreeList() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<int64_t> ParkedPages() const ABSL_LOCKS_EXCLUDED(mu_);

  // The owner of `page`, kNoOwner when free. REQUIRES: 0 <= page <= num_pages.
  OwnerId OwnerOf(int64_t page) const ABSL_LOCKS_EXCLUDED(mu_);
  // The last owner `page` was handed to (kept after it is freed), kNoOwner
  // when it never was; always kNoOwner unless PoolOptions.scrub.
  // REQUIRES: 0 <= page <= num_pages.
  OwnerId LastOwnerOf(int64_t page) const ABSL_LOCKS_EXCLUDED(mu_);

  // Verifies the class invariants, the executor mirror included (which
  // synchronizes the executor). Returns INTERNAL describing the first
  // violation.
  absl::Status CheckInvariants() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct OwnerState {
    int64_t pages_owned = 0;
    int64_t quota_pages = 0;
    // Pages given since the checkpoint, in order; engaged while active.
    std::optional<std::vector<int64_t>> given_since_checkpoint;
  };

  PagePool(const PoolOptions& options, PlanExecutor* executor);

  absl::Status InitFreeList() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t RingAt(int64_t index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ring_[ModNonNegative(head_ + index, capacity_)];
  }
  // Writes ring_[position .. position + pages.size()) (modulo capacity) and
  // mirrors the write to the executor.
  absl::Status WriteRing(int64_t position, absl::Span<const int64_t> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pushes `pages` to the front of the free list, first page first.
  absl::Status PushFront(absl::Span<const int64_t> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Merges parked pages into the free list and sorts it ascending.
  absl::Status MergeParkedAndSort() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks that `request`'s owner owns last_loc's page (the request writes
  // into it). Messages name last_locs[index]; they are only built on refusal.
  // A free page is FAILED_PRECONDITION, worded by FreePageState.
  absl::Status CheckLastLocOwned(const AllocRequest& request,
                                 int64_t last_loc) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "was never allocated" or "was already freed": why a free `page` cannot
  // be freed or written into.
  const char* FreePageState(int64_t page) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return allocated_once_[page] ? "was already freed" : "was never allocated";
  }
  // Validates and frees the distinct pages of `values` (slots or page ids),
  // all or nothing. Messages name slots[i] or pages[i].
  absl::StatusOr<int64_t> FreeDistinct(OwnerId owner,
                                       absl::Span<const int64_t> values,
                                       bool values_are_slots)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `pages` free and returns them under the pool's policy.
  absl::Status ReleasePages(OwnerState& state, absl::Span<const int64_t> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Allocate's passes, in the order it runs them. Each reads and writes
  // scratch_; only MakeRoomForBatch (a sort of the free list) and
  // CommitPlan change the pool.
  //
  // Checks everything about each request that does not depend on admission
  // order: its shape, its owner, its destination, and that last_loc's page
  // is the owner's when the request writes into it. Sets results[i].status
  // for each request it refuses and leaves the others OK; fills
  // scratch_.shapes and scratch_.pages_needed (0 for a refused request).
  // Returns the pages the requests it accepts need, together.
  // REQUIRES: results.size() == requests.size(), every status OK.
  int64_t ValidateRequests(absl::Span<const AllocRequest> requests,
                           absl::Span<AllocResult> results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under kSorted, merges the parked pages into the free list and sorts it
  // when `batch_pages` exceed the free pages and some pages are parked;
  // otherwise changes nothing. Returns the executor's error when the
  // mirror write fails.
  absl::Status MakeRoomForBatch(int64_t batch_pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Admits the requests ValidateRequests accepted, in order, against the
  // free pages and their owners' quotas, and builds scratch_.plan (reading
  // from the current head of the free list) and scratch_.admitted (the
  // admitted requests' indices). Sets a refused request's status to
  // RESOURCE_EXHAUSTED and counts the refusal; fills an admitted request's
  // num_slots and num_new_pages. Changes no page, owner or free-list
  // state. Returns false when no request was admitted (nothing to launch).
  // REQUIRES: ValidateRequests (and MakeRoomForBatch) ran on `requests`.
  bool AdmitAndPlan(absl::Span<const AllocRequest> requests,
                    absl::Span<AllocResult> results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Launches scratch_.plan on the executor. Returns true when the launch
  // succeeded. On failure nothing has been committed, so the batch rolls
  // back by refusing it: every admitted request's result becomes the
  // executor's status with no slots and no pages, and the call returns
  // false. REQUIRES: AdmitAndPlan returned true.
  bool ExecutePlan(absl::Span<AllocResult> results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the plan's pages to the admitted requests' owners (recording them
  // in active checkpoints), moves the free list's head past them and
  // counts the batch. Cannot fail. REQUIRES: ExecutePlan returned true.
  void CommitPlan(absl::Span<const AllocRequest> requests)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PoolGeometry geometry_;
  const FreePolicy policy_;
  const bool scrub_;
  const int64_t capacity_;  // ring capacity: num_pages
  PlanExecutor* const executor_;

  mutable absl::Mutex mu_;
  // The free list is ring_[head_], ring_[head_ + 1], ... (modulo capacity_),
  // free_count_ entries.
  std::vector<int64_t> ring_ ABSL_GUARDED_BY(mu_);
  int64_t head_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t free_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> parked_ ABSL_GUARDED_BY(mu_);
  // owner_of_[p] for p in 0..num_pages; page 0 stays kNoOwner.
  std::vector<OwnerId> owner_of_ ABSL_GUARDED_BY(mu_);
  // allocated_once_[p]: page p has been handed out since the pool was
  // created (Clear keeps it). One bit a page, set as pages are handed out,
  // so that a refusal can tell a page never allocated from a double free.
  std::vector<bool> allocated_once_ ABSL_GUARDED_BY(mu_);
  // last_owner_[p]: the owner page p was last handed to (PoolOptions.scrub;
  // empty otherwise). Freeing keeps it; so does Clear.
  std::vector<OwnerId> last_owner_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<OwnerId, OwnerState> owners_ ABSL_GUARDED_BY(mu_);
  PoolStats counters_ ABSL_GUARDED_BY(mu_);  // only the counter fields

  // Allocate's working storage, kept between batches so that it stays warm
  // in cache (fresh vectors per batch showed in the profile).
  struct BatchScratch {
    std::vector<ExtendShape> shapes;
    std::vector<int64_t> pages_needed;
    std::vector<size_t> admitted;
    absl::flat_hash_map<OwnerId, int64_t> pages_by_owner;
    BatchPlan plan;
  };
  BatchScratch scratch_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pagealloc

#endif  // PAGEALLOC_ALLOCATOR_PAGE_POOL_H_
