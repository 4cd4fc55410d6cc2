#include "server/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
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
  // `completion` is the backend's counter and `stream` its executor's,
  // which outlive every ring.
  CudaRing(std::unique_ptr<cuda_vmm::ExportedMemory> memory, int64_t capacity,
           const cuda_vmm::ExportedMemory* completion, int device,
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

  int64_t* slots() override { return static_cast<int64_t*>(memory_->data()); }
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
  const std::unique_ptr<cuda_vmm::ExportedMemory> memory_;
  const int64_t capacity_;
  const cuda_vmm::ExportedMemory* const completion_;
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
    RETURN_IF_ERROR(cuda_vmm::CheckSupport(options.gpu));
    // One counter for the pool: the stream is in order, so a client that
    // waits for the value written after its launch waits for that launch
    // (and perhaps later ones), whoever's they are.
    ASSIGN_OR_RETURN(
        std::unique_ptr<cuda_vmm::ExportedMemory> completion,
        cuda_vmm::ExportedMemory::Create(options.gpu, sizeof(uint64_t)));
    // Fresh memory holds anything; a client waiting for value >= 1 must
    // not pass before the first launch.
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options.gpu), "cudaSetDevice"));
    RETURN_IF_ERROR(
        CudaStatus(cudaMemset(completion->data(), 0, completion->bytes()),
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
    backend->mps_ = properties.mpsEnabled != 0;
    return backend;
  }

  ~CudaBackend() override {
    // A scrub queued on the stream may still write through the slab's
    // mapping, which goes before the executor.
    (void)executor_->Synchronize();
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  PlanExecutor* executor() override { return executor_.get(); }

  absl::StatusOr<std::unique_ptr<RingMemory>> CreateRing(
      uint64_t session_id, int64_t capacity_slots) override {
    absl::StatusOr<std::unique_ptr<cuda_vmm::ExportedMemory>> memory =
        cuda_vmm::ExportedMemory::Create(
            gpu_, capacity_slots * static_cast<int64_t>(sizeof(int64_t)));
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
    RETURN_IF_ERROR(cuda_vmm::StreamWriteValue(executor_->stream(),
                                               completion_->data(), value));
    completion_value_.store(value, std::memory_order_relaxed);
    return value;
  }

  uint64_t completion_value() const override {
    return completion_value_.load(std::memory_order_relaxed);
  }

  DeviceDescription DescribeDevice() const override {
    return {BackendKind::kCuda, gpu_, uuid_, mps_};
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
    slab_.slab_id = NewKvSlabId();
    return absl::OkStatus();
  }

  absl::Status AdoptKvSlab(const KvLayout& layout,
                           const KvSlabGeometry& geometry, bool scrub,
                           UniqueFd fd, uint64_t slab_id) override {
    if (slab_memory_ != nullptr || slab_import_ != nullptr) {
      return absl::FailedPreconditionError("the KV slab exists already");
    }
    UniqueFd kept(fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!kept.valid()) {
      return absl::InternalError(
          absl::StrFormat("dup of the kept KV slab: %s", strerror(errno)));
    }
    // The import proves the descriptor is a VMM allocation at least the
    // slab's size on this GPU, and holds the memory for the daemon's life
    // (the service manager's duplicate holds it across restarts). Its
    // mapping is the scrub target; nothing is zeroed: the pages hold KV.
    auto imported =
        cuda_vmm::Mapping::Import(std::move(fd), geometry.total_bytes, gpu_);
    if (!imported.ok()) {
      return absl::DataLossError(
          absl::StrCat("the kept KV slab: ", imported.status().message()));
    }
    slab_import_ = std::move(*imported);
    if (scrub) {
      KvScrubTarget target;
      target.page_size = geometry.page_size;
      for (const KvBufferPlacement& placement : geometry.placements) {
        target.buffers.push_back(
            {static_cast<char*>(slab_import_->data()) + placement.offset,
             placement.stride_bytes});
      }
      RETURN_IF_ERROR(executor_->SetKvScrubTarget(target));
    }
    slab_fd_ = std::move(kept);
    slab_.layout = layout;
    slab_.geometry = geometry;
    slab_.scrub = scrub;
    slab_.fd = slab_fd_.get();
    slab_.adopted = true;
    slab_.slab_id = slab_id;
    return absl::OkStatus();
  }

  const KvSlab* kv_slab() const override {
    return slab_fd_.valid() ? &slab_ : nullptr;
  }

  std::string Summary() const override {
    return absl::StrFormat(
        "cuda (GPU %d: %s, %s; rings and completion counter shared as CUDA "
        "virtual-memory file descriptors; %s%s)",
        gpu_, device_name_, uuid_, mps_ ? "CUDA MPS on" : "no CUDA MPS",
        slab_fd_.valid()
            ? absl::StrFormat("; a %s KV slab as a VMM fd%s",
                              FormatBytes(slab_.geometry.total_bytes),
                              slab_.adopted ? ", kept from the last run" : "")
            : std::string());
  }

 private:
  CudaBackend(int gpu, std::unique_ptr<CudaExecutor> executor,
              std::unique_ptr<cuda_vmm::ExportedMemory> completion)
      : gpu_(gpu),
        completion_(std::move(completion)),
        executor_(std::move(executor)) {}

  const int gpu_;
  // Before the executor: destroyed after it, once its destructor has
  // waited for the stream's last write to the counter.
  const std::unique_ptr<cuda_vmm::ExportedMemory> completion_;
  const std::unique_ptr<CudaExecutor> executor_;
  // The last value queued on the stream; only the thread driving the pool
  // writes it (one at a time, handed over under the batcher's lock).
  std::atomic<uint64_t> completion_value_{0};
  std::string device_name_;
  bool mps_ = false;
  std::string uuid_;
  // The KV slab: the allocation, its exported fd (what sessions receive),
  // and the daemon's own mapping (only with --kv_scrub). The mapping goes
  // before the allocation.
  std::unique_ptr<cuda_vmm::Allocation> slab_memory_;
  UniqueFd slab_fd_;
  // An adopted slab: the import of the kept descriptor, mapped.
  std::unique_ptr<cuda_vmm::Mapping> slab_import_;
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
