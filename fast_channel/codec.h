// The one codec of the fast channel's wire format (fast_channel/layout.h):
// the client library writes calls and reads answers through it, the daemon
// takes calls and writes answers through it.
//
// Trust. A channel's memory is writable by its client at any time, so the
// daemon's side never reads a size, count or capacity back from it: the
// codec's capacity comes from the daemon's own records, TakeCall copies a
// call out once (each header field read once, every count bounded before
// any array is copied) into daemon-private memory, and the answer writers
// bound every write by that capacity. The client's side trusts the daemon
// but still clamps what it reads to the capacity Register described.

#ifndef PAGEALLOC_FAST_CHANNEL_CODEC_H_
#define PAGEALLOC_FAST_CHANNEL_CODEC_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "fast_channel/layout.h"

namespace pagealloc {
namespace fast_channel {

// A channel's capacities, as the daemon created it.
struct Capacity {
  int32_t max_requests = 0;   // every array's length
  int32_t message_bytes = 0;  // the message area's size
};

// Whether `capacity` describes a channel the codec can work with
// (max_requests >= 1, message_bytes >= 64).
absl::Status ValidateCapacity(const Capacity& capacity);

// A call as a client posts it. Which arrays a kind uses: layout.h.
struct CallView {
  CallKind kind = CallKind::kDecode;
  uint32_t options = 0;  // k* option bits
  int64_t release_ring_up_to = 0;
  absl::Span<const int64_t> in0, in1, in2;
  absl::Span<const int64_t> free_first;
  // kFreeSlots / kFreePages: the release fence's value (layout.h); 0: none.
  uint64_t release_value = 0;
  // SessionRef.call_id (0: none; kRetry in `options` marks a retry).
  uint64_t call_id = 0;
  // kMatchPrefix: the chain's keys back to back, kKeyBytes bytes each (the
  // int64 arrays must then be empty: the keys take their memory). Packed,
  // as the channel holds them, so that posting is one copy.
  absl::string_view keys = {};
};

// A call as the daemon took it: copied out of shared memory, checked for
// shape (kind known, counts within capacity, option bits known). The
// vectors are reused from call to call (TakeCall only grows them).
struct TakenCall {
  CallKind kind = CallKind::kDecode;
  uint32_t options = 0;
  int64_t release_ring_up_to = 0;
  // kFreeSlots / kFreePages: the release fence's value (0: none); 0 for
  // every other kind, whatever the header says.
  uint64_t release_value = 0;
  // SessionRef.call_id (0: none, and always 0 for kMatchPrefix); a retry
  // (kRetry in `options`) always has one.
  uint64_t call_id = 0;
  int32_t num_requests = 0;
  // The arrays the kind uses hold num_requests values; the others are
  // empty spans. free_first holds num_free_first page ids.
  std::vector<int64_t> in0_storage, in1_storage, in2_storage, free_storage;
  absl::Span<const int64_t> in0, in1, in2, free_first;
  // kMatchPrefix: num_requests keys (empty for every other kind); the int64
  // arrays are empty then. A key is the daemon's prefix key type
  // (allocator/prefix_index.h's PrefixKey), so the daemon's match walks
  // this copy as it is, with no second copy into its own type.
  std::vector<Key> key_storage;
  absl::Span<const Key> keys;
  absl::string_view key(int32_t index) const {
    return absl::string_view(reinterpret_cast<const char*>(keys[index].data()),
                             kKeyBytes);
  }
};

// An allocation call's answer as the client reads it. The spans point into
// the channel and stay valid until the next call is posted.
struct AllocAnswerView {
  absl::Span<const int32_t> codes;  // one per request; 0 when accepted
  absl::Span<const int64_t> ring_offsets, counts, new_pages;
  // One per refused request, in order (a placeholder where the message
  // area ran out).
  std::vector<std::string> messages;
  int64_t ring_end = 0;
  int64_t pages_freed_first = 0;
  int32_t batch_requests = 0;
  uint64_t launch_id = 0;
  uint64_t completion_value = 0;
};

// Reads and writes one mapped channel. Copyable and cheap: it holds the
// base address and the capacity. Not thread-safe: one call in flight per
// channel, by the protocol.
class ChannelCodec {
 public:
  // `base` maps at least ChannelLayout(capacity).total_bytes bytes.
  // REQUIRES: ValidateCapacity(capacity).ok().
  ChannelCodec(void* base, const Capacity& capacity);

