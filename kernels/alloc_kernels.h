// Host-side entry point of the expand kernels (kernels/alloc_kernels.cu):
// expands a packed batch plan (kernels/plan_packing.h) into slots with one
// kernel launch. Plain C++ plus the CUDA runtime's types.

#ifndef PAGEALLOC_KERNELS_ALLOC_KERNELS_H_
#define PAGEALLOC_KERNELS_ALLOC_KERNELS_H_

#include <cuda_runtime_api.h>

#include "kernels/expand_plan.h"

namespace pagealloc {

// Launches one kernel on `stream` that writes every slot of the packed plan
// `params` describes to its request's destination. Picks the per-request
// kernel when no request writes more than kPerRequestMaxSlots slots, else
// the chunk kernel for long extends of similar lengths (UsesChunkKernel: a
// block per kChunkSlots (1024) slots of one request), else the tiled one (one
// thread per slot, 1 or 8 slots per thread by size). Returns cudaSuccess at
// once, launching nothing, when num_slots is 0; cudaErrorInvalidValue,
// launching nothing, for inconsistent parameters (null arrays, sizes out of
// range); else the launch's error (cudaGetLastError). Asynchronous: the slots
// are written when the stream gets there. Allocates nothing.
cudaError_t LaunchExpandPlan(const ExpandParams& params, cudaStream_t stream);

// As LaunchExpandPlan, for a plan packed with each request's batch index
// plus one as its first_slot: reads the request's last_loc from
// `last_loc.last_loc` on the device, as LastLocPlan (expand_plan.h) says,
// recording a refused value in `last_loc.error`. Also cudaErrorInvalidValue,
// launching nothing, for a null array or error word, or a slot_limit not
// above page_size.
cudaError_t LaunchExpandPlanLastLoc(const ExpandParams& params,
                                    const DeviceLastLoc& last_loc,
                                    cudaStream_t stream);

// As LaunchExpandPlan, for a plan packed into kernel parameters
// (PackInlinePlan): the decode kernel when every request writes one slot,
// else the per-request, chunk or tiled kernel as above. The launch passes the
// smallest parameter size tier (kInlineTierWords) that holds
// params.header.words_used words. `params` may be reused as soon as this
// returns: the launch copies it.
cudaError_t LaunchExpandInlinePlan(const MaxInlineExpandParams& params,
                                   cudaStream_t stream);

// Launches the client's local decode (LocalDecodeParams, PackLocalDecode)
// on `stream` in the smallest parameter tier (kLocalDecodeTierWords) that
// holds its requests. cudaErrorInvalidValue, launching nothing, for a
// request count out of [1, kMaxLocalDecodeRequests], a null array or error
// word, or a slot_limit not above page_size. `params` may be reused as soon
// as this returns: the launch copies it.
cudaError_t LaunchExpandLocalDecode(const MaxLocalDecodeParams& params,
                                    cudaStream_t stream);

}  // namespace pagealloc

#endif  // PAGEALLOC_KERNELS_ALLOC_KERNELS_H_
