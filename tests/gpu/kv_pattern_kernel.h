// A scheduler's stand-in writing KV on the GPU: a kernel that reads a
// call's slot indices straight from the session's mapped ring, on the
// caller's stream, and writes tests/kv_pattern.h's pattern (session, slot,
// buffer) into every KV buffer at those slots, as an attention kernel
// writes K and V. Used by tests/kv_writer.cc on the CUDA backend.
// Host-only declaration.

#ifndef PAGEALLOC_TESTS_GPU_KV_PATTERN_KERNEL_H_
#define PAGEALLOC_TESTS_GPU_KV_PATTERN_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pagealloc::testing {

// One KV buffer as the kernel sees it (a KvBuffer's data and stride).
struct KvPatternBuffer {
  char* data = nullptr;  // slot 0 (device pointer)
  int64_t stride_bytes = 0;
};

struct KvPatternParams {
  const KvPatternBuffer* buffers = nullptr;  // [num_buffers], device memory
  int32_t num_buffers = 0;
  const int64_t* slots = nullptr;  // [count], device memory (the ring)
  int64_t count = 0;
  // Slots a writer may be handed: [first_slot, num_slots) (page 0's slots
  // are never handed out). A slot read outside it is counted in *bad_slots
  // and nothing is written for it.
  int64_t first_slot = 0;
  int64_t num_slots = 0;
  uint64_t session = 0;  // whose pattern
  // Count, in *nonzero_bytes, the bytes of each slot that are not zero
  // before the kernel writes it (a slot new to this session must read zero
  // under --kv_scrub).
  bool expect_zero = false;
  unsigned long long* bad_slots = nullptr;      // device counter
  unsigned long long* nonzero_bytes = nullptr;  // device counter
};

// Launches one kernel on `stream` that writes KvPatternByte(session, slot,
// buffer, byte) into every byte of slot slots[i] of every buffer. Returns
// cudaSuccess at once, launching nothing, for count == 0;
// cudaErrorInvalidValue, launching nothing, for null pointers or sizes out
// of range; else the launch's error. Asynchronous; allocates nothing.
cudaError_t LaunchWriteKvPattern(const KvPatternParams& params,
                                 cudaStream_t stream);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_GPU_KV_PATTERN_KERNEL_H_
