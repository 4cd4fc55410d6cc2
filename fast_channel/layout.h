// The fast channel's shared-memory layout: allocation calls (and Free,
// Checkpoint, Rollback, MatchPrefix) through memory the daemon and one
// client map, for clients on the daemon's host. gRPC stays the control plane:
// Register opens the channel (RegisterResponse.fast_channel), KeepAlive holds
// the lease, ReleaseRing and GetStats go over gRPC.
//
// Why. An empty unary gRPC call costs more than the allocation it would
// carry (most of it thread wake-ups across cores inside gRPC). The channel
// carries exactly what an AllocExtend / AllocDecode / Alloc call carries,
// and the daemon runs it through the same call core as the gRPC handlers.
//
// Memory. Each session that asked for a channel gets two things of its own,
// handed to it as file descriptors over the memory socket
// (memory/memory_socket.h), never by name:
//   - the channel: anonymous shared memory (memory/shared_region.h) holding
//     a header, the call's arrays and the answer's arrays, at the offsets
//     ChannelLayout computes;
//   - its doorbell: an eventfd the client writes to wake the daemon's
//     poller when the poller sleeps.
// A session can only reach its own channel and its own doorbell: whatever
// it writes, it can wake, or fail to wake, its own calls' poller and
// nobody's sleep flag but its own.
//
// This header is the wire format; fast_channel/codec.h is the one codec
// that reads and writes it, on both ends. Everything a client writes is
// untrusted: the daemon's codec copies a call out once and takes every
// capacity from its own records, never from the header; the daemon writes
// poller_sleeping and session_ended but never reads them back.
//
// Protocol (one call in flight per session):
//   client: write kind, options and arrays; request_seq += 1 (seq_cst);
//           if poller_sleeping: write 1 to the doorbell eventfd.
//   poller: before it sleeps, poller_sleeping = 1 in each of its channels
//           (seq_cst), then looks at their request_seq once more, then
//           waits on their doorbells (epoll); awake, poller_sleeping = 0.
//           Either the client sees the flag or the poller sees the call.
//   daemon: sees request_seq != the last it answered; copies the call;
//           answers into the answer fields; response_seq = request_seq
//           (release); if client_waiting: futex_wake(response_seq).
//   client: spins, then futex-waits, until response_seq == request_seq;
//           reads the answer.
// A client that gives up waiting (its deadline) must not reuse the
// channel: the daemon may still answer into it.
//
// The reserve's reclaim (client/page_reserve.h keeps pages the session
// owns but has not handed to its caller). When an allocation call of one
// session is refused for want of pages, the daemon asks the others:
//   daemon: in each other channel with a live client: reclaim_pages =
//           the pages wanted (a hint); reclaim_seq += 1; reserve_bell += 1
//           (seq_cst); futex_wake(reserve_bell). At most one ask per
//           channel per ReclaimInterval.
//   client: its reserve thread (asleep on reserve_bell, at most its tick)
//           sees reclaim_seq != reclaim_answered; returns its unused
//           reserve above its low mark, and at least half of it, with an
//           ordinary FreePages call; then reclaim_answered = reclaim_seq.
// Nothing here moves a page: pages change hands only through calls the
// daemon validates, so a client that ignores an ask only keeps pages it
// owns (within its quota), and one that writes these words at random
// only skews its own metrics.
//
// The release fence. A page a session frees may still be read by GPU work
// the session queued before the free; it must not reach another session
// before that work is done. So a free may carry a release value:
//   client: release_word's next value v = the last one queued + 1; queues
//           the write of v to release_word on the stream that reads the
//           pages (CUDA backend: cuStreamWriteValue64, after the work
//           queued before it; CPU backend: a store at once); posts the
//           free with release_value = v.
//   daemon: checks the free as any other (all or nothing); keeps its pages
//           owned by the session, pending, until release_word >= v, then
//           frees them into the pool. It looks at the word before each
//           launch and at a bounded interval.
// The word is the client's: one that never advances keeps only its own
// session's pages (within its quota), one that jumps ahead frees only its
// own pages early. Pending pages are reclaimed with the session's others
// when it ends.
//
// The stale-answer fence. An answer can wait in the channel while its
// client is paused (stopped, swapped out, descheduled) past its lease; by
// the time the client reads it, the daemon may have reclaimed the session's
// pages and handed them to another session. So:
//   daemon: when it ends the session (closed, lease lost, client gone,
//           dropped, shutting down), before it frees a single page of it:
//           writes end_reason, then session_ended = 1 (seq_cst); written
//           once, never read back.
//   client: after it has read an answer (whatever it says), loads
//           session_ended (seq_cst); when set, the call fails with
//           NOT_FOUND naming the session and end_reason, and the session
//           is gone for good.
// The flag is stored before the pages are freed, and loaded after the
// answer is read: a client that finds it clear read the answer while the
// session still owned its pages. (What a client does with slots after its
// lease ran out is beyond any fence: keeping the lease is its part.)

