// KeptState: the pool kept across the daemon's own restarts (docs/design.md,
// "A restart keeps the pool").
//
// The daemon's state lives in a state journal (//state_journal) in a memfd
// that the service manager keeps in its file-descriptor store beside the
// KV slab (//fd_store), or that the daemon holds and hands to a successor
// (//handover; DescriptorKeeper): a snapshot of the pool (PoolState, with the
// daemon's identity) and the pool's change records since (PoolChange, one per
// operation, appended under the pool's lock before the operation's answer
// leaves the daemon). A restarted daemon gets both descriptors back, checks
// the journal whole, rebuilds the pool from the snapshot, replays the
// records, and adopts the slab: every page is in the state it was in after
// the last operation whose record committed, and an operation whose record
// did not commit never happened (its caller had no answer).
//
// Fail closed. A journal that fails a check (checksum, sequence, a state
// that breaks the pool's invariants, a slab that is not the kept one) is
// never used: the daemon starts a fresh pool and a fresh slab, drops the
// old descriptors from the store, says why in its log and in
// pagealloc_state_recovery, and resuming clients learn their sessions are
// gone. A journal this build cannot read (another format or pool
// semantics version), or one kept for a pool of other flags, is neither
// used nor dropped: the daemon refuses to start (an operator can go back
// to the build that wrote it), unless told to discard it.
//
// Formats. A journal this build creates is of the newest journal format
// and holds records of the newest record format (pool_state_codec.h). A
// journal it takes over keeps the formats it was made with: its records
// are appended in the newest record format its journal format allows
// (journal format N: record format N), and its snapshots in the state
// format it allows (state format 2 from journal format 3, 3 from 4), so
// that the build that made it can still take it back (a rollback), and a
// build that reads only older formats refuses a newer journal at Open
// rather than failing in a replay. What an older format cannot hold (pages
// awaiting release before journal format 3; the calls' tags and each
// session's latest call before 4) is not kept in such a file.
//
// A record that cannot be kept (the log full even after a snapshot, the
// snapshot larger than its slot) breaks the kept state: the change is
// applied but not recorded, so the daemon drops the descriptors from the
// store at once; a restart then starts fresh rather than from a state that
// lacks the change.
//
// This class is thread-compatible: its PoolChangeLog methods run under the
// pool's lock; Open, Replay and StartKeeping run before the daemon serves;
// stats() may be read from any thread.

#ifndef PAGEALLOC_KEPT_STATE_KEPT_STATE_H_
#define PAGEALLOC_KEPT_STATE_KEPT_STATE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/page_pool.h"
#include "allocator/pool_change_log.h"
#include "allocator/pool_state.h"
#include "memory/unique_fd.h"
#include "pool_state/pool_state_codec.h"
#include "state_journal/state_journal.h"

