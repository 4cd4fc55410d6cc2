#include "bench/workload.h"

namespace pagealloc::bench {

absl::Status Workload::Validate() const {
  if (batch < 1 || prefill_chunk < 1 || max_seq_len < 2 || draft_tokens < 1) {
    return absl::InvalidArgumentError(
        "--batch, --prefill_chunk, --draft_tokens must be >= 1 and "
        "--max_seq_len >= 2");
  }
  return absl::OkStatus();
}

}  // namespace pagealloc::bench
