// The free-list policy: where a free puts its pages back, in which order,
// and when parked pages are merged into the free list. Every decision the
// pool makes about the free list's order, and nothing else: FreeListPolicy
// reads the pool's figures and answers; PagePool moves the pages.
//
// The variants, by (FreePolicy, Semantics, page_size):
//   - kLifo: frees go to the front of the free list (the hottest pages are
//     reused first); under Semantics::kSglang with page_size 1 to its back
//     instead (SGLang's token allocator appends: FIFO reuse).
//   - kSorted: frees are parked; a merge puts the parked pages into the
//     free list and sorts it ascending (SGLang's need_sort). Under
//     Semantics::kPagealloc the merge runs once per launch, when the launch
//     as a whole does not fit; under Semantics::kSglang before each call
//     whose SGLang over-estimate exceeds the free pages left.
//   - The order of a free's distinct pages: ascending for slot frees under
//     Semantics::kSglang with page_size > 1 (its torch.unique), first
//     appearance otherwise.

#ifndef PAGEALLOC_ALLOCATOR_FREE_LIST_POLICY_H_
#define PAGEALLOC_ALLOCATOR_FREE_LIST_POLICY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
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

// What the pool is exact to where SGLang's single-process allocator and the
// daemon's own contract differ (docs/design.md, "SGLang compatibility").
// Ownership checks, refusing double frees and rollbacks that leave later
// frees alone hold under both.
enum class Semantics : uint8_t {
  // The daemon's own contract: slot frees put their pages back in order of
  // first appearance; under kSorted, parked pages are merged when a launch
  // as a whole does not fit.
  kPagealloc,
  // SGLang's allocators: slot frees put the distinct pages back ascending
  // (its free's torch.unique), with page_size 1 in the order given and at
  // the back of the free list (its token allocator); under kSorted, parked
  // pages are merged when SGLang's over-estimate for the call says so.
  kSglang,
};

// Parses "pagealloc" or "sglang".
absl::StatusOr<Semantics> ParseSemantics(absl::string_view name);
absl::string_view SemanticsName(Semantics semantics);

// The order in which a free puts a call's distinct pages back.
enum class FreeOrder : uint8_t {
  // The pool's default: kAscending for slot frees under Semantics::kSglang
  // with page_size > 1, kFirstAppearance otherwise.
  kDefault,
  // Ascending page ids (SGLang's free: torch.unique of slot // page_size).
  kAscending,
  // In order of first appearance (SGLang's free_segment path, one slot per
  // page in the sequence's order, and its token allocator).
  kFirstAppearance,
};

// Where a free puts the pages it returns.
enum class ReleaseTarget : uint8_t {
  kFront,  // the front of the free list: reused first (kLifo)
  kBack,   // the back of the free list: reused last (kLifo, SGLang's tokens)
  kPark,   // parked until a merge (kSorted)
};

// When parked pages are merged into the free list.
enum class MergeTrigger : uint8_t {
  kNever,     // nothing is ever parked (kLifo)
  kPerBatch,  // once, before admission (kSorted, Semantics::kPagealloc)
  kPerCall,   // before each call (kSorted, Semantics::kSglang)
};

// SGLang's over-estimate of the pages one allocation call needs, the figure
// its allocators compare with len(free_pages) to decide on a merge: for
// extend, extend_num_tokens // page_size + batch_size + 1; for decode,
// batch_size; for alloc, and for every call at page_size 1 (its token
// allocator), the pages the call needs. Every request of the call counts
// towards batch_size; requests with a malformed shape add no tokens or
// pages; lengths are clamped to the pool's slot range, which keeps the sums
// from overflowing and changes no comparison (a clamped request alone
// exceeds the pool). The call's kind is its first request's. Returns 0 for
// an empty call.
int64_t SglangCallEstimate(absl::Span<const AllocRequest> call,
                           const PoolGeometry& geometry);

// One pool's free-list policy, fixed when the pool is built. A value type.
// This class is thread-safe (it is immutable).
class FreeListPolicy {
 public:
  FreeListPolicy(FreePolicy policy, Semantics semantics,
                 const PoolGeometry& geometry);

  FreePolicy policy() const { return policy_; }
  Semantics semantics() const { return semantics_; }
  ReleaseTarget release_target() const { return release_target_; }
  MergeTrigger merge_trigger() const { return merge_trigger_; }

  // Resolves FreeOrder::kDefault for a free of slots (`values_are_slots`)
  // or of page ids; any other order is returned as it is.
  FreeOrder ResolveOrder(FreeOrder order, bool values_are_slots) const {
    if (order != FreeOrder::kDefault) return order;
    return values_are_slots && semantics_ == Semantics::kSglang &&
                   geometry_.page_size > 1
               ? FreeOrder::kAscending
               : FreeOrder::kFirstAppearance;
  }

  // Returns whether to merge before admitting a batch whose accepted
  // requests need `batch_pages` pages together, with `free_pages` in the
  // free list and `parked_pages` parked: under kPerBatch, when the batch
  // does not fit and a merge has pages to add. A merge costs a sort of the
  // free list, so it runs only when the launch cannot do without.
  bool MergeBeforeBatch(int64_t batch_pages, int64_t free_pages,
                        int64_t parked_pages) const {
    return merge_trigger_ == MergeTrigger::kPerBatch &&
           batch_pages > free_pages && parked_pages > 0;
  }

  // Returns whether to merge before admitting `call`, with
  // `available_pages` free pages left after the earlier calls of the
  // launch and `parked_pages` parked: under kPerCall, when
  // SglangCallEstimate(call) exceeds the pages left and a merge has pages
  // to add, whether or not the call then fits.
  bool MergeBeforeCall(absl::Span<const AllocRequest> call,
                       int64_t available_pages, int64_t parked_pages) const {
    if (merge_trigger_ != MergeTrigger::kPerCall || parked_pages == 0 ||
        call.empty()) {
      return false;
    }
    return SglangCallEstimate(call, geometry_) > available_pages;
  }

 private:
  FreePolicy policy_;
  Semantics semantics_;
  PoolGeometry geometry_;
  ReleaseTarget release_target_;
  MergeTrigger merge_trigger_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_ALLOCATOR_FREE_LIST_POLICY_H_
