// The floor and spin kernels. Trivial enough that the .cuh layer would hold one line,
// so the __global__ function lives here with its launcher.

#include "bench/floor_kernel.h"

namespace pagealloc {
namespace {

// Grid: 1 block of 1 thread.
__global__ void EmptyKernel() {}

// Grid: 1 block of 1 thread.
__global__ void SpinKernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

cudaError_t LaunchSpinKernel(cudaStream_t stream, long long cycles) {
  SpinKernel<<<1, 1, 0, stream>>>(cycles);
  return cudaGetLastError();
}

cudaError_t LaunchEmptyKernel(cudaStream_t stream) {
  EmptyKernel<<<1, 1, 0, stream>>>();
  return cudaGetLastError();
}

}  // namespace pagealloc
