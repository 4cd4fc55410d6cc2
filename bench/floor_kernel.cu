// The floor kernel. Trivial enough that the .cuh layer would hold one line,
// so the __global__ function lives here with its launcher.

#include "bench/floor_kernel.h"

namespace pagealloc {
namespace {

// Grid: 1 block of 1 thread.
__global__ void EmptyKernel() {}

}  // namespace

cudaError_t LaunchEmptyKernel(cudaStream_t stream) {
  EmptyKernel<<<1, 1, 0, stream>>>();
  return cudaGetLastError();
}

}  // namespace pagealloc
