// PoolState: the whole state of a PagePool as plain values, what
// PagePool::ExportState returns and PagePool::CreateFromState restores
// (docs/design.md, "The pool's change records and state"). Everything a
// later operation's outcome depends on is here, and nothing else: a pool
// restored from it is indistinguishable from the exported one.
//
// Lists that come from hash containers inside the pool are sorted (owners by
// id, references and pins by page, prefix entries by page), so that two
// pools in the same state export equal values whatever their hash seeds.
//
// Derived figures are left out and recomputed on restore: each owner's page
// count (from owner_of), the prefix index's counts, and where each page
// sits in its owner's given_log (from given_live).

#ifndef PAGEALLOC_ALLOCATOR_POOL_STATE_H_
#define PAGEALLOC_ALLOCATOR_POOL_STATE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "allocator/free_list_policy.h"
#include "allocator/prefix_index.h"
#include "allocator/requests.h"

namespace pagealloc {

// The version of the pool's transition rules: what each operation does to
// the state (admission, merges, where frees go, eviction order, the
// checkpoint log's compaction). A state or a change record is only
// replayable by a pool of the same rules, so CreateFromState refuses a state
// of another version. Raise it with every change to the rules that could
// make a replay diverge, and say so in docs/design.md, section 16.
inline constexpr uint32_t kPoolSemanticsVersion = 1;

// Most bytes of an owner's metadata (PagePool::AddOwner).
inline constexpr size_t kMaxOwnerMetadataBytes = 4096;

// The pool's counters since it was created (PoolStats' counter fields; each
// is described there).
struct PoolCounters {
  int64_t slots_allocated = 0;
  int64_t pages_allocated = 0;
  int64_t pages_freed = 0;
  int64_t out_of_pages_refusals = 0;
  int64_t quota_refusals = 0;
  int64_t free_list_sorts = 0;
  int64_t batches_executed = 0;
  int64_t pages_scrubbed = 0;
  int64_t prefix_pages_published = 0;
  int64_t prefix_publish_existing = 0;
  int64_t prefix_lookup_pages = 0;
  int64_t prefix_hit_pages = 0;
  int64_t prefix_pages_adopted = 0;
  int64_t prefix_evicted_for_allocation = 0;
  int64_t prefix_evicted_by_reset = 0;
  int64_t prefix_cleared = 0;

  bool operator==(const PoolCounters& other) const;
  bool operator!=(const PoolCounters& other) const { return !(*this == other); }
};

// An active checkpoint: its id and where its owner's given_log stood.
struct PoolCheckpointState {
  uint64_t id = 0;
  uint64_t log_position = 0;

  bool operator==(const PoolCheckpointState& other) const {
    return id == other.id && log_position == other.log_position;
  }
};

// The parts of a call the pool keeps (PoolLastCall.parts): an allocation
// call can free pages and take a checkpoint first, each its own operation.
enum CallPart : uint32_t {
  kCallAllocate = 1u << 0,
  kCallFree = 1u << 1,  // FreeSlots, FreePages, AwaitRelease
  kCallCheckpoint = 1u << 2,
  kCallRollback = 1u << 3,
  kCallClear = 1u << 4,  // ClearOwner
  // Not a part: set on a kept allocation once a tagged allocation of the
  // owner was not kept (more calls in flight than are kept), whose pages
  // could be ones this one gave and lost: its pages can no longer be given
  // back, and a retry of it is refused.
  kCallPagesMoved = 1u << 5,
};
inline constexpr uint32_t kKnownCallParts = (1u << 6) - 1;

// Tagged calls kept per owner: its latest ones, so that a session with
// several calls in flight at a restart (a scheduler's thread and its page
// reserve's) has each answered.
inline constexpr size_t kKeptCallsPerOwner = 4;

// One of an owner's latest tagged calls whose parts took effect, and what
// each part answered: what a retry of that call is answered with
// (PagePool::Allocate and the tagged operations say how).
struct PoolKeptCall {
  uint64_t id = 0;  // 0: none yet
  uint32_t parts = 0;
  // When a part of it last took effect, against the owner's other kept
  // calls (larger: later; calls of one session may take effect out of
  // their ids' order): a retried allocation's pages must not be ones a
  // call that took effect after it holds.
  uint64_t order = 0;
  int64_t freed = 0;           // kCallFree: pages freed
  uint64_t checkpoint_id = 0;  // kCallCheckpoint: the checkpoint taken
  int64_t returned = 0;        // kCallRollback, kCallClear: pages returned
  // kCallAllocate: the pages the call took, in the order it took them.
  std::vector<int64_t> pages;

