#include "common/cuda_status.h"

#include <string>

#include "absl/strings/str_format.h"

namespace pagealloc {

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrFormat(
      "%s: %s (%s)", what, cudaGetErrorString(error), cudaGetErrorName(error));
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver) {
    return absl::FailedPreconditionError("no CUDA GPU: " + message);
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
