// The expand kernels: __global__ wrappers around the per-thread bodies in
// kernels/expand_plan.h (which the host-side tests run too). Included only by
// kernels/alloc_kernels.cu.

#ifndef PAGEALLOC_KERNELS_ALLOC_KERNELS_CUH_
#define PAGEALLOC_KERNELS_ALLOC_KERNELS_CUH_

#include <cstdint>

#include "kernels/expand_plan.h"

namespace pagealloc {

// One thread per packed request; for batches whose requests write at most
// kPerRequestMaxSlots slots each (pure decode is the common case).
// Grid: ceil(params.num_requests / kExpandThreads) blocks of kExpandThreads.
template <bool kPow2PageSize>
__global__ void __launch_bounds__(kExpandThreads)
    ExpandPerRequestKernel(const ExpandParams params,  // arrays on device
                           int page_shift) {  // log2(page_size) if kPow2
  ExpandRequestThread<kPow2PageSize>(
      params, page_shift,
      static_cast<int64_t>(blockIdx.x) * kExpandThreads + threadIdx.x);
}

// One thread per slot, kSlotsPerThread slots each; for everything else.
// Grid: ceil(params.num_slots / (kExpandTileSlots * kSlotsPerThread)) blocks
// of kExpandThreads.
template <bool kPow2PageSize, int kSlotsPerThread>
__global__ void __launch_bounds__(kExpandThreads)
    ExpandTileKernel(const ExpandParams params,  // arrays on device
                     int page_shift) {  // log2(page_size) if kPow2
  ExpandTileThread<kPow2PageSize, kSlotsPerThread>(
      params, page_shift, blockIdx.x, static_cast<int>(threadIdx.x));
}

}  // namespace pagealloc

#endif  // PAGEALLOC_KERNELS_ALLOC_KERNELS_CUH_
