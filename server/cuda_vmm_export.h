// Device memory the daemon shares with its clients: a CUDA virtual-memory
// allocation (cuMemCreate) on the pool's GPU, at the device's granularity,
// exportable as a POSIX file descriptor that the memory socket hands to an
// authenticated session (SCM_RIGHTS); and the stream write that sets the
// completion counter in such memory.

#ifndef PAGEALLOC_SERVER_CUDA_VMM_EXPORT_H_
#define PAGEALLOC_SERVER_CUDA_VMM_EXPORT_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "memory/cuda_vmm_import.h"
#include "memory/unique_fd.h"

namespace pagealloc {

// One allocation, mapped read-write into the daemon (base()) and exported
// once as a file descriptor (fd()), which it owns. Destroying it unmaps the
// daemon's view, releases its handle and closes the descriptor; clients
// that imported the memory keep it until they unmap it. This class is
// thread-compatible (immutable once created).
class ExportedDeviceMemory {
 public:
  // Creates at least `min_bytes` (rounded up to the granularity) on CUDA
  // device `device`. RESOURCE_EXHAUSTED when the GPU has not the memory,
  // FAILED_PRECONDITION when the device cannot export memory as file
  // descriptors, INTERNAL for other CUDA failures.
  static absl::StatusOr<std::unique_ptr<ExportedDeviceMemory>> Create(
      int device, uint64_t min_bytes);

  ~ExportedDeviceMemory();
  ExportedDeviceMemory(const ExportedDeviceMemory&) = delete;
  ExportedDeviceMemory& operator=(const ExportedDeviceMemory&) = delete;

  // The daemon's mapping (a device pointer).
  void* base() const { return mapping_->base(); }
  // The allocation's size: what a client must map.
  uint64_t bytes() const { return mapping_->bytes(); }
  // The exported descriptor, valid while this lives.
  int fd() const { return fd_.get(); }

 private:
  ExportedDeviceMemory(std::unique_ptr<DeviceMapping> mapping, UniqueFd fd)
      : mapping_(std::move(mapping)), fd_(std::move(fd)) {}

  const std::unique_ptr<DeviceMapping> mapping_;
  const UniqueFd fd_;
};

// Queues on `stream` the write of `value` to the uint64 at `address`
// (mapped device memory), after the work queued before it: a stream that
// waits for the value (cuStreamWaitValue64) sees everything that work
// wrote (the write carries a memory barrier). Returns without waiting.
absl::Status StreamWriteValue(cudaStream_t stream, void* address,
                              uint64_t value);

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_CUDA_VMM_EXPORT_H_
