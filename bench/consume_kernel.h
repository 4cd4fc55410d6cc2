// The benchmark's stand-in for an engine's first use of its slots: a kernel
// on the client's own stream that reads a call's slots out of the mapped
// ring, as SGLang's step writes out_cache_loc into its request-to-token
// table. Host-only declaration.

#ifndef PAGEALLOC_BENCH_CONSUME_KERNEL_H_
#define PAGEALLOC_BENCH_CONSUME_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pagealloc::bench {

// Copies `count` int64 slots from `src` (device memory, e.g. a mapped ring)
// to `dst` (device memory) on `stream`. Returns cudaSuccess at once for
// count == 0, cudaErrorInvalidValue for a negative count or a null
// pointer, else the launch's error.
cudaError_t LaunchConsumeSlots(const int64_t* src, int64_t* dst, int64_t count,
                               cudaStream_t stream);

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_CONSUME_KERNEL_H_
