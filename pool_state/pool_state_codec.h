// The binary encodings of a PagePool's state (PoolState) and of its change
// records (PoolChange), as the daemon's crash-consistent file stores them:
// a snapshot as opaque bytes and a log of records (docs/design.md, section
// 16). The file frames, orders and checksums the bytes; this codec owns
// what is inside them.
//
// Hand-written rather than protobuf: EncodePoolChange runs on the
// allocation path under the pool's lock for every batch (a 256-request
// decode batch takes about 34 us end to end), and a protobuf message
// allocates per message and per repeated field. This encoder computes the
// record's size, grows the caller's buffer once (not at all once it is
// warm) and stores fixed-width fields.
//
// The format. Every integer is little-endian and fixed width (u8, u32, i32,
// u64, i64); a bool is a u8 that is 0 or 1; a key is its 32 bytes; a
// string is a u32 length and its bytes. Nothing is aligned.
//
// A change record (kPoolChangeFormatVersion 4; version 3 is version 4
// without the calls' tags, version 2 is version 3 without kAwaitRelease,
// and version 1 differs from 2 only in kMatchPrefix, below):
//   u8 version, u8 kind (PoolChangeKind), then by kind:
//   kAddOwner (1):     u64 owner, i64 quota_pages, string metadata
//                      (<= kMaxOwnerMetadataBytes)
//   kRemoveOwner (2):  u64 owner
//   kCheckpoint (5), kClearOwner (7): u64 owner, tag
//   kAllocate (3):     u32 requests, u32 calls, bool launch_failed,
//                      [launch_failed: u32 status code (1..16), string
//                      message (<= kMaxLaunchMessageBytes; longer ones are
//                      cut)], then per request 42 bytes: u8 kind
//                      (RequestKind), u8 flags (bit 0: it had a
//                      destination; the other bits 0), u64 owner, i64
//                      index, i64 prefix_len, i64 seq_len, i64 last_loc;
//                      then per call 18 bytes: i64 num_requests, bool
//                      all_or_nothing, tag (CallSpan.call) (versions 1 to
//                      3: 9 bytes, without the tag)
//   kFree (4):         u64 owner, u32 pages, u32 shared_pages, i64 each,
//                      tag
//   kRollback (6):     u64 owner, u64 checkpoint_id, tag
//   kClearPool (8):    bool force
//   kPublish (9):      u64 owner, bool pin, bool has_parent, [key parent],
//                      u32 n, n x i64 page, n x key
//   kMatchPrefix (10): u64 owner, bool adopt, bool refused,
//                      u32 keys_looked_up, u32 pages_found (<= it),
//                      u32 n (pages_found for an adopt that was not
//                      refused, else 0), n x i64 page;
//                      version 1: u64 owner, bool adopt, bool refused,
//                      u32 n, n x key (the keys the caller gave)
//   kUnpin (11):       u64 owner, u32 n, n x i64 page
//   kResetPrefixCache (12): nothing
//   kAwaitRelease (13): u64 owner, u32 n, n x i64 page, tag (version 3
//                      on; version 3 without the tag)
// where a tag (version 4 on; versions 1 to 3 have none, and those fields
// end before it) is 9 bytes: u64 call id, bool retry (PoolChange.call,
// CallTag). A retry names its call: retry 1 with id 0 is malformed, and
// the encoder writes an untagged call's retry flag as 0 (the pool keeps
// nothing of an untagged call).
//
// A state (kPoolStateFormatVersion 3; version 2 is version 3 without the
// owners' kept_calls, and version 1 is version 2 without their
// awaiting_release lists), the fields of PoolState in order:
//   "PPST", u32 version, u32 semantics_version, i64 num_pages,
//   i64 page_size, u8 free_policy, u8 semantics, bool scrub, u8 0,
//   i64 max_pinned_pages_per_owner, i64 ring_head,
//   u64 n + n x i64 free_pages, u64 n + n x i64 parked_pages,
//   (num_pages + 1) x u64 owner_of, allocated_once as a bitmap of
//   ceil((num_pages + 1) / 8) bytes (page p is bit p % 8 of byte p / 8),
//   [scrub: (num_pages + 1) x u64 last_owner],
//   u64 owners, each: u64 id, i64 quota_pages, string metadata,
//     u64 next_checkpoint_id, u32 n + n x (u64 id, u64 log_position),
//     u64 n + n x i64 given_log + given_live as a bitmap of ceil(n / 8)
//     bytes, u64 n + n x (i64 page, i64 count) refs, u64 n + n x i64 pins,
//     [version 2 on: u64 n + n x i64 awaiting_release],
//     [version 3: u32 n (<= kKeptCallsPerOwner) + n kept calls, each
//     u64 id, u32 parts, u64 order, i64 freed, u64 checkpoint_id,
//     i64 returned, u64 m + m x i64 pages];
//   u64 entries, each 85 bytes: i64 page, key, bool has_parent, key parent,
//     i64 count, i32 pins;
//   u64 n + n x i64 prefix_lru; the 16 counters as i64, in PoolCounters'
//   order.
//
// Versions: a decoder takes exactly the versions it knows (records 1 to
// 4, states 1 to 3) and refuses others with INVALID_ARGUMENT; what an older
// version does not hold decodes as its default (no tags: untagged calls;
// no awaiting_release, no kept_calls: empty). An encoder writes an older
// version for a file that older builds may take back (docs/design.md,
// section 16), and drops what that version cannot hold: a record of a
// kind it lacks (kAwaitRelease before 3) is not written at all; the
// calls' tags are left out of records before version 4 (the record is
// still written, untagged); the owners' kept_calls are left out of states
// before version 3, and their awaiting_release lists out of version 1.
// Any change to a layout, a field's meaning or the set of kinds is a new
// version, documented here and in docs/design.md; a change to what
// operations do to the state is a new kPoolSemanticsVersion
// (pool_state.h), which CreateFromState checks.
//
// Decoding trusts nothing it reads: every read is bounds-checked, every
// enum and bool range-checked, every count bounded by the pool's geometry
// (the caller's, never the bytes') and by the bytes left before anything is
// reserved, so hostile input costs at most O(its length) memory. Malformed
// bytes (truncated, out of range, trailing) are DATA_LOSS. Structure is all
// the decoder checks: whether a state is consistent is CreateFromState's
// business, whether a record applies Replay's, and whether the bytes are
// the ones written (a checksum) the file's.

