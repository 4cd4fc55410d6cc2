// Launcher and instantiations of the expand kernels.

#include "kernels/alloc_kernels.h"

#include <cstdint>

#include "kernels/alloc_kernels.cuh"

namespace pagealloc {
namespace {

// Above this many slots the tiled kernel gives each thread 4 slots: a
// launch then already has ~512 blocks, about a wave on an H200, and more
// slots per thread put more independent ring reads and stores behind each
// thread's chain of dependent reads (tile mark, request fields, ring) rather
// than running more waves of that chain. (8 slots per thread spill
// registers.)
constexpr int64_t kOneSlotPerThreadMaxSlots = kExpandTileSlots * 512;
constexpr int kManySlotsPerThread = 4;

template <bool kPow2PageSize>
cudaError_t Launch(const ExpandParams& params, int page_shift,
                   cudaStream_t stream) {
  if (UsesPerRequestKernel(params.max_request_slots)) {
    const int64_t blocks =
        (params.num_requests + kExpandThreads - 1) / kExpandThreads;
    ExpandPerRequestKernel<kPow2PageSize>
        <<<static_cast<unsigned>(blocks), kExpandThreads, 0, stream>>>(
            params, page_shift);
  } else if (params.num_slots <= kOneSlotPerThreadMaxSlots) {
    const int64_t blocks =
        (params.num_slots + kExpandTileSlots - 1) / kExpandTileSlots;
    ExpandTileKernel<kPow2PageSize, 1>
        <<<static_cast<unsigned>(blocks), kExpandThreads, 0, stream>>>(
            params, page_shift);
  } else {
    constexpr int64_t kTile = kManySlotsPerThread * kExpandTileSlots;
    const int64_t blocks = (params.num_slots + kTile - 1) / kTile;
    ExpandTileKernel<kPow2PageSize, kManySlotsPerThread>
        <<<static_cast<unsigned>(blocks), kExpandThreads, 0, stream>>>(
            params, page_shift);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchExpandPlan(const ExpandParams& params, cudaStream_t stream) {
  if (params.num_slots == 0) return cudaSuccess;
  const bool per_request =
      UsesPerRequestKernel(params.max_request_slots);
  if (params.num_slots < 0 || params.num_requests < 1 ||
      params.num_requests > params.num_slots || params.page_size < 1 ||
      params.ring_capacity < 1 || params.max_request_slots < 1 ||
      params.slot_begin == nullptr || params.partial_slots == nullptr ||
      params.first_slot == nullptr || params.ring_start == nullptr ||
      params.destination == nullptr || params.free_ring == nullptr ||
      (!per_request && params.tile_first_request == nullptr)) {
    return cudaErrorInvalidValue;
  }
  // gridDim.x is below 2^31; the per-slot index math is 64-bit throughout.
  const int64_t threads_needed =
      per_request ? params.num_requests : params.num_slots;
  if (threads_needed / kExpandThreads >= (int64_t{1} << 31) - 1) {
    return cudaErrorInvalidValue;
  }
  const int page_shift = PageShift(params.page_size);
  return page_shift >= 0 ? Launch<true>(params, page_shift, stream)
                         : Launch<false>(params, 0, stream);
}

}  // namespace pagealloc
