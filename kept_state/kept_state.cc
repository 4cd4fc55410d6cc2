#include "kept_state/kept_state.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "fd_store/fd_store.h"
#include "kept_state/session_record.h"
#include "pool_state/pool_state_codec.h"

namespace pagealloc {
namespace {

// Journal record kinds.
constexpr uint32_t kPoolChangeRecord = 1;

// The snapshot: this header, the fingerprint, then the pool's state
// (//pool_state's encoding). Little-endian.
constexpr uint32_t kSnapshotMagic = 0x5453'4b50;  // "PKST"
constexpr uint32_t kSnapshotVersion = 1;
struct SnapshotHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t slab_id;
  uint64_t starts;
  // The pool's geometry, which bounds what the state's decoder reads.
  int64_t num_pages;
  int64_t page_size;
  uint64_t fingerprint_bytes;
  uint64_t state_bytes;
};
static_assert(sizeof(SnapshotHeader) == 56);
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);

// The journal's creator tag: short, so a digest of the fingerprint; the
// whole fingerprint is in each snapshot, to say what differs.
std::string CreatorFor(absl::string_view fingerprint) {
  const TokenDigest digest = DigestToken(fingerprint);
  std::string hex;
  for (uint8_t byte : digest) absl::StrAppendFormat(&hex, "%02x", byte);
  return absl::StrCat("pagealloc kept state; fingerprint sha256 ", hex);
}

// The lines of `kept` that `now` does not have, for the refusal.
std::string FingerprintDifference(absl::string_view kept,
                                  absl::string_view now) {
  std::vector<absl::string_view> a = absl::StrSplit(kept, '\n');
  std::vector<absl::string_view> b = absl::StrSplit(now, '\n');
  std::vector<std::string> out;
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const absl::string_view x = i < a.size() ? a[i] : "";
    const absl::string_view y = i < b.size() ? b[i] : "";
    if (x != y) out.push_back(absl::StrFormat("kept '%s', now '%s'", x, y));
  }
  return absl::StrJoin(out, "; ");
}

struct DecodedSnapshot {
  DaemonIdentity identity;
  std::string fingerprint;
  PoolState state;
};

absl::StatusOr<DecodedSnapshot> DecodeSnapshot(absl::string_view bytes) {
  SnapshotHeader header;
  if (bytes.size() < sizeof(header)) {
    return absl::DataLossError(absl::StrFormat(
        "kept snapshot of %d bytes: shorter than its header", bytes.size()));
  }
  std::memcpy(&header, bytes.data(), sizeof(header));
  if (header.magic != kSnapshotMagic || header.version != kSnapshotVersion) {
    return absl::DataLossError(absl::StrFormat(
        "kept snapshot: magic 0x%08x version %d; this build reads 0x%08x "
        "version %d",
        header.magic, header.version, kSnapshotMagic, kSnapshotVersion));
  }
  const uint64_t rest = bytes.size() - sizeof(header);
  if (header.fingerprint_bytes > rest ||
      header.state_bytes != rest - header.fingerprint_bytes) {
    return absl::DataLossError(absl::StrFormat(
        "kept snapshot of %d bytes: its header says %d + %d + %d", bytes.size(),
        sizeof(header), header.fingerprint_bytes, header.state_bytes));
  }
  // The state holds at least 8 bytes a page (its owner): a header that
  // says more pages than that is corrupt, whatever its checksum said.
  if (header.num_pages < 1 || header.page_size < 1 ||
      static_cast<uint64_t>(header.num_pages) > header.state_bytes / 8 ||
      header.page_size > (int64_t{1} << 30)) {
    return absl::DataLossError(absl::StrFormat(
        "kept snapshot: a pool of %d pages of %d tokens in %d bytes of state",
        header.num_pages, header.page_size, header.state_bytes));
  }
  PoolGeometry geometry;
  geometry.num_pages = header.num_pages;
  geometry.page_size = header.page_size;
  DecodedSnapshot snapshot;
  snapshot.identity.slab_id = header.slab_id;
  snapshot.identity.starts = header.starts;
  snapshot.fingerprint =
      std::string(bytes.substr(sizeof(header), header.fingerprint_bytes));
  ASSIGN_OR_RETURN(
      snapshot.state,
      DecodePoolState(bytes.substr(sizeof(header) + header.fingerprint_bytes),
                      geometry));
  return snapshot;
}

