// MemoryBudget: the memory the daemon may allocate on its sessions' behalf
// (their rings and fast channels), one accounted total per kind of memory:
// host memory (CPU rings, every fast channel) and, on the CUDA backend, GPU
// memory (CUDA rings). A Register that would pass the budget is refused
// with RESOURCE_EXHAUSTED naming what it asked, what is in use and the
// budget, before anything is allocated, so that the kernel never has to
// answer an allocation with the OOM killer (a memory cgroup does) and the
// GPU keeps what others need. docs/operations.md, "Memory budget".
//
// The defaults come from what the daemon can have: its memory cgroup's
// limit (CgroupMemoryLimit) or the host's available memory, and the GPU's
// free memory at start, less the KV slab (DefaultSessionBudget).

#ifndef PAGEALLOC_SERVER_MEMORY_BUDGET_H_
#define PAGEALLOC_SERVER_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace pagealloc {

// A budget of bytes and what is charged against it. Charges are taken
// whole or not at all; the total in use never passes the limit.
//
// This class is thread-safe.
class MemoryBudget {
 public:
  // Bytes charged to a budget; given back when destroyed. Movable; a
  // default-made Charge holds nothing. It must not outlive its budget.
  class Charge {
   public:
    Charge() = default;
    Charge(Charge&& other) noexcept { *this = std::move(other); }
    Charge& operator=(Charge&& other) noexcept;
    ~Charge() { Reset(); }

    int64_t bytes() const { return bytes_; }
    // Gives the bytes back now.
    void Reset();

   private:
    friend class MemoryBudget;
    Charge(MemoryBudget* budget, int64_t bytes)
        : budget_(budget), bytes_(bytes) {}

    MemoryBudget* budget_ = nullptr;
    int64_t bytes_ = 0;
  };

  // `name` names the memory ("host", "gpu": the metrics' label) and `flag`
  // the flag that sets the budget, for messages. REQUIRES: limit >= 0.
  MemoryBudget(std::string name, std::string flag, int64_t limit_bytes);
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Charges `bytes` for `what` ("a ring of 1048576 slots"). Returns
  // RESOURCE_EXHAUSTED with the numbers (asked, in use, budget) and
  // charges nothing when they do not fit; INVALID_ARGUMENT for a negative
  // size.
  absl::StatusOr<Charge> Take(int64_t bytes, absl::string_view what)
      ABSL_LOCKS_EXCLUDED(mu_);

  int64_t limit() const { return limit_; }
  int64_t used() const ABSL_LOCKS_EXCLUDED(mu_);
  // Takes refused since start.
  int64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }
  const std::string& name() const { return name_; }

 private:
  void Give(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string name_;
  const std::string flag_;
  const int64_t limit_;
  mutable absl::Mutex mu_;
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> refusals_{0};
};

// The memory limit of the cgroup this process is in: cgroup v2's
// memory.max, or cgroup v1's memory.limit_in_bytes, of the cgroup
// `proc_self_cgroup` names, under `cgroup_root` (v2 there, v1 under
// `cgroup_root`/memory). The tightest limit of the cgroup and its
// ancestors that are visible. nullopt when there is none ("max", or v1's
// "no limit" of nearly 2^63) or it cannot be read.
std::optional<int64_t> CgroupMemoryLimit(
    const std::string& proc_self_cgroup = "/proc/self/cgroup",
    const std::string& cgroup_root = "/sys/fs/cgroup");

// What the daemon may have of the host's memory: the kernel's
// MemAvailable, or its memory cgroup's limit where that is smaller (a
// cgroup over its limit answers with the OOM killer, whatever the host has
// free). `bytes` is -1 when neither can be read.
struct HostMemory {
  int64_t bytes = -1;
  bool cgroup_limit = false;  // `bytes` is the cgroup's limit
  // "available", "the memory cgroup's limit": for messages.
  const char* source() const {
    return cgroup_limit ? "the memory cgroup's limit" : "available";
  }
};
HostMemory AvailableHostMemory();

// The default budget of sessions' memory given `room`, what the daemon may
// have of that memory in all (the cgroup's limit or the host's available
// memory; the GPU's free memory at start), and `taken`, what the daemon
// holds of it already or will (the KV slab, the pool's bookkeeping).
// Host memory keeps a quarter of what is left (at least 64 MiB) for the
// daemon's own heap (gRPC's buffers, streams); GPU memory gives sessions
// an eighth of what is left and leaves the rest to the other processes on
// the GPU. Never negative.
enum class BudgetMemory { kHost, kGpu };
int64_t DefaultSessionBudget(BudgetMemory memory, int64_t room, int64_t taken);

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_MEMORY_BUDGET_H_
