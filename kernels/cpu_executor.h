// CpuExecutor: the reference executor. Expands a batch plan into slots on
// the host (the plan's host semantics, allocator/plan_expansion.h), reading
// the batch's pages from its own mirror of the free ring, exactly as the
// CUDA executor does on the device.
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
#include "allocator/plan_expansion.h"

namespace pagealloc {

class CpuExecutor final : public HostExecutor {
 public:
  CpuExecutor() = default;

  // Copies the plan's ring copies and expands its requests into their
  // destinations. Returns INTERNAL, writing nothing, when the plan's ring
  // capacity is not the mirror's or it scrubs pages without a matching
  // target; INVALID_ARGUMENT, writing nothing, for ring copies out of shape
  // (ValidateRingCopies).
  absl::Status Execute(const BatchPlan& plan) override;
  const char* name() const override { return "cpu"; }

  // Sets the KV memory that plans' scrub_pages are zeroed in (host
  // pointers: the daemon's mapping of the slab). Until it is set, a plan
  // that lists pages to scrub is refused (INTERNAL) and changes nothing.
  // REQUIRES: no launch in progress.
  void SetKvScrubTarget(KvScrubTarget target) {
    scrub_target_ = std::move(target);
  }

 private:
  KvScrubTarget scrub_target_;
};

// Zeroes page `page`'s slots in every buffer of `target`.
void ScrubPage(const KvScrubTarget& target, int64_t page);

}  // namespace pagealloc

#endif  // PAGEALLOC_KERNELS_CPU_EXECUTOR_H_
