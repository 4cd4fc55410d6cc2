#include "bench/workload.h"

#include "absl/strings/str_cat.h"

namespace pagealloc::bench {

const char* Workload::mode() const {
  if (gpu_ordered) return async_completion ? "gpu" : "sync_gpu";
  return async_completion ? "async" : "sync";
}

absl::Status Workload::Validate() const {
  if (batch < 1 || prefill_chunk < 1 || max_seq_len < 2 || draft_tokens < 1) {
    return absl::InvalidArgumentError(
        "--batch, --prefill_chunk, --draft_tokens must be >= 1 and "
        "--max_seq_len >= 2");
  }
  if (lanes < 0 || lanes > kMaxLanes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lanes must be 0..", kMaxLanes));
  }
  return absl::OkStatus();
}

}  // namespace pagealloc::bench
