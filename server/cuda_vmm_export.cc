#include "server/cuda_vmm_export.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace pagealloc {

absl::StatusOr<std::unique_ptr<ExportedDeviceMemory>>
ExportedDeviceMemory::Create(int device, uint64_t min_bytes) {
  ASSIGN_OR_RETURN(const CudaDriver* d, GetCudaDriver());
  ASSIGN_OR_RETURN(const uint64_t granularity,
                   SharedAllocationGranularity(device));
  const uint64_t bytes = (std::max<uint64_t>(min_bytes, 1) + granularity - 1) /
                         granularity * granularity;
  const CUmemAllocationProp properties = SharedAllocationProperties(device);
  CUmemGenericAllocationHandle handle = 0;
  RETURN_IF_ERROR(
      CuStatus(d->MemCreate(&handle, bytes, &properties, 0), "cuMemCreate"));
  // From here the handle is released on every path: the mapping and the
  // exported descriptor each hold the memory on their own.
  int exported = -1;
  const absl::Status status = CuStatus(
      d->MemExportToShareableHandle(
          &exported, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
      "cuMemExportToShareableHandle");
  UniqueFd fd(exported);
  absl::StatusOr<std::unique_ptr<DeviceMapping>> mapping =
      status.ok() ? DeviceMapping::Map(device, handle, bytes)
                  : absl::StatusOr<std::unique_ptr<DeviceMapping>>(status);
  d->MemRelease(handle);
  if (!mapping.ok()) return mapping.status();
  return std::unique_ptr<ExportedDeviceMemory>(
      new ExportedDeviceMemory(*std::move(mapping), std::move(fd)));
}

ExportedDeviceMemory::~ExportedDeviceMemory() = default;

absl::Status StreamWriteValue(cudaStream_t stream, void* address,
                              uint64_t value) {
  ASSIGN_OR_RETURN(const CudaDriver* d, GetCudaDriver());
  return CuStatus(d->StreamWriteValue64(static_cast<CUstream>(stream),
                                        reinterpret_cast<CUdeviceptr>(address),
                                        value, CU_STREAM_WRITE_VALUE_DEFAULT),
                  "cuStreamWriteValue64");
}

}  // namespace pagealloc
