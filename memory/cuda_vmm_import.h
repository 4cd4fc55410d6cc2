// CUDA virtual memory as pagealloc shares it between processes: the driver
// functions it uses, and the mapping of an allocation that another process
// made with cuMemCreate and exported as a POSIX file descriptor (the output
// ring and the completion counter, handed over the memory socket).
//
// Why the driver API, and why through the runtime. Sharing device memory
// by file descriptor needs the driver's virtual-memory calls (cuMemCreate,
// cuMemImportFromShareableHandle, cuMemMap, ...) and its stream memory
// operations (cuStreamWriteValue64, cuStreamWaitValue64), which the runtime
// does not wrap. We resolve them with cudaGetDriverEntryPointByVersion from
// the static CUDA runtime, which loads libcuda at run time already: no
// build links libcuda, and a CPU build has none of this.

#ifndef PAGEALLOC_MEMORY_CUDA_VMM_IMPORT_H_
#define PAGEALLOC_MEMORY_CUDA_VMM_IMPORT_H_

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "memory/unique_fd.h"

namespace pagealloc {

// The driver functions pagealloc calls, at their CUDA 12.0 signatures.
struct CudaDriver {
  PFN_cuGetErrorString_v6000 GetErrorString;
  PFN_cuGetErrorName_v6000 GetErrorName;
  PFN_cuDeviceGet_v2000 DeviceGet;
  PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute;
  PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity;
  PFN_cuMemCreate_v10020 MemCreate;
  PFN_cuMemRelease_v10020 MemRelease;
  PFN_cuMemExportToShareableHandle_v10020 MemExportToShareableHandle;
  PFN_cuMemImportFromShareableHandle_v10020 MemImportFromShareableHandle;
  PFN_cuMemAddressReserve_v10020 MemAddressReserve;
  PFN_cuMemAddressFree_v10020 MemAddressFree;
  PFN_cuMemMap_v10020 MemMap;
  PFN_cuMemUnmap_v10020 MemUnmap;
  PFN_cuMemSetAccess_v10020 MemSetAccess;
  PFN_cuStreamWriteValue64_v11070 StreamWriteValue64;
  PFN_cuStreamWaitValue64_v11070 StreamWaitValue64;
};

// Resolves the driver functions (once per process). FAILED_PRECONDITION
// "no CUDA GPU: ..." without a usable driver, FAILED_PRECONDITION naming
// the function when the driver lacks one.
absl::StatusOr<const CudaDriver*> GetCudaDriver();

// The one place where a CUresult becomes an absl::Status: OK for
// CUDA_SUCCESS, RESOURCE_EXHAUSTED for out of memory, FAILED_PRECONDITION
// for an operation the device or driver does not support, INTERNAL for the
// rest. `what` names the call.
absl::Status CuStatus(CUresult result, const char* what);

// Finds the local ordinal of the GPU with `uuid` ("GPU-..."): processes may
// number GPUs differently (CUDA_VISIBLE_DEVICES). FAILED_PRECONDITION when
// this process cannot see it.
absl::StatusOr<int> FindCudaDevice(const std::string& uuid);

// Checks that `device` can share memory the way pagealloc does: virtual
// memory management, POSIX file-descriptor handles and 64-bit stream memory
// operations. FAILED_PRECONDITION naming what is missing.
absl::Status CheckCudaSharing(int device);

// The allocation properties pagealloc uses: pinned device memory on
// `device`, exportable as a POSIX file descriptor.
CUmemAllocationProp SharedAllocationProperties(int device);

// The granularity (bytes) that sizes and mappings of such allocations on
// `device` are multiples of.
absl::StatusOr<uint64_t> SharedAllocationGranularity(int device);

// A CUDA virtual-memory allocation mapped into this process, readable and
// writable from `device`. Destroying it unmaps it and frees the address
// range; the memory itself lives while any process maps it or holds a
// handle to it (the daemon's, another client's). This class is
// thread-compatible (immutable once mapped).
class DeviceMapping {
 public:
  // Maps `bytes` of the allocation `handle` at a fresh address range. The
  // mapping holds its own reference: the caller may release `handle`.
  // REQUIRES: `bytes` is the allocation's size. INTERNAL when CUDA
  // refuses (the message names the call).
  static absl::StatusOr<std::unique_ptr<DeviceMapping>> Map(
      int device, CUmemGenericAllocationHandle handle, uint64_t bytes);

  // Imports the allocation `fd` refers to (cuMemExportToShareableHandle's
  // POSIX fd, as received over the memory socket), of `bytes`, and maps
  // it. Closes `fd`: the import holds its own reference. FAILED_PRECONDITION
  // when `bytes` is 0 or not a multiple of the device's granularity;
  // INTERNAL when CUDA refuses (e.g. the fd is not such an allocation).
  static absl::StatusOr<std::unique_ptr<DeviceMapping>> Import(int device,
                                                               UniqueFd fd,
                                                               uint64_t bytes);

  ~DeviceMapping();
  DeviceMapping(const DeviceMapping&) = delete;
  DeviceMapping& operator=(const DeviceMapping&) = delete;

  void* base() const { return reinterpret_cast<void*>(base_); }
  uint64_t bytes() const { return bytes_; }
  int device() const { return device_; }

 private:
  DeviceMapping(int device, CUdeviceptr base, uint64_t bytes)
      : device_(device), base_(base), bytes_(bytes) {}

  const int device_;
  const CUdeviceptr base_;
  const uint64_t bytes_;
};

// Queues on `stream` (a cudaStream_t; null: the legacy default stream of
// the current device) a wait until the uint64 at `address` (mapped device
// memory) is >= `value`. Returns without waiting.
absl::Status StreamWaitValueAtLeast(void* stream, const void* address,
                                    uint64_t value);

}  // namespace pagealloc

#endif  // PAGEALLOC_MEMORY_CUDA_VMM_IMPORT_H_
