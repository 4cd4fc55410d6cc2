// CUDA virtual memory management (VMM) for memory shared between processes
// as file descriptors: the daemon creates physical device memory with
// cuMemCreate (POSIX file-descriptor handles, the device's granularity) and
// exports it as an fd; a client imports the fd it was handed over the
// memory socket and maps it into its own device address space. No CUDA IPC
// legacy handles, no shared PID or IPC namespace: the fd is the capability.
//
// Used for the KV slab; written to serve the output rings and a completion
// counter the same way. Built only where the CUDA toolkit is; the driver
// API is reached through the CUDA runtime's driver entry points
// (cudaGetDriverEntryPointByVersion), so nothing links libcuda: the runtime
// loads the driver (libcuda.so.1) as it always does.

#ifndef PAGEALLOC_MEMORY_CUDA_VMM_H_
#define PAGEALLOC_MEMORY_CUDA_VMM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "memory/unique_fd.h"

namespace pagealloc {
namespace cuda_vmm {

// The granularity cuMemCreate needs on `device` for fd-exportable memory
// (the recommended one: 2 MiB on Hopper). FAILED_PRECONDITION when the
// device does not support VMM or POSIX fd handles, INTERNAL for other CUDA
// errors.
absl::StatusOr<int64_t> Granularity(int device);

// The ordinal, in this process, of the device whose UUID is `uuid`
// ("GPU-..."). FAILED_PRECONDITION when it is not visible here
// (CUDA_VISIBLE_DEVICES).
absl::StatusOr<int> DeviceByUuid(const std::string& uuid);

// Physical device memory made with cuMemCreate, exportable as a POSIX fd.
// Destroying it releases this process's handle; the memory itself lives
// until every mapping of it (in any process) is gone and every exported fd
// is closed, so a slab can outlive the object that made it (e.g. an fd
// kept in systemd's file-descriptor store across a daemon restart).
//
// This class is thread-compatible.
class Allocation {
 public:
  // `bytes` is rounded up to the device's granularity. RESOURCE_EXHAUSTED
  // when the device has not that much free memory; otherwise as
  // Granularity.
  static absl::StatusOr<std::unique_ptr<Allocation>> Create(int device,
                                                            int64_t bytes);
  ~Allocation();
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  // A new file descriptor for the memory (cuMemExportToShareableHandle),
  // to hand to another process. INTERNAL on failure.
  absl::StatusOr<UniqueFd> Export() const;

  int device() const { return device_; }
  int64_t bytes() const { return bytes_; }
  // The CUmemGenericAllocationHandle.
  uint64_t handle() const { return handle_; }

 private:
  Allocation(int device, uint64_t handle, int64_t bytes)
      : device_(device), handle_(handle), bytes_(bytes) {}

  const int device_;
  const uint64_t handle_;
  const int64_t bytes_;
};

// VMM memory mapped into this process's device address space, readable and
// writable from `device`: a reserved range, the memory mapped over it,
// access set. Destroying it unmaps the memory and frees the range.
//
// This class is thread-compatible (immutable once made).
class Mapping {
 public:
  // Maps an allocation of this process (the daemon's own view of a slab).
  static absl::StatusOr<std::unique_ptr<Mapping>> Map(
      const Allocation& allocation);
  // Imports the memory `fd` refers to (another process's Export, received
  // over a Unix socket) and maps `bytes` of it on `device`. The descriptor
  // is closed once imported. INVALID_ARGUMENT for a size that is not a
  // multiple of the granularity, INTERNAL when the import or the mapping
  // fails (e.g. the fd is not a VMM export, or is smaller than `bytes`).
  static absl::StatusOr<std::unique_ptr<Mapping>> Import(UniqueFd fd,
                                                         int64_t bytes,
                                                         int device);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  // The mapping's first byte: a device pointer.
  void* data() const { return reinterpret_cast<void*>(address_); }
  int64_t bytes() const { return bytes_; }
  int device() const { return device_; }

 private:
  Mapping(int device, uint64_t address, int64_t bytes)
      : device_(device), address_(address), bytes_(bytes) {}
  // Reserves a range, maps `handle` over it and sets access.
  static absl::StatusOr<std::unique_ptr<Mapping>> MapHandle(int device,
                                                            uint64_t handle,
                                                            int64_t bytes);

  const int device_;
  const uint64_t address_;  // CUdeviceptr
  const int64_t bytes_;
};

}  // namespace cuda_vmm
}  // namespace pagealloc

#endif  // PAGEALLOC_MEMORY_CUDA_VMM_H_
