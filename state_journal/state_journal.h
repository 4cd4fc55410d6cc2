// StateJournal: the daemon's crash-consistent state file. One snapshot of
// the pool (opaque bytes) and a log of change records ((kind, payload)
// pairs, opaque too) appended after it, in a fixed-capacity file that is
// mapped and written with plain stores, so that the state outlives the
// process: the file is a memfd kept in systemd's fd store, or a file on a
// tmpfs such as /dev/shm. What the snapshot and the records mean is the
// caller's; this is the container. The wire format is state_journal/
// format.h; docs/design.md, "The state journal", says why it is so.
//
// Crash model: the writing process dies (SIGKILL, abort, a crash) at any
// instruction, while the machine and its kernel stay up. Every store the
// process made to the MAP_SHARED mapping before it died is then in the
// page cache, in program order; the process's own stores are ordered for
// the compiler and for weaker CPUs by the release store that commits. Power
// loss is out of scope (a memfd or a tmpfs dies with the machine anyway):
// nothing is ever msync'd or fsync'd, and Append makes no system call.
//
// Commit points. An Append writes its record past the log's committed tail,
// then commits it with one 64-bit release store of the commit word (the new
// tail). A WriteSnapshot writes the snapshot into the slot not in use, then
// commits it with one release store of the commit word that names the new
// epoch (and so that slot) and a tail of 0, which empties the log in the
// same store. Either store has happened or it has not: a process killed at
// any instant leaves a file that Open recovers to the state exactly before
// or exactly after each operation. Recovery trusts nothing it reads: every
// length and offset is bounded before use, the header, the snapshot, the
// commit word and every committed record are checksummed, and a file that
// fails any check is refused (DATA_LOSS), never repaired or half-read.
//
// One writer at a time: the caller makes sure no two processes hold a
// StateJournal of one file (the fd store hands it to one daemon).
//
// This class is thread-compatible: the caller serializes every call.

#ifndef PAGEALLOC_STATE_JOURNAL_STATE_JOURNAL_H_
#define PAGEALLOC_STATE_JOURNAL_STATE_JOURNAL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "memory/unique_fd.h"
#include "state_journal/format.h"

namespace pagealloc {

struct StateJournalOptions {
  // Bytes each of the two snapshot slots holds: the largest snapshot
  // WriteSnapshot takes. 0 .. 1 TiB.
  int64_t snapshot_capacity_bytes = 0;
  // Bytes of the log: each record takes 32 bytes of header plus its payload,
  // rounded up to 8. A multiple of 8, 32 .. 4 GiB.
  int64_t log_capacity_bytes = 0;
  // An opaque tag of at most 256 bytes, recorded by Create and returned by
  // Open (the daemon puts its pool's geometry and its build there, to tell
  // whether a journal is one it can resume).
  std::string creator;
};

struct JournalRecord {
  uint32_t kind = 0;
  std::string payload;
};

// What a journal held when Open read it.
struct RecoveredJournal {
  std::string creator;          // StateJournalOptions.creator
  uint32_t format_version = 0;  // of the build that created the file
  uint64_t epoch = 0;           // 0 at Create, + 1 by each WriteSnapshot
  std::string snapshot;         // empty before the first WriteSnapshot
  // Appended after that snapshot, in order.
  std::vector<JournalRecord> records;
  // Bytes of an append that began but never committed (its record header
  // was found past the tail), discarded; 0 when none was seen. For the
  // daemon's log and metrics only: the state is the same either way.
  int64_t torn_bytes = 0;
};

class StateJournal {
 public:
  static constexpr uint32_t kFormatVersion = journal_format::kFormatVersion;
  static constexpr uint32_t kMinReadableFormat =
      journal_format::kMinReadableFormat;

  // Returns the file size a journal with `options` takes, or -1 when Create
  // would refuse the options.
  static int64_t FileSizeFor(const StateJournalOptions& options);

