// A scheduler's forward still reading KV after it freed the pages: one
// kernel that first spins for a while on the GPU (work queued ahead of the
// read), then reads every KV buffer at a call's slots and counts the bytes
// that are not tests/kv_pattern.h's pattern of the expected session. Used
// by tests/gpu/release_fence_test.cc. Host-only declaration.

#ifndef PAGEALLOC_TESTS_GPU_RELEASE_FENCE_KERNEL_H_
#define PAGEALLOC_TESTS_GPU_RELEASE_FENCE_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tests/gpu/kv_pattern_kernel.h"

namespace pagealloc::testing {

struct SpinThenCheckParams {
  const KvPatternBuffer* buffers = nullptr;  // [num_buffers], device memory
  int32_t num_buffers = 0;
  const int64_t* slots = nullptr;  // [count], device memory
  int64_t count = 0;
  uint64_t session = 0;  // whose pattern the slots must hold
  int64_t spin_ns = 0;   // GPU time spent before the read (globaltimer)
  unsigned long long* mismatched_bytes = nullptr;  // device counter
};

// Launches one kernel on `stream`: spins for params.spin_ns, then adds to
// *mismatched_bytes the bytes of slots[0..count) in every buffer that
// differ from KvPatternByte(session, slot, buffer, byte). cudaSuccess at
// once for count == 0; cudaErrorInvalidValue, launching nothing, for null
// pointers or sizes out of range; else the launch's error. Asynchronous.
cudaError_t LaunchSpinThenCheck(const SpinThenCheckParams& params,
                                cudaStream_t stream);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_GPU_RELEASE_FENCE_KERNEL_H_
