// CUDA virtual memory management (VMM) for device memory shared between
// processes as file descriptors: the KV slab, each session's output ring
// and the pool's completion counter. The daemon creates physical device
// memory with cuMemCreate (pinned, on one GPU, POSIX file-descriptor
// handles, sized to the device's granularity), maps it for itself and
// exports it as an fd; a client imports the fd it was handed over the
// memory socket and maps it into its own device address space. No CUDA IPC
// legacy handles, no shared PID or IPC namespace: the fd is the capability.
// The daemon's stream writes the completion counter and a client's stream
// waits on it with the driver's stream memory operations.
//
// Why the driver API, and why through the runtime: sharing device memory by
// file descriptor needs the driver's virtual-memory calls and its stream
// memory operations (cuStreamWriteValue64, cuStreamWaitValue64), which the
// runtime does not wrap. They are resolved with
// cudaGetDriverEntryPointByVersion (CUDA 12.0 signatures) from the static
// CUDA runtime, which loads the driver (libcuda.so.1) anyway: nothing links
// libcuda. Built only where the CUDA toolkit is; a CPU build has none of
// this, and its callers answer FAILED_PRECONDITION for GPU memory.
//
// Every function here fails with FAILED_PRECONDITION "no CUDA GPU: ..." on
// a machine without a usable GPU or driver, FAILED_PRECONDITION naming the
// driver function when the driver lacks one, FAILED_PRECONDITION for an
// operation the device or driver does not support, RESOURCE_EXHAUSTED when
// the device is out of memory, and INTERNAL for other CUDA errors (the
// message names the call). Functions that take a device make it the
// calling thread's current device.

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

// The granularity (bytes) that every allocation's size, every mapping's
// size and every reserved range's alignment on `device` is a multiple of:
// the recommended one for fd-exportable memory (2 MiB on the H200).
// FAILED_PRECONDITION when the device does not support VMM or POSIX fd
// handles.
absl::StatusOr<int64_t> Granularity(int device);

// Checks that `device` supports everything this header shares: virtual
// memory management, POSIX file-descriptor handles and 64-bit stream memory
// operations. FAILED_PRECONDITION naming what is missing.
absl::Status CheckSupport(int device);

// The ordinal, in this process, of the GPU whose UUID is `uuid` ("GPU-..."):
// processes may number GPUs differently (CUDA_VISIBLE_DEVICES).
// FAILED_PRECONDITION when this process cannot see it.
absl::StatusOr<int> DeviceByUuid(const std::string& uuid);

// Physical device memory made with cuMemCreate, exportable as a POSIX fd.
// Destroying it releases this process's handle; the memory itself lives
// until every mapping of it (in any process) is gone and every exported fd
// is closed, so a slab can outlive the object that made it (e.g. an fd
// kept in systemd's file-descriptor store across a daemon restart).
//
// This class is thread-compatible (immutable once made).
class Allocation {
 public:
  // Creates `bytes` rounded up to the device's granularity on `device`.
  // INVALID_ARGUMENT when `bytes` < 1, RESOURCE_EXHAUSTED when the device
  // has not that much free memory; otherwise as Granularity.
  static absl::StatusOr<std::unique_ptr<Allocation>> Create(int device,
                                                            int64_t bytes);
  ~Allocation();
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  // Returns a new file descriptor for the memory
  // (cuMemExportToShareableHandle), to hand to another process.
  absl::StatusOr<UniqueFd> Export() const;

  int device() const { return device_; }
  // The size: a multiple of the granularity.
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
// access set. The mapping holds the memory on its own (the allocation or
// the imported handle it came from may go first). Destroying it unmaps the
// memory and frees the range.
//
// This class is thread-compatible (immutable once made).
class Mapping {
 public:
  // Maps an allocation of this process (the daemon's own view).
  static absl::StatusOr<std::unique_ptr<Mapping>> Map(
      const Allocation& allocation);
  // Imports the memory `fd` refers to (another process's Export, received
  // over a Unix socket) and maps `bytes` of it on `device`. Closes `fd`:
  // the import holds its own reference. INVALID_ARGUMENT when `bytes` is
  // not a positive multiple of the granularity; INTERNAL when the import or
  // the mapping fails (e.g. the fd is not a VMM export, or is smaller than
  // `bytes`).
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
  // Reserves a range, maps `bytes` of `handle` over it and sets access.
  static absl::StatusOr<std::unique_ptr<Mapping>> MapHandle(int device,
                                                            uint64_t handle,
                                                            int64_t bytes);

  const int device_;
  const uint64_t address_;  // CUdeviceptr
  const int64_t bytes_;
};

// An allocation the daemon shares whole: created, mapped read-write here
// (data()) and exported once as a file descriptor (fd()) that it owns. An
// output ring or the completion counter. Destroying it unmaps the daemon's
// view, releases its handle and closes the descriptor; processes that
// imported the memory keep it until they unmap it.
//
// This class is thread-compatible (immutable once made).
class ExportedMemory {
 public:
  // Creates at least `bytes` (rounded up to the granularity) on `device`.
  // As Allocation::Create, Allocation::Export and Mapping::Map.
  static absl::StatusOr<std::unique_ptr<ExportedMemory>> Create(int device,
                                                                int64_t bytes);
  ~ExportedMemory();
  ExportedMemory(const ExportedMemory&) = delete;
  ExportedMemory& operator=(const ExportedMemory&) = delete;

  // The daemon's mapping: a device pointer.
  void* data() const { return mapping_->data(); }
  // The allocation's size: what an importer maps.
  int64_t bytes() const { return allocation_->bytes(); }
  // The exported descriptor, valid while this lives.
  int fd() const { return fd_.get(); }

 private:
  ExportedMemory(std::unique_ptr<Allocation> allocation, UniqueFd fd,
                 std::unique_ptr<Mapping> mapping);

  // The mapping is unmapped first, then the handle released.
  const std::unique_ptr<Allocation> allocation_;
  const UniqueFd fd_;
  const std::unique_ptr<Mapping> mapping_;
};

// Queues on `stream` (a cudaStream_t; null: the legacy default stream of
// the current device) the write of `value` to the uint64 at `address`
// (mapped VMM memory), after the work queued before it: a stream that
// waits for the value (StreamWaitValueAtLeast) sees everything that work
// wrote (the write carries a memory barrier). Returns without waiting.
absl::Status StreamWriteValue(void* stream, void* address, uint64_t value);

// Queues on `stream` (as above) a wait until the uint64 at `address`
// (mapped VMM memory) is >= `value`. Returns without waiting.
absl::Status StreamWaitValueAtLeast(void* stream, const void* address,
                                    uint64_t value);

}  // namespace cuda_vmm
}  // namespace pagealloc

#endif  // PAGEALLOC_MEMORY_CUDA_VMM_H_
