// FakeExecutor: the allocator's own test executor. It really executes plans
// on the host (the plan's host semantics, allocator/plan_expansion.h, which
// the CPU reference executor in //kernels:cpu_executor runs too), so allocator/
// tests and benchmarks need nothing outside allocator/. A failure switch
// makes the next launches fail, so that tests can check that a failed
// launch changes nothing.
//
// Destinations are host pointers.
//
// This class is thread-compatible: the pool serializes calls.

#ifndef PAGEALLOC_ALLOCATOR_FAKE_EXECUTOR_H_
#define PAGEALLOC_ALLOCATOR_FAKE_EXECUTOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "allocator/executor.h"
#include "allocator/plan_expansion.h"

namespace pagealloc {

class FakeExecutor final : public HostExecutor {
 public:
  FakeExecutor() = default;

  // Writes each ring copy's and each planned request's slots to its
  // destination. Returns the
  // failure switch's status, writing nothing, while the switch is armed,
  // and INTERNAL, writing nothing, when the plan's ring capacity is not the
  // mirror's or a ring copy is out of shape (page_size other than 1, a
  // negative offset, a count outside [1, capacity]).
  absl::Status Execute(const BatchPlan& plan) override;
  const char* name() const override { return "fake"; }

  // Makes the next `launches` calls to Execute return `status` without
  // writing anything; later calls execute again. Replaces an armed switch.
  // REQUIRES: launches >= 0 and !status.ok().
  void FailNextLaunches(int64_t launches, absl::Status status);

  // Calls to Execute so far, failed ones included.
  int64_t launches() const { return launches_; }
  // Calls to Execute still to fail.
  int64_t failures_pending() const { return failures_pending_; }
  // The last successful launch's ring copies and planned requests (the
  // plan's two forms, BatchPlan).
  int64_t last_ring_copies() const { return last_ring_copies_; }
  int64_t last_planned_requests() const { return last_planned_requests_; }
  // The pages successful launches were told to scrub (BatchPlan.
  // scrub_pages), in order; the fake has no KV memory to zero.
  const std::vector<int64_t>& scrubbed_pages() const { return scrubbed_; }

 private:
  std::vector<int64_t> scrubbed_;
  int64_t launches_ = 0;
  int64_t last_ring_copies_ = 0;
  int64_t last_planned_requests_ = 0;
  int64_t failures_pending_ = 0;
  absl::Status failure_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_ALLOCATOR_FAKE_EXECUTOR_H_
