// Launchers and instantiations of the expand kernels.

#include <cstddef>
#include <cstdint>

#include "kernels/alloc_kernels.cuh"
#include "kernels/alloc_kernels.h"

namespace pagealloc {
namespace {

int64_t Blocks(int64_t threads) {
  return (threads + kExpandThreads - 1) / kExpandThreads;
}

// The chunk kernel's grid: the chunks of the largest request, per request.
// UsesChunkKernel bounds both: at most 2^19 chunks and 65535 requests.
dim3 ChunkGrid(int64_t num_requests, int64_t max_request_slots) {
  return dim3(static_cast<unsigned>(ChunksPerRequest(max_request_slots)),
              static_cast<unsigned>(num_requests));
}

template <bool kPow2PageSize, class Source>
cudaError_t Launch(const ExpandParams& params, const Source& source,
                   int page_shift, cudaStream_t stream) {
  if (UsesPerRequestKernel(params.max_request_slots)) {
    ExpandPerRequestKernel<kPow2PageSize, Source>
        <<<static_cast<unsigned>(Blocks(params.num_requests)), kExpandThreads,
           0, stream>>>(params, source, page_shift);
  } else if (UsesChunkKernel(params.num_requests, params.num_slots,
                             params.max_request_slots)) {
    ExpandChunkKernel<kPow2PageSize, Source>
        <<<ChunkGrid(params.num_requests, params.max_request_slots),
           kExpandThreads, 0, stream>>>(params, source, page_shift);
  } else if (TileSlotsPerThread(params.num_slots, kPow2PageSize) == 1) {
    ExpandTileKernel<kPow2PageSize, 1, Source>
        <<<static_cast<unsigned>(Blocks(params.num_slots)), kExpandThreads, 0,
           stream>>>(params, source, page_shift);
  } else {
    constexpr int kPerThread =
        kPow2PageSize ? kManySlotsPerThread : kManySlotsPerThreadAnyPageSize;
    ExpandTileKernel<kPow2PageSize, kPerThread, Source>
        <<<static_cast<unsigned>(
               Blocks((params.num_slots + kPerThread - 1) / kPerThread)),
           kExpandThreads, 0, stream>>>(params, source, page_shift);
  }
  return cudaGetLastError();
}

// LaunchExpandPlan's checks of `params`: cudaSuccess when they hold.
cudaError_t CheckUploadedParams(const ExpandParams& params) {
  const bool per_request = UsesPerRequestKernel(params.max_request_slots);
  if (params.num_slots < 0 || params.num_requests < 1 ||
      params.num_requests > params.num_slots || params.page_size < 1 ||
      params.ring_capacity < 1 || params.max_request_slots < 1 ||
      params.max_request_slots > params.num_slots ||
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
  return cudaSuccess;
}

template <class Source>
cudaError_t LaunchUploaded(const ExpandParams& params, const Source& source,
                           cudaStream_t stream) {
  const int page_shift = PageShift(params.page_size);
  return page_shift >= 0 ? Launch<true>(params, source, page_shift, stream)
                         : Launch<false>(params, source, 0, stream);
}

// The inline kernel for `header`, in size tier kWords, and its grid.
template <int kWords>
const void* InlineKernel(const InlinePlanHeader& header, dim3* grid) {
  if (header.kind == kInlineDecode) {
    *grid = dim3(static_cast<unsigned>(Blocks(header.num_requests)));
    return reinterpret_cast<const void*>(&ExpandInlineDecodeKernel<kWords>);
  }
  const bool pow2 = header.page_shift >= 0;
  if (UsesPerRequestKernel(header.max_request_slots)) {
    *grid = dim3(static_cast<unsigned>(Blocks(header.num_requests)));
    return pow2 ? reinterpret_cast<const void*>(
                      &ExpandInlinePerRequestKernel<kWords, true>)
                : reinterpret_cast<const void*>(
                      &ExpandInlinePerRequestKernel<kWords, false>);
  }
  if (UsesChunkKernel(header.num_requests, header.num_slots,
                      header.max_request_slots)) {
    *grid = ChunkGrid(header.num_requests, header.max_request_slots);
    return pow2 ? reinterpret_cast<const void*>(
                      &ExpandInlineChunkKernel<kWords, true>)
                : reinterpret_cast<const void*>(
                      &ExpandInlineChunkKernel<kWords, false>);
  }
  const int per_thread = TileSlotsPerThread(header.num_slots, pow2);
  *grid = dim3(static_cast<unsigned>(
      Blocks((header.num_slots + per_thread - 1) / per_thread)));
  if (per_thread == 1) {
    return pow2 ? reinterpret_cast<const void*>(
                      &ExpandInlineTileKernel<kWords, true, 1>)
                : reinterpret_cast<const void*>(
                      &ExpandInlineTileKernel<kWords, false, 1>);
  }
  return pow2 ? reinterpret_cast<const void*>(
                    &ExpandInlineTileKernel<kWords, true, kManySlotsPerThread>)
              : reinterpret_cast<const void*>(
                    &ExpandInlineTileKernel<kWords, false,
                                            kManySlotsPerThreadAnyPageSize>);
}

// Every tier's struct is a prefix of the largest one: the launch copies
// sizeof(InlineExpandParams<tier>) bytes from the start of the packed one.
static_assert(offsetof(InlineExpandParams<kInlineTierWords[0]>, words) ==
                  offsetof(MaxInlineExpandParams, words),
              "inline tiers share one layout");
static_assert(offsetof(LocalDecodeParams<kLocalDecodeTierWords[0]>, words) ==
                  offsetof(MaxLocalDecodeParams, words),
              "local decode tiers share one layout");

}  // namespace

cudaError_t LaunchExpandPlan(const ExpandParams& params, cudaStream_t stream) {
  if (params.num_slots == 0) return cudaSuccess;
  const cudaError_t checked = CheckUploadedParams(params);
  if (checked != cudaSuccess) return checked;
  return LaunchUploaded(params, UploadedSource{}, stream);
}

cudaError_t LaunchExpandPlanLastLoc(const ExpandParams& params,
                                    const DeviceLastLoc& last_loc,
                                    cudaStream_t stream) {
  if (params.num_slots == 0) return cudaSuccess;
  const cudaError_t checked = CheckUploadedParams(params);
  if (checked != cudaSuccess) return checked;
  if (last_loc.last_loc == nullptr || last_loc.error == nullptr ||
      last_loc.slot_limit <= params.page_size) {
    return cudaErrorInvalidValue;
  }
  return LaunchUploaded(params, LastLocSource{last_loc}, stream);
}

cudaError_t LaunchExpandInlinePlan(const MaxInlineExpandParams& params,
                                   cudaStream_t stream) {
  const InlinePlanHeader& h = params.header;
  if (h.num_slots == 0) return cudaSuccess;
  const int64_t needed = h.kind == kInlineDecode
                             ? InlineDecodeWords(h.num_requests)
                             : InlineGeneralWords(h.num_requests);
  if (h.num_requests < 1 || h.num_slots < h.num_requests ||
      h.num_slots >= (int64_t{1} << 31) || h.page_size < 1 ||
      h.ring_capacity < 1 || h.free_ring == nullptr ||
      h.max_request_slots < 1 || h.max_request_slots > h.num_slots ||
      (h.kind != kInlineDecode && h.kind != kInlineGeneral) ||
      (h.kind == kInlineDecode && h.num_slots != h.num_requests) ||
      h.page_shift != PageShift(h.page_size) || h.words_used != needed ||
      h.words_used > kMaxInlineWords || h.narrow_base != 2 * h.num_requests) {
    return cudaErrorInvalidValue;
  }
  dim3 grid;
  const void* kernel = h.words_used <= kInlineTierWords[0]
                           ? InlineKernel<kInlineTierWords[0]>(h, &grid)
                           : InlineKernel<kInlineTierWords[1]>(h, &grid);
  void* args[] = {const_cast<MaxInlineExpandParams*>(&params)};
  const cudaError_t launched =
      cudaLaunchKernel(kernel, grid, dim3(kExpandThreads), args, 0, stream);
  if (launched != cudaSuccess) return launched;
  return cudaGetLastError();
}

cudaError_t LaunchExpandLocalDecode(const MaxLocalDecodeParams& params,
                                    cudaStream_t stream) {
  const LocalDecodeHeader& h = params.header;
  if (h.num_requests < 1 || h.num_requests > kMaxLocalDecodeRequests ||
      h.page_size < 1 || h.out == nullptr || h.last_loc.last_loc == nullptr ||
      h.last_loc.error == nullptr || h.last_loc.slot_limit <= h.page_size) {
    return cudaErrorInvalidValue;
  }
  const void* kernel =
      LocalDecodeWords(h.num_requests) <= kLocalDecodeTierWords[0]
          ? reinterpret_cast<const void*>(
                &ExpandLocalDecodeKernel<kLocalDecodeTierWords[0]>)
          : reinterpret_cast<const void*>(
                &ExpandLocalDecodeKernel<kLocalDecodeTierWords[1]>);
  void* args[] = {const_cast<MaxLocalDecodeParams*>(&params)};
  const cudaError_t launched = cudaLaunchKernel(
      kernel, dim3(static_cast<unsigned>(Blocks(h.num_requests))),
      dim3(kExpandThreads), args, 0, stream);
  if (launched != cudaSuccess) return launched;
  return cudaGetLastError();
}

}  // namespace pagealloc