#ifndef PAGEALLOC_FAST_CHANNEL_LAYOUT_H_
#define PAGEALLOC_FAST_CHANNEL_LAYOUT_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace pagealloc {
namespace fast_channel {

inline constexpr uint32_t kMagic = 0x50414643;  // "PAFC"
// Bumped whenever a field's meaning or offset changes; both ends check it.
inline constexpr uint32_t kVersion = 11;

// What a call is (the gRPC method it stands for).
enum class CallKind : uint32_t {
  // Allocation calls may also carry free_first (AllocOptions
  // .free_pages_first) and the kCheckpointFirst option bit.
  kExtend = 1,      // in0 = prefix_lens, in1 = seq_lens, in2 = last_locs
  kDecode = 2,      // in1 = seq_lens, in2 = last_locs
  kAlloc = 3,       // in1 = num_tokens
  kFreeSlots = 4,   // in1 = slots; answer: op_value = pages freed
  kFreePages = 5,   // in1 = pages; answer: op_value = pages freed
  kCheckpoint = 6,  // no arrays; answer: op_value = the checkpoint's id
  // in1 = nothing (the latest checkpoint, which ends) or one checkpoint id
  // (RollbackRequest.checkpoint_id); answer: op_value = pages returned.
  kRollback = 7,
  // MatchPrefixRequest: num_requests keys of kKeyBytes bytes each, back to
  // back from ChannelLayout::keys (the four input arrays' memory, room for
  // max_requests keys); the kAdopt option bit is MatchPrefixRequest.adopt.
  // Answer: op_value = pages matched (the longest published or cached
  // prefix of the chain), those pages in new_pages[0, op_value).
  kMatchPrefix = 8,
};

inline bool IsKnownKind(uint32_t kind) {
  return kind >= static_cast<uint32_t>(CallKind::kExtend) &&
         kind <= static_cast<uint32_t>(CallKind::kMatchPrefix);
}
// Free, Checkpoint, Rollback, MatchPrefix: answered with op_value, not
// per-request results.
inline bool IsOperation(CallKind kind) { return kind >= CallKind::kFreeSlots; }

// AllocOptions, as bits of ChannelHeader::options.
inline constexpr uint32_t kAsyncCompletion = 1u << 0;
inline constexpr uint32_t kCheckpointFirst = 1u << 1;
// AllocOptions.all_or_nothing.
inline constexpr uint32_t kAllOrNothing = 1u << 2;
// FreeRequest.order for kFreeSlots / kFreePages: neither bit is
// FREE_ORDER_DEFAULT; both together are refused.
inline constexpr uint32_t kFreeAscending = 1u << 3;
inline constexpr uint32_t kFreeFirstAppearance = 1u << 4;
// MatchPrefixRequest.adopt, for kMatchPrefix only.
inline constexpr uint32_t kAdopt = 1u << 5;
// SessionRef.retry: the call is sent again with its call_id (every kind
// but kMatchPrefix; refused without a call_id).
inline constexpr uint32_t kRetry = 1u << 6;
inline constexpr uint32_t kKnownOptions =
    kAsyncCompletion | kCheckpointFirst | kAllOrNothing | kFreeAscending |
    kFreeFirstAppearance | kAdopt | kRetry;

// A prefix key's size on the wire (kMatchPrefix): what the daemon's prefix
// index keys are (allocator/prefix_index.h's kPrefixKeyBytes, a SHA-256
// digest), fixed so that a key's place follows from its index.
inline constexpr int32_t kKeyBytes = 32;
// A key as the daemon takes it out of the channel.
using Key = std::array<uint8_t, kKeyBytes>;

// Room for the reason a session ended (ChannelHeader::end_reason).
inline constexpr int32_t kEndReasonBytes = 120;

struct alignas(64) ChannelHeader {
  // Written by the daemon at creation; a client checks them against what
  // Register described. The daemon never reads them back.
  uint32_t magic;
  uint32_t version;
  int32_t max_requests;   // capacity of every array
  int32_t message_bytes;  // capacity of the message area
  // 1 while the channel's poller sleeps (or may): the client writes its
  // doorbell after posting a call. Written by the daemon only.
  std::atomic<uint32_t> poller_sleeping;
  // 1 once the daemon has ended the session (the stale-answer fence, see
  // above); end_reason says why. Written by the daemon only, once.
  std::atomic<uint32_t> session_ended;