#ifndef PAGEALLOC_POOL_STATE_POOL_STATE_CODEC_H_
#define PAGEALLOC_POOL_STATE_POOL_STATE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "allocator/pool_change_log.h"
#include "allocator/pool_state.h"
#include "allocator/prefix_index.h"
#include "allocator/requests.h"

namespace pagealloc {

// Records are written in kPoolChangeFormatVersion and read in every
// version from kMinPoolChangeFormatVersion on.
inline constexpr uint8_t kPoolChangeFormatVersion = 4;
inline constexpr uint8_t kMinPoolChangeFormatVersion = 1;
// States likewise.
inline constexpr uint32_t kPoolStateFormatVersion = 3;
inline constexpr uint32_t kMinPoolStateFormatVersion = 1;

// Whether record format `format` can hold a record of `kind` (every kind
// but kAwaitRelease from format 1, that one from 3). A format that holds a
// kind may still drop some of its fields: the calls' tags before format 4
// (PoolChangeFormatHoldsTags).
bool PoolChangeFormatHolds(uint8_t format, PoolChangeKind kind);
// Whether record format `format` keeps the calls' tags (CallTag): format 4
// on. A file of an older format forgets which calls took effect, so that
// a retry answered from it could run a call twice.
inline constexpr bool PoolChangeFormatHoldsTags(uint8_t format) {
  return format >= 4;
}
// Most bytes of a failed launch's message a record keeps.
inline constexpr size_t kMaxLaunchMessageBytes = 1024;

// Returns the size of `change`'s encoding in record format `format`. O(1).
size_t EncodedPoolChangeSize(const PoolChange& change,
                             uint8_t format = kPoolChangeFormatVersion);

// Appends `change`'s encoding in record format `format` to `out`.
// Allocates only when `out`'s capacity is short (a caller that clears and
// reuses one string allocates once it is warm). O(the record's size).
// Format 1 is for a file that builds reading only format 1 may take over
// (docs/design.md, section 16): its match records need `change.keys`,
// which the pool's records carry beside what the walk found. Formats 1
// to 3 leave out the calls' tags.
// REQUIRES: kMinPoolChangeFormatVersion <= format <= kPoolChangeFormatVersion
// and PoolChangeFormatHolds(format, change.kind).
void EncodePoolChange(const PoolChange& change, std::string* out,
                      uint8_t format = kPoolChangeFormatVersion);

// A decoded change record: the PoolChange view and the storage it points
// into. Decoding into the same object again reuses the storage.
//
// This class is thread-compatible.
class DecodedPoolChange {
 public:
  DecodedPoolChange() = default;
  DecodedPoolChange(const DecodedPoolChange&) = delete;
  DecodedPoolChange& operator=(const DecodedPoolChange&) = delete;

  // The record; valid until the next DecodePoolChange into this object.
  // Requests that had a destination point at RecordedDestination().
  const PoolChange& change() const { return change_; }

 private:
  friend absl::Status DecodePoolChange(absl::string_view bytes,
                                       const PoolGeometry& geometry,
                                       DecodedPoolChange* out);

  PoolChange change_;
  std::string metadata_;
  std::vector<AllocRequest> requests_;
  std::vector<CallSpan> calls_;
  absl::Status launch_failure_;
  std::vector<int64_t> pages_;
  std::vector<int64_t> shared_pages_;
  std::vector<PrefixKey> keys_;
  PrefixKey parent_key_{};
};

// Decodes one record of a pool of `geometry` (the daemon's own, which
// bounds the counts) into `out`. Returns DATA_LOSS for malformed bytes,
// INVALID_ARGUMENT for a format version this decoder does not know; `out`
// is then unspecified.
absl::Status DecodePoolChange(absl::string_view bytes,
                              const PoolGeometry& geometry,
                              DecodedPoolChange* out);

// Appends `state`'s encoding in state format `format` to `out` (formats 1
// and 2 leave out the owners' kept_calls, format 1 their awaiting_release
// lists too). O(pages + owners' lists).
// REQUIRES: kMinPoolStateFormatVersion <= format <= kPoolStateFormatVersion.
void EncodePoolState(const PoolState& state, std::string* out,
                     uint32_t format = kPoolStateFormatVersion);

// Decodes a state of a pool of `geometry` (the daemon's own; a state of
// another geometry is DATA_LOSS). Returns DATA_LOSS for malformed bytes,
// INVALID_ARGUMENT for a format version this decoder does not know.
absl::StatusOr<PoolState> DecodePoolState(absl::string_view bytes,
                                          const PoolGeometry& geometry);

}  // namespace pagealloc

#endif  // PAGEALLOC_POOL_STATE_POOL_STATE_CODEC_H_
