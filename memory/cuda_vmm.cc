#include "memory/cuda_vmm.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "absl/base/call_once.h"
#include "absl/strings/str_format.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace pagealloc {
namespace cuda_vmm {
namespace {

// The driver API functions we use, found through the runtime (which loaded
// the driver), so that no binary links libcuda. Versions are the ABI the
// code was written against (CUDA 12.0).
struct Driver {
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 get_granularity = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;
  PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
};

constexpr unsigned int kDriverAbi = 12000;

absl::StatusOr<const Driver*> GetDriver() {
  static absl::once_flag once;
  static Driver driver;
  static absl::Status* loaded = nullptr;
  absl::call_once(once, [] {
    auto find = [](const char* symbol, auto* function) -> absl::Status {
      void* address = nullptr;
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSuccess;
      RETURN_IF_ERROR(CudaStatus(
          cudaGetDriverEntryPointByVersion(symbol, &address, kDriverAbi,
                                           cudaEnableDefault, &found),
          "cudaGetDriverEntryPointByVersion"));
      if (found != cudaDriverEntryPointSuccess || address == nullptr) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "the CUDA driver has no %s (version %d)", symbol, kDriverAbi));
      }
      *function =
          reinterpret_cast<std::remove_pointer_t<decltype(function)>>(address);
      return absl::OkStatus();
    };
    absl::Status status = [&]() -> absl::Status {
      RETURN_IF_ERROR(find("cuGetErrorString", &driver.get_error_string));
      RETURN_IF_ERROR(
          find("cuDeviceGetAttribute", &driver.device_get_attribute));
      RETURN_IF_ERROR(
          find("cuMemGetAllocationGranularity", &driver.get_granularity));
      RETURN_IF_ERROR(find("cuMemCreate", &driver.create));
      RETURN_IF_ERROR(find("cuMemRelease", &driver.release));
      RETURN_IF_ERROR(
          find("cuMemExportToShareableHandle", &driver.export_handle));
      RETURN_IF_ERROR(
          find("cuMemImportFromShareableHandle", &driver.import_handle));
      RETURN_IF_ERROR(find("cuMemAddressReserve", &driver.address_reserve));
      RETURN_IF_ERROR(find("cuMemAddressFree", &driver.address_free));
      RETURN_IF_ERROR(find("cuMemMap", &driver.map));
      RETURN_IF_ERROR(find("cuMemUnmap", &driver.unmap));
      RETURN_IF_ERROR(find("cuMemSetAccess", &driver.set_access));
      return absl::OkStatus();
    }();
    loaded = new absl::Status(std::move(status));
  });
  if (!loaded->ok()) return *loaded;
  return &driver;
}

// The one place a CUresult becomes an absl::Status.
absl::Status DriverStatus(const Driver& driver, CUresult result,
                          const char* what) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* text = nullptr;
  if (driver.get_error_string(result, &text) != CUDA_SUCCESS ||
      text == nullptr) {
    text = "unknown error";
  }
  const absl::StatusCode code = result == CUDA_ERROR_OUT_OF_MEMORY
                                    ? absl::StatusCode::kResourceExhausted
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrFormat("%s failed: %s (%d)", what, text,
                                            static_cast<int>(result)));
}

CUmemAllocationProp Properties(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Makes `device` current (creating the runtime's primary context, which
// the driver calls below then use).
absl::Status UseDevice(int device) {
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  return CudaStatus(cudaFree(nullptr), "cudaFree(nullptr) (context)");
}

}  // namespace

absl::StatusOr<int64_t> Granularity(int device) {
  ASSIGN_OR_RETURN(const Driver* driver, GetDriver());
  RETURN_IF_ERROR(UseDevice(device));
  int vmm = 0;
  int posix_fd = 0;
  RETURN_IF_ERROR(DriverStatus(
      *driver,
      driver->device_get_attribute(
          &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
          device),
      "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)"));
  RETURN_IF_ERROR(DriverStatus(
      *driver,
      driver->device_get_attribute(
          &posix_fd,
          CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
          device),
      "cuDeviceGetAttribute(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)"));
  if (vmm == 0 || posix_fd == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "CUDA device %d does not support virtual memory management with "
        "POSIX file-descriptor handles (VMM %d, POSIX fd %d)",
        device, vmm, posix_fd));
  }
  const CUmemAllocationProp prop = Properties(device);
  size_t granularity = 0;
  RETURN_IF_ERROR(DriverStatus(
      *driver,
      driver->get_granularity(&granularity, &prop,
                              CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
      "cuMemGetAllocationGranularity"));
  return static_cast<int64_t>(granularity);
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
      "check CUDA_VISIBLE_DEVICES)",
      uuid, count));
}

