#include "memory/cuda_vmm_import.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace pagealloc {
namespace {

// The ABI the function pointer types above describe: the driver hands out
// each function as it was at this version (later drivers keep it).
constexpr unsigned int kDriverAbiVersion = 12000;

template <typename Fn>
absl::Status Resolve(const char* symbol, Fn* fn) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  RETURN_IF_ERROR(CudaStatus(
      cudaGetDriverEntryPointByVersion(symbol, &address, kDriverAbiVersion,
                                       cudaEnableDefault, &found),
      "cudaGetDriverEntryPointByVersion"));
  if (found != cudaDriverEntryPointSuccess || address == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the NVIDIA driver has no %s at the CUDA %d.%d ABI (result %d); "
        "update the driver",
        symbol, kDriverAbiVersion / 1000, kDriverAbiVersion % 1000 / 10,
        static_cast<int>(found)));
  }
  *fn = reinterpret_cast<Fn>(address);
  return absl::OkStatus();
}

absl::StatusOr<CudaDriver> ResolveAll() {
  // Resolving makes the runtime load the driver: a machine without one
  // fails here with the runtime's "no CUDA GPU" status.
  int count = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  CudaDriver d;
  RETURN_IF_ERROR(Resolve("cuGetErrorString", &d.GetErrorString));
  RETURN_IF_ERROR(Resolve("cuGetErrorName", &d.GetErrorName));
  RETURN_IF_ERROR(Resolve("cuDeviceGet", &d.DeviceGet));
  RETURN_IF_ERROR(Resolve("cuDeviceGetAttribute", &d.DeviceGetAttribute));
  RETURN_IF_ERROR(
      Resolve("cuMemGetAllocationGranularity", &d.MemGetAllocationGranularity));
  RETURN_IF_ERROR(Resolve("cuMemCreate", &d.MemCreate));
  RETURN_IF_ERROR(Resolve("cuMemRelease", &d.MemRelease));
  RETURN_IF_ERROR(
      Resolve("cuMemExportToShareableHandle", &d.MemExportToShareableHandle));
  RETURN_IF_ERROR(Resolve("cuMemImportFromShareableHandle",
                          &d.MemImportFromShareableHandle));
  RETURN_IF_ERROR(Resolve("cuMemAddressReserve", &d.MemAddressReserve));
  RETURN_IF_ERROR(Resolve("cuMemAddressFree", &d.MemAddressFree));
  RETURN_IF_ERROR(Resolve("cuMemMap", &d.MemMap));
  RETURN_IF_ERROR(Resolve("cuMemUnmap", &d.MemUnmap));
  RETURN_IF_ERROR(Resolve("cuMemSetAccess", &d.MemSetAccess));
  RETURN_IF_ERROR(Resolve("cuStreamWriteValue64", &d.StreamWriteValue64));
  RETURN_IF_ERROR(Resolve("cuStreamWaitValue64", &d.StreamWaitValue64));
  return d;
}

// The driver's device handle for a runtime ordinal (the same numbering:
// both see CUDA_VISIBLE_DEVICES), with the runtime's primary context made
// current, which the driver's calls below run in.
absl::StatusOr<CUdevice> SelectDevice(const CudaDriver& d, int device) {
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  CUdevice handle = 0;
  RETURN_IF_ERROR(CuStatus(d.DeviceGet(&handle, device), "cuDeviceGet"));
  return handle;
}

}  // namespace

absl::StatusOr<const CudaDriver*> GetCudaDriver() {
  // Resolved once; a failure is kept too (the driver will not appear
  // later in this process).
  static const absl::StatusOr<CudaDriver>* const driver =
      new absl::StatusOr<CudaDriver>(ResolveAll());
  if (!driver->ok()) return driver->status();
  return &**driver;
}

absl::Status CuStatus(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = "unknown";
  const char* text = "unknown error";
  // Only reached once the table resolved (every caller got it from there).
  if (absl::StatusOr<const CudaDriver*> d = GetCudaDriver(); d.ok()) {
    (*d)->GetErrorName(result, &name);
    (*d)->GetErrorString(result, &text);
  }
  const std::string message = absl::StrFormat("%s: %s (%s, %d)", what, text,
                                              name, static_cast<int>(result));
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::ResourceExhaustedError(message);
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NOT_PERMITTED:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<int> FindCudaDevice(const std::string& uuid) {
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
      "check CUDA_VISIBLE_DEVICES, and that the container was given that "
      "GPU)",
      uuid, count));
}

