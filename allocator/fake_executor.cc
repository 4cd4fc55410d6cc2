#include "allocator/fake_executor.h"

#include <cassert>
#include <utility>

#include "absl/strings/str_format.h"
#include "allocator/plan_expansion.h"
#include "common/status_macros.h"

namespace pagealloc {
absl::Status FakeExecutor::Execute(const BatchPlan& plan) {
  ++launches_;
  if (failures_pending_ > 0) {
    --failures_pending_;
    return failure_;
  }
  RETURN_IF_ERROR(ring_.CheckCapacity(plan));
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
  ring_.Expand(plan);
  last_ring_copies_ = plan.ring_copies.size();
  last_planned_requests_ = plan.requests.size();
  scrubbed_.insert(scrubbed_.end(), plan.scrub_pages.begin(),
                   plan.scrub_pages.end());
  return absl::OkStatus();
}

void FakeExecutor::FailNextLaunches(int64_t launches, absl::Status status) {
  assert(launches >= 0);
  assert(!status.ok());
  failures_pending_ = launches;
  failure_ = std::move(status);
}

}  // namespace pagealloc
