#include "client/cuda_ring_view.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace pagealloc {
namespace {

absl::StatusOr<int> FindDevice(const std::string& uuid) {
  int count = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  for (int device = 0; device < count; ++device) {
    cudaDeviceProp properties;
    RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&properties, device),
                               "cudaGetDeviceProperties"));
    if (FormatCudaUuid(properties.uuid) == uuid) return device;
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "the daemon's GPU %s is not visible to this process (%d GPUs visible; "
      "check CUDA_VISIBLE_DEVICES)",
      uuid, count));
}

class CudaIpcRingView final : public RingView {
 public:
  CudaIpcRingView(int device, const int64_t* slots, int64_t capacity)
      : device_(device), slots_(slots), capacity_(capacity) {}
  ~CudaIpcRingView() override {
    cudaSetDevice(device_);
    cudaIpcCloseMemHandle(const_cast<int64_t*>(slots_));
  }

  const int64_t* slots() const override { return slots_; }
  int64_t capacity_slots() const override { return capacity_; }
  bool on_device() const override { return true; }
  absl::Status CopyToHost(const int64_t* src, int64_t count,
                          int64_t* dst) const override {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    return CudaStatus(
        cudaMemcpy(dst, src, count * sizeof(int64_t), cudaMemcpyDeviceToHost),
        "cudaMemcpy(ring to host)");
  }

 private:
  const int device_;
  const int64_t* const slots_;
  const int64_t capacity_;
};

// IPC events can be opened once per process; keep them by handle.
class EventCache {
 public:
  absl::StatusOr<cudaEvent_t> Open(const std::string& handle) {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(handle);
    if (it != events_.end()) return it->second;
    if (handle.size() != sizeof(cudaIpcEventHandle_t)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cuda_ipc_event_handle is %d bytes; expected %d",
                          handle.size(), sizeof(cudaIpcEventHandle_t)));
    }
    cudaIpcEventHandle_t ipc;
    std::memcpy(&ipc, handle.data(), sizeof(ipc));
    cudaEvent_t event;
    RETURN_IF_ERROR(CudaStatus(cudaIpcOpenEventHandle(&event, ipc),
                               "cudaIpcOpenEventHandle"));
    events_[handle] = event;
    return event;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, cudaEvent_t> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<RingView>> MapCudaIpcRing(
    const v1::OutputRing& ring, const std::string& device_uuid) {
  ASSIGN_OR_RETURN(int device, FindDevice(device_uuid));
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  if (ring.cuda_ipc_handle().size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cuda_ipc_handle is %d bytes; expected %d",
        ring.cuda_ipc_handle().size(), sizeof(cudaIpcMemHandle_t)));
  }
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, ring.cuda_ipc_handle().data(), sizeof(handle));
  void* slots = nullptr;
  RETURN_IF_ERROR(CudaStatus(
      cudaIpcOpenMemHandle(&slots, handle, cudaIpcMemLazyEnablePeerAccess),
      "cudaIpcOpenMemHandle"));
  return std::make_unique<CudaIpcRingView>(
      device, static_cast<const int64_t*>(slots), ring.capacity_slots());
}

absl::Status WaitForDaemonEvent(const std::string& event_handle, void* stream) {
  static EventCache* const events = new EventCache();
  ASSIGN_OR_RETURN(cudaEvent_t event, events->Open(event_handle));
  return CudaStatus(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event, 0),
      "cudaStreamWaitEvent");
}

}  // namespace pagealloc