namespace pagealloc {

// The names the daemon's descriptors carry in the store (FDNAME=).
inline constexpr char kStateFdName[] = "pagealloc-state";
inline constexpr char kSlabFdName[] = "pagealloc-slab";

// Who a kept state belongs to, beyond the pool: kept in each snapshot.
struct DaemonIdentity {
  // Drawn when the slab was made; clients compare it to the slab they
  // mapped (KvSlab.slab_id). 0: no slab.
  uint64_t slab_id = 0;
  // Starts of the daemon on this state: 1 at the first.
  uint64_t starts = 0;
};

// Who holds the kept descriptors between two runs of the daemon.
enum class DescriptorKeeper {
  // systemd's file-descriptor store (//fd_store): they outlive any end of
  // the daemon, a crash included. Needs $NOTIFY_SOCKET.
  kServiceManager,
  // The daemon itself, until it hands them to a successor (//handover):
  // they outlive a planned restart, not a crash.
  kDaemon,
};

struct KeptStateOptions {
  // What the pool's state means (the daemon's flags that shape it:
  // layout, page size, policy, semantics, backend, device). A kept state
  // of another fingerprint is refused (FAILED_PRECONDITION) unless
  // `discard` is set.
  std::string fingerprint;
  // The journal's capacities for a new state: each snapshot slot (0: room
  // for any state of the pool with max_owners owners) and the log of
  // records after a snapshot.
  int64_t snapshot_capacity_bytes = 0;
  int64_t max_owners = 1024;
  int64_t log_capacity_bytes = 0;
  // Drop a kept state this build refuses instead of refusing to start.
  bool discard = false;
  DescriptorKeeper keeper = DescriptorKeeper::kServiceManager;
};

// What Open found.
enum class KeptStateOutcome {
  kNone,       // nothing kept: a first start
  kRecovered,  // a kept state passed every check
  kCorrupt,    // a kept state failed a check: discarded, fresh pool
  kDiscarded,  // a kept state this build refuses, discarded as told
};
absl::string_view KeptStateOutcomeName(KeptStateOutcome outcome);

// Figures for /metrics. Counters since start.
struct KeptStateStats {
  KeptStateOutcome outcome = KeptStateOutcome::kNone;
  std::string reason;    // why a kept state was discarded; "" otherwise
  bool keeping = false;  // recording (not broken)
  // Keeping, and the descriptors are held where a crash of the daemon
  // leaves them: the service manager's store, or a descriptor keeper that
  // is alive (SetCrashSurvivalProbe).
  bool outlives_crash = false;
  int64_t records = 0;  // appended since start
  int64_t record_bytes = 0;
  int64_t snapshots = 0;  // written since start
  int64_t failures = 0;   // records or snapshots that could not be kept
  int64_t log_bytes_used = 0;
  int64_t log_capacity_bytes = 0;
  int64_t replayed_records = 0;  // at recovery
  double recovery_seconds = 0;   // Open to StartKeeping
  DaemonIdentity identity;
};

class KeptState final : public PoolChangeLog {
 public:
  // Takes the kept descriptors among `passed` (by kStateFdName and
  // kSlabFdName; TakePassedFds, or a handover) and checks the journal
  // whole. OK with
  // outcome() kNone, kRecovered, kCorrupt or kDiscarded;
  // FAILED_PRECONDITION when the kept state is one this build refuses and
  // options.discard is not set, saying why and how to go on.
  static absl::StatusOr<std::unique_ptr<KeptState>> Open(
      const KeptStateOptions& options,
      absl::flat_hash_map<std::string, UniqueFd> passed);

  // Whether Open with `options` would take over the journal in `state_fd`
  // (read through a duplicate while its writer may still run):
  // FAILED_PRECONDITION saying why not, as Open would refuse; OK otherwise,
  // also for a journal that fails a check now (a write in progress: Open
  // decides once the writer has stopped). A successor asks this before
  // the running daemon stops.
  static absl::Status CheckTakeOver(const KeptStateOptions& options,
                                    int state_fd);

  KeptStateOutcome outcome() const { return outcome_; }
  DescriptorKeeper keeper() const { return options_.keeper; }
  // Whether the kept records hold the calls' tags (not in a journal taken
  // over from before journal format 4). Where not, the server refuses
  // retries: one answered from a file without them could run a call twice.
  bool KeepsCallTags() const {
    return PoolChangeFormatHoldsTags(record_format_);
  }
  // kRecovered: the pool's state in the snapshot (records not yet
  // applied), the identity kept with it, and the kept slab's descriptor
  // (invalid when none was kept).
  const PoolState& recovered_state() const { return state_; }
  const DaemonIdentity& identity() const { return identity_; }
  UniqueFd TakeSlabFd() { return std::move(slab_fd_); }

  // Gives up the recovered state (the slab it needs is missing or not the
  // kept one, or the pool refused it): the daemon starts fresh, and
  // outcome() becomes kCorrupt with `why`.
  void Discard(const absl::Status& why);

  // kRecovered: applies the kept records to `pool` (built from
  // recovered_state() with this as its change log, which records nothing
  // while it replays). DATA_LOSS when a record fails to decode or apply;
  // the caller then Discards.
  absl::Status Replay(PagePool& pool);

