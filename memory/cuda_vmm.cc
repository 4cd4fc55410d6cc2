#include "memory/cuda_vmm.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace pagealloc {
namespace cuda_vmm {
namespace {

// The driver functions used here, at their CUDA 12.0 signatures.
struct Driver {
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

absl::StatusOr<Driver> ResolveAll() {
  // Resolving makes the runtime load the driver: a machine without one
  // fails here with the runtime's "no CUDA GPU" status.
  int count = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  Driver d;
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

// The driver's functions, resolved once per process; a failure is kept too
// (the driver will not appear later in this process).
absl::StatusOr<const Driver*> GetDriver() {
  static const absl::StatusOr<Driver>* const driver =
      new absl::StatusOr<Driver>(ResolveAll());
  if (!driver->ok()) return driver->status();
  return &**driver;
}

// The one place where a CUresult becomes an absl::Status: OK for
// CUDA_SUCCESS, RESOURCE_EXHAUSTED for out of memory, FAILED_PRECONDITION
// for an operation the device or driver does not support, INTERNAL for the
// rest. `what` names the call.
absl::Status DriverStatus(const Driver& d, CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = "unknown";
  const char* text = "unknown error";
  if (d.GetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) {
    name = "unknown";
  }
  if (d.GetErrorString(result, &text) != CUDA_SUCCESS || text == nullptr) {
    text = "unknown error";
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

// Makes the runtime ordinal `device` current, with the runtime's primary
// context (which the driver's calls below run in) created, and returns the
// driver's handle for it (the same numbering: both see
// CUDA_VISIBLE_DEVICES).
absl::StatusOr<CUdevice> SelectDevice(const Driver& d, int device) {
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  RETURN_IF_ERROR(
      CudaStatus(cudaFree(nullptr), "cudaFree(nullptr) (primary context)"));
  CUdevice handle = 0;
  RETURN_IF_ERROR(DriverStatus(d, d.DeviceGet(&handle, device), "cuDeviceGet"));
  return handle;
}

// A device capability this header needs, in words.
struct Need {
  CUdevice_attribute attribute;
  const char* what;
};

constexpr Need kVmm = {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                       "virtual memory management (cuMemCreate)"};
constexpr Need kPosixFd = {
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
    "POSIX file-descriptor memory handles"};
constexpr Need kStreamMemOps = {
    CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
    "64-bit stream memory operations (cuStreamWaitValue64)"};

// Selects `device` and checks it has each of `needs`.
absl::Status Require(const Driver& d, int device,
                     std::initializer_list<Need> needs) {
  ASSIGN_OR_RETURN(const CUdevice handle, SelectDevice(d, device));
  for (const Need& need : needs) {
    int value = 0;
    RETURN_IF_ERROR(
        DriverStatus(d, d.DeviceGetAttribute(&value, need.attribute, handle),
                     "cuDeviceGetAttribute"));
    if (value == 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "CUDA device %d does not support %s, which pagealloc needs to "
          "share device memory with its clients",
          device, need.what));
    }
  }
  return absl::OkStatus();
}

// Pinned device memory on `device`, exportable as a POSIX fd.
CUmemAllocationProp Properties(int device) {
  CUmemAllocationProp properties = {};
  properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  properties.location.id = device;
  properties.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return properties;
}

}  // namespace

absl::StatusOr<int64_t> Granularity(int device) {
  ASSIGN_OR_RETURN(const Driver* d, GetDriver());
  RETURN_IF_ERROR(Require(*d, device, {kVmm, kPosixFd}));
  const CUmemAllocationProp properties = Properties(device);
  size_t granularity = 0;
  RETURN_IF_ERROR(DriverStatus(
      *d,
      d->MemGetAllocationGranularity(&granularity, &properties,
                                     CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
      "cuMemGetAllocationGranularity"));
  if (granularity == 0) {
    return absl::InternalError(
        "cuMemGetAllocationGranularity reported a granularity of 0");
  }
  return static_cast<int64_t>(granularity);
}

absl::Status CheckSupport(int device) {
  ASSIGN_OR_RETURN(const Driver* d, GetDriver());
  return Require(*d, device, {kVmm, kPosixFd, kStreamMemOps});
}

absl::StatusOr<int> DeviceByUuid(const std::string& uuid) {
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

absl::StatusOr<std::unique_ptr<Allocation>> Allocation::Create(int device,
                                                               int64_t bytes) {
  ASSIGN_OR_RETURN(const Driver* d, GetDriver());
  ASSIGN_OR_RETURN(const int64_t granularity, Granularity(device));
  if (bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a VMM allocation of %d bytes", bytes));
  }
  const int64_t rounded = (bytes + granularity - 1) / granularity * granularity;
  const CUmemAllocationProp properties = Properties(device);
  CUmemGenericAllocationHandle handle = 0;
  RETURN_IF_ERROR(DriverStatus(
      *d, d->MemCreate(&handle, static_cast<size_t>(rounded), &properties, 0),
      "cuMemCreate"));
  return std::unique_ptr<Allocation>(new Allocation(device, handle, rounded));
}

Allocation::~Allocation() {
  absl::StatusOr<const Driver*> d = GetDriver();
  if (d.ok()) (*d)->MemRelease(handle_);
}

absl::StatusOr<UniqueFd> Allocation::Export() const {
  ASSIGN_OR_RETURN(const Driver* d, GetDriver());
  int fd = -1;
  RETURN_IF_ERROR(DriverStatus(
      *d,
      d->MemExportToShareableHandle(
          &fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
      "cuMemExportToShareableHandle"));
  return UniqueFd(fd);
}

absl::StatusOr<std::unique_ptr<Mapping>> Mapping::MapHandle(int device,
                                                            uint64_t handle,
                                                            int64_t bytes) {
  ASSIGN_OR_RETURN(const Driver* d, GetDriver());
  ASSIGN_OR_RETURN(const int64_t granularity, Granularity(device));
  if (bytes < 1 || bytes % granularity != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a VMM mapping of %d bytes on CUDA device %d: not a multiple of the "
        "device's granularity (%d)",
        bytes, device, granularity));
  }
  const size_t size = static_cast<size_t>(bytes);
  CUdeviceptr address = 0;
  RETURN_IF_ERROR(
      DriverStatus(*d,
                   d->MemAddressReserve(&address, size,
                                        static_cast<size_t>(granularity), 0, 0),
                   "cuMemAddressReserve"));
  absl::Status mapped =
      DriverStatus(*d, d->MemMap(address, size, 0, handle, 0), "cuMemMap");
  if (mapped.ok()) {
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    mapped = DriverStatus(*d, d->MemSetAccess(address, size, &access, 1),
                          "cuMemSetAccess");
    if (!mapped.ok()) d->MemUnmap(address, size);
  }
  if (!mapped.ok()) {
    d->MemAddressFree(address, size);
    return mapped;
  }
  return std::unique_ptr<Mapping>(new Mapping(device, address, bytes));
}

absl::StatusOr<std::unique_ptr<Mapping>> Mapping::Map(
    const Allocation& allocation) {
  return MapHandle(allocation.device(), allocation.handle(),
                   allocation.bytes());
}

absl::StatusOr<std::unique_ptr<Mapping>> Mapping::Import(UniqueFd fd,
                                                         int64_t bytes,
                                                         int device) {
  ASSIGN_OR_RETURN(const Driver* d, GetDriver());
  RETURN_IF_ERROR(SelectDevice(*d, device).status());
  CUmemGenericAllocationHandle handle = 0;
  RETURN_IF_ERROR(DriverStatus(
      *d,
      d->MemImportFromShareableHandle(
          &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
      "cuMemImportFromShareableHandle"));
  fd.reset();  // the handle holds the memory now
  absl::StatusOr<std::unique_ptr<Mapping>> mapping =
      MapHandle(device, handle, bytes);
  // The mapping holds the memory from here on (or nothing does, on failure).
  d->MemRelease(handle);
  return mapping;
}

Mapping::~Mapping() {
  absl::StatusOr<const Driver*> d = GetDriver();
  if (!d.ok()) return;
  // The driver unmaps in the device's context; the caller's current device
  // is put back afterwards. Errors here have nowhere to go.
  int current = -1;
  const bool restore = cudaGetDevice(&current) == cudaSuccess &&
                       current != device_ &&
                       cudaSetDevice(device_) == cudaSuccess;
  (*d)->MemUnmap(address_, static_cast<size_t>(bytes_));
  (*d)->MemAddressFree(address_, static_cast<size_t>(bytes_));
  if (restore) cudaSetDevice(current);
}

ExportedMemory::ExportedMemory(std::unique_ptr<Allocation> allocation,
                               UniqueFd fd, std::unique_ptr<Mapping> mapping)
    : allocation_(std::move(allocation)),
      fd_(std::move(fd)),
      mapping_(std::move(mapping)) {}

ExportedMemory::~ExportedMemory() = default;

absl::StatusOr<std::unique_ptr<ExportedMemory>> ExportedMemory::Create(
    int device, int64_t bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<Allocation> allocation,
                   Allocation::Create(device, bytes));
  ASSIGN_OR_RETURN(UniqueFd fd, allocation->Export());
  ASSIGN_OR_RETURN(std::unique_ptr<Mapping> mapping, Mapping::Map(*allocation));
  return std::unique_ptr<ExportedMemory>(new ExportedMemory(
      std::move(allocation), std::move(fd), std::move(mapping)));
}

absl::Status StreamWriteValue(void* stream, void* address, uint64_t value) {
  ASSIGN_OR_RETURN(const Driver* d, GetDriver());
  return DriverStatus(
      *d,
      d->StreamWriteValue64(static_cast<CUstream>(stream),
                            reinterpret_cast<CUdeviceptr>(address), value,
                            CU_STREAM_WRITE_VALUE_DEFAULT),
      "cuStreamWriteValue64");
}

absl::Status StreamWaitValueAtLeast(void* stream, const void* address,
                                    uint64_t value) {
  ASSIGN_OR_RETURN(const Driver* d, GetDriver());
  return DriverStatus(
      *d,
      d->StreamWaitValue64(static_cast<CUstream>(stream),
                           reinterpret_cast<CUdeviceptr>(address), value,
                           CU_STREAM_WAIT_VALUE_GEQ),
      "cuStreamWaitValue64");
}

}  // namespace cuda_vmm
}  // namespace pagealloc
