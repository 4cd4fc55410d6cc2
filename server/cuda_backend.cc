#include "server/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda_executor.h"
#include "memory/cuda_vmm.h"
#include "memory/unique_fd.h"

namespace pagealloc {
namespace {

class CudaRing final : public RingMemory {
 public:
  CudaRing(int device, int64_t* slots, int64_t capacity, std::string ipc_handle,
           std::string event_handle)
      : device_(device),
        slots_(slots),
        capacity_(capacity),
        ipc_handle_(std::move(ipc_handle)),
        event_handle_(std::move(event_handle)) {}
  ~CudaRing() override {
    cudaSetDevice(device_);
    cudaFree(slots_);
  }

  int64_t* slots() override { return slots_; }
  int64_t capacity_slots() const override { return capacity_; }
  RingDescription Describe() const override {
    RingDescription ring;
    ring.capacity_slots = capacity_;
    ring.cuda_ipc_handle = ipc_handle_;
    ring.cuda_ipc_event_handle = event_handle_;
    return ring;
  }

 private:
  const int device_;
  int64_t* const slots_;
  const int64_t capacity_;
  const std::string ipc_handle_;
  const std::string event_handle_;
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
    std::unique_ptr<CudaBackend> backend(
        new CudaBackend(options.gpu, std::move(executor)));
    cudaDeviceProp properties;
    RETURN_IF_ERROR(
        CudaStatus(cudaGetDeviceProperties(&properties, options.gpu),
                   "cudaGetDeviceProperties"));
    backend->device_name_ = properties.name;
    backend->uuid_ = FormatCudaUuid(properties.uuid);
    // One interprocess event for the whole daemon: a client that waits on it
    // after its answer waits for its launch or a later one (stream order).
    RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(
                       &backend->completion_,
                       cudaEventDisableTiming | cudaEventInterprocess),
                   "cudaEventCreateWithFlags(interprocess)"));
    cudaIpcEventHandle_t handle;
    RETURN_IF_ERROR(
        CudaStatus(cudaIpcGetEventHandle(&handle, backend->completion_),
                   "cudaIpcGetEventHandle"));
    backend->event_handle_.assign(reinterpret_cast<const char*>(&handle),
                                  sizeof(handle));
    return backend;
  }

  ~CudaBackend() override {
    // A scrub queued on the stream may still write through the slab's
    // mapping, which goes before the executor.
    (void)executor_->Synchronize();
    cudaSetDevice(gpu_);
    if (completion_ != nullptr) cudaEventDestroy(completion_);
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  PlanExecutor* executor() override { return executor_.get(); }

  absl::StatusOr<std::unique_ptr<RingMemory>> CreateRing(
      uint64_t session_id, int64_t capacity_slots) override {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(gpu_), "cudaSetDevice"));
    void* slots = nullptr;
    const absl::Status allocated = CudaStatus(
        cudaMalloc(&slots, capacity_slots * sizeof(int64_t)), "cudaMalloc");
    if (!allocated.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("cannot allocate a %d-slot output ring on GPU %d: %s",
                          capacity_slots, gpu_, allocated.message()));
    }
    cudaIpcMemHandle_t handle;
    const absl::Status exported =
        CudaStatus(cudaIpcGetMemHandle(&handle, slots), "cudaIpcGetMemHandle");
    if (!exported.ok()) {
      cudaFree(slots);
      return exported;
    }
    return std::make_unique<CudaRing>(
        gpu_, static_cast<int64_t*>(slots), capacity_slots,
        std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)),
        event_handle_);
  }

  absl::Status CopyToHost(const int64_t* src, int64_t count,
                          int64_t* dst) override {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(gpu_), "cudaSetDevice"));
    return CudaStatus(
        cudaMemcpy(dst, src, count * sizeof(int64_t), cudaMemcpyDeviceToHost),
        "cudaMemcpy(ring to host)");
  }

  absl::Status CompleteLaunch(bool async) override {
    if (!async) return executor_->Synchronize();
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(gpu_), "cudaSetDevice"));
    return CudaStatus(cudaEventRecord(completion_, executor_->stream()),
                      "cudaEventRecord(completion)");
  }

  DeviceDescription DescribeDevice() const override {
    return {BackendKind::kCuda, gpu_, uuid_};
  }

  absl::StatusOr<int64_t> KvAlignment() override {
    return cuda_vmm::Granularity(gpu_);
  }

  absl::StatusOr<int64_t> KvAvailableBytes() override {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(gpu_), "cudaSetDevice"));
    size_t free = 0, total = 0;
    RETURN_IF_ERROR(
        CudaStatus(cudaMemGetInfo(&free, &total), "cudaMemGetInfo"));
    return static_cast<int64_t>(free);
  }

  // One cuMemCreate allocation for the whole slab, exported once as a POSIX
  // fd that every session receives a duplicate of: one import and one map
  // per client. The daemon maps it only to scrub.
  absl::Status CreateKvSlab(const KvLayout& layout,
                            const KvSlabGeometry& geometry,
                            bool scrub) override {
    if (slab_memory_ != nullptr) {
      return absl::FailedPreconditionError("the KV slab exists already");
    }
    ASSIGN_OR_RETURN(std::unique_ptr<cuda_vmm::Allocation> memory,
                     cuda_vmm::Allocation::Create(gpu_, geometry.total_bytes));
    if (memory->bytes() != geometry.total_bytes) {
      return absl::InternalError(absl::StrFormat(
          "the KV slab of %d bytes became %d bytes: not a multiple of GPU "
          "%d's granularity",
          geometry.total_bytes, memory->bytes(), gpu_));
    }
    ASSIGN_OR_RETURN(UniqueFd fd, memory->Export());
    if (scrub) {
      // Fresh device memory holds whatever it held: zero it once, so that
      // a page never owned needs no scrub; later pages are zeroed as they
      // change owner, by the executor, on its stream.
      ASSIGN_OR_RETURN(slab_mapping_, cuda_vmm::Mapping::Map(*memory));
      RETURN_IF_ERROR(CudaStatus(cudaSetDevice(gpu_), "cudaSetDevice"));
      RETURN_IF_ERROR(
          CudaStatus(cudaMemset(slab_mapping_->data(), 0, geometry.total_bytes),
                     "cudaMemset (KV slab)"));
      KvScrubTarget target;
      target.page_size = geometry.page_size;
      for (const KvBufferPlacement& placement : geometry.placements) {
        target.buffers.push_back(
            {static_cast<char*>(slab_mapping_->data()) + placement.offset,
             placement.stride_bytes});
      }
      RETURN_IF_ERROR(executor_->SetKvScrubTarget(target));
    }
    slab_memory_ = std::move(memory);
    slab_fd_ = std::move(fd);
    slab_.layout = layout;
    slab_.geometry = geometry;
    slab_.scrub = scrub;
    slab_.fd = slab_fd_.get();
    return absl::OkStatus();
  }

  const KvSlab* kv_slab() const override {
    return slab_memory_ != nullptr ? &slab_ : nullptr;
  }

  std::string Summary() const override {
    return absl::StrFormat(
        "cuda (GPU %d: %s, %s; rings shared by CUDA IPC%s)", gpu_, device_name_,
        uuid_,
        slab_memory_ != nullptr
            ? absl::StrFormat("; a %s KV slab as a VMM fd",
                              FormatBytes(slab_.geometry.total_bytes))
            : std::string());
  }

 private:
  CudaBackend(int gpu, std::unique_ptr<CudaExecutor> executor)
      : gpu_(gpu), executor_(std::move(executor)) {}

  const int gpu_;
  const std::unique_ptr<CudaExecutor> executor_;
  std::string device_name_;
  std::string uuid_;
  cudaEvent_t completion_ = nullptr;
  std::string event_handle_;
  // The KV slab: the allocation, its exported fd (what sessions receive),
  // and the daemon's own mapping (only with --kv_scrub). The mapping goes
  // before the allocation.
  std::unique_ptr<cuda_vmm::Allocation> slab_memory_;
  UniqueFd slab_fd_;
  std::unique_ptr<cuda_vmm::Mapping> slab_mapping_;
  KvSlab slab_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    const CudaBackendOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend,
                   CudaBackend::Create(options));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace pagealloc