  const Capacity& capacity() const { return capacity_; }
  ChannelHeader* header() const { return header_; }

  // ---- Daemon side.

  // Writes the header fields a new channel starts with (the rest of the
  // region is zero). poller_sleeping starts at 1: the poller that will
  // serve the channel may be asleep, so the client's first call rings.
  void Initialize();
  // Tells the client whether to ring the doorbell after posting (see the
  // protocol in layout.h). Never read back by the daemon.
  void SetPollerSleeping(bool sleeping) {
    header_->poller_sleeping.store(sleeping ? 1 : 0, std::memory_order_seq_cst);
  }
  // The sequence number of the last call posted (the client's word).
  uint32_t PostedSeq() const {
    return header_->request_seq.load(std::memory_order_acquire);
  }
  // Copies the posted call into `call`. INVALID_ARGUMENT naming the field
  // when its kind, options or counts are malformed (nothing is copied then
  // beyond the header fields): an unknown kind or option bit, an option bit
  // of another kind (kAdopt is a match's only bit and only a match's), a
  // count outside [0, max_requests] (for kMatchPrefix: more keys than the
  // key area holds).
  absl::Status TakeCall(TakenCall* call) const;

  // Answers. A call is answered by either WriteRefusal, or by the
  // per-request writers (BeginResults, then Accepted/Refused for requests
  // 0..n-1 in order, then FinishResults), or by WriteOpValue, or (a
  // kMatchPrefix) by WriteMatchedPages; then Publish.
  void WriteRefusal(const absl::Status& status);
  void BeginResults();
  void Accepted(int32_t index, int64_t ring_offset, int64_t count,
                int64_t new_pages) {
    codes_[index] = 0;
    ring_offsets_[index] = ring_offset;
    counts_[index] = count;
    new_pages_[index] = new_pages;
  }
  void Refused(int32_t index, const absl::Status& status);
  void FinishResults(int32_t num_results, int64_t ring_end,
                     int64_t pages_freed_first, int32_t batch_requests,
                     uint64_t launch_id, uint64_t completion_value);
  void WriteOpValue(int64_t op_value);
  // A match's answer: `pages` into new_pages, op_value = their number.
  // INTERNAL, writing nothing, when they are more than the capacity (a
  // match finds at most one page per key, so this is a daemon bug).
  absl::Status WriteMatchedPages(absl::Span<const int64_t> pages);
  // Publishes the answer to call `seq` and wakes a sleeping client.
  void Publish(uint32_t seq);
  // The stale-answer fence (layout.h): records that the session ended and
  // why (truncated to kEndReasonBytes), then sets session_ended and wakes
  // a sleeping client. Call before any of the session's pages is freed,
  // and at most once per channel.
  void EndSession(absl::string_view reason);
  // The reserve's reclaim (layout.h): asks the client for its unused
  // reserve (`pages` wanted, a hint) and wakes its reserve thread.
  void AskForReserve(int64_t pages);
  // What the client reports of its reserve: hints for metrics, clamped to
  // >= 0, never used for a decision about pages.
  struct ReserveHints {
    int64_t pages = 0;
    int64_t refills = 0;
    int64_t returns = 0;
    // Whether the client has answered the latest ask.
    bool answered = true;
  };
  ReserveHints ReadReserveHints() const;
  // The release fence (layout.h): the client's release word, one load. The
  // caller keeps the monotonic maximum; the value is the client's word.
  uint64_t ReadReleaseWord() const;

  // ---- Client side.

