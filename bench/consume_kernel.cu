// One line of device code: the .cuh layer would hold nothing else, so the
// __global__ function lives here with its launcher.

#include "bench/consume_kernel.h"

namespace pagealloc::bench {
namespace {

constexpr int kThreads = 256;
// A decode's 256 or 1024 slots take one or four blocks; a prefill chunk's
// tens of thousands at most this many, each thread striding.
constexpr int64_t kMaxBlocks = 256;

// grid: min(ceil(count / kThreads), kMaxBlocks) blocks of kThreads threads;
// thread i copies slots i, i + grid size, ...
__global__ void ConsumeSlotsKernel(const int64_t* __restrict__ src,  // [count]
                                   int64_t* __restrict__ dst,        // [count]
                                   int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += stride) {
    dst[i] = src[i];
  }
}

}  // namespace

cudaError_t LaunchConsumeSlots(const int64_t* src, int64_t* dst, int64_t count,
                               cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (count < 0 || src == nullptr || dst == nullptr) {
    return cudaErrorInvalidValue;
  }
  int64_t blocks = (count + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  ConsumeSlotsKernel<<<static_cast<unsigned int>(blocks), kThreads, 0,
                       stream>>>(src, dst, count);
  return cudaGetLastError();
}

}  // namespace pagealloc::bench
