#include "state_journal/state_journal.h"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace pagealloc {
namespace {

namespace jf = journal_format;

// The crc32 of zlib and gzip (reflected, polynomial 0xEDB88320), chained
// as zlib's crc32(crc, ...) is: ISA-L's carry-less-multiply version, 4-8
// times faster than zlib's tables on this format's records (a 256-request
// decode's record is about 11 KB, and its crc is taken under the pool's
// lock on every call). An empty piece leaves the running value as it is.
uint32_t Crc(uint32_t crc, const void* data, size_t bytes) {
  if (bytes == 0) return crc;
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), bytes);
}

// Errors that mean "no memory for this now", as opposed to a broken system.
bool OutOfMemory(int error) {
  return error == ENOSPC || error == ENOMEM || error == EFBIG ||
         error == EDQUOT;
}

absl::Status SystemError(absl::string_view what, int error) {
  return absl::Status(OutOfMemory(error) ? absl::StatusCode::kResourceExhausted
                                         : absl::StatusCode::kInternal,
                      absl::StrFormat("state journal: %s failed: %s", what,
                                      std::strerror(error)));
}

absl::Status ValidateOptions(const StateJournalOptions& options) {
  if (options.snapshot_capacity_bytes < 0 ||
      options.snapshot_capacity_bytes > jf::kMaxSnapshotCapacityBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "snapshot_capacity_bytes (%d) is not in [0, %d]",
        options.snapshot_capacity_bytes, jf::kMaxSnapshotCapacityBytes));
  }
  if (options.log_capacity_bytes < jf::kRecordHeaderBytes ||
      options.log_capacity_bytes > jf::kMaxLogCapacityBytes ||
      options.log_capacity_bytes % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "log_capacity_bytes (%d) is not a multiple of 8 in [%d, %d]",
        options.log_capacity_bytes, jf::kRecordHeaderBytes,
        jf::kMaxLogCapacityBytes));
  }
  if (static_cast<int64_t>(options.creator.size()) > jf::kMaxCreatorBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("creator is %d bytes, more than %d",
                        options.creator.size(), jf::kMaxCreatorBytes));
  }
  return absl::OkStatus();
}

uint32_t HeaderCrc(const jf::FileHeader& header) {
  return Crc(0, &header, offsetof(jf::FileHeader, header_crc));
}

// crc of a slot header's bytes after its crc field, then of `data`.
uint32_t SlotCrc(const jf::SlotHeader& header, const char* data, size_t bytes) {
  const char* raw = reinterpret_cast<const char*>(&header);
  return Crc(Crc(0, raw + 4, sizeof(header) - 4), data, bytes);
}

// The whole file, mapped read-write; unmapped unless released.
class Mapping {
 public:
  Mapping(char* base, size_t bytes) : base_(base), bytes_(bytes) {}
  ~Mapping() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  char* release() { return std::exchange(base_, nullptr); }

 private:
  char* base_;
  size_t bytes_;
};

absl::StatusOr<char*> MapFile(int fd, int64_t bytes) {
  void* base = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                    MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return SystemError("mmap", errno);
  return static_cast<char*>(base);
}

std::atomic<uint64_t>* CommitWordIn(char* base) {
  return reinterpret_cast<std::atomic<uint64_t>*>(base + jf::kCommitWordOffset);
}

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("state journal: ", what));
}

}  // namespace

int64_t StateJournal::FileSizeFor(const StateJournalOptions& options) {
  if (!ValidateOptions(options).ok()) return -1;
  return jf::LayoutFor(options.snapshot_capacity_bytes,
                       options.log_capacity_bytes)
      .file_bytes;
}

StateJournal::StateJournal(UniqueFd fd, char* base,
                           const jf::FileLayout& layout,
                           int64_t snapshot_capacity, int64_t log_capacity,
                           uint64_t epoch, int64_t tail, uint64_t next_sequence)
    : fd_(std::move(fd)),
      base_(base),
      layout_(layout),
      snapshot_capacity_(snapshot_capacity),
      log_capacity_(log_capacity),
      commit_word_(CommitWordIn(base)),
      log_(base + layout.log_offset),
      epoch_(epoch),
      tail_(tail),
      next_sequence_(next_sequence) {}

