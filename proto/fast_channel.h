// The fast channel: allocation calls (and Free, Checkpoint, Rollback)
// through shared memory instead of gRPC, for clients on the daemon's host.
//
// Why. On the H200 host an empty unary gRPC call costs 51-69 us (most of
// it thread wake-ups across cores inside gRPC), more than the allocation it
// would carry. The fast channel carries exactly what an AllocExtend /
// AllocDecode / Alloc call carries, through memory both processes map, and
// the daemon's poller thread runs it through the same validation, batcher
// and answer code as the gRPC handlers. gRPC stays the control plane:
// Register opens the channel (RegisterResponse.fast_channel), KeepAlive
// holds the lease, ReleaseRing / GetStats go over gRPC.
//
// Memory. Two POSIX shared-memory objects, created by the daemon with the
// rings' file mode (the daemon's group may map them):
//   - the doorbell, one per daemon: a counter clients bump after posting a
//     call, and a flag saying the poller sleeps on it (futex);
//   - the channel, one per session: a header, the call's arrays, and the
//     answer's arrays (layout below).
// Everything a client writes is untrusted: the daemon copies a call out of
// the channel before it validates it, and bounds every count.
//
// Protocol (one call in flight per session):
//   client: write kind, options and arrays; request_seq += 1 (release);
//           doorbell.seq += 1; if doorbell.pollers_sleeping: futex_wake.
//   daemon: sees request_seq != the last it answered; copies the call;
//           answers into the answer fields; response_seq = request_seq
//           (release); if client_waiting: futex_wake(response_seq).
//   client: spins, then futex-waits, until response_seq == request_seq;
//           reads the answer.
// A client that gives up waiting (its deadline) must not reuse the
// channel: the daemon may still answer into it.

#ifndef PAGEALLOC_PROTO_FAST_CHANNEL_H_
#define PAGEALLOC_PROTO_FAST_CHANNEL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pagealloc {
namespace fast_channel {

inline constexpr uint32_t kMagic = 0x50414643;  // "PAFC"
inline constexpr uint32_t kVersion = 3;

// What a call is (the gRPC method it stands for).
enum class CallKind : uint32_t {
  // Allocation calls may also carry free_first (AllocOptions
  // .free_pages_first) and the kCheckpointFirst option bit.
  kExtend = 1,      // in0 = prefix_lens, in1 = seq_lens, in2 = last_locs
  kDecode = 2,      // in1 = seq_lens, in2 = last_locs
  kAlloc = 3,       // in1 = num_tokens
  kFreeSlots = 4,   // in1 = slots; answer: op_value = pages freed
  kFreePages = 5,   // in1 = pages; answer: op_value = pages freed
  kCheckpoint = 6,  // no arrays
  kRollback = 7,    // no arrays; answer: op_value = pages returned
};

inline bool IsKnownKind(uint32_t kind) {
  return kind >= static_cast<uint32_t>(CallKind::kExtend) &&
         kind <= static_cast<uint32_t>(CallKind::kRollback);
}
// Free, Checkpoint, Rollback: answered with op_value, not per-request
// results.
inline bool IsOperation(CallKind kind) { return kind >= CallKind::kFreeSlots; }

// AllocOptions, as bits.
inline constexpr uint32_t kAsyncCompletion = 1u << 0;
inline constexpr uint32_t kCheckpointFirst = 1u << 1;

struct Doorbell {
  std::atomic<uint32_t> seq;
  // Pollers asleep on seq (a client wakes them all when it is not 0).
  std::atomic<uint32_t> pollers_sleeping;
};

struct alignas(64) ChannelHeader {
  // Set by the daemon at creation; never changed.
  uint32_t magic;
  uint32_t version;
  int32_t max_requests;   // capacity of every array
  int32_t message_bytes;  // capacity of the message area

  // The call (client writes, then bumps request_seq).
  alignas(64) std::atomic<uint32_t> request_seq;
  uint32_t kind;  // CallKind
  int32_t num_requests;
  uint32_t options;  // k* option bits
  int64_t release_ring_up_to;
  // AllocOptions.free_pages_first: this many page ids in free_first.
  int32_t num_free_first;

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
};

// Byte offsets of a channel's parts, from its capacity.
struct ChannelLayout {
  explicit ChannelLayout(int32_t max_requests, int32_t message_bytes);
  size_t in0, in1, in2;                    // int64[max_requests] each
  size_t free_first;                       // int64[max_requests]
  size_t codes;                            // int32[max_requests]
  size_t ring_offsets, counts, new_pages;  // int64[max_requests] each
  size_t messages;                         // char[message_bytes]
  size_t total_bytes;
};

// A POSIX shared-memory object mapped read-write.
class SharedRegion {
 public:
  // Creates `name` (which must not exist) with `mode`, sized and zeroed.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Create(
      const std::string& name, size_t bytes, int mode);
  // Maps an existing `name`, which must be at least `min_bytes` long.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Open(
      const std::string& name, size_t min_bytes);
  // Unmaps; the creator also unlinks the name (unless Unlink did).
  ~SharedRegion();
  // Creator only: removes the name now; the mapping stays valid.
  void Unlink();

  void* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  SharedRegion(std::string name, void* base, size_t bytes, bool owner)
      : name_(std::move(name)), base_(base), bytes_(bytes), owner_(owner) {}
  const std::string name_;
  void* const base_;
  const size_t bytes_;
  const bool owner_;
  std::atomic<bool> linked_{true};
};

// futex(2) on a 32-bit word in shared memory (not FUTEX_PRIVATE).
// Waits while *word == expected, at most `timeout`; spurious returns are
// possible, so callers re-check their condition.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               absl::Duration timeout);
void FutexWakeAll(std::atomic<uint32_t>* word);

}  // namespace fast_channel
}  // namespace pagealloc

#endif  // PAGEALLOC_PROTO_FAST_CHANNEL_H_
