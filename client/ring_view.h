// RingView: a client's mapping of its session's output ring;
// CompletionCounter: its mapping of the pool's completion counter (CUDA
// backend), which orders a stream's work after the daemon's launches; and
// ReleaseWordWriter: its session's release word (the release fence,
// fast_channel/layout.h), which orders the daemon's reuse of freed pages
// after a stream's work.

#ifndef PAGEALLOC_CLIENT_RING_VIEW_H_
#define PAGEALLOC_CLIENT_RING_VIEW_H_

#include <atomic>
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

// Writes a session's release word (in its fast channel's header, which
// stays mapped while this lives) in order with a stream's work. This class
// is thread-safe.
class ReleaseWordWriter {
 public:
  virtual ~ReleaseWordWriter() = default;
  // Queues on `stream` (a cudaStream_t; null: the legacy default stream)
  // the write of `value` to the word, behind the work queued there before
  // (CUDA backend: cuStreamWriteValue64 on the word's host page, registered
  // with CUDA); returns without waiting. On the CPU backend program order
  // is the order: the word is written at once and `stream` is ignored.
  virtual absl::Status Write(uint64_t value, void* stream) const = 0;
  // The word as the host sees it now.
  virtual uint64_t Read() const = 0;
};

// The writer of `word` for `pool`'s backend. On the CUDA backend the
// word's page is registered with CUDA (mapped, portable); FAILED_PRECONDITION
// in a client built without CUDA or where the GPU is not visible, INTERNAL
// when CUDA refuses the registration.
absl::StatusOr<std::unique_ptr<ReleaseWordWriter>> MapReleaseWord(
    const v1::PoolInfo& pool, std::atomic<uint64_t>* word);

}  // namespace pagealloc

#endif  // PAGEALLOC_CLIENT_RING_VIEW_H_