StateJournal::~StateJournal() {
  munmap(base_, static_cast<size_t>(layout_.file_bytes));
}

absl::StatusOr<std::unique_ptr<StateJournal>> StateJournal::Create(
    UniqueFd fd, const StateJournalOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  if (!fd.valid()) {
    return absl::InvalidArgumentError("state journal: no descriptor");
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return SystemError("fstat", errno);
  if (st.st_size != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "state journal: the file for a new journal is %d bytes, not empty "
        "(Create never writes over another journal)",
        st.st_size));
  }
  const jf::FileLayout layout = jf::LayoutFor(options.snapshot_capacity_bytes,
                                              options.log_capacity_bytes);
  if (ftruncate(fd.get(), layout.file_bytes) != 0) {
    return SystemError("ftruncate", errno);
  }
  // Pages of a tmpfs or memfd are otherwise taken when first stored to,
  // and a full tmpfs or a cgroup at its limit answers that store with
  // SIGBUS, in the middle of an Append.
  int error;
  do {
    error = posix_fallocate(fd.get(), 0, layout.file_bytes);
  } while (error == EINTR);
  if (error != 0) return SystemError("reserving the file's pages", error);
  // A memfd made with MFD_ALLOW_SEALING: nobody may resize it under our
  // mapping (SIGBUS). Other files answer F_GET_SEALS with EINVAL, and a
  // memfd without sealing reports F_SEAL_SEAL already; both are left so.
  const int seals = fcntl(fd.get(), F_GET_SEALS);
  if (seals >= 0 && (seals & F_SEAL_SEAL) == 0 &&
      fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
          0) {
    return SystemError("sealing the memfd", errno);
  }
  ASSIGN_OR_RETURN(char* base, MapFile(fd.get(), layout.file_bytes));
  Mapping mapping(base, layout.file_bytes);

  // The file is all zeros: lay out the header, slot 0's empty snapshot of
  // epoch 0 and a commit word naming it, and the magic last, so that a
  // process killed here leaves a file Open refuses as no journal.
  jf::FileHeader header;
  std::memset(&header, 0, sizeof(header));
  std::memcpy(header.magic, jf::kMagic, sizeof(header.magic));
  header.format_version = jf::kFormatVersion;
  header.snapshot_capacity = options.snapshot_capacity_bytes;
  header.log_capacity = options.log_capacity_bytes;
  header.creator_bytes = static_cast<uint32_t>(options.creator.size());
  std::memcpy(header.creator, options.creator.data(), options.creator.size());
  header.header_crc = HeaderCrc(header);
  std::memcpy(base + sizeof(header.magic),
              reinterpret_cast<const char*>(&header) + sizeof(header.magic),
              sizeof(header) - sizeof(header.magic));

  jf::SlotHeader slot;
  std::memset(&slot, 0, sizeof(slot));
  slot.crc = SlotCrc(slot, nullptr, 0);
  std::memcpy(base + layout.slot_offset[0], &slot, sizeof(slot));
  CommitWordIn(base)->store(jf::EncodeCommitWord(0, 0),
                            std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(base, header.magic, sizeof(header.magic));

  return std::unique_ptr<StateJournal>(new StateJournal(
      std::move(fd), mapping.release(), layout, options.snapshot_capacity_bytes,
      options.log_capacity_bytes, /*epoch=*/0, /*tail=*/0,
      /*next_sequence=*/0));
}