// Room for any state a pool of `num_pages` can be in, with the headroom
// the per-owner lists need: a page's owner, last owner and free-list
// entry (24 bytes), its prefix-index entry and LRU place (93), its
// checkpoint-log entries and references (at most ~16 between them in
// practice), each owner's metadata and lists' headers; then rounded to
// the journal's 8 bytes. A snapshot that outgrows it breaks the kept state
// (logged, pagealloc_state_kept 0), never corrupts it.
int64_t SnapshotCapacityFor(int64_t num_pages, int64_t max_owners) {
  const int64_t bytes = 160 * (num_pages + 1) +
                        (kMaxOwnerMetadataBytes + 256) * max_owners +
                        (int64_t{8} << 20);
  return (bytes + 7) / 8 * 8;
}

double NowSeconds() {
  return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
}

// Why this build, with `options`, does not take over a kept state that
// decoded as `snapshot` (FAILED_PRECONDITION); OK when it does.
absl::Status TakeOverRefusal(const KeptStateOptions& options,
                             const DecodedSnapshot& snapshot) {
  if (snapshot.fingerprint != options.fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the kept state belongs to a pool of other flags (",
        FingerprintDifference(snapshot.fingerprint, options.fingerprint), ")"));
  }
  if (snapshot.state.semantics_version != kPoolSemanticsVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the kept state follows pool semantics version %d; this build's is "
        "%d",
        snapshot.state.semantics_version, kPoolSemanticsVersion));
  }
  return absl::OkStatus();
}

// The newest pool change record format and pool state format a journal of
// `journal_format` may hold: journal format 2 came with record format 2,
// 3 with record format 3 and state format 2, and 4 with record format 4
// and state format 3, so that a build that cannot decode them refuses such
// a journal at Open. REQUIRES:
// StateJournal::kMinReadableFormat <= journal_format <= kFormatVersion.
uint8_t RecordFormatFor(uint32_t journal_format) {
  static_assert(
      StateJournal::kFormatVersion == 4 && kPoolChangeFormatVersion == 4,
      "a new journal or record format: say which records it holds");
  return journal_format >= 4   ? 4
         : journal_format >= 3 ? 3
         : journal_format >= 2 ? 2
                               : 1;
}
uint32_t StateFormatFor(uint32_t journal_format) {
  static_assert(
      StateJournal::kFormatVersion == 4 && kPoolStateFormatVersion == 3,
      "a new journal or state format: say which states it holds");
  return journal_format >= 4 ? 3 : journal_format >= 3 ? 2 : 1;
}

bool KeptByServiceManager(const KeptStateOptions& options) {
  return options.keeper == DescriptorKeeper::kServiceManager;
}

absl::Status NeedServiceManager() {
  return absl::FailedPreconditionError(
      "--keep_state needs a service manager that keeps descriptors "
      "($NOTIFY_SOCKET is not set): run the daemon as a systemd unit with "
      "FileDescriptorStoreMax= (deploy/systemd/pagealloc@.service)");
}

}  // namespace

