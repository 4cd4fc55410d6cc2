// The CUDA backend: the CudaExecutor on one GPU; each session's output ring
// a CUDA virtual-memory allocation exported as a POSIX file descriptor; and
// one completion counter for the pool, a uint64 in such an allocation, that
// the executor's stream sets after each asynchronous launch and that a
// client's stream waits on (memory/cuda_vmm.h). The memory socket hands
// both descriptors to each session: a client needs the daemon's socket and
// the GPU, nothing else (no CUDA IPC, no shared IPC or PID namespace).

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

// Returns FAILED_PRECONDITION "no CUDA GPU: ..." where no usable GPU is,
// and FAILED_PRECONDITION naming the feature for a GPU or driver that
// cannot share memory by file descriptor.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    const CudaBackendOptions& options);

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_CUDA_BACKEND_H_
