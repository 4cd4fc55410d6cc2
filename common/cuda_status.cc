#include "common/cuda_status.h"

#include <string>

#include "absl/strings/str_format.h"

namespace pagealloc {
namespace {

std::string Gib(size_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1 << 30));
}

// "12.8" from CUDA's 1000 * major + 10 * minor.
std::string CudaVersion(int version) {
  return absl::StrFormat("%d.%d", version / 1000, version % 1000 / 10);
}

}  // namespace

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrFormat(
      "%s: %s (%s)", what, cudaGetErrorString(error), cudaGetErrorName(error));
  if (error == cudaErrorInsufficientDriver) {
    // The runtime says the same for a missing driver and an old one; the
    // driver's version tells them apart (0: no driver at all).
    int driver = 0;
    int runtime = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "no CUDA GPU: no NVIDIA driver is installed (libcuda.so.1 not "
          "found); %s",
          message));
    }
    cudaRuntimeGetVersion(&runtime);
    return absl::FailedPreconditionError(absl::StrFormat(
        "no CUDA GPU: the NVIDIA driver supports CUDA %s, older than this "
        "build's CUDA %s runtime (update the driver); %s",
        CudaVersion(driver), CudaVersion(runtime), message));
  }
  if (error == cudaErrorNoDevice) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no CUDA GPU: the NVIDIA driver is installed but finds no GPU "
        "(check nvidia-smi and CUDA_VISIBLE_DEVICES); %s",
        message));
  }
  if (error == cudaErrorMemoryAllocation) {
    // Sizing errors say what is there to size against.
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("%s; the GPU has %s free of %s", message,
                          Gib(free_bytes), Gib(total_bytes)));
    }
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

std::string FormatCudaUuid(const cudaUUID_t& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  return absl::StrFormat(
      "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%"
      "02x",
      b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
      b[12], b[13], b[14], b[15]);
}

}  // namespace pagealloc