absl::StatusOr<std::pair<std::unique_ptr<StateJournal>, RecoveredJournal>>
StateJournal::Open(UniqueFd fd) {
  if (!fd.valid()) {
    return absl::InvalidArgumentError("state journal: no descriptor");
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return SystemError("fstat", errno);
  if (st.st_size < jf::kPageBytes) {
    return Corrupt(absl::StrFormat(
        "the file is %d bytes, shorter than its header page (%d): truncated, "
        "or not a journal",
        st.st_size, jf::kPageBytes));
  }

  // The header, copied out once and checked before anything it says is
  // used: first what it is (magic, format), then that it is intact.
  jf::FileHeader header;
  ssize_t got;
  do {
    got = pread(fd.get(), &header, sizeof(header), 0);
  } while (got < 0 && errno == EINTR);
  if (got < 0) return SystemError("reading the header", errno);
  if (got != sizeof(header)) {
    return Corrupt(absl::StrFormat("the header is short (%d bytes read)", got));
  }
  if (std::memcmp(header.magic, jf::kMagic, sizeof(header.magic)) != 0) {
    return Corrupt(
        "bad magic: not a state journal, or its Create never finished");
  }
  // A format we cannot read may lay out its header otherwise, so its
  // version is reported before our checksum is tried on it.
  if (header.format_version < jf::kMinReadableFormat ||
      header.format_version > jf::kFormatVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "state journal format %d; this build reads %d..%d",
        header.format_version, jf::kMinReadableFormat, jf::kFormatVersion));
  }
  const uint32_t header_crc = HeaderCrc(header);
  if (header_crc != header.header_crc) {
    return Corrupt(absl::StrFormat(
        "header checksum mismatch (stored 0x%08x, computed 0x%08x)",
        header.header_crc, header_crc));
  }
  // Checksummed, yet still bounded: a checksum is no proof of sanity.
  if (header.reserved != 0 || header.creator_bytes > jf::kMaxCreatorBytes ||
      header.snapshot_capacity >
          static_cast<uint64_t>(jf::kMaxSnapshotCapacityBytes) ||
      header.log_capacity < static_cast<uint64_t>(jf::kRecordHeaderBytes) ||
      header.log_capacity > static_cast<uint64_t>(jf::kMaxLogCapacityBytes) ||
      header.log_capacity % 8 != 0) {
    return Corrupt(absl::StrFormat(
        "header out of range: creator of %d bytes, snapshot capacity %d, log "
        "capacity %d, reserved %d",
        header.creator_bytes, header.snapshot_capacity, header.log_capacity,
        header.reserved));
  }
  const int64_t snapshot_capacity =
      static_cast<int64_t>(header.snapshot_capacity);
  const int64_t log_capacity = static_cast<int64_t>(header.log_capacity);
  const jf::FileLayout layout = jf::LayoutFor(snapshot_capacity, log_capacity);
  if (st.st_size != layout.file_bytes) {
    return Corrupt(absl::StrFormat(
        "the file is %d bytes; its header's capacities (snapshot %d, log %d) "
        "make %d: truncated or resized",
        st.st_size, snapshot_capacity, log_capacity, layout.file_bytes));
  }

  ASSIGN_OR_RETURN(char* base, MapFile(fd.get(), layout.file_bytes));
  Mapping mapping(base, layout.file_bytes);

  const uint64_t word = CommitWordIn(base)->load(std::memory_order_acquire);
  const std::optional<jf::CommitState> commit = jf::DecodeCommitWord(word);
  if (!commit.has_value()) {
    return Corrupt(
        absl::StrFormat("commit word 0x%016x fails its check", word));
  }
  const int64_t tail = static_cast<int64_t>(commit->tail);
  if (tail > log_capacity || tail % 8 != 0) {
    return Corrupt(absl::StrFormat(
        "the log's committed tail (%d) is not a multiple of 8 within its "
        "capacity (%d)",
        tail, log_capacity));
  }

  // The active snapshot: the slot of the commit word's epoch.
  const int slot_index = static_cast<int>(commit->epoch_tag & 1);
  const char* slot = base + layout.slot_offset[slot_index];
  jf::SlotHeader slot_header;
  std::memcpy(&slot_header, slot, sizeof(slot_header));
  if (jf::EpochTag(slot_header.epoch) != commit->epoch_tag ||
      slot_header.reserved != 0 ||
      slot_header.length > static_cast<uint64_t>(snapshot_capacity)) {
    return Corrupt(absl::StrFormat(
        "snapshot slot %d does not hold the committed snapshot: epoch %d "
        "(the commit word's is %d mod 2^16), %d bytes of %d",
        slot_index, slot_header.epoch, commit->epoch_tag, slot_header.length,
        snapshot_capacity));
  }
  RecoveredJournal recovered;
  recovered.creator.assign(header.creator, header.creator_bytes);
  recovered.format_version = header.format_version;
  recovered.epoch = slot_header.epoch;
  recovered.snapshot.assign(slot + jf::kSlotDataOffset, slot_header.length);
  const uint32_t slot_crc = SlotCrc(slot_header, recovered.snapshot.data(),
                                    recovered.snapshot.size());
  if (slot_crc != slot_header.crc) {
    return Corrupt(absl::StrFormat(
        "snapshot of epoch %d (slot %d, %d bytes): checksum mismatch (stored "
        "0x%08x, computed 0x%08x)",
        slot_header.epoch, slot_index, slot_header.length, slot_header.crc,
        slot_crc));
  }

  // The committed records, [0, tail). Each bound is checked against the
  // tail before the bytes it names are read.
  const char* log = base + layout.log_offset;
  int64_t offset = 0;
  uint64_t sequence = 0;
  while (offset < tail) {
    if (tail - offset < jf::kRecordHeaderBytes) {
      return Corrupt(absl::StrFormat(
          "record %d at log offset %d: its header runs past the committed "
          "tail (%d)",
          sequence, offset, tail));
    }
    jf::RecordHeader record;
    std::memcpy(&record, log + offset, sizeof(record));
    if (record.payload_bytes > tail - offset - jf::kRecordHeaderBytes) {
      return Corrupt(absl::StrFormat(
          "record %d at log offset %d: its %d bytes of payload run past the "
          "committed tail (%d)",
          sequence, offset, record.payload_bytes, tail));
    }
    // Within the tail: offset, tail and the header are multiples of 8.
    const int64_t bytes = jf::RecordBytes(record.payload_bytes);
    JournalRecord out;
    out.kind = record.kind;
    out.payload.assign(log + offset + jf::kRecordHeaderBytes,
                       record.payload_bytes);
    char padding[8];
    const int64_t padding_bytes =
        bytes - jf::kRecordHeaderBytes - record.payload_bytes;
    std::memcpy(padding, log + offset + bytes - padding_bytes, padding_bytes);
    uint32_t crc =
        Crc(0, reinterpret_cast<const char*>(&record) + 4, sizeof(record) - 4);
    crc = Crc(crc, out.payload.data(), out.payload.size());
    crc = Crc(crc, padding, padding_bytes);
    if (crc != record.crc) {
      return Corrupt(absl::StrFormat(
          "record %d at log offset %d (%d bytes of payload): checksum "
          "mismatch (stored 0x%08x, computed 0x%08x)",
          sequence, offset, record.payload_bytes, record.crc, crc));
    }
    if (record.marker != jf::kRecordMarker) {
      return Corrupt(absl::StrFormat(
          "record %d at log offset %d has no record marker (0x%08x)", sequence,
          offset, record.marker));
    }
    if (record.epoch != recovered.epoch || record.sequence != sequence) {
      return Corrupt(absl::StrFormat(
          "record %d at log offset %d is record %d of epoch %d, not of the "
          "snapshot's epoch %d",
          sequence, offset, record.sequence, record.epoch, recovered.epoch));
    }
    recovered.records.push_back(std::move(out));
    offset += bytes;
    ++sequence;
  }

  // An append that began past the tail and never committed: its header
  // names the next record of this epoch. Only counted.
  if (log_capacity - tail >= jf::kRecordHeaderBytes) {
    jf::RecordHeader torn;
    std::memcpy(&torn, log + tail, sizeof(torn));
    if (torn.marker == jf::kRecordMarker && torn.epoch == recovered.epoch &&
        torn.sequence == sequence &&
        torn.payload_bytes <= log_capacity - tail - jf::kRecordHeaderBytes) {
      recovered.torn_bytes = jf::RecordBytes(torn.payload_bytes);
    }
  }

  std::unique_ptr<StateJournal> journal(new StateJournal(
      std::move(fd), mapping.release(), layout, snapshot_capacity, log_capacity,
      recovered.epoch, tail, sequence));
  return std::make_pair(std::move(journal), std::move(recovered));
}

