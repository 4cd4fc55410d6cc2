// Host-side entry point of the scrub kernel (kernels/scrub_kernels.cu):
// zeroes whole pages of the KV slab in every buffer (--kv_scrub), on the
// executor's stream right before the allocation kernel that hands the pages
// out. Plain C++ plus the CUDA runtime's types.

#ifndef PAGEALLOC_KERNELS_SCRUB_KERNELS_H_
#define PAGEALLOC_KERNELS_SCRUB_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pagealloc {

// One KV buffer as the scrub kernel sees it.
struct ScrubBuffer {
  char* base = nullptr;    // slot 0 of the buffer (device pointer)
  int64_t page_bytes = 0;  // page_size * the buffer's bytes per slot
};

struct ScrubParams {
  const ScrubBuffer* buffers = nullptr;  // [num_buffers], device memory
  int32_t num_buffers = 0;
  const int64_t* pages = nullptr;  // [num_pages], device memory
  int64_t num_pages = 0;
};

// Threads per block of the scrub kernel.
inline constexpr int kScrubThreads = 256;

// Launches one kernel on `stream` that zeroes page pages[i] of every buffer
// (bytes [pages[i] * page_bytes, (pages[i] + 1) * page_bytes) from its
// base). Returns cudaSuccess at once, launching nothing, when num_pages is
// 0; cudaErrorInvalidValue, launching nothing, for null arrays or sizes out
// of range; else the launch's error (cudaGetLastError). Asynchronous.
// Allocates nothing.
cudaError_t LaunchScrubPages(const ScrubParams& params, cudaStream_t stream);

}  // namespace pagealloc

#endif  // PAGEALLOC_KERNELS_SCRUB_KERNELS_H_
