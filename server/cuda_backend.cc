#include "server/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "client/cuda_vmm_import.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda_executor.h"
#include "server/cuda_vmm_export.h"

namespace pagealloc {
namespace {

class CudaRing final : public RingMemory {
 public:
  // `completion` is the backend's counter and `stream` its executor's,
  // which outlive every ring.
  CudaRing(std::unique_ptr<ExportedDeviceMemory> memory, int64_t capacity,
           const ExportedDeviceMemory* completion, int device,
           cudaStream_t stream)
      : memory_(std::move(memory)),
        capacity_(capacity),
        completion_(completion),
        device_(device),
        stream_(stream) {}
  ~CudaRing() override {
    // A launch queued for the session may still be writing its slots (an
    // async call whose client died): unmap only once the stream is past
    // it. Errors here have nowhere to go.
    if (cudaSetDevice(device_) == cudaSuccess) cudaStreamSynchronize(stream_);
  }

  int64_t* slots() override { return static_cast<int64_t*>(memory_->base()); }
  int64_t capacity_slots() const override { return capacity_; }
  RingDescription Describe() const override {
    RingDescription ring;
    ring.capacity_slots = capacity_;
    ring.memory = RingDescription::Memory::kCudaVmm;
    ring.fd = memory_->fd();
    ring.bytes = memory_->bytes();
    ring.completion_fd = completion_->fd();
    ring.completion_bytes = completion_->bytes();
    return ring;
  }

 private:
  const std::unique_ptr<ExportedDeviceMemory> memory_;
  const int64_t capacity_;
  const ExportedDeviceMemory* const completion_;
  const int device_;
  const cudaStream_t stream_;
};

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      const CudaBackendOptions& options) {
    CudaExecutorOptions executor_options;
    executor_options.device_ordinal = options.gpu;
    executor_options.max_requests_per_batch = options.max_batch_requests;
    executor_options.max_slots_per_batch = options.max_batch_tokens;
    ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutor> executor,
                     CudaExecutor::Create(executor_options));
    RETURN_IF_ERROR(CheckCudaSharing(options.gpu));
    // One counter for the pool: the stream is in order, so a client that
    // waits for the value written after its launch waits for that launch
    // (and perhaps later ones), whoever's they are.
    ASSIGN_OR_RETURN(
        std::unique_ptr<ExportedDeviceMemory> completion,
        ExportedDeviceMemory::Create(options.gpu, sizeof(uint64_t)));
    // Fresh memory holds anything; a client waiting for value >= 1 must
    // not pass before the first launch.
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options.gpu), "cudaSetDevice"));
    RETURN_IF_ERROR(
        CudaStatus(cudaMemset(completion->base(), 0, completion->bytes()),
                   "cudaMemset(completion counter)"));
    RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(),
                               "cudaDeviceSynchronize(completion counter)"));
    std::unique_ptr<CudaBackend> backend(new CudaBackend(
        options.gpu, std::move(executor), std::move(completion)));
    cudaDeviceProp properties;
    RETURN_IF_ERROR(
        CudaStatus(cudaGetDeviceProperties(&properties, options.gpu),
                   "cudaGetDeviceProperties"));
    backend->device_name_ = properties.name;
    backend->uuid_ = FormatCudaUuid(properties.uuid);
    return backend;
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  PlanExecutor* executor() override { return executor_.get(); }

  absl::StatusOr<std::unique_ptr<RingMemory>> CreateRing(
      uint64_t session_id, int64_t capacity_slots) override {
    absl::StatusOr<std::unique_ptr<ExportedDeviceMemory>> memory =
        ExportedDeviceMemory::Create(
            gpu_, static_cast<uint64_t>(capacity_slots) * sizeof(int64_t));
    if (!memory.ok()) {
      return absl::Status(
          absl::IsResourceExhausted(memory.status())
              ? absl::StatusCode::kResourceExhausted
              : memory.status().code(),
          absl::StrFormat(
              "cannot allocate a %d-slot output ring for session %d on GPU "
              "%d: %s",
              capacity_slots, session_id, gpu_, memory.status().message()));
    }
    return std::make_unique<CudaRing>(*std::move(memory), capacity_slots,
                                      completion_.get(), gpu_,
                                      executor_->stream());
  }

  absl::Status CopyToHost(const int64_t* src, int64_t count,
                          int64_t* dst) override {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(gpu_), "cudaSetDevice"));
    return CudaStatus(
        cudaMemcpy(dst, src, count * sizeof(int64_t), cudaMemcpyDeviceToHost),
        "cudaMemcpy(ring to host)");
  }

  absl::StatusOr<uint64_t> CompleteLaunch(bool async) override {
    if (!async) {
      // The stream has written every value queued so far once it is idle.
      RETURN_IF_ERROR(executor_->Synchronize());
      return completion_value_.load(std::memory_order_relaxed);
    }
    const uint64_t value =
        completion_value_.load(std::memory_order_relaxed) + 1;
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(gpu_), "cudaSetDevice"));
    RETURN_IF_ERROR(
        StreamWriteValue(executor_->stream(), completion_->base(), value));
    completion_value_.store(value, std::memory_order_relaxed);
    return value;
  }

  uint64_t completion_value() const override {
    return completion_value_.load(std::memory_order_relaxed);
  }

  DeviceDescription DescribeDevice() const override {
    return {BackendKind::kCuda, gpu_, uuid_};
  }

  std::string Summary() const override {
    return absl::StrFormat(
        "cuda (GPU %d: %s, %s; rings and completion counter shared as CUDA "
        "virtual-memory file descriptors)",
        gpu_, device_name_, uuid_);
  }

 private:
  CudaBackend(int gpu, std::unique_ptr<CudaExecutor> executor,
              std::unique_ptr<ExportedDeviceMemory> completion)
      : gpu_(gpu),
        completion_(std::move(completion)),
        executor_(std::move(executor)) {}

  const int gpu_;
  // Before the executor: destroyed after it, once its destructor has
  // waited for the stream's last write to the counter.
  const std::unique_ptr<ExportedDeviceMemory> completion_;
  const std::unique_ptr<CudaExecutor> executor_;
  // The last value queued on the stream; only the thread driving the pool
  // writes it (one at a time, handed over under the batcher's lock).
  std::atomic<uint64_t> completion_value_{0};
  std::string device_name_;
  std::string uuid_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    const CudaBackendOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend,
                   CudaBackend::Create(options));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace pagealloc