  // Checks the header the daemon wrote: magic, version and capacity.
  absl::Status CheckHeader() const;
  // Writes `call` and posts it as call `seq`. INVALID_ARGUMENT (nothing
  // posted) when an array does not fit the capacity, or for a kMatchPrefix
  // when a key is not kKeyBytes long or an int64 array is not empty.
  absl::Status PostCall(const CallView& call, uint32_t seq);
  // Whether the poller may be asleep: read after PostCall, it says whether
  // the doorbell must be rung.
  bool PollerSleeping() const {
    return header_->poller_sleeping.load(std::memory_order_seq_cst) != 0;
  }
  bool Answered(uint32_t seq) const {
    return header_->response_seq.load(std::memory_order_acquire) == seq;
  }
  // The answered call's whole-call status.
  absl::Status CallStatus() const;
  // An answered allocation call's per-request results, which must number
  // `num_requests` (INTERNAL otherwise).
  absl::Status ReadAllocAnswer(int32_t num_requests,
                               AllocAnswerView* answer) const;
  // An answered Free's or Rollback's count.
  int64_t OpValue() const { return header_->op_value; }
  // An answered match's pages (they point into the channel and stay valid
  // until the next call is posted). INTERNAL when op_value is outside
  // [0, num_keys], the keys the call carried.
  absl::StatusOr<absl::Span<const int64_t>> ReadMatchedPages(
      int32_t num_keys) const;
  // The stale-answer fence (layout.h): whether the daemon has ended the
  // session. Load it after reading an answer; when true, the answer must
  // not be believed.
  // A header that reads zeros ended too: the daemon frees an ended
  // session's header page after a while, even where the client still maps
  // it (server/retired_channel_headers.h), and only the kernel writes the
  // zeros (hence the volatile read of the magic).
  bool SessionEnded() const {
    return header_->session_ended.load(std::memory_order_seq_cst) != 0 ||
           *static_cast<const volatile uint32_t*>(&header_->magic) !=
               fast_channel::kMagic;
  }
  // Why the daemon ended the session ("" while it lives).
  std::string EndReason() const;

  // The reserve's words (layout.h), for the client's reserve thread. These
  // may be called from any thread of the client.
  // The word the reserve thread sleeps on (FutexWait), and a wake of it.
  std::atomic<uint32_t>* reserve_bell() const { return &header_->reserve_bell; }
  void RingReserveBell() const;
  // The daemon's latest ask: its sequence number and pages wanted (a hint).
  uint32_t ReclaimSeq() const {
    return header_->reclaim_seq.load(std::memory_order_seq_cst);
  }
  int64_t ReclaimPages() const {
    return header_->reclaim_pages.load(std::memory_order_relaxed);
  }
  // Whether ask `seq` has been answered, and its answer (after the
  // return call).
  bool ReclaimAnswered(uint32_t seq) const {
    return header_->reclaim_answered.load(std::memory_order_acquire) == seq;
  }
  void AnswerReclaim(uint32_t seq) const {
    header_->reclaim_answered.store(seq, std::memory_order_release);
  }
  // The release fence's word (layout.h), which the client's stream writes
  // (any thread of the client).
  std::atomic<uint64_t>* release_word() const { return &header_->release_word; }
  // Reports the reserve's size and counts (hints for the daemon's metrics).
  void ReportReserve(int64_t pages, int64_t refills, int64_t returns) const;

 private:
  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }
  // Appends to the message area, truncated to fit the capacity.
  void AddMessage(absl::string_view text, bool length_prefixed);

  char* base_;
  Capacity capacity_;
  ChannelLayout layout_;
  ChannelHeader* header_;
  int32_t* codes_;
  int64_t* ring_offsets_;
  int64_t* counts_;
  int64_t* new_pages_;
  int32_t messages_used_ = 0;  // daemon side, while answering
};

}  // namespace fast_channel
}  // namespace pagealloc

#endif  // PAGEALLOC_FAST_CHANNEL_CODEC_H_
