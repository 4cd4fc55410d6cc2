// The state journal's wire format: the file's layout, as the writer
// (state_journal.cc) lays it out and recovery reads it back. The file
// outlives the process that wrote it, and a build of another version may
// read it: every offset here is pinned by a static_assert, and a change to
// any field's meaning or place is a new kFormatVersion.
//
// All integers are little-endian (the daemon runs on x86-64 and arm64).
// The file, FileLayout's parts in order, each page-aligned:
//
//   [0, 4096)        the header page: FileHeader at 0 (written once, by
//                    Create), the commit word at kCommitWordOffset.
//   slot 0, slot 1   two snapshot slots of slot_stride bytes: a SlotHeader,
//                    then the snapshot's bytes from kSlotDataOffset.
//   the log          log_capacity bytes of records, back to back from its
//                    start, each a RecordHeader, its payload, and zeros to
//                    the next multiple of 8.
//
// The commit word says which snapshot and which records are the state: the
// active slot is the one of the epoch it names (epoch & 1), the records are
// those in [0, tail) of the log. Everything else in the file (the inactive
// slot, the log past the tail, the header page's unused bytes) is scratch:
// recovery never reads it as state.

#ifndef PAGEALLOC_STATE_JOURNAL_FORMAT_H_
#define PAGEALLOC_STATE_JOURNAL_FORMAT_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace pagealloc {
namespace journal_format {

// The file's first 8 bytes; Create writes them last, so that a file whose
// Create never finished is refused as not a journal.
inline constexpr char kMagic[8] = {'P', 'A', 'J', 'O', 'U', 'R', 'N', 'L'};

// The format this build writes, and the oldest it reads.
//   1: the layout below.
//   2: the same layout. A file of format 2 may hold the daemon's records
//      in a newer format than a file of format 1 does (pool change record
//      format 2: kept_state), so that a build that cannot decode those
//      refuses the file at Open (FAILED_PRECONDITION: start the build that
//      wrote it) rather than finding an undecodable record in its replay.
//      A file keeps the format it was created with.
//   3: the same layout; the daemon's records and snapshots in it may be of
//      pool change record format 3 and pool state format 2 (pages awaiting
//      release: kept_state).
//   4: the same layout; the daemon's records and snapshots in it may be of
//      pool change record format 4 and pool state format 3 (the calls'
//      tags and each session's latest call, for retries by call id:
//      kept_state).
inline constexpr uint32_t kFormatVersion = 4;
inline constexpr uint32_t kMinReadableFormat = 1;

inline constexpr int64_t kPageBytes = 4096;
inline constexpr int64_t kMaxCreatorBytes = 256;
// Bounds on the capacities, which recovery reads from the file: 1 TiB of
// snapshot, 4 GiB of log (a record's payload length is 32 bits).
inline constexpr int64_t kMaxSnapshotCapacityBytes = int64_t{1} << 40;
inline constexpr int64_t kMaxLogCapacityBytes = int64_t{1} << 32;

// At offset 0. Every byte before header_crc is checked by it.
struct FileHeader {
  char magic[8];                   // kMagic
  uint32_t format_version;         // kFormatVersion of the build that made it
  uint32_t reserved;               // 0
  uint64_t snapshot_capacity;      // bytes each slot holds, <= kMax...
  uint64_t log_capacity;           // bytes of the log, a multiple of 8
  uint32_t creator_bytes;          // <= kMaxCreatorBytes
  char creator[kMaxCreatorBytes];  // StateJournalOptions.creator, then zeros
  uint32_t header_crc;             // crc32 of the 292 bytes before it
};
static_assert(offsetof(FileHeader, magic) == 0);
// A later format keeps magic and format_version where they are, so that
// every build can say which format it was handed.
static_assert(offsetof(FileHeader, format_version) == 8);
static_assert(offsetof(FileHeader, reserved) == 12);
static_assert(offsetof(FileHeader, snapshot_capacity) == 16);
static_assert(offsetof(FileHeader, log_capacity) == 24);
static_assert(offsetof(FileHeader, creator_bytes) == 32);
static_assert(offsetof(FileHeader, creator) == 36);
static_assert(offsetof(FileHeader, header_crc) == 292);
static_assert(sizeof(FileHeader) == 296);

// The commit word, in the header page on a cache line of its own. Bits
// 0..39: the log's committed tail in bytes (a multiple of 8); bits 40..55:
// the active snapshot's epoch mod 2^16 (its slot is epoch & 1); bits 56..63:
// a CRC-8 of bits 0..55 (polynomial 0x07, initial value 0xff), which finds
// any one corrupted byte of the word (a burst of at most 8 bits), so that no
// single flipped byte can move the tail back to an earlier record's end and
// drop committed records unnoticed. One 64-bit release store of it commits
// an append (a new tail) or a snapshot (a new epoch and a tail of 0).
inline constexpr int64_t kCommitWordOffset = 512;
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the commit word must be one store");
static_assert(sizeof(std::atomic<uint64_t>) == 8);
static_assert(kCommitWordOffset >= static_cast<int64_t>(sizeof(FileHeader)) &&
              kCommitWordOffset % 64 == 0);

inline constexpr int kTailBits = 40;
inline constexpr int kEpochTagBits = 16;
inline constexpr uint64_t kTailMask = (uint64_t{1} << kTailBits) - 1;
inline constexpr uint64_t kEpochTagMask = (uint64_t{1} << kEpochTagBits) - 1;
static_assert(kMaxLogCapacityBytes <= static_cast<int64_t>(kTailMask));

// At the start of each snapshot slot; the snapshot's bytes follow at
// kSlotDataOffset. crc covers the header's bytes after it and the
// snapshot's `length` bytes.
struct SlotHeader {
  uint32_t crc;
  uint32_t reserved;  // 0
  uint64_t epoch;     // the snapshot's epoch: 0 for Create's empty one
  uint64_t length;    // <= snapshot_capacity
};
static_assert(offsetof(SlotHeader, crc) == 0);
static_assert(offsetof(SlotHeader, epoch) == 8);
static_assert(offsetof(SlotHeader, length) == 16);
static_assert(sizeof(SlotHeader) == 24);
inline constexpr int64_t kSlotDataOffset = 64;

// One record of the log. crc covers the header's bytes after it, the
// payload and the zero padding: every byte of a committed record is checked.
// The marker tells the header of an append that never committed (counted
// as torn) from zeros and other scratch past the tail.
inline constexpr uint32_t kRecordMarker = 0x4345524a;  // "JREC"
struct RecordHeader {
  uint32_t crc;
  uint32_t payload_bytes;
  uint32_t kind;      // the caller's
  uint32_t marker;    // kRecordMarker
  uint64_t epoch;     // the snapshot's epoch the record follows
  uint64_t sequence;  // 0 for the first record after that snapshot
};
static_assert(offsetof(RecordHeader, crc) == 0);
static_assert(offsetof(RecordHeader, payload_bytes) == 4);
static_assert(offsetof(RecordHeader, kind) == 8);
static_assert(offsetof(RecordHeader, marker) == 12);
static_assert(offsetof(RecordHeader, epoch) == 16);
static_assert(offsetof(RecordHeader, sequence) == 24);
static_assert(sizeof(RecordHeader) == 32);
inline constexpr int64_t kRecordHeaderBytes = sizeof(RecordHeader);

constexpr int64_t RoundUp(int64_t value, int64_t to) {
  return (value + to - 1) / to * to;
}

// Bytes a record with `payload_bytes` of payload takes in the log.
constexpr int64_t RecordBytes(int64_t payload_bytes) {
  return RoundUp(kRecordHeaderBytes + payload_bytes, 8);
}

// Byte offsets of a journal's parts, from its capacities.
struct FileLayout {
  int64_t slot_stride = 0;
  int64_t slot_offset[2] = {0, 0};
  int64_t log_offset = 0;
  int64_t file_bytes = 0;
};

// REQUIRES: 0 <= snapshot_capacity <= kMaxSnapshotCapacityBytes,
// 0 <= log_capacity <= kMaxLogCapacityBytes (no overflow then).
constexpr FileLayout LayoutFor(int64_t snapshot_capacity,
                               int64_t log_capacity) {
  FileLayout layout;
  layout.slot_stride = RoundUp(kSlotDataOffset + snapshot_capacity, kPageBytes);
  layout.slot_offset[0] = kPageBytes;
  layout.slot_offset[1] = kPageBytes + layout.slot_stride;
  layout.log_offset = kPageBytes + 2 * layout.slot_stride;
  layout.file_bytes = layout.log_offset + RoundUp(log_capacity, kPageBytes);
  return layout;
}

namespace internal {
constexpr std::array<uint8_t, 256> MakeCrc8Table() {
  std::array<uint8_t, 256> table{};
  for (int i = 0; i < 256; ++i) {
    uint8_t crc = static_cast<uint8_t>(i);
    for (int bit = 0; bit < 8; ++bit) {
      crc = static_cast<uint8_t>((crc & 0x80) ? (crc << 1) ^ 0x07 : crc << 1);
    }
    table[i] = crc;
  }
  return table;
}
inline constexpr std::array<uint8_t, 256> kCrc8Table = MakeCrc8Table();

// CRC-8 of the word's low 7 bytes, lowest first.
constexpr uint8_t Crc8Of56Bits(uint64_t bits) {
  uint8_t crc = 0xff;
  for (int i = 0; i < 7; ++i) {
    crc = kCrc8Table[crc ^ static_cast<uint8_t>(bits >> (8 * i))];
  }
  return crc;
}
}  // namespace internal

constexpr uint64_t EpochTag(uint64_t epoch) { return epoch & kEpochTagMask; }

// REQUIRES: tail <= kMaxLogCapacityBytes.
constexpr uint64_t EncodeCommitWord(uint64_t epoch, uint64_t tail) {
  const uint64_t bits = (EpochTag(epoch) << kTailBits) | (tail & kTailMask);
  return (uint64_t{internal::Crc8Of56Bits(bits)} << 56) | bits;
}

struct CommitState {
  uint64_t epoch_tag = 0;  // EpochTag of the active snapshot's epoch
  uint64_t tail = 0;       // bytes of committed records
};

// nullopt when the word's CRC-8 does not match.
constexpr std::optional<CommitState> DecodeCommitWord(uint64_t word) {
  const uint64_t bits = word & ((uint64_t{1} << 56) - 1);
  if (internal::Crc8Of56Bits(bits) != (word >> 56)) return std::nullopt;
  return CommitState{bits >> kTailBits, bits & kTailMask};
}

}  // namespace journal_format
}  // namespace pagealloc

#endif  // PAGEALLOC_STATE_JOURNAL_FORMAT_H_