absl::StatusOr<std::unique_ptr<Allocation>> Allocation::Create(int device,
                                                               int64_t bytes) {
  ASSIGN_OR_RETURN(const Driver* driver, GetDriver());
  ASSIGN_OR_RETURN(const int64_t granularity, Granularity(device));
  if (bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a VMM allocation of %d bytes", bytes));
  }
  const int64_t rounded = (bytes + granularity - 1) / granularity * granularity;
  const CUmemAllocationProp prop = Properties(device);
  CUmemGenericAllocationHandle handle = 0;
  RETURN_IF_ERROR(DriverStatus(
      *driver, driver->create(&handle, static_cast<size_t>(rounded), &prop, 0),
      "cuMemCreate"));
  return std::unique_ptr<Allocation>(new Allocation(device, handle, rounded));
}

Allocation::~Allocation() {
  absl::StatusOr<const Driver*> driver = GetDriver();
  if (driver.ok()) (*driver)->release(handle_);
}

absl::StatusOr<UniqueFd> Allocation::Export() const {
  ASSIGN_OR_RETURN(const Driver* driver, GetDriver());
  int fd = -1;
  RETURN_IF_ERROR(DriverStatus(
      *driver,
      driver->export_handle(&fd, handle_,
                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
      "cuMemExportToShareableHandle"));
  return UniqueFd(fd);
}

absl::StatusOr<std::unique_ptr<Mapping>> Mapping::MapHandle(int device,
                                                            uint64_t handle,
                                                            int64_t bytes) {
  ASSIGN_OR_RETURN(const Driver* driver, GetDriver());
  ASSIGN_OR_RETURN(const int64_t granularity, Granularity(device));
  if (bytes < 1 || bytes % granularity != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a VMM mapping of %d bytes: not a multiple of the device's "
        "granularity (%d)",
        bytes, granularity));
  }
  CUdeviceptr address = 0;
  const size_t size = static_cast<size_t>(bytes);
  RETURN_IF_ERROR(
      DriverStatus(*driver,
                   driver->address_reserve(
                       &address, size, static_cast<size_t>(granularity), 0, 0),
                   "cuMemAddressReserve"));
  absl::Status mapped = DriverStatus(
      *driver, driver->map(address, size, 0, handle, 0), "cuMemMap");
  if (!mapped.ok()) {
    driver->address_free(address, size);
    return mapped;
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  absl::Status accessible = DriverStatus(
      *driver, driver->set_access(address, size, &access, 1), "cuMemSetAccess");
  if (!accessible.ok()) {
    driver->unmap(address, size);
    driver->address_free(address, size);
    return accessible;
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
  ASSIGN_OR_RETURN(const Driver* driver, GetDriver());
  RETURN_IF_ERROR(UseDevice(device));
  CUmemGenericAllocationHandle handle = 0;
  RETURN_IF_ERROR(DriverStatus(
      *driver,
      driver->import_handle(
          &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
      "cuMemImportFromShareableHandle"));
  fd.reset();  // the handle holds the memory now
  absl::StatusOr<std::unique_ptr<Mapping>> mapping =
      MapHandle(device, handle, bytes);
  // The mapping holds the memory; the imported handle is not needed.
  driver->release(handle);
  return mapping;
}

Mapping::~Mapping() {
  absl::StatusOr<const Driver*> driver = GetDriver();
  if (!driver.ok()) return;
  (*driver)->unmap(address_, static_cast<size_t>(bytes_));
  (*driver)->address_free(address_, static_cast<size_t>(bytes_));
}

}  // namespace cuda_vmm
}  // namespace pagealloc
