// An empty kernel: the launch-and-complete floor the expand kernel is
// measured against in bench/kernel_benchmark.

#ifndef PAGEALLOC_BENCH_FLOOR_KERNEL_H_
#define PAGEALLOC_BENCH_FLOOR_KERNEL_H_

#include <cuda_runtime_api.h>

namespace pagealloc {

// Launches one block of one thread that does nothing, on `stream`.
// Returns the launch's error.
cudaError_t LaunchEmptyKernel(cudaStream_t stream);

}  // namespace pagealloc

#endif  // PAGEALLOC_BENCH_FLOOR_KERNEL_H_
