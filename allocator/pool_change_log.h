// PoolChange and PoolChangeLog: the record of every change to a PagePool's
// state, as the pool reports it to the log it was given
// (PoolOptions.change_log), and the interface that takes the records
// (docs/design.md, "The pool's change records and state").
//
// A record holds an operation's inputs, never its outputs: what
// PagePool::Replay needs to apply the same operation to a pool in the same
// state and get the same state. A prefix match is the one exception: it
// records what its walk found beside its keys, so that a file need not
// store the keys (four times the bytes of an adopt's pages, and not needed
// for a plain match).
// Replaying every record of a pool, in order, from its initial state (or
// from a PoolState it exported, and the records after it) gives a pool in
// that pool's state exactly.
//
// A record is a view: its spans and strings point into the caller's
// arguments and the pool's working storage, valid only during
// PoolChangeLog::Record. Building one costs a few stores; a log that keeps
// it copies or encodes it (//pool_state:pool_state_codec).

#ifndef PAGEALLOC_ALLOCATOR_POOL_CHANGE_LOG_H_
#define PAGEALLOC_ALLOCATOR_POOL_CHANGE_LOG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "allocator/pool_state.h"
#include "allocator/prefix_index.h"
#include "allocator/requests.h"

namespace pagealloc {

// Which operation a record is. The values are part of the record format
// (//pool_state): never renumber one.
enum class PoolChangeKind : uint8_t {
  kAddOwner = 1,           // owner, quota_pages, metadata
  kRemoveOwner = 2,        // owner
  kAllocate = 3,           // requests, calls, launch_failure
  kFree = 4,               // owner, pages, shared_pages
  kCheckpoint = 5,         // owner
  kRollback = 6,           // owner, checkpoint_id
  kClearOwner = 7,         // owner
  kClearPool = 8,          // force
  kPublish = 9,            // owner, pages, keys, parent_key, pin
  kMatchPrefix = 10,       // owner, adopt, refused, keys_looked_up,
                           // pages_found, pages (format 1: keys)
  kUnpin = 11,             // owner, pages
  kResetPrefixCache = 12,  // nothing
  kAwaitRelease = 13,      // owner, pages (record format 3 on)
};
// From record format 4 on, kAllocate's calls carry their CallTag, and
// kFree, kCheckpoint, kRollback, kClearOwner and kAwaitRelease carry `call`.
inline constexpr uint8_t kMaxPoolChangeKind = 13;

// Returns "add_owner", "allocate", ...; "unknown" for another value.
absl::string_view PoolChangeKindName(PoolChangeKind kind);

// Stands for a request's destination in a record: records say only whether
// a request had one (a request with slots and none is refused), never where
// it pointed. Replay never writes through it. Non-null, one address per
// process.
inline int64_t* RecordedDestination() {
  static int64_t destination = 0;
  return &destination;
}

// One change: the operation and its inputs. Only the fields its kind names
// (PoolChangeKind) are meaningful; the others keep their defaults.
struct PoolChange {
  PoolChangeKind kind = PoolChangeKind::kResetPrefixCache;
  OwnerId owner = kNoOwner;

  // kAddOwner.
  int64_t quota_pages = 0;
  absl::string_view metadata;

  // kAllocate: the batch as the caller passed it, every request (refused
  // ones too: a refusal can change counters). Of each request's
  // destination only whether it is null counts. `calls` as given (empty:
  // the batch is one call). launch_failure: the executor's error when the
  // launch failed and the batch was refused (merges and evictions before
  // it still happened); null when it ran or nothing was launched.
  absl::Span<const AllocRequest> requests;
  absl::Span<const CallSpan> calls;
  const absl::Status* launch_failure = nullptr;

  // kFree: the owned pages freed, in the order they went back, and the
  // shared pages whose references were dropped, in the order given (the
  // caller's slots or pages, already resolved: no order to apply).
  // kPublish: the caller's pages, one per key. kUnpin: the pages unpinned.
  // kAwaitRelease: the pages that begin to await release, in order.
  // kMatchPrefix: the pages an adopt took (below).
  absl::Span<const int64_t> pages;
  absl::Span<const int64_t> shared_pages;

  // kFree, kCheckpoint, kRollback, kClearOwner, kAwaitRelease: the call's
  // tag (id 0: untagged). kAllocate's are in `calls`.
  CallTag call;

  // kRollback.
  uint64_t checkpoint_id = 0;

  // kClearPool.
  bool force = false;

  // kPublish: keys in chain order, parent_key null at a chain's start, pin.
  // kMatchPrefix: the keys the caller gave (below).
  absl::Span<const PrefixKey> keys;
  const PrefixKey* parent_key = nullptr;
  bool pin = false;

  // kMatchPrefix: what the walk found, which is what record format 2
  // (pool_state_codec.h) stores rather than the keys (32 bytes a page; a
  // system prompt's chain is thousands of pages): how many keys it was
  // given, how many pages it found (the matched prefix), and, for an adopt
  // that was not refused, those pages in chain order in `pages` (empty
  // otherwise: a plain match and a refused adopt change only counters).
  // adopt; refused: the adopt was refused over quota, which still counts
  // the lookup and the refusal. The pool's records carry `keys` too, for a
  // file kept in record format 1. Replay walks `keys` when the record has
  // them (the pool's, or one decoded from format 1), and otherwise walks
  // the found pages again by their keys in the index (format 2).
  bool adopt = false;
  bool refused = false;
  int64_t keys_looked_up = 0;
  int64_t pages_found = 0;
};

// Where a pool reports its changes. The pool calls it under its lock, in
// the order the changes happen, once for each operation that changed (or
// may have changed) its state, after applying it; refused calls that change
// nothing are not reported, nor are changes made by PagePool::Replay (they
// are in the log already). After each record it asks WantsSnapshot, and
// when the answer is yes, hands the log its whole state (still under its
// lock, so that the snapshot is exactly the state after that record): this
// is how a log is compacted.
//
// The methods run on the allocation path with the pool's lock held: they
// must not call back into the pool, and should be quick (encode and
// append; leave I/O to another thread). A log that cannot keep a record
// must not lose it silently: the pool has applied the change and will not
// undo it, so the log remembers the failure and reports it its own way.
//
// Implementations are called from one thread at a time (the pool's lock).
class PoolChangeLog {
 public:
  virtual ~PoolChangeLog() = default;

  // Takes one record. `change` and what it points to are valid only during
  // the call.
  virtual void Record(const PoolChange& change) = 0;

  // Returns whether the log wants a snapshot now (asked after each record).
  virtual bool WantsSnapshot() = 0;

  // Takes the pool's state after the record just taken. Valid only during
  // the call.
  virtual void WriteSnapshot(const PoolState& state) = 0;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_ALLOCATOR_POOL_CHANGE_LOG_H_
