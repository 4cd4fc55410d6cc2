// RingView: a client's mapping of its session's output ring.

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

// Maps the ring a RegisterResponse describes, on `pool`'s backend: on the
// CPU backend from `ring_fd`, the ring's memory as the memory socket handed
// it over (FAILED_PRECONDITION when it is missing or not what `ring`
// describes); on the CUDA backend from the ring's IPC handle (`ring_fd` is
// unused).
absl::StatusOr<std::unique_ptr<RingView>> MapRing(const v1::PoolInfo& pool,
                                                  const v1::OutputRing& ring,
                                                  UniqueFd ring_fd);

}  // namespace pagealloc

#endif  // PAGEALLOC_CLIENT_RING_VIEW_H_