void StateJournal::Store(char* to, const void* from, size_t bytes) {
  if (ABSL_PREDICT_FALSE(stores_left_ >= 0)) {
    if (static_cast<int64_t>(bytes) > stores_left_) {
      bytes = static_cast<size_t>(stores_left_);
      stores_dropped_ = true;
    }
    stores_left_ -= static_cast<int64_t>(bytes);
  }
  if (bytes != 0) std::memcpy(to, from, bytes);
}

void StateJournal::Commit(uint64_t word) {
  if (ABSL_PREDICT_FALSE(stores_left_ >= 0)) {
    if (stores_left_ == 0) {
      stores_dropped_ = true;
      return;
    }
    --stores_left_;
  }
  // Release: the record's or snapshot's bytes are stored before the word
  // that makes them the state (for the compiler on x86-64, for the CPU on
  // weaker ones).
  commit_word_->store(word, std::memory_order_release);
}

absl::Status StateJournal::Append(
    uint32_t kind, absl::Span<const absl::string_view> payload_parts) {
  int64_t payload_bytes = 0;
  for (absl::string_view part : payload_parts) {
    if (static_cast<int64_t>(part.size()) > log_capacity_ - payload_bytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "state journal: a record of more than %d bytes of payload does not "
          "fit a log of %d bytes",
          log_capacity_, log_capacity_));
    }
    payload_bytes += static_cast<int64_t>(part.size());
  }
  const int64_t bytes = jf::RecordBytes(payload_bytes);
  if (bytes > log_capacity_ - tail_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "state journal: a record of %d bytes (%d of payload) does not fit the "
        "log: %d of %d bytes used (a snapshot empties it)",
        bytes, payload_bytes, tail_, log_capacity_));
  }

  // The record goes past the tail, where recovery does not look; header
  // first, so that recovery can count a torn one, and its crc last, taken
  // in one pass over the record as it lies in the file (every crc32 call
  // has a fixed cost, which a record's few pieces would pay each).
  char* const at = log_ + tail_;
  jf::RecordHeader header;
  header.crc = 0;
  header.payload_bytes = static_cast<uint32_t>(payload_bytes);
  header.kind = kind;
  header.marker = jf::kRecordMarker;
  header.epoch = epoch_;
  header.sequence = next_sequence_;
  const char* raw = reinterpret_cast<const char*>(&header);
  Store(at + 4, raw + 4, sizeof(header) - 4);
  char* to = at + jf::kRecordHeaderBytes;
  for (absl::string_view part : payload_parts) {
    Store(to, part.data(), part.size());
    to += part.size();
  }
  static constexpr char kZeros[8] = {};
  Store(to, kZeros, bytes - jf::kRecordHeaderBytes - payload_bytes);
  const uint32_t crc = Crc(0, at + 4, bytes - 4);
  Store(at, &crc, sizeof(crc));

  Commit(jf::EncodeCommitWord(epoch_, tail_ + bytes));
  tail_ += bytes;
  ++next_sequence_;
  return absl::OkStatus();
}

absl::Status StateJournal::WriteSnapshot(absl::string_view snapshot) {
  if (static_cast<int64_t>(snapshot.size()) > snapshot_capacity_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "state journal: a snapshot of %d bytes does not fit its slot of %d",
        snapshot.size(), snapshot_capacity_));
  }
  // The slot not in use holds nothing recovery reads until the commit.
  const uint64_t epoch = epoch_ + 1;
  char* const slot = base_ + layout_.slot_offset[epoch & 1];
  jf::SlotHeader header;
  header.reserved = 0;
  header.epoch = epoch;
  header.length = snapshot.size();
  Store(slot + jf::kSlotDataOffset, snapshot.data(), snapshot.size());
  header.crc = SlotCrc(header, slot + jf::kSlotDataOffset, snapshot.size());
  Store(slot, &header, sizeof(header));

  // One store names the new slot and empties the log.
  Commit(jf::EncodeCommitWord(epoch, 0));
  epoch_ = epoch;
  tail_ = 0;
  next_sequence_ = 0;
  return absl::OkStatus();
}

}  // namespace pagealloc