absl::string_view KeptStateOutcomeName(KeptStateOutcome outcome) {
  switch (outcome) {
    case KeptStateOutcome::kNone:
      return "none";
    case KeptStateOutcome::kRecovered:
      return "recovered";
    case KeptStateOutcome::kCorrupt:
      return "corrupt";
    case KeptStateOutcome::kDiscarded:
      return "discarded";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<KeptState>> KeptState::Open(
    const KeptStateOptions& options,
    absl::flat_hash_map<std::string, UniqueFd> passed) {
  if (KeptByServiceManager(options) && !ServiceManagerListening()) {
    return NeedServiceManager();
  }
  std::unique_ptr<KeptState> kept(new KeptState(options));
  kept->opened_at_ = NowSeconds();
  auto log = Logger("state");
  auto slab = passed.find(kSlabFdName);
  if (slab != passed.end()) kept->slab_fd_ = std::move(slab->second);
  auto state = passed.find(kStateFdName);
  if (state == passed.end()) {
    if (kept->slab_fd_.valid()) {
      // A slab without its state: its pages' owners are unknown.
      kept->Discard(absl::DataLossError(
          "the service manager kept a KV slab but no state journal"));
    }
    return kept;
  }
  absl::StatusOr<std::pair<std::unique_ptr<StateJournal>, RecoveredJournal>>
      opened = StateJournal::Open(std::move(state->second));
  if (!opened.ok()) {
    if (opened.status().code() == absl::StatusCode::kFailedPrecondition &&
        !options.discard) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the kept state is not one this build can take over: ",
          opened.status().message(),
          ". Start the build that wrote it, or start with --discard_state "
          "(every session and its KV is lost)"));
    }
    kept->Discard(opened.status());
    if (opened.status().code() == absl::StatusCode::kFailedPrecondition) {
      kept->outcome_ = KeptStateOutcome::kDiscarded;
    }
    return kept;
  }
  RecoveredJournal& recovered = opened->second;
  absl::StatusOr<DecodedSnapshot> snapshot =
      recovered.snapshot.empty()
          ? absl::DataLossError("the kept journal holds no snapshot")
          : DecodeSnapshot(recovered.snapshot);
  if (!snapshot.ok()) {
    kept->Discard(snapshot.status());
    return kept;
  }
  if (recovered.creator != CreatorFor(snapshot->fingerprint)) {
    kept->Discard(absl::DataLossError(
        "the kept journal's creator does not match its snapshot"));
    return kept;
  }
  if (absl::Status refused = TakeOverRefusal(options, *snapshot);
      !refused.ok()) {
    if (!options.discard) {
      return absl::FailedPreconditionError(absl::StrCat(
          refused.message(),
          ". Start the build or the flags that kept it, or start with "
          "--discard_state (every session and its KV is lost)"));
    }
    kept->Discard(refused);
    kept->outcome_ = KeptStateOutcome::kDiscarded;
    return kept;
  }
  kept->journal_ = std::move(opened->first);
  kept->record_format_ = RecordFormatFor(recovered.format_version);
  kept->state_format_ = StateFormatFor(recovered.format_version);
  kept->state_ = std::move(snapshot->state);
  kept->identity_ = snapshot->identity;
  kept->records_ = std::move(recovered.records);
  kept->outcome_ = KeptStateOutcome::kRecovered;
  log->info(
      "kept state found: start {} of this pool, {} records after its "
      "snapshot{}",
      kept->identity_.starts + 1, kept->records_.size(),
      recovered.torn_bytes > 0
          ? absl::StrFormat(" (an append of %d bytes never committed: its "
                            "operation was never answered)",
                            recovered.torn_bytes)
          : std::string());
  return kept;
}

void KeptState::Discard(const absl::Status& why) {
  outcome_ = KeptStateOutcome::kCorrupt;
  reason_ = std::string(why.message());
  journal_.reset();
  slab_fd_.reset();
  state_ = PoolState();
  records_.clear();
  identity_ = DaemonIdentity();
  Logger("state")->error(
      "the kept state is not used ({}): starting a fresh pool and a fresh KV "
      "slab; every session of the last run is gone",
      reason_);
  // The store's copies go too, so that no later start finds them.
  if (KeptByServiceManager(options_) && ServiceManagerListening()) {
    RemoveStoredFds(kStateFdName).IgnoreError();
    RemoveStoredFds(kSlabFdName).IgnoreError();
  }
}

absl::Status KeptState::Replay(PagePool& pool) {
  replaying_ = true;
  DecodedPoolChange change;
  for (const JournalRecord& record : records_) {
    if (record.kind != kPoolChangeRecord) {
      replaying_ = false;
      return absl::DataLossError(absl::StrFormat(
          "kept record %d: unknown kind %d", replayed_records_, record.kind));
    }
    absl::Status applied =
        DecodePoolChange(record.payload, pool.geometry(), &change);
    if (applied.ok()) applied = pool.Replay(change.change());
    if (!applied.ok()) {
      replaying_ = false;
      return absl::DataLossError(absl::StrFormat(
          "kept record %d: %s", replayed_records_, applied.message()));
    }
    ++replayed_records_;
  }
  replaying_ = false;
  records_.clear();
  records_.shrink_to_fit();
  return absl::OkStatus();
}

