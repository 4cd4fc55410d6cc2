#include "tests/gpu/release_fence_kernel.h"
#include "tests/kv_pattern.h"

namespace pagealloc::testing {
namespace {

constexpr int kThreads = 128;

__device__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// grid: one block of kThreads threads. Thread 0 spins, the block waits for
// it, then the threads stride over (slot, buffer, byte) and count the bytes
// that are not the expected session's pattern.
__global__ void SpinThenCheckKernel(
    const KvPatternBuffer* __restrict__ buffers,  // [num_buffers]
    int32_t num_buffers,
    const int64_t* __restrict__ slots,  // [count]
    int64_t count, uint64_t session, int64_t spin_ns,
    unsigned long long* __restrict__ mismatched_bytes) {  // [1]
  if (threadIdx.x == 0) {
    const uint64_t start = GlobalTimerNs();
    while (GlobalTimerNs() - start < static_cast<uint64_t>(spin_ns)) {
    }
  }
  __syncthreads();
  unsigned long long mismatched = 0;
  for (int32_t b = 0; b < num_buffers; ++b) {
    const KvPatternBuffer buffer = buffers[b];
    for (int64_t i = 0; i < count; ++i) {
      const int64_t slot = slots[i];
      const volatile uint8_t* element = reinterpret_cast<const uint8_t*>(
          buffer.data + slot * buffer.stride_bytes);
      for (int64_t byte = threadIdx.x; byte < buffer.stride_bytes;
           byte += blockDim.x) {
        if (element[byte] != KvPatternByte(session, slot, b, byte)) {
          ++mismatched;
        }
      }
    }
  }
  if (mismatched != 0) atomicAdd(mismatched_bytes, mismatched);
}

}  // namespace

cudaError_t LaunchSpinThenCheck(const SpinThenCheckParams& params,
                                cudaStream_t stream) {
  if (params.count == 0) return cudaSuccess;
  if (params.count < 0 || params.num_buffers < 1 || params.buffers == nullptr ||
      params.slots == nullptr || params.mismatched_bytes == nullptr ||
      params.spin_ns < 0) {
    return cudaErrorInvalidValue;
  }
  SpinThenCheckKernel<<<1, kThreads, 0, stream>>>(
      params.buffers, params.num_buffers, params.slots, params.count,
      params.session, params.spin_ns, params.mismatched_bytes);
  return cudaGetLastError();
}

}  // namespace pagealloc::testing
