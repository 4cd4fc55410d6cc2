#include "allocator/plan_expansion.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "allocator/requests.h"

namespace pagealloc {

void ExpandRequest(const PlannedRequest& request, int64_t page_size,
                   const int64_t* ring, int64_t ring_capacity, int64_t head,
                   int64_t* out) {
  const int64_t num_slots = request.seq_len - request.prefix_len;
  // (1) the rest of the prefix's partial last page.
  const int64_t partial = PartialPageSlots(
      {request.prefix_len, request.seq_len, request.last_loc}, page_size);
  for (int64_t t = 0; t < partial; ++t) out[t] = request.last_loc + 1 + t;
  // (2) + (3): new pages, each filled from its start; the last may be
  // partial. One modulo per request; the walk over the ring wraps by
  // comparison, so that a long extend costs a store per slot and little
  // else (the allocator's benchmarks run on this).
  int64_t position =
      ModNonNegative(head + request.first_new_page, ring_capacity);
  for (int64_t t = partial; t < num_slots; t += page_size) {
    const int64_t base = ring[position] * page_size;
    const int64_t n = std::min(page_size, num_slots - t);
    for (int64_t k = 0; k < n; ++k) out[t + k] = base + k;
    if (++position == ring_capacity) position = 0;
  }
}

void CopyRingEntries(const RingCopy& copy, const int64_t* ring,
                     int64_t ring_capacity, int64_t head) {
  const int64_t position =
      ModNonNegative(head + copy.ring_offset, ring_capacity);
  const int64_t first = std::min(copy.count, ring_capacity - position);
  std::memcpy(copy.destination, ring + position, first * sizeof(int64_t));
  std::memcpy(copy.destination + first, ring,
              (copy.count - first) * sizeof(int64_t));
}

void ExpandPlan(const BatchPlan& plan, const int64_t* ring) {
  for (const RingCopy& copy : plan.ring_copies) {
    CopyRingEntries(copy, ring, plan.free_ring_capacity, plan.free_ring_head);
  }
  for (const PlannedRequest& request : plan.requests) {
    ExpandRequest(request, plan.page_size, ring, plan.free_ring_capacity,
                  plan.free_ring_head, request.destination);
  }
}

absl::Status HostFreeRing::Init(int64_t capacity) {
  if (capacity < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("free ring capacity (%d) must be >= 1", capacity));
  }
  ring_.assign(capacity, 0);
  return absl::OkStatus();
}

absl::Status HostFreeRing::Write(int64_t position,
                                 absl::Span<const int64_t> pages) {
  if (position < 0 ||
      position + static_cast<int64_t>(pages.size()) > capacity()) {
    return absl::OutOfRangeError(
        absl::StrFormat("free ring write [%d, %d) outside capacity %d",
                        position, position + pages.size(), ring_.size()));
  }
  std::copy(pages.begin(), pages.end(), ring_.begin() + position);
  return absl::OkStatus();
}

absl::Status HostFreeRing::CheckCapacity(const BatchPlan& plan) const {
  if (plan.free_ring_capacity != capacity()) {
    return absl::InternalError(
        absl::StrFormat("plan ring capacity %d differs from the executor's %d",
                        plan.free_ring_capacity, ring_.size()));
  }
  return absl::OkStatus();
}

}  // namespace pagealloc
