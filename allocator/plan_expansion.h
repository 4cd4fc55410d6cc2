// The plan's host semantics: how a BatchPlan (allocator/executor.h) becomes
// slots, as plain functions over the plan and a host copy of the free ring.
// Every executor that runs on the host uses them (the CPU reference
// executor, kernels/cpu_executor.h, and the allocator's FakeExecutor); the
// CUDA kernels are checked against them.

#ifndef PAGEALLOC_ALLOCATOR_PLAN_EXPANSION_H_
#define PAGEALLOC_ALLOCATOR_PLAN_EXPANSION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "allocator/executor.h"

namespace pagealloc {

// Expands one planned request into `out` (seq_len - prefix_len slots):
// first the slots that continue the prefix's partial page (last_loc + 1,
// ...), then each new page from its first slot, the last one possibly
// partial, taking the new pages from `ring` (ring_capacity entries) starting
// at ring position head + request.first_new_page.
void ExpandRequest(const PlannedRequest& request, int64_t page_size,
                   const int64_t* ring, int64_t ring_capacity, int64_t head,
                   int64_t* out);

// Copies `copy`'s entries of `ring` (ring_capacity entries, the batch's
// pages starting at position head) to its destination, in two parts when
// they wrap around the ring's end.
// REQUIRES: 0 <= copy.ring_offset, 1 <= copy.count <= ring_capacity.
void CopyRingEntries(const RingCopy& copy, const int64_t* ring,
                     int64_t ring_capacity, int64_t head);

// Runs `plan` over `ring` (plan.free_ring_capacity entries): its ring
// copies, then each planned request into its destination. Scrubbing is the
// executor's (it owns the KV memory, if any).
// REQUIRES: the plan's ring copies are in shape (each as CopyRingEntries
// requires) and its destinations are host pointers with room.
void ExpandPlan(const BatchPlan& plan, const int64_t* ring);

// A host executor's mirror of the free ring: what InitFreeRing, WriteFreeRing
// and ReadFreeRing (PlanExecutor) keep, and the plans run over it.
//
// This class is thread-compatible.
class HostFreeRing {
 public:
  // Sets the mirror to `capacity` zero entries. INVALID_ARGUMENT for a
  // capacity below 1.
  absl::Status Init(int64_t capacity);
  // Writes `pages` at `position`. OUT_OF_RANGE, writing nothing, for a
  // write outside the ring.
  absl::Status Write(int64_t position, absl::Span<const int64_t> pages);
  // INTERNAL when `plan`'s ring capacity is not the mirror's.
  absl::Status CheckCapacity(const BatchPlan& plan) const;
  // ExpandPlan over the mirror. REQUIRES: CheckCapacity(plan).ok(), and
  // ExpandPlan's.
  void Expand(const BatchPlan& plan) const { ExpandPlan(plan, ring_.data()); }

  const std::vector<int64_t>& entries() const { return ring_; }
  int64_t capacity() const { return static_cast<int64_t>(ring_.size()); }

 private:
  std::vector<int64_t> ring_;
};

// The free-ring half of PlanExecutor on the host, which every host executor
// shares: a HostFreeRing behind InitFreeRing, WriteFreeRing and
// ReadFreeRing, and nothing to wait for. Execute is the executor's own.
//
// This class is thread-compatible: the pool serializes calls.
class HostExecutor : public PlanExecutor {
 public:
  // Returns INVALID_ARGUMENT for a capacity below 1.
  absl::Status InitFreeRing(int64_t capacity) override {
    return ring_.Init(capacity);
  }
  // Returns OUT_OF_RANGE, writing nothing, for a write outside the ring.
  absl::Status WriteFreeRing(int64_t position,
                             absl::Span<const int64_t> pages) override {
    return ring_.Write(position, pages);
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<int64_t>> ReadFreeRing() override {
    return ring_.entries();
  }

 protected:
  HostFreeRing ring_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_ALLOCATOR_PLAN_EXPANSION_H_