  bool operator==(const PoolKeptCall& other) const {
    return id == other.id && parts == other.parts && order == other.order &&
           freed == other.freed && checkpoint_id == other.checkpoint_id &&
           returned == other.returned && pages == other.pages;
  }
  bool operator!=(const PoolKeptCall& other) const { return !(*this == other); }
};

// One registered owner.
struct PoolOwnerState {
  OwnerId id = kNoOwner;
  int64_t quota_pages = 0;
  std::string metadata;  // opaque, at most kMaxOwnerMetadataBytes
  uint64_t next_checkpoint_id = 1;
  // Active checkpoints, oldest first; ids ascending, positions
  // non-decreasing and at most given_log.size().
  std::vector<PoolCheckpointState> checkpoints;
  // The pages given since the log was last empty, in order (empty without
  // a checkpoint), and for each entry whether it is live: the page is still
  // the owner's from that give (what a rollback returns).
  std::vector<int64_t> given_log;
  std::vector<bool> given_live;
  // References on shared pages, (page, count > 0) ascending by page, and
  // the shared pages the owner pins, ascending.
  std::vector<std::pair<int64_t, int64_t>> refs;
  std::vector<int64_t> pins;
  // Pages awaiting release, in the order they began to wait: freed by a
  // free that waits for the owner's release fence (PagePool::AwaitRelease).
  // Each is the owner's, or a shared page it holds a reference on; each
  // once.
  std::vector<int64_t> awaiting_release;
  // The owner's latest tagged calls that took effect, ids ascending, at
  // most kKeptCallsPerOwner (state format 3 on).
  std::vector<PoolKeptCall> kept_calls;

  bool operator==(const PoolOwnerState& other) const;
  bool operator!=(const PoolOwnerState& other) const {
    return !(*this == other);
  }
};

struct PoolState {
  // The fingerprint: what the state means and the pool it fits.
  uint32_t semantics_version = kPoolSemanticsVersion;
  int64_t num_pages = 0;
  int64_t page_size = 0;
  FreePolicy free_policy = FreePolicy::kLifo;
  Semantics semantics = Semantics::kPagealloc;
  bool scrub = false;
  int64_t max_pinned_pages_per_owner = 0;

  // The free list: its head's position in the ring of num_pages entries and
  // its pages in order from the head. Parked pages in the order parked.
  int64_t ring_head = 0;
  std::vector<int64_t> free_pages;
  std::vector<int64_t> parked_pages;
  // Per page 0..num_pages: its owner (kNoOwner free, kSharedOwner shared),
  // whether it was ever handed out, and (scrub only; else empty) its last
  // owner.
  std::vector<OwnerId> owner_of;
  std::vector<bool> allocated_once;
  std::vector<OwnerId> last_owner;
  // Registered owners, ascending by id.
  std::vector<PoolOwnerState> owners;
  // The shared pages: the prefix index's entries, ascending by page, and
  // its cached, unpinned pages, least recently used first.
  std::vector<PrefixEntryState> prefix_entries;
  std::vector<int64_t> prefix_lru;
  PoolCounters counters;

  bool operator==(const PoolState& other) const;
  bool operator!=(const PoolState& other) const { return !(*this == other); }
};

// Describes the first field in which `a` and `b` differ ("owners[1].
// given_log[3]: 17 vs 12"), or returns "" when they are equal. For tests
// and for the logs of a recovery that went wrong.
std::string FirstDifference(const PoolState& a, const PoolState& b);

}  // namespace pagealloc

#endif  // PAGEALLOC_ALLOCATOR_POOL_STATE_H_
