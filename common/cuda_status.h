// The one place where a cudaError_t becomes an absl::Status, shared by the
// CUDA executor, the daemon's CUDA backend and the client's IPC mapping.

#ifndef PAGEALLOC_COMMON_CUDA_STATUS_H_
#define PAGEALLOC_COMMON_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"

namespace pagealloc {

// OK for cudaSuccess. A machine without a usable GPU is FAILED_PRECONDITION
// "no CUDA GPU: " and the reason in words: "no NVIDIA driver is installed",
// a driver older than the runtime (both versions), or no device. Out of
// device memory is RESOURCE_EXHAUSTED with the GPU's free and total memory.
// Every other failure is INTERNAL. `what` names the call.
absl::Status CudaStatus(cudaError_t error, const char* what);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints a UUID.
std::string FormatCudaUuid(const cudaUUID_t& uuid);

}  // namespace pagealloc

#endif  // PAGEALLOC_COMMON_CUDA_STATUS_H_
