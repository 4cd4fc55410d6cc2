#include "client/cuda_ring_view.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "memory/cuda_vmm.h"

namespace pagealloc {
namespace {

class CudaRingView final : public RingView {
 public:
  CudaRingView(std::unique_ptr<cuda_vmm::Mapping> mapping, int64_t capacity)
      : mapping_(std::move(mapping)), capacity_(capacity) {}

  const int64_t* slots() const override {
    return static_cast<const int64_t*>(mapping_->data());
  }
  int64_t capacity_slots() const override { return capacity_; }
  bool on_device() const override { return true; }
  absl::Status CopyToHost(const int64_t* src, int64_t count,
                          int64_t* dst) const override {
    RETURN_IF_ERROR(
        CudaStatus(cudaSetDevice(mapping_->device()), "cudaSetDevice"));
    return CudaStatus(
        cudaMemcpy(dst, src, count * sizeof(int64_t), cudaMemcpyDeviceToHost),
        "cudaMemcpy(ring to host)");
  }

 private:
  const std::unique_ptr<cuda_vmm::Mapping> mapping_;
  const int64_t capacity_;
};

class CudaCompletionCounter final : public CompletionCounter {
 public:
  explicit CudaCompletionCounter(std::unique_ptr<cuda_vmm::Mapping> mapping)
      : mapping_(std::move(mapping)) {}

  absl::Status OrderAfter(uint64_t value, void* stream) const override {
    if (stream == nullptr) {
      RETURN_IF_ERROR(
          CudaStatus(cudaSetDevice(mapping_->device()), "cudaSetDevice"));
    }
    return cuda_vmm::StreamWaitValueAtLeast(stream, mapping_->data(), value);
  }

 private:
  const std::unique_ptr<cuda_vmm::Mapping> mapping_;
};

// Maps `bytes` of the memory `fd` exports on the GPU `device_uuid` names;
// an error names `what` and the numbers.
absl::StatusOr<std::unique_ptr<cuda_vmm::Mapping>> Import(
    const std::string& device_uuid, UniqueFd fd, uint64_t bytes,
    const char* what) {
  ASSIGN_OR_RETURN(const int device, cuda_vmm::DeviceByUuid(device_uuid));
  absl::StatusOr<std::unique_ptr<cuda_vmm::Mapping>> mapping =
      cuda_vmm::Mapping::Import(std::move(fd), static_cast<int64_t>(bytes),
                                device);
  if (!mapping.ok()) {
    return absl::Status(
        mapping.status().code(),
        absl::StrFormat("cannot map %s (%d bytes on GPU %s): %s", what, bytes,
                        device_uuid, mapping.status().message()));
  }
  return mapping;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RingView>> MapCudaRing(
    const v1::OutputRing& ring, const std::string& device_uuid, UniqueFd fd,
    uint64_t bytes) {
  if (bytes < static_cast<uint64_t>(ring.capacity_slots()) * sizeof(int64_t)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the daemon's memory socket sent a ring of %d bytes for %d slots",
        bytes, ring.capacity_slots()));
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<cuda_vmm::Mapping> mapping,
      Import(device_uuid, std::move(fd), bytes, "the output ring"));
  return std::make_unique<CudaRingView>(std::move(mapping),
                                        ring.capacity_slots());
}

absl::StatusOr<std::unique_ptr<CompletionCounter>> MapCudaCompletionCounter(
    const std::string& device_uuid, UniqueFd fd, uint64_t bytes) {
  if (!fd.valid()) {
    return absl::FailedPreconditionError(
        "no completion counter: the daemon's memory socket did not hand one "
        "over");
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<cuda_vmm::Mapping> mapping,
      Import(device_uuid, std::move(fd), bytes, "the completion counter"));
  return std::make_unique<CudaCompletionCounter>(std::move(mapping));
}

namespace {

class CudaReleaseWord final : public ReleaseWordWriter {
 public:
  CudaReleaseWord(std::atomic<uint64_t>* word, void* page, void* device_word)
      : word_(word), page_(page), device_word_(device_word) {}
  ~CudaReleaseWord() override { cudaHostUnregister(page_); }

  absl::Status Write(uint64_t value, void* stream) const override {
    // The write waits for the work queued on `stream` before it, and
    // carries a memory barrier: once the daemon reads `value` that work is
    // done, its reads of the freed pages included.
    return cuda_vmm::StreamWriteValue(stream, device_word_, value);
  }
  uint64_t Read() const override {
    return word_->load(std::memory_order_acquire);
  }

 private:
  std::atomic<uint64_t>* const word_;
  void* const page_;
  void* const device_word_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ReleaseWordWriter>> MapCudaReleaseWord(
    std::atomic<uint64_t>* word) {
  const uintptr_t page_bytes = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  void* page = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(word) /
                                       page_bytes * page_bytes);
  // The channel's memory is a shared file mapping the daemon also maps;
  // registering pins the page and maps it for the GPU.
  RETURN_IF_ERROR(CudaStatus(
      cudaHostRegister(page, page_bytes,
                       cudaHostRegisterMapped | cudaHostRegisterPortable),
      "cudaHostRegister(the release word's page)"));
  void* device_word = nullptr;
  const absl::Status mapped =
      CudaStatus(cudaHostGetDevicePointer(&device_word, word, 0),
                 "cudaHostGetDevicePointer(the release word)");
  if (!mapped.ok()) {
    cudaHostUnregister(page);
    return mapped;
  }
  return std::make_unique<CudaReleaseWord>(word, page, device_word);
}

}  // namespace pagealloc
