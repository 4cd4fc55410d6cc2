// The scrub kernel's device code (launched by kernels/scrub_kernels.cu).

#ifndef PAGEALLOC_KERNELS_SCRUB_KERNELS_CUH_
#define PAGEALLOC_KERNELS_SCRUB_KERNELS_CUH_

#include <cstdint>

#include "kernels/scrub_kernels.h"

namespace pagealloc {

// Grid: one block per (page, buffer) pair, blockIdx.x = page index *
// num_buffers + buffer; kScrubThreads threads stride over the page's bytes,
// 16 at a time where the page is 16-byte aligned and sized.
__global__ void ScrubPagesKernel(
    const ScrubBuffer* __restrict__ buffers,  // [num_buffers]
    int32_t num_buffers,
    const int64_t* __restrict__ pages,  // [num_pages]
    int64_t num_pages) {
  const int64_t pair = blockIdx.x;
  const int64_t page = pages[pair / num_buffers];
  const ScrubBuffer buffer = buffers[pair % num_buffers];
  char* const start = buffer.base + page * buffer.page_bytes;
  const int64_t bytes = buffer.page_bytes;
  if ((reinterpret_cast<uintptr_t>(start) & 15) == 0 && (bytes & 15) == 0) {
    uint4* const out = reinterpret_cast<uint4*>(start);
    const int64_t words = bytes / 16;
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x) {
      out[i] = make_uint4(0, 0, 0, 0);
    }
  } else {
    for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) start[i] = 0;
  }
}

}  // namespace pagealloc

#endif  // PAGEALLOC_KERNELS_SCRUB_KERNELS_CUH_
