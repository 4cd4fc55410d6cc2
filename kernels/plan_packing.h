// Packs a BatchPlan into the struct-of-arrays block the expand kernel reads
// (kernels/expand_plan.h), so that one copy uploads a whole batch. Pure
// host code: the CUDA executor packs into pinned staging, the tests and the
// benchmark into ordinary memory.

#ifndef PAGEALLOC_KERNELS_PLAN_PACKING_H_
#define PAGEALLOC_KERNELS_PLAN_PACKING_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "allocator/executor.h"
#include "kernels/expand_plan.h"

namespace pagealloc {

// Where each array of a packed plan sits in its block, in bytes from the
// block's start (all multiples of 8), and the figures that pick the kernel.
struct PackedPlan {
  int64_t num_requests = 0;       // requests with >= 1 slot; 0: no work
  int64_t num_slots = 0;          // slots the batch writes
  int64_t max_request_slots = 0;  // the largest request's slots
  int64_t num_tile_marks = 0;     // tile_first_request entries
  int64_t bytes = 0;              // bytes of the block in use
  int64_t slot_begin_offset = 0;
  int64_t partial_slots_offset = 0;
  int64_t first_slot_offset = 0;
  int64_t ring_start_offset = 0;
  int64_t destination_offset = 0;
  int64_t tile_first_request_offset = 0;
};

// Returns the largest block a plan of at most `max_requests` requests and
// `max_slots` slots can pack into.
int64_t MaxPackedPlanBytes(int64_t max_requests, int64_t max_slots);

// Validates `plan` against a free ring of `ring_capacity` entries and packs
// it into `block` (8-byte aligned). Requests with no slots are left out.
// Returns INVALID_ARGUMENT naming the request and field when the plan is
// inconsistent (a plan the pool built never is), and RESOURCE_EXHAUSTED
// when the packed plan does not fit in `block`; `block` may then hold
// garbage.
absl::StatusOr<PackedPlan> PackPlan(const BatchPlan& plan,
                                    int64_t ring_capacity,
                                    absl::Span<int64_t> block);

// Validates `plan` as PackPlan does, without packing it.
absl::StatusOr<PackedPlan> ValidatePlan(const BatchPlan& plan,
                                        int64_t ring_capacity);

// Checks `plan`'s ring copies (BatchPlan.ring_copies; OK when it has none)
// against a free ring of `ring_capacity` entries: page_size 1, the plan's
// ring capacity and head, each copy's range within the batch's
// num_new_pages pages and its destination, and num_slots (the requests'
// and the copies' slots together). Returns INVALID_ARGUMENT naming the copy
// and field otherwise.
absl::Status ValidateRingCopies(const BatchPlan& plan, int64_t ring_capacity);

// Writes into `out` the plan `plan` describes with its ring copies as
// planned requests (prefix_len 0, seq_len the copy's count, first_new_page
// its ring offset), after its own requests, and no copies: the form the
// expand kernel runs. `out`'s vectors keep their storage between calls.
// REQUIRES: ValidateRingCopies(plan, ...) is OK.
void RingCopiesAsRequests(const BatchPlan& plan, BatchPlan* out);

// No plan of more requests than this is passed inline (a tiled general
// plan, 3.5 words a request, in the 8 KB tier holds fewer).
inline constexpr int64_t kMaxInlineDecodeRequests = kMaxInlineWords / 2;

// Validates `plan` as PackPlan does and, when it fits in the kernel
// parameters (kernels/expand_plan.h: InlineExpandParams), packs it into
// `params`, reading pages from the device ring `free_ring`, and returns
// true. Returns false, with `params` unspecified, when the plan writes no
// slot or does not fit (more words than InlineWordsLimit allows its kernel,
// or values of 2^31 and more); the uploaded block (PackPlan) takes it then.
// Returns INVALID_ARGUMENT for an inconsistent plan.
absl::StatusOr<bool> PackInlinePlan(const BatchPlan& plan,
                                    int64_t ring_capacity,
                                    const int64_t* free_ring,
                                    MaxInlineExpandParams* params);

// Packs a decode of the client's local expansion into `params` (kernels/
// expand_plan.h, LocalDecodeParams): request r takes a new page when
// new_pages[r] is 1, the next of `pages` in order, and continues its
// prefix's page when it is 0. Sets params->header to `header` with
// num_requests new_pages.size(). Returns false, with `params` unspecified,
// when the batch does not fit: more than kMaxLocalDecodeRequests requests,
// or a page id of 2^31 or more (the uploaded plan takes it then).
// INVALID_ARGUMENT for an empty batch, a count other than 0 or 1, a page id
// below 1, or pages.size() other than the counts' sum.
absl::StatusOr<bool> PackLocalDecode(absl::Span<const int64_t> new_pages,
                                     absl::Span<const int64_t> pages,
                                     const LocalDecodeHeader& header,
                                     MaxLocalDecodeParams* params);

// Returns the kernel parameters for `packed`, whose block was copied to
// `device_block`, reading pages from `free_ring`.
ExpandParams MakeExpandParams(const PackedPlan& packed,
                              const void* device_block,
                              const int64_t* free_ring, int64_t ring_capacity,
                              int64_t page_size);

}  // namespace pagealloc

#endif  // PAGEALLOC_KERNELS_PLAN_PACKING_H_
