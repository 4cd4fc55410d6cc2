// RingView: a client's mapping of its session's output ring; and
// CompletionCounter: its mapping of the pool's completion counter (CUDA
// backend), which orders a stream's work after the daemon's launches.

#ifndef PAGEALLOC_CLIENT_RING_VIEW_H_
#define PAGEALLOC_CLIENT_RING_VIEW_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "memory/unique_fd.h"
#include "proto/pagealloc.pb.h"

namespace pagealloc {

// This class is thread-safe (it is immutable once mapped).
class RingView {
 public:
  virtual ~RingView() = default;
  // The ring's first slot: a host pointer (CPU backend) or a device pointer
  // (CUDA backend).
  virtual const int64_t* slots() const = 0;
  virtual int64_t capacity_slots() const = 0;
  virtual bool on_device() const = 0;
  // Copies `count` slots starting at `src` (inside the ring) to host `dst`.
  virtual absl::Status CopyToHost(const int64_t* src, int64_t count,
                                  int64_t* dst) const = 0;
};

// Maps the ring a RegisterResponse describes, on `pool`'s backend, from
// `ring_fd` of `ring_bytes`, the ring's memory as the memory socket handed
// it over: a memfd on the CPU backend (mapped read-only), a CUDA
// virtual-memory allocation on the CUDA backend (imported and mapped on the
// GPU with the pool's device UUID). FAILED_PRECONDITION when the descriptor
// is missing or its size does not hold `ring`'s capacity, or when the GPU
// is not visible here; INTERNAL when CUDA refuses the mapping.
absl::StatusOr<std::unique_ptr<RingView>> MapRing(const v1::PoolInfo& pool,
                                                  const v1::OutputRing& ring,
                                                  UniqueFd ring_fd,
                                                  uint64_t ring_bytes);

// The pool's completion counter: a uint64 in device memory that the
// daemon's stream sets after each asynchronous launch, to values that only
// grow (AllocResponse.completion_value). This class is thread-safe.
class CompletionCounter {
 public:
  virtual ~CompletionCounter() = default;
  // Queues on `stream` (a cudaStream_t; null: the legacy default stream) a
  // wait until the counter is >= `value`; returns without waiting.
  virtual absl::Status OrderAfter(uint64_t value, void* stream) const = 0;
};

// Maps the completion counter of a CUDA pool from the descriptor the memory
// socket handed over. FAILED_PRECONDITION on a CPU pool, in a client built
// without CUDA, or when the GPU is not visible here.
absl::StatusOr<std::unique_ptr<CompletionCounter>> MapCompletionCounter(
    const v1::PoolInfo& pool, UniqueFd fd, uint64_t bytes);

}  // namespace pagealloc

#endif  // PAGEALLOC_CLIENT_RING_VIEW_H_
