// Launcher of the scrub kernel.

#include <cstdint>

#include "kernels/scrub_kernels.cuh"
#include "kernels/scrub_kernels.h"

namespace pagealloc {

cudaError_t LaunchScrubPages(const ScrubParams& params, cudaStream_t stream) {
  if (params.num_pages == 0) return cudaSuccess;
  if (params.buffers == nullptr || params.pages == nullptr ||
      params.num_buffers < 1 || params.num_pages < 0 ||
      params.num_pages > (int64_t{1} << 31) / params.num_buffers) {
    return cudaErrorInvalidValue;
  }
  const int64_t blocks = params.num_pages * params.num_buffers;
  ScrubPagesKernel<<<static_cast<unsigned>(blocks), kScrubThreads, 0, stream>>>(
      params.buffers, params.num_buffers, params.pages, params.num_pages);
  return cudaGetLastError();
}

}  // namespace pagealloc
