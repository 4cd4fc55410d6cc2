#include "tests/gpu/kv_pattern_kernel.h"
#include "tests/kv_pattern.h"

namespace pagealloc::testing {
namespace {

constexpr int kThreads = 128;

// grid: (count, num_buffers) blocks of kThreads threads; block (i, b)
// writes slot slots[i] of buffer b, its threads striding over the
// element's bytes. Each thread reads (expect_zero) and writes only its own
// bytes, so no two threads touch one byte.
__global__ void WriteKvPatternKernel(
    const KvPatternBuffer* __restrict__ buffers,  // [num_buffers]
    const int64_t* __restrict__ slots,            // [count]
    int64_t first_slot, int64_t num_slots, uint64_t session, bool expect_zero,
    unsigned long long* __restrict__ bad_slots,        // [1]
    unsigned long long* __restrict__ nonzero_bytes) {  // [1]
  const int64_t slot = slots[blockIdx.x];
  const int buffer_index = static_cast<int>(blockIdx.y);
  if (slot < first_slot || slot >= num_slots) {
    if (threadIdx.x == 0 && buffer_index == 0) atomicAdd(bad_slots, 1ull);
    return;
  }
  const KvPatternBuffer buffer = buffers[buffer_index];
  uint8_t* const element =
      reinterpret_cast<uint8_t*>(buffer.data + slot * buffer.stride_bytes);
  unsigned long long nonzero = 0;
  for (int64_t byte = threadIdx.x; byte < buffer.stride_bytes;
       byte += blockDim.x) {
    if (expect_zero && element[byte] != 0) ++nonzero;
    element[byte] = KvPatternByte(session, slot, buffer_index, byte);
  }
  if (nonzero != 0) atomicAdd(nonzero_bytes, nonzero);
}

}  // namespace

cudaError_t LaunchWriteKvPattern(const KvPatternParams& params,
                                 cudaStream_t stream) {
  if (params.count == 0) return cudaSuccess;
  if (params.count < 0 || params.count > INT32_MAX || params.num_buffers < 1 ||
      params.num_buffers > 65535 || params.buffers == nullptr ||
      params.slots == nullptr || params.bad_slots == nullptr ||
      params.nonzero_bytes == nullptr || params.first_slot < 0 ||
      params.num_slots < params.first_slot) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned int>(params.count),
                  static_cast<unsigned int>(params.num_buffers));
  WriteKvPatternKernel<<<grid, kThreads, 0, stream>>>(
      params.buffers, params.slots, params.first_slot, params.num_slots,
      params.session, params.expect_zero, params.bad_slots,
      params.nonzero_bytes);
  return cudaGetLastError();
}

}  // namespace pagealloc::testing
