// The expand kernels: __global__ wrappers around the per-thread bodies in
// kernels/expand_plan.h (which the host-side tests run too). Included only by
// kernels/alloc_kernels.cu.

#ifndef PAGEALLOC_KERNELS_ALLOC_KERNELS_CUH_
#define PAGEALLOC_KERNELS_ALLOC_KERNELS_CUH_

#include <cstdint>

#include "kernels/expand_plan.h"

namespace pagealloc {

// Registers per thread are capped at 64 (4 blocks of kExpandThreads per SM):
// the tiled kernel's 8 slots per thread then run a 1M-slot plan in one wave.
inline constexpr int kExpandMinBlocksPerSm = 4;

// The chunk kernel's bulk plans (UsesChunkKernel) have about 8 blocks per SM
// (64 requests of 16384 slots: 1024 blocks on 132 SMs); at 5 blocks per SM
// (<= 48 registers) each SM holds 5 at once and takes the rest as they
// finish. Page sizes that are not powers of two take 4: their 64-bit
// divisions would spill at 48.
inline constexpr int ChunkMinBlocksPerSm(bool pow2_page_size) {
  return pow2_page_size ? 5 : 4;
}

// --- Plans uploaded as a struct-of-arrays block ---
//
// Source (expand_plan.h) says how a thread reads the block: UploadedSource
// as packed, LastLocSource with each request's last_loc from the caller's
// device array (the client library's local expansion).

// One thread per packed request; for batches whose requests write at most
// kPerRequestMaxSlots slots each.
// Grid: ceil(params.num_requests / kExpandThreads) blocks of kExpandThreads.
template <bool kPow2PageSize, class Source>
__global__ void __launch_bounds__(kExpandThreads, kExpandMinBlocksPerSm)
    ExpandPerRequestKernel(const ExpandParams params,  // arrays on device
                           const Source source,
                           int page_shift) {  // log2(page_size) if kPow2
  ExpandRequestThread<kPow2PageSize>(
      source.MakePlan(params), page_shift,
      static_cast<int64_t>(blockIdx.x) * kExpandThreads + threadIdx.x);
}

// One thread per slot, kSlotsPerThread slots each; for everything else.
// Grid: ceil(params.num_slots / (kExpandTileSlots * kSlotsPerThread)) blocks
// of kExpandThreads.
template <bool kPow2PageSize, int kSlotsPerThread, class Source>
__global__ void __launch_bounds__(kExpandThreads, kExpandMinBlocksPerSm)
    ExpandTileKernel(const ExpandParams params,  // arrays on device
                     const Source source,
                     int page_shift) {  // log2(page_size) if kPow2
  ExpandTileThread<kPow2PageSize, kSlotsPerThread>(
      source.MakePlan(params), page_shift, blockIdx.x,
      static_cast<int>(threadIdx.x));
}

// Block (c, r) writes chunk c of request r; for long extends
// (UsesChunkKernel). Grid: ChunksPerRequest(params.max_request_slots) x
// params.num_requests blocks of kExpandThreads.
template <bool kPow2PageSize, class Source>
__global__ void __launch_bounds__(kExpandThreads,
                                  ChunkMinBlocksPerSm(kPow2PageSize))
    ExpandChunkKernel(const ExpandParams params,  // arrays on device
                      const Source source,
                      int page_shift) {  // log2(page_size) if kPow2
  ExpandChunkThread<kPow2PageSize>(source.MakePlan(params), page_shift,
                                   blockIdx.x, blockIdx.y,
                                   static_cast<int>(threadIdx.x));
}

// --- Plans passed in the kernel parameters (kWords: the size tier) ---

// Every request writes one slot. Grid: ceil(num_requests / kExpandThreads)
// blocks of kExpandThreads.
template <int kWords>
__global__ void __launch_bounds__(kExpandThreads, kExpandMinBlocksPerSm)
    ExpandInlineDecodeKernel(
        const __grid_constant__ InlineExpandParams<kWords> params) {
  ExpandDecodeThread(
      params, static_cast<int64_t>(blockIdx.x) * kExpandThreads + threadIdx.x);
}

// As ExpandPerRequestKernel.
template <int kWords, bool kPow2PageSize>
__global__ void __launch_bounds__(kExpandThreads, kExpandMinBlocksPerSm)
    ExpandInlinePerRequestKernel(
        const __grid_constant__ InlineExpandParams<kWords> params) {
  ExpandRequestThread<kPow2PageSize>(
      InlinePlan<kWords>(params), static_cast<int>(params.header.page_shift),
      static_cast<int64_t>(blockIdx.x) * kExpandThreads + threadIdx.x);
}

// As ExpandTileKernel.
template <int kWords, bool kPow2PageSize, int kSlotsPerThread>
__global__ void __launch_bounds__(kExpandThreads, kExpandMinBlocksPerSm)
    ExpandInlineTileKernel(
        const __grid_constant__ InlineExpandParams<kWords> params) {
  ExpandTileThread<kPow2PageSize, kSlotsPerThread>(
      InlinePlan<kWords>(params), static_cast<int>(params.header.page_shift),
      blockIdx.x, static_cast<int>(threadIdx.x));
}

// As ExpandChunkKernel.
template <int kWords, bool kPow2PageSize>
__global__ void __launch_bounds__(kExpandThreads,
                                  ChunkMinBlocksPerSm(kPow2PageSize))
    ExpandInlineChunkKernel(
        const __grid_constant__ InlineExpandParams<kWords> params) {
  ExpandChunkThread<kPow2PageSize>(
      InlinePlan<kWords>(params), static_cast<int>(params.header.page_shift),
      blockIdx.x, blockIdx.y, static_cast<int>(threadIdx.x));
}

// The client's local decode (LocalDecodeParams, kWords: the size tier).
// Grid: ceil(num_requests / kExpandThreads) blocks of kExpandThreads.
template <int kWords>
__global__ void __launch_bounds__(kExpandThreads, kExpandMinBlocksPerSm)
    ExpandLocalDecodeKernel(
        const __grid_constant__ LocalDecodeParams<kWords> params) {
  ExpandLocalDecodeThread(
      params, static_cast<int64_t>(blockIdx.x) * kExpandThreads + threadIdx.x);
}

}  // namespace pagealloc

#endif  // PAGEALLOC_KERNELS_ALLOC_KERNELS_CUH_