absl::Status CheckCudaSharing(int device) {
  ASSIGN_OR_RETURN(const CudaDriver* d, GetCudaDriver());
  ASSIGN_OR_RETURN(CUdevice handle, SelectDevice(*d, device));
  struct Need {
    CUdevice_attribute attribute;
    const char* what;
  };
  for (const Need& need :
       {Need{CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
             "virtual memory management (cuMemCreate)"},
        Need{CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
             "POSIX file-descriptor memory handles"},
        Need{CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
             "64-bit stream memory operations (cuStreamWaitValue64)"}}) {
    int value = 0;
    RETURN_IF_ERROR(
        CuStatus(d->DeviceGetAttribute(&value, need.attribute, handle),
                 "cuDeviceGetAttribute"));
    if (value == 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "CUDA device %d does not support %s, which pagealloc needs to "
          "share its ring and completion counter",
          device, need.what));
    }
  }
  return absl::OkStatus();
}

CUmemAllocationProp SharedAllocationProperties(int device) {
  CUmemAllocationProp properties = {};
  properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  properties.location.id = device;
  properties.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return properties;
}

absl::StatusOr<uint64_t> SharedAllocationGranularity(int device) {
  ASSIGN_OR_RETURN(const CudaDriver* d, GetCudaDriver());
  const CUmemAllocationProp properties = SharedAllocationProperties(device);
  size_t granularity = 0;
  RETURN_IF_ERROR(
      CuStatus(d->MemGetAllocationGranularity(&granularity, &properties,
                                              CU_MEM_ALLOC_GRANULARITY_MINIMUM),
               "cuMemGetAllocationGranularity"));
  if (granularity == 0) {
    return absl::InternalError(
        "cuMemGetAllocationGranularity reported a granularity of 0");
  }
  return granularity;
}

absl::StatusOr<std::unique_ptr<DeviceMapping>> DeviceMapping::Map(
    int device, CUmemGenericAllocationHandle handle, uint64_t bytes) {
  ASSIGN_OR_RETURN(const CudaDriver* d, GetCudaDriver());
  RETURN_IF_ERROR(SelectDevice(*d, device).status());
  ASSIGN_OR_RETURN(const uint64_t granularity,
                   SharedAllocationGranularity(device));
  CUdeviceptr base = 0;
  RETURN_IF_ERROR(
      CuStatus(d->MemAddressReserve(&base, bytes, granularity, 0, 0),
               "cuMemAddressReserve"));
  absl::Status mapped =
      CuStatus(d->MemMap(base, bytes, 0, handle, 0), "cuMemMap");
  if (mapped.ok()) {
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    mapped =
        CuStatus(d->MemSetAccess(base, bytes, &access, 1), "cuMemSetAccess");
    if (!mapped.ok()) d->MemUnmap(base, bytes);
  }
  if (!mapped.ok()) {
    d->MemAddressFree(base, bytes);
    return mapped;
  }
  return std::unique_ptr<DeviceMapping>(new DeviceMapping(device, base, bytes));
}

absl::StatusOr<std::unique_ptr<DeviceMapping>> DeviceMapping::Import(
    int device, UniqueFd fd, uint64_t bytes) {
  ASSIGN_OR_RETURN(const CudaDriver* d, GetCudaDriver());
  RETURN_IF_ERROR(SelectDevice(*d, device).status());
  ASSIGN_OR_RETURN(const uint64_t granularity,
                   SharedAllocationGranularity(device));
  if (bytes == 0 || bytes % granularity != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "device memory of %d bytes from the daemon; CUDA device %d maps "
        "multiples of %d bytes",
        bytes, device, granularity));
  }
  CUmemGenericAllocationHandle handle = 0;
  RETURN_IF_ERROR(CuStatus(
      d->MemImportFromShareableHandle(
          &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
      "cuMemImportFromShareableHandle"));
  fd.reset();
  absl::StatusOr<std::unique_ptr<DeviceMapping>> mapping =
      Map(device, handle, bytes);
  // The mapping holds the memory from here on (or nothing does, on failure).
  d->MemRelease(handle);
  return mapping;
}

DeviceMapping::~DeviceMapping() {
  absl::StatusOr<const CudaDriver*> d = GetCudaDriver();
  if (!d.ok() || cudaSetDevice(device_) != cudaSuccess) return;
  (*d)->MemUnmap(base_, bytes_);
  (*d)->MemAddressFree(base_, bytes_);
}

absl::Status StreamWaitValueAtLeast(void* stream, const void* address,
                                    uint64_t value) {
  ASSIGN_OR_RETURN(const CudaDriver* d, GetCudaDriver());
  return CuStatus(d->StreamWaitValue64(static_cast<CUstream>(stream),
                                       reinterpret_cast<CUdeviceptr>(address),
                                       value, CU_STREAM_WAIT_VALUE_GEQ),
                  "cuStreamWaitValue64");
}

}  // namespace pagealloc
