#include "kernels/cuda_status.h"

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

}  // namespace pagealloc
