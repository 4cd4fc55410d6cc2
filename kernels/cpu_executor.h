// CpuExecutor: the reference executor. Expands a batch plan into slots on
// the host, reading the batch's pages from its own mirror of the free ring,
// exactly as the CUDA executor does on the device.
//
// Destinations are host pointers (on the CPU backend, into the POSIX shared
// memory rings clients map).
//
// This class is thread-compatible: the pool serializes calls.

#ifndef PAGEALLOC_KERNELS_CPU_EXECUTOR_H_
#define PAGEALLOC_KERNELS_CPU_EXECUTOR_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "allocator/executor.h"

namespace pagealloc {

class CpuExecutor final : public PlanExecutor {
 public:
  CpuExecutor() = default;

  absl::Status InitFreeRing(int64_t capacity) override;
  absl::Status WriteFreeRing(int64_t position,
                             absl::Span<const int64_t> pages) override;
  // Copies the plan's ring copies and expands its requests into their
  // destinations. Returns INTERNAL, writing nothing, when the plan's ring
  // capacity is not the mirror's or it scrubs pages without a matching
  // target; INVALID_ARGUMENT, writing nothing, for ring copies out of shape
  // (ValidateRingCopies).
  absl::Status Execute(const BatchPlan& plan) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<int64_t>> ReadFreeRing() override;
  const char* name() const override { return "cpu"; }

  // Sets the KV memory that plans' scrub_pages are zeroed in (host
  // pointers: the daemon's mapping of the slab). Until it is set, a plan
  // that lists pages to scrub is refused (INTERNAL) and changes nothing.
  // REQUIRES: no launch in progress.
  void SetKvScrubTarget(KvScrubTarget target) {
    scrub_target_ = std::move(target);
  }

 private:
  std::vector<int64_t> ring_;
  KvScrubTarget scrub_target_;
};

// Zeroes page `page`'s slots in every buffer of `target`.
void ScrubPage(const KvScrubTarget& target, int64_t page);

// Expands one planned request into `out` (seq_len - prefix_len slots),
// taking its new pages from `ring` starting at ring position
// head + request.first_new_page. Shared by the CPU executor and the tests
// that check GPU output against it.
void ExpandRequest(const PlannedRequest& request, int64_t page_size,
                   const int64_t* ring, int64_t ring_capacity, int64_t head,
                   int64_t* out);

// Copies `copy`'s entries of `ring` (ring_capacity entries, the batch's
// pages starting at position head) to its destination, in two parts when
// they wrap around the ring's end. Shared as ExpandRequest is.
// REQUIRES: ValidateRingCopies (kernels/plan_packing.h) accepted the copy's
// plan.
void CopyRingEntries(const RingCopy& copy, const int64_t* ring,
                     int64_t ring_capacity, int64_t head);

}  // namespace pagealloc

#endif  // PAGEALLOC_KERNELS_CPU_EXECUTOR_H_
