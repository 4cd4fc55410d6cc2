// The CUDA backend: the CudaExecutor on one GPU, session rings in device
// memory exported through CUDA IPC memory handles, and an interprocess event
// recorded after each asynchronous launch.

#ifndef PAGEALLOC_SERVER_CUDA_BACKEND_H_
#define PAGEALLOC_SERVER_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "server/backend.h"

namespace pagealloc {

struct CudaBackendOptions {
  int gpu = 0;
  int64_t max_batch_requests = 8192;
  int64_t max_batch_tokens = int64_t{1} << 21;
};

// Returns FAILED_PRECONDITION "no CUDA GPU: ..." where no usable GPU is.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    const CudaBackendOptions& options);

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_CUDA_BACKEND_H_