absl::Status KeptState::StartKeeping(PagePool& pool, int slab_fd,
                                     DaemonIdentity identity) {
  const bool store = KeptByServiceManager(options_);
  if (store && !ServiceManagerListening()) return NeedServiceManager();
  identity.starts = identity_.starts + 1;
  identity_ = identity;
  const bool fresh = journal_ == nullptr;
  if (fresh) {
    UniqueFd fd(
        memfd_create("pagealloc-state", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd.valid()) {
      return absl::InternalError(
          absl::StrCat("memfd_create (state journal): ", strerror(errno)));
    }
    StateJournalOptions journal_options;
    journal_options.snapshot_capacity_bytes =
        options_.snapshot_capacity_bytes > 0
            ? options_.snapshot_capacity_bytes
            : SnapshotCapacityFor(pool.geometry().num_pages,
                                  options_.max_owners);
    journal_options.log_capacity_bytes = options_.log_capacity_bytes;
    journal_options.creator = CreatorFor(options_.fingerprint);
    ASSIGN_OR_RETURN(journal_,
                     StateJournal::Create(std::move(fd), journal_options));
    record_format_ = RecordFormatFor(StateJournal::kFormatVersion);
    state_format_ = StateFormatFor(StateJournal::kFormatVersion);
  }
  // The state as it stands now (recovered and replayed, or fresh), as the
  // base the records that follow apply to.
  RETURN_IF_ERROR(journal_->WriteSnapshot(EncodeSnapshot(pool.ExportState())));
  snapshots_++;
  // The slab before the state: a start that finds a state finds its slab.
  // A start that finds the slab alone discards it (Open).
  kept_slab_fd_ = slab_fd;
  if (slab_fd >= 0 && store && fresh) {
    RemoveStoredFds(kSlabFdName).IgnoreError();
    RETURN_IF_ERROR(StoreFd(kSlabFdName, slab_fd));
  }
  if (store && fresh) {
    RemoveStoredFds(kStateFdName).IgnoreError();
    RETURN_IF_ERROR(StoreFd(kStateFdName, journal_->fd()));
  }
  keeping_ = true;
  keeping_flag_ = true;
  log_bytes_used_ = journal_->log_bytes_used();
  recovery_seconds_ = NowSeconds() - opened_at_;
  return absl::OkStatus();
}

absl::string_view KeptState::EncodeSnapshot(const PoolState& state) {
  // The pool's state is encoded in place behind the header, whose size
  // field is filled in after: no second copy of a state of megabytes.
  SnapshotHeader header{kSnapshotMagic,
                        kSnapshotVersion,
                        identity_.slab_id,
                        identity_.starts,
                        state.num_pages,
                        state.page_size,
                        options_.fingerprint.size(),
                        /*state_bytes=*/0};
  std::string& out = snapshot_scratch_;
  out.assign(reinterpret_cast<const char*>(&header), sizeof(header));
  out += options_.fingerprint;
  const size_t state_start = out.size();
  EncodePoolState(state, &out, state_format_);
  header.state_bytes = out.size() - state_start;
  std::memcpy(out.data(), &header, sizeof(header));
  return out;
}

void KeptState::Record(const PoolChange& change) {
  if (replaying_ || !keeping_) return;
  // A journal taken over in an older format keeps it (a rollback may take
  // it back): a change it cannot hold, pages beginning to await release, is
  // not kept there. They stay their session's after a restart, as with
  // the build that made the file. Before record format 4 the calls' tags
  // are left out too (the encoder drops them): KeepsCallTags says so.
  if (!PoolChangeFormatHolds(record_format_, change.kind)) return;
  scratch_.clear();
  EncodePoolChange(change, &scratch_, record_format_);
  const absl::string_view parts[] = {scratch_};
  absl::Status appended = journal_->Append(kPoolChangeRecord, parts);
  if (absl::IsResourceExhausted(appended)) {
    // The log is full: the pool snapshots right after this record
    // (WantsSnapshot), so it is enough that the snapshot covers it. Ask
    // for it by remembering the record is pending.
    snapshot_pending_ = true;
    return;
  }
  if (!appended.ok()) {
    Break(appended);
    return;
  }
  records_appended_++;
  record_bytes_ += scratch_.size();
  log_bytes_used_ = journal_->log_bytes_used();
}

bool KeptState::WantsSnapshot() {
  if (!keeping_) return false;
  // Half the log: a snapshot then costs one pass over the pool's state for
  // every half-log of records, and the log never fills between two.
  return snapshot_pending_ ||
         journal_->log_bytes_used() * 2 > journal_->log_capacity();
}

void KeptState::WriteSnapshot(const PoolState& state) {
  if (!keeping_) return;
  absl::Status written = journal_->WriteSnapshot(EncodeSnapshot(state));
  if (!written.ok()) {
    Break(written);
    return;
  }
  snapshot_pending_ = false;
  snapshots_++;
  log_bytes_used_ = journal_->log_bytes_used();
}

void KeptState::Break(const absl::Status& why) {
  keeping_ = false;
  keeping_flag_ = false;
  failures_++;
  Logger("state")->error(
      "the pool's state can no longer be kept ({}): dropped from the "
      "service manager's store (or no longer offered to a successor); a "
      "restart now starts a fresh pool",
      std::string(why.message()));
  if (KeptByServiceManager(options_)) {
    RemoveStoredFds(kStateFdName).IgnoreError();
    RemoveStoredFds(kSlabFdName).IgnoreError();
  }
  if (break_observer_) break_observer_();
}

absl::StatusOr<std::vector<std::pair<std::string, int>>>
KeptState::KeptDescriptors() const {
  if (!keeping_flag_.load()) {
    return absl::FailedPreconditionError(
        "this daemon's pool state is not kept (never started, or broken: "
        "its log says why)");
  }
  std::vector<std::pair<std::string, int>> fds;
  if (kept_slab_fd_ >= 0) fds.emplace_back(kSlabFdName, kept_slab_fd_);
  fds.emplace_back(kStateFdName, journal_->fd());
  return fds;
}

absl::Status KeptState::CheckTakeOver(const KeptStateOptions& options,
                                      int state_fd) {
  UniqueFd fd(fcntl(state_fd, F_DUPFD_CLOEXEC, 0));
  if (!fd.valid()) {
    return absl::InternalError(
        absl::StrCat("dup (state journal): ", strerror(errno)));
  }
  absl::StatusOr<std::pair<std::unique_ptr<StateJournal>, RecoveredJournal>>
      opened = StateJournal::Open(std::move(fd));
  if (!opened.ok()) {
    // A format this build cannot read is final; any other failure may be
    // a write in progress, and Open decides once the writer has stopped.
    if (opened.status().code() != absl::StatusCode::kFailedPrecondition ||
        options.discard) {
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(
        absl::StrCat("the kept state is not one this build can take over: ",
                     opened.status().message()));
  }
  absl::StatusOr<DecodedSnapshot> snapshot =
      DecodeSnapshot(opened->second.snapshot);
  if (!snapshot.ok() || options.discard) return absl::OkStatus();
  return TakeOverRefusal(options, *snapshot);
}

KeptStateStats KeptState::stats() const {
  KeptStateStats stats;
  stats.outcome = outcome_;
  stats.reason = reason_;
  stats.keeping = keeping_flag_;
  stats.outlives_crash =
      stats.keeping &&
      (KeptByServiceManager(options_) ||
       (crash_survival_probe_ != nullptr && crash_survival_probe_()));
  stats.records = records_appended_;
  stats.record_bytes = record_bytes_;
  stats.snapshots = snapshots_;
  stats.failures = failures_;
  stats.log_bytes_used = log_bytes_used_;
  stats.log_capacity_bytes = options_.log_capacity_bytes;
  stats.replayed_records = replayed_records_;
  stats.recovery_seconds = recovery_seconds_;
  stats.identity = identity_;
  return stats;
}

}  // namespace pagealloc
