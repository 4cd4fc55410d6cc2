// The control block the coordinator and its workers share: one small file
// mapped by all, holding the start and stop flags and each worker's state
// and call count (for the progress line). Plain lock-free atomics in shared
// memory.

#ifndef PAGEALLOC_BENCH_CONTROL_H_
#define PAGEALLOC_BENCH_CONTROL_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace pagealloc::bench {

// Most workers one phase can have.
inline constexpr int kMaxClients = 256;

enum WorkerState : int64_t { kStarting = 0, kReady, kDone, kFailed };

struct Control {
  std::atomic<int64_t> go;
  std::atomic<int64_t> stop;
  struct Worker {
    std::atomic<int64_t> state;  // a WorkerState
    std::atomic<int64_t> calls;
  } workers[kMaxClients];
};
static_assert(std::atomic<int64_t>::is_always_lock_free,
              "the control block is shared between processes");

// Maps the control block at `path`: a new, zeroed one when `create`, else
// the coordinator's. INTERNAL when the file cannot be opened or mapped.
absl::StatusOr<Control*> MapControl(const std::string& path, bool create);

// Unmaps a block MapControl returned.
void UnmapControl(Control* control);

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_CONTROL_H_
