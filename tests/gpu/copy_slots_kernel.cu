#include "tests/gpu/copy_slots_kernel.h"

namespace pagealloc::testing {
namespace {

// grid: ceil(count / 256) blocks of 256 threads; one slot per thread.
__global__ void CopySlotsKernel(const int64_t* __restrict__ src,  // [count]
                                int64_t* __restrict__ dst,        // [count]
                                int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) dst[i] = src[i];
}

}  // namespace

cudaError_t LaunchCopySlots(const int64_t* src, int64_t* dst, int64_t count,
                            cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (count < 0 || src == nullptr || dst == nullptr) {
    return cudaErrorInvalidValue;
  }
  constexpr int kThreads = 256;
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  CopySlotsKernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(
      src, dst, count);
  return cudaGetLastError();
}

}  // namespace pagealloc::testing
