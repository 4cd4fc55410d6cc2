// The batch plan and the narrow interface through which the pool drives an
// executor (the CPU reference in //kernels:cpu_executor, the CUDA one, or,
// in allocator/'s own tests and benchmark, FakeExecutor in fake_executor.h).
//
// The pool owns the truth: the free list's order, the owner of every page.
// An executor keeps a mirror of the free list (a ring of page ids, the same
// capacity and positions as the pool's) so that expanding a plan never needs
// the host's list: the plan says where in the ring the batch's pages start.

#ifndef PAGEALLOC_ALLOCATOR_EXECUTOR_H_
#define PAGEALLOC_ALLOCATOR_EXECUTOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace pagealloc {

// One admitted request of a batch, in extend form.
struct PlannedRequest {
  int64_t prefix_len = 0;
  int64_t seq_len = 0;
  int64_t last_loc = -1;
  // Index of the request's first new page among the batch's new pages: its
  // pages sit at ring positions free_ring_head + first_new_page + k.
  int64_t first_new_page = 0;
  // Slots of all earlier requests of the batch (an exclusive prefix sum).
  int64_t output_offset = 0;
  // Receives seq_len - prefix_len slots, in the executor's address space.
  int64_t* destination = nullptr;
};

// A run of slots that are free-ring entries as they stand: with page_size 1
// a page is its one slot, so request k's slots are the ring entries at
// positions free_ring_head + first_new_page + j, no arithmetic needed, and
// requests whose destinations follow each other make one run.
struct RingCopy {
  // Offset of the run's first entry from free_ring_head.
  int64_t ring_offset = 0;
  int64_t count = 0;  // entries copied, >= 1
  // Receives `count` slots, in the executor's address space.
  int64_t* destination = nullptr;
};

// What one launch does: expand the admitted requests into slots, reading the
// batch's new pages from the free ring starting at free_ring_head. Request k
// reads pages [first_new_page, first_new_page + its new pages), so the batch
// reads num_new_pages consecutive ring positions (modulo the capacity).
//
// A plan of page_size 1 may say the same as ring copies instead: copy k
// writes ring entries [free_ring_head + ring_offset, ... + count) (modulo
// the capacity) to its destination. The pool plans page_size 1 that way
// (PoolOptions.ring_copy_plans) and then leaves `requests` empty; an
// executor serves both parts of any plan it is given (their destinations
// never overlap).
struct BatchPlan {
  int64_t page_size = 1;
  int64_t free_ring_head = 0;
  int64_t free_ring_capacity = 0;
  int64_t num_new_pages = 0;  // pages the batch takes from the free list
  int64_t num_slots = 0;      // slots the batch writes, all requests together
  std::vector<PlannedRequest> requests;
  // page_size 1 only; in ring order, not overlapping.
  std::vector<RingCopy> ring_copies;
  // Pages of this batch whose KV slots the executor zeroes, in every KV
  // buffer, before the batch's slots are handed out: those going to a
  // session other than their last owner (PoolOptions.scrub). Empty unless
  // the pool scrubs.
  std::vector<int64_t> scrub_pages;
};

// The KV memory an executor scrubs (BatchPlan.scrub_pages): buffers in the
// executor's address space, page p covering slots [p * page_size,
// (p + 1) * page_size) of each.
struct KvScrubTarget {
  struct Buffer {
    char* base = nullptr;      // slot 0 of the buffer
    int64_t stride_bytes = 0;  // bytes per slot
  };
  int64_t page_size = 0;
  std::vector<Buffer> buffers;
};

// Runs plans. Calls come from one thread at a time (the pool holds its lock
// around them), in the order the pool changes its free list: an executor
// must apply them in that order (a CUDA executor issues all of them on one
// stream).
class PlanExecutor {
 public:
  virtual ~PlanExecutor() = default;

  // Sizes the free-ring mirror. The pool calls it once, first.
  virtual absl::Status InitFreeRing(int64_t capacity) = 0;

  // Writes `pages` to ring positions [position, position + pages.size()).
  // REQUIRES: position + pages.size() <= capacity (the pool splits writes
  // that wrap around).
  virtual absl::Status WriteFreeRing(int64_t position,
                                     absl::Span<const int64_t> pages) = 0;

  // Expands `plan` into slots, writing request k's slots to its destination.
  // Returns INTERNAL when the device fails; the pool then commits nothing.
  virtual absl::Status Execute(const BatchPlan& plan) = 0;

  // Waits until everything issued so far has completed (a no-op for
  // synchronous executors).
  virtual absl::Status Synchronize() = 0;

  // Returns the whole mirror ring, for invariant checks.
  virtual absl::StatusOr<std::vector<int64_t>> ReadFreeRing() = 0;

  // A short name for logs and metrics: "cpu", "cuda".
  virtual const char* name() const = 0;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_ALLOCATOR_EXECUTOR_H_
