// An empty kernel: the launch-and-complete floor the expand kernel is
// measured against in bench/kernel_benchmark.

#ifndef PAGEALLOC_BENCH_FLOOR_KERNEL_H_
#define PAGEALLOC_BENCH_FLOOR_KERNEL_H_

#include <cuda_runtime_api.h>

namespace pagealloc {

// Launches one block of one thread that does nothing, on `stream`.
// Returns the launch's error.
cudaError_t LaunchEmptyKernel(cudaStream_t stream);

// As LaunchEmptyKernel, with a `bytes`-byte kernel parameter (2048, 8192 or
// 32736: the inline plan's size tiers), so the cost of passing a plan in the
// parameters can be read off. Returns cudaErrorInvalidValue for other sizes.
cudaError_t LaunchEmptyKernelWithParams(cudaStream_t stream, int bytes);

// Launches one block of one thread that spins for `cycles` SM clock cycles
// and touches no memory: queued before a timed launch, it keeps the GPU
// busy while the host queues the timing events and the launch, so that the
// events time the GPU, not the host. Returns the launch's error.
cudaError_t LaunchSpinKernel(cudaStream_t stream, long long cycles);

}  // namespace pagealloc

#endif  // PAGEALLOC_BENCH_FLOOR_KERNEL_H_