  // The call (client writes, then bumps request_seq).
  alignas(64) std::atomic<uint32_t> request_seq;
  uint32_t kind;  // CallKind
  int32_t num_requests;
  uint32_t options;  // k* option bits
  int64_t release_ring_up_to;
  // AllocOptions.free_pages_first: this many page ids in free_first.
  int32_t num_free_first;
  // kFreeSlots / kFreePages: the release fence (FreeRequest.release_value).
  // Not 0: the pages leave the session only once its release_word >= this
  // value. 0: at once.
  uint64_t release_value;
  // SessionRef.call_id (0: none); ignored for kMatchPrefix.
  uint64_t call_id;

  // The answer (daemon writes, then sets response_seq = request_seq).
  alignas(64) std::atomic<uint32_t> response_seq;
  std::atomic<uint32_t> client_waiting;  // the client sleeps on response_seq
  // The whole call's status (a google.rpc.Code); when not 0 the call was
  // refused as a whole, the message is in the message area, and there are
  // no per-request results.
  int32_t call_code;
  int32_t num_results;
  // Bytes used in the message area: the call's message, or the per-request
  // messages of refused requests, each as a 4-byte length and its bytes, in
  // request order (truncated to fit).
  int32_t messages_used;
  int32_t batch_requests;
  int64_t ring_end;
  uint64_t launch_id;
  // Free: pages freed; Rollback: pages returned.
  int64_t op_value;
  // Allocation calls: pages freed by free_first.
  int64_t pages_freed_first;
  // Allocation calls: AllocResponse.completion_value (the pool's completion
  // counter once the call's slots are written).
  uint64_t completion_value;

  // Why the session ended ("lost its lease", "closed by client", ...):
  // end_reason_bytes bytes of end_reason, written before session_ended.
  alignas(64) int32_t end_reason_bytes;
  char end_reason[kEndReasonBytes];

  // The session's page reserve (client/page_reserve.h; the reclaim
  // protocol above). Words the daemon writes and never reads back:
  //   reclaim_seq, reclaim_pages.
  // Words the client writes, which the daemon reads as hints for metrics
  // only (never for a decision about pages):
  //   reclaim_answered, reserve_pages, reserve_refills, reserve_returns.
  // reserve_bell is written by both and read by neither for its value: the
  // client's reserve thread sleeps on it (futex), the daemon bumps it after
  // an ask, the client's own threads when the reserve crosses a mark.
  alignas(64) std::atomic<uint32_t> reserve_bell;
  // Bumped by the daemon for each ask for this session's unused reserve.
  std::atomic<uint32_t> reclaim_seq;
  // The last reclaim_seq the client's reserve thread answered.
  std::atomic<uint32_t> reclaim_answered;
  uint32_t reserve_padding;
  // Pages the session whose allocation starved asked for (the latest ask).
  std::atomic<int64_t> reclaim_pages;
  // Pages in the client's reserve now, and refills and returns since the
  // session began, as the client reports them.
  std::atomic<int64_t> reserve_pages;
  std::atomic<int64_t> reserve_refills;
  std::atomic<int64_t> reserve_returns;

