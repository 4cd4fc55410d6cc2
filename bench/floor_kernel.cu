// The floor and spin kernels. Trivial enough that the .cuh layer would hold one
// line, so the __global__ function lives here with its launcher.

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

template <int kBytes>
struct Blob {
  char bytes[kBytes];
};

// Grid: 1 block of 1 thread.
template <int kBytes>
__global__ void EmptyParamKernel(const __grid_constant__ Blob<kBytes> blob) {}

template <int kBytes>
cudaError_t LaunchEmptyParam(cudaStream_t stream) {
  static const Blob<kBytes> blob = {};
  EmptyParamKernel<kBytes><<<1, 1, 0, stream>>>(blob);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchEmptyKernelWithParams(cudaStream_t stream, int bytes) {
  switch (bytes) {
    case 2048:
      return LaunchEmptyParam<2048>(stream);
    case 8192:
      return LaunchEmptyParam<8192>(stream);
    case 32736:
      return LaunchEmptyParam<32736>(stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchSpinKernel(cudaStream_t stream, long long cycles) {
  SpinKernel<<<1, 1, 0, stream>>>(cycles);
  return cudaGetLastError();
}

cudaError_t LaunchEmptyKernel(cudaStream_t stream) {
  EmptyKernel<<<1, 1, 0, stream>>>();
  return cudaGetLastError();
}

}  // namespace pagealloc