  // Lays out a new, empty journal (epoch 0, no snapshot, no records) in
  // `fd`, which must be an empty file (a fresh memfd, a new file on a
  // tmpfs): sizes it to FileSizeFor(options), reserves its pages (so that a
  // full tmpfs refuses it now, not with SIGBUS on a later store), seals a
  // memfd that allows it against growing, shrinking and further seals, and
  // maps it. Returns INVALID_ARGUMENT for bad options or no descriptor,
  // FAILED_PRECONDITION when the file is not empty (Create never writes
  // over another journal), RESOURCE_EXHAUSTED when the memory cannot be
  // reserved, INTERNAL for other system errors.
  static absl::StatusOr<std::unique_ptr<StateJournal>> Create(
      UniqueFd fd, const StateJournalOptions& options);

  // Maps the journal in `fd` (open read-write), checks all of it, and returns
  // what it holds with a writer positioned after its last committed record.
  // Returns DATA_LOSS for a file that is not a whole, intact journal: shorter
  // or longer than its header says (truncated), a bad magic (not a journal, or
  // its Create never finished), a header, commit word, snapshot or committed
  // record that fails its checksum, a record of another epoch or out of
  // sequence; FAILED_PRECONDITION for a format this build cannot read ("state
  // journal format 7; this build reads 1..1"); INTERNAL when it cannot be read
  // or mapped. The file is not changed.
  static absl::StatusOr<
      std::pair<std::unique_ptr<StateJournal>, RecoveredJournal>>
  Open(UniqueFd fd);

  ~StateJournal();
  StateJournal(const StateJournal&) = delete;
  StateJournal& operator=(const StateJournal&) = delete;

  // Appends one record whose payload is `payload_parts` back to back, and
  // commits it. O(payload); no system call, no allocation. Returns
  // RESOURCE_EXHAUSTED and changes nothing when the log has no room for it
  // (WriteSnapshot then empties the log).
  absl::Status Append(uint32_t kind,
                      absl::Span<const absl::string_view> payload_parts);

  // Writes `snapshot` into the slot not in use and commits it as the state,
  // with an empty log and the next epoch. O(snapshot); no system call.
  // Returns RESOURCE_EXHAUSTED and changes nothing when it is larger than
  // snapshot_capacity().
  absl::Status WriteSnapshot(absl::string_view snapshot);

  int64_t log_bytes_used() const { return tail_; }
  int64_t log_capacity() const { return log_capacity_; }
  int64_t snapshot_capacity() const { return snapshot_capacity_; }
  uint64_t epoch() const { return epoch_; }
  // The journal's descriptor, to hand to the fd store. Owned by the journal.
  int fd() const { return fd_.get(); }

  // Test seam for the crash tests: from now on the writer makes only
  // `stores` more stores to the file and drops the rest, as if its process
  // had been killed there. A store is one byte of a plain store or one
  // store of the commit word (a single instruction). The journal object is
  // of no further use afterwards; reopen the file to see what it holds.
  void CrashAfterStoresForTesting(int64_t stores) { stores_left_ = stores; }
  // Whether CrashAfterStoresForTesting's limit has dropped a store.
  bool crashed_for_testing() const { return stores_dropped_; }

 private:
  StateJournal(UniqueFd fd, char* base,
               const journal_format::FileLayout& layout,
               int64_t snapshot_capacity, int64_t log_capacity, uint64_t epoch,
               int64_t tail, uint64_t next_sequence);

  // Every store to the file goes through these two.
  void Store(char* to, const void* from, size_t bytes);
  void Commit(uint64_t word);

  const UniqueFd fd_;
  char* const base_;  // the whole file, mapped read-write
  const journal_format::FileLayout layout_;
  const int64_t snapshot_capacity_;
  const int64_t log_capacity_;
  std::atomic<uint64_t>* const commit_word_;  // in the mapping
  char* const log_;                           // in the mapping
  uint64_t epoch_;                            // the active snapshot's
  int64_t tail_;                              // committed log bytes
  uint64_t next_sequence_;                    // of the next record
  int64_t stores_left_ = -1;                  // < 0: no test limit
  bool stores_dropped_ = false;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_STATE_JOURNAL_STATE_JOURNAL_H_
