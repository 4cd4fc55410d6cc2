#include "kernels/cpu_executor.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "allocator/plan_expansion.h"
#include "common/status_macros.h"
#include "kernels/plan_packing.h"

namespace pagealloc {

void ScrubPage(const KvScrubTarget& target, int64_t page) {
  for (const KvScrubTarget::Buffer& buffer : target.buffers) {
    const int64_t page_bytes = target.page_size * buffer.stride_bytes;
    std::memset(buffer.base + page * page_bytes, 0, page_bytes);
  }
}

absl::Status CpuExecutor::Execute(const BatchPlan& plan) {
  RETURN_IF_ERROR(ring_.CheckCapacity(plan));
  if (!plan.scrub_pages.empty() && scrub_target_.page_size != plan.page_size) {
    return absl::InternalError(absl::StrFormat(
        "the plan scrubs %d pages of %d slots; the executor's KV memory has "
        "pages of %d slots",
        plan.scrub_pages.size(), plan.page_size, scrub_target_.page_size));
  }
  RETURN_IF_ERROR(ValidateRingCopies(plan, ring_.capacity()));
  // Zeroed before the slots are written: the batch's answer, which hands
  // them out, follows this launch.
  for (int64_t page : plan.scrub_pages) ScrubPage(scrub_target_, page);
  ring_.Expand(plan);
  return absl::OkStatus();
}

}  // namespace pagealloc
