// A scheduler's stand-in on the GPU: a kernel that reads slots the daemon
// wrote into a session's ring, on the caller's stream, as an attention
// kernel would read its slot indices. Host-only declaration.

#ifndef PAGEALLOC_TESTS_GPU_COPY_SLOTS_KERNEL_H_
#define PAGEALLOC_TESTS_GPU_COPY_SLOTS_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pagealloc::testing {

// Copies `count` int64 slots from `src` (device memory, e.g. a mapped ring)
// to `dst` (device memory) on `stream`. Returns cudaSuccess at once for
// count == 0, cudaErrorInvalidValue for a negative count or a null
// pointer, else the launch's error.
cudaError_t LaunchCopySlots(const int64_t* src, int64_t* dst, int64_t count,
                            cudaStream_t stream);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_GPU_COPY_SLOTS_KERNEL_H_
