// The CUDA backend's ring and completion counter as a client maps them:
// CUDA virtual-memory allocations the daemon exported as POSIX file
// descriptors (handed over the memory socket), imported and mapped on the
// GPU with the daemon's device UUID (memory/cuda_vmm.h).

#ifndef PAGEALLOC_CLIENT_CUDA_RING_VIEW_H_
#define PAGEALLOC_CLIENT_CUDA_RING_VIEW_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/ring_view.h"
#include "memory/unique_fd.h"
#include "proto/pagealloc.pb.h"

namespace pagealloc {

// Finds the local ordinal of the GPU with `device_uuid` (processes may
// number GPUs differently, e.g. under CUDA_VISIBLE_DEVICES) and maps the
// ring `fd` holds there (`bytes`: the allocation's size, at least the
// ring's capacity). FAILED_PRECONDITION when this process cannot see that
// GPU or `bytes` cannot hold the ring; INTERNAL when CUDA refuses.
absl::StatusOr<std::unique_ptr<RingView>> MapCudaRing(
    const v1::OutputRing& ring, const std::string& device_uuid, UniqueFd fd,
    uint64_t bytes);

// Maps the pool's completion counter likewise. Its OrderAfter with a null
// stream makes the counter's GPU the calling thread's current device (the
// legacy default stream is the current device's).
absl::StatusOr<std::unique_ptr<CompletionCounter>> MapCudaCompletionCounter(
    const std::string& device_uuid, UniqueFd fd, uint64_t bytes);

// The release word's writer on the CUDA backend: registers the host page
// holding `word` with CUDA (cudaHostRegister, mapped and portable, so every
// context may use it) and writes it with cuStreamWriteValue64 through its
// device address. FAILED_PRECONDITION where no GPU is usable or the device
// does not support stream memory operations on host memory, INTERNAL
// when CUDA refuses the registration.
absl::StatusOr<std::unique_ptr<ReleaseWordWriter>> MapCudaReleaseWord(
    std::atomic<uint64_t>* word);

}  // namespace pagealloc

#endif  // PAGEALLOC_CLIENT_CUDA_RING_VIEW_H_