  // Starts keeping `pool`: a new journal unless one was recovered, a
  // snapshot of the pool now with `identity` (its starts counted), and
  // both descriptors in the service manager's store (`slab_fd` -1: no
  // slab); from then on every change is recorded. REQUIRES: `pool` has
  // this as its change log.
  absl::Status StartKeeping(PagePool& pool, int slab_fd,
                            DaemonIdentity identity);

  // PoolChangeLog.
  void Record(const PoolChange& change) override;
  bool WantsSnapshot() override;
  void WriteSnapshot(const PoolState& state) override;

  KeptStateStats stats() const;

  // Where the daemon holds the descriptors itself (DescriptorKeeper::
  // kDaemon): `probe` says whether a process of its own (//fd_keeper) holds
  // them too, so that they outlive the daemon's crash. Called by stats(),
  // from any thread. Set before the daemon serves.
  void SetCrashSurvivalProbe(std::function<bool()> probe) {
    crash_survival_probe_ = std::move(probe);
  }

  // Runs `observer` when the kept state breaks (a change it could not
  // keep), under the pool's lock, after the service manager's store
  // dropped the descriptors: whoever else holds them for a successor
  // (//fd_keeper) must drop them too. It must be quick and must not call
  // into the pool. Set before the daemon serves.
  void SetBreakObserver(std::function<void()> observer) {
    break_observer_ = std::move(observer);
  }

  // The descriptors a successor takes over, by name (kStateFdName, and
  // kSlabFdName when there is a slab), not owned; FAILED_PRECONDITION when
  // the state is not kept (before StartKeeping, or broken). Any thread.
  absl::StatusOr<std::vector<std::pair<std::string, int>>> KeptDescriptors()
      const;

 private:
  explicit KeptState(const KeptStateOptions& options) : options_(options) {}
  // Marks the kept state broken: stops recording and drops the store's
  // descriptors, so that a restart starts fresh.
  void Break(const absl::Status& why);
  // Writes the snapshot's bytes, the identity and the pool's state, into
  // snapshot_scratch_ and returns them (valid until the next call).
  absl::string_view EncodeSnapshot(const PoolState& state);

  const KeptStateOptions options_;
  KeptStateOutcome outcome_ = KeptStateOutcome::kNone;
  std::string reason_;
  std::unique_ptr<StateJournal> journal_;
  // The record format Record writes into journal_ (RecordFormatFor).
  uint8_t record_format_ = kPoolChangeFormatVersion;
  // The pool state format its snapshots are written in (StateFormatFor).
  uint32_t state_format_ = kPoolStateFormatVersion;
  UniqueFd slab_fd_;
  // The slab StartKeeping kept (not owned: the backend's); -1 for none.
  int kept_slab_fd_ = -1;
  PoolState state_;
  std::vector<JournalRecord> records_;
  DaemonIdentity identity_;
  std::function<void()> break_observer_;
  std::function<bool()> crash_survival_probe_;
  bool replaying_ = false;
  bool keeping_ = false;
  // A record found the log full: the snapshot that follows it must be
  // written (it holds the change the log could not).
  bool snapshot_pending_ = false;
  // Encoded record, reused between records (no allocation once warm).
  std::string scratch_;
  // Encoded snapshot, reused between snapshots: a pool of 1M pages
  // encodes to 13 MB, which a fresh buffer would fault in page by page
  // under the pool's lock at every snapshot.
  std::string snapshot_scratch_;
  double opened_at_ = 0;

  // Read by stats() from other threads.
  std::atomic<int64_t> records_appended_{0};
  std::atomic<int64_t> record_bytes_{0};
  std::atomic<int64_t> snapshots_{0};
  std::atomic<int64_t> failures_{0};
  std::atomic<int64_t> log_bytes_used_{0};
  std::atomic<bool> keeping_flag_{false};
  int64_t replayed_records_ = 0;
  double recovery_seconds_ = 0;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_KEPT_STATE_KEPT_STATE_H_
