#include "allocator/fake_executor.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "absl/strings/str_format.h"
#include "allocator/requests.h"

namespace pagealloc {
namespace {

// Writes `request`'s seq_len - prefix_len slots to its destination: first
// the slots that continue the prefix's partial page (last_loc + 1, ...),
// then each new page from its first slot, the last one possibly partial.
// New page k of the request sits at ring position
// head + first_new_page + k (modulo the capacity).
void WriteSlots(const PlannedRequest& request, const BatchPlan& plan,
                const std::vector<int64_t>& ring) {
  const int64_t page_size = plan.page_size;
  const int64_t num_slots = request.seq_len - request.prefix_len;
  const int64_t partial = PartialPageSlots(
      {request.prefix_len, request.seq_len, request.last_loc}, page_size);
  int64_t* out = request.destination;
  int64_t t = 0;
  for (; t < partial; ++t) out[t] = request.last_loc + 1 + t;
  const int64_t capacity = ring.size();
  // One modulo per request; the walk over the ring wraps by comparison, so
  // that long extends cost a store per slot and little else (the benchmark
  // runs on this executor).
  int64_t position =
      ModNonNegative(plan.free_ring_head + request.first_new_page, capacity);
  while (t < num_slots) {
    const int64_t first_slot = ring[position] * page_size;
    const int64_t end = std::min(num_slots, t + page_size);
    for (int64_t slot = first_slot; t < end; ++t, ++slot) out[t] = slot;
    if (++position == capacity) position = 0;
  }
}

// Copies `copy`'s ring entries to its destination, in two parts when the
// range wraps around the ring's end.
void CopyRing(const RingCopy& copy, const BatchPlan& plan,
              const std::vector<int64_t>& ring) {
  const int64_t capacity = ring.size();
  const int64_t position =
      ModNonNegative(plan.free_ring_head + copy.ring_offset, capacity);
  const int64_t first = std::min(copy.count, capacity - position);
  std::copy_n(ring.begin() + position, first, copy.destination);
  std::copy_n(ring.begin(), copy.count - first, copy.destination + first);
}

}  // namespace

absl::Status FakeExecutor::InitFreeRing(int64_t capacity) {
  if (capacity < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("free ring capacity (%d) must be >= 1", capacity));
  }
  ring_.assign(capacity, 0);
  return absl::OkStatus();
}

absl::Status FakeExecutor::WriteFreeRing(int64_t position,
                                         absl::Span<const int64_t> pages) {
  if (position < 0 || position + static_cast<int64_t>(pages.size()) >
                          static_cast<int64_t>(ring_.size())) {
    return absl::OutOfRangeError(
        absl::StrFormat("free ring write [%d, %d) outside capacity %d",
                        position, position + pages.size(), ring_.size()));
  }
  std::copy(pages.begin(), pages.end(), ring_.begin() + position);
  return absl::OkStatus();
}

absl::Status FakeExecutor::Execute(const BatchPlan& plan) {
  ++launches_;
  if (failures_pending_ > 0) {
    --failures_pending_;
    return failure_;
  }
  if (plan.free_ring_capacity != static_cast<int64_t>(ring_.size())) {
    return absl::InternalError(
        absl::StrFormat("plan ring capacity %d differs from the executor's %d",
                        plan.free_ring_capacity, ring_.size()));
  }
  for (const RingCopy& copy : plan.ring_copies) {
    if (plan.page_size != 1 || copy.ring_offset < 0 || copy.count < 1 ||
        copy.count > plan.free_ring_capacity) {
      return absl::InternalError(absl::StrFormat(
          "ring copy of %d entries at offset %d in a plan of page_size %d "
          "and ring capacity %d",
          copy.count, copy.ring_offset, plan.page_size,
          plan.free_ring_capacity));
    }
  }
  for (const RingCopy& copy : plan.ring_copies) CopyRing(copy, plan, ring_);
  for (const PlannedRequest& request : plan.requests) {
    WriteSlots(request, plan, ring_);
  }
  last_ring_copies_ = plan.ring_copies.size();
  last_planned_requests_ = plan.requests.size();
  scrubbed_.insert(scrubbed_.end(), plan.scrub_pages.begin(),
                   plan.scrub_pages.end());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> FakeExecutor::ReadFreeRing() {
  return ring_;
}

void FakeExecutor::FailNextLaunches(int64_t launches, absl::Status status) {
  assert(launches >= 0);
  assert(!status.ok());
  failures_pending_ = launches;
  failure_ = std::move(status);
}

}  // namespace pagealloc