  // The release fence (the protocol above). Written by the client, on its
  // GPU stream on the CUDA backend (the library registers this header's
  // page with CUDA and queues cuStreamWriteValue64 behind the work that
  // reads the pages it frees); read by the daemon with plain loads, as a
  // monotonic maximum (a value lower than one seen before is ignored).
  alignas(64) std::atomic<uint64_t> release_word;
};

// The layout is shared between separately built processes: pin it.
static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "the channel's words are shared between processes");
static_assert(sizeof(std::atomic<uint32_t>) == 4);
static_assert(offsetof(ChannelHeader, magic) == 0);
static_assert(offsetof(ChannelHeader, message_bytes) == 12);
static_assert(offsetof(ChannelHeader, poller_sleeping) == 16);
static_assert(offsetof(ChannelHeader, session_ended) == 20);
static_assert(offsetof(ChannelHeader, request_seq) == 64);
static_assert(offsetof(ChannelHeader, kind) == 68);
static_assert(offsetof(ChannelHeader, num_requests) == 72);
static_assert(offsetof(ChannelHeader, options) == 76);
static_assert(offsetof(ChannelHeader, release_ring_up_to) == 80);
static_assert(offsetof(ChannelHeader, num_free_first) == 88);
static_assert(offsetof(ChannelHeader, release_value) == 96);
static_assert(offsetof(ChannelHeader, call_id) == 104);
static_assert(offsetof(ChannelHeader, response_seq) == 128);
static_assert(offsetof(ChannelHeader, client_waiting) == 132);
static_assert(offsetof(ChannelHeader, call_code) == 136);
static_assert(offsetof(ChannelHeader, num_results) == 140);
static_assert(offsetof(ChannelHeader, messages_used) == 144);
static_assert(offsetof(ChannelHeader, batch_requests) == 148);
static_assert(offsetof(ChannelHeader, ring_end) == 152);
static_assert(offsetof(ChannelHeader, launch_id) == 160);
static_assert(offsetof(ChannelHeader, op_value) == 168);
static_assert(offsetof(ChannelHeader, pages_freed_first) == 176);
static_assert(offsetof(ChannelHeader, completion_value) == 184);
static_assert(offsetof(ChannelHeader, end_reason_bytes) == 192);
static_assert(offsetof(ChannelHeader, end_reason) == 196);
static_assert(std::atomic<int64_t>::is_always_lock_free,
              "the reserve's words are shared between processes");
static_assert(sizeof(std::atomic<int64_t>) == 8);
static_assert(offsetof(ChannelHeader, reserve_bell) == 320);
static_assert(offsetof(ChannelHeader, reclaim_seq) == 324);
static_assert(offsetof(ChannelHeader, reclaim_answered) == 328);
static_assert(offsetof(ChannelHeader, reclaim_pages) == 336);
static_assert(offsetof(ChannelHeader, reserve_pages) == 344);
static_assert(offsetof(ChannelHeader, reserve_refills) == 352);
static_assert(offsetof(ChannelHeader, reserve_returns) == 360);
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the release word is shared with another process and a GPU");
static_assert(offsetof(ChannelHeader, release_word) == 384);
static_assert(sizeof(ChannelHeader) == 448);

// Byte offsets of a channel's parts, from its capacity. Each part starts on
// its own cache line.
struct ChannelLayout {
  constexpr ChannelLayout(int32_t max_requests, int32_t message_bytes)
      : in0(sizeof(ChannelHeader)),
        in1(After(in0, max_requests, 8)),
        in2(After(in1, max_requests, 8)),
        free_first(After(in2, max_requests, 8)),
        codes(After(free_first, max_requests, 8)),
        ring_offsets(After(codes, max_requests, 4)),
        counts(After(ring_offsets, max_requests, 8)),
        new_pages(After(counts, max_requests, 8)),
        messages(After(new_pages, max_requests, 8)),
        total_bytes(After(messages, message_bytes, 1)) {}

  size_t in0, in1, in2;  // int64[max_requests] each
  size_t free_first;     // int64[max_requests]
  // kMatchPrefix's keys: char[max_requests * kKeyBytes] from in0, over the
  // four input arrays (which that kind does not use otherwise).
  constexpr size_t keys() const { return in0; }
  size_t codes;                            // int32[max_requests]
  size_t ring_offsets, counts, new_pages;  // int64[max_requests] each
  size_t messages;                         // char[message_bytes]
  size_t total_bytes;

 private:
  // Where the part after one at `start` of `count` elements of
  // `element_bytes` begins: the next cache line.
  static constexpr size_t After(size_t start, int32_t count,
                                size_t element_bytes) {
    const size_t end = start + static_cast<size_t>(count) * element_bytes;
    return (end + 63) / 64 * 64;
  }
};

static_assert(ChannelLayout(1, 64).in0 == 448);
// max_requests keys fit in the four input arrays, whatever their padding.
static_assert(kKeyBytes == 4 * sizeof(int64_t));
static_assert(ChannelLayout(1, 64).codes - ChannelLayout(1, 64).keys() >=
              1 * kKeyBytes);
static_assert(ChannelLayout(7, 64).codes - ChannelLayout(7, 64).keys() >=
              7 * kKeyBytes);
static_assert(ChannelLayout(8192, 64).codes - ChannelLayout(8192, 64).keys() ==
              size_t{8192} * kKeyBytes);
static_assert(ChannelLayout(8192, 65536).total_bytes ==
              448 + 7 * 8192 * 8 + 8192 * 4 + 65536);

}  // namespace fast_channel
}  // namespace pagealloc

#endif  // PAGEALLOC_FAST_CHANNEL_LAYOUT_H_
