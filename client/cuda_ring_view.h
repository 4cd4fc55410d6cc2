// The CUDA backend's ring as a client maps it: device memory opened from
// the daemon's CUDA IPC handle, on the GPU with the daemon's device UUID.

#ifndef PAGEALLOC_CLIENT_CUDA_RING_VIEW_H_
#define PAGEALLOC_CLIENT_CUDA_RING_VIEW_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/ring_view.h"
#include "proto/pagealloc.pb.h"

namespace pagealloc {

// Finds the local ordinal of the GPU with `device_uuid` (processes may
// number GPUs differently, e.g. under CUDA_VISIBLE_DEVICES) and opens the
// ring there. FAILED_PRECONDITION when this process cannot see that GPU.
absl::StatusOr<std::unique_ptr<RingView>> MapCudaIpcRing(
    const v1::OutputRing& ring, const std::string& device_uuid);

// Makes `stream` (a cudaStream_t) wait for the daemon's latest completion
// event, for calls made with async_completion. `event_handle` is
// OutputRing.cuda_ipc_event_handle; the event is opened once per process.
absl::Status WaitForDaemonEvent(const std::string& event_handle, void* stream);

}  // namespace pagealloc

#endif  // PAGEALLOC_CLIENT_CUDA_RING_VIEW_H_
