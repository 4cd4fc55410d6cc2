// The pagealloc client library: what a scheduler process links to allocate
// KV-cache slots from a pagealloc daemon.
//
//   ASSIGN_OR_RETURN(auto client, pagealloc::Client::Connect(
//       {.target = "unix:///run/pagealloc/gpu0.sock",
//        .client_name = "scheduler-tp0"}));
//   ASSIGN_OR_RETURN(pagealloc::Allocation a,
//                    client->AllocExtend(prefix_lens, seq_lens, last_locs));
//   for (size_t i = 0; i < a.size(); ++i) use(a[i].slots, a[i].count);
//   client->Release(a);  // the ring space may be reused from now on
//
// Connect registers a session, receives the session's memory over the
// daemon's memory socket (memory/memory_socket.h: its fast channel, its
// output ring, on a GPU daemon the pool's completion counter, and the
// pool's KV slab when the daemon owns the KV memory, as file descriptors),
// maps the output ring once (a CUDA virtual-memory import on a GPU daemon,
// mmap on a CPU one) and the KV slab once (kv_buffers()), and keeps the
// session's lease alive from a background thread. Slots come back as
// pointers into the mapped ring: device pointers on the CUDA backend, host
// pointers on the CPU backend. The client must reach the daemon's memory
// socket (same host; in a container, the daemon's socket directory
// mounted): nothing else is shared, no host IPC or PID namespace. Errors
// are absl::Status values with the daemon's code and message.
//
// When the daemon dies or the session's lease is lost, every call fails and
// session_status() says why: the slots the session held are void and the
// scheduler must rebuild its KV state (see docs/operations.md). The memory
// socket's connection stays open for the session's life, so a client on
// the daemon's host learns of either at once: a call waiting on the fast
// channel fails then, and so does every later call.
//
// Restarts. A session registered `resumable` outlives its process for its
// lease: another process takes it back with Client::Resume (its id and
// token). With ClientOptions.reconnect_timeout, a client whose daemon died
// re-dials and Resumes its session from the restarted daemon, which keeps
// it only when the daemon keeps its state across restarts
// (PoolInfo.state_kept); see "Reconnect" below.
//
// This class is thread-safe.

#ifndef PAGEALLOC_CLIENT_CLIENT_H_
#define PAGEALLOC_CLIENT_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/kv_buffers.h"
#include "grpcpp/grpcpp.h"
#include "memory/unique_fd.h"
#include "proto/pagealloc.grpc.pb.h"

namespace pagealloc {

// The channel arguments Client::Connect uses for a target: HTTP/2 BDP
// probing off (on a local socket it only adds a PING round per message,
// and with it a wake-up of each side).
grpc::ChannelArguments ClientChannelArguments();

struct ClientOptions {
  // gRPC target: "unix:///run/pagealloc/gpu0.sock" or "host:port". Empty:
  // GPU 0's daemon where pagealloc-server listens by default
  // (FindDaemonTarget, common/socket_location.h); UNAVAILABLE, naming the
  // paths looked at, when none is there.
  std::string target;
  // Shown in the daemon's logs and metrics.
  std::string client_name;
  // Output ring size in slots (0: the daemon's default).
  int64_t ring_capacity_slots = 0;
  // Most pages this session may own (0: the daemon's cap, if any).
  int64_t quota_pages = 0;
  // How often to renew the lease (0: a third of the daemon's lease).
  absl::Duration keepalive_interval = absl::ZeroDuration();
  // Deadline of each call.
  absl::Duration call_timeout = absl::Seconds(30);
  // Credentials for TCP targets (default: insecure, right for Unix sockets).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Use this channel instead of dialing `target` (in-process tests).
  std::shared_ptr<grpc::Channel> channel;
  // Send allocation calls, Free, Checkpoint, Rollback and MatchPrefix
  // through the session's fast channel (shared memory, fast_channel/layout.h)
  // when the daemon offers one and this process can reach its memory socket;
  // else, and for return_inline calls, through gRPC.
  bool fast_channel = true;
  // How long a fast call spins for its answer before it sleeps (a sleeping
  // caller pays one wake-up when the answer comes).
  absl::Duration fast_channel_spin = absl::Microseconds(500);
  // The pool's Register secret, when its daemon runs with
  // --register_secret_file (RegisterRequest.register_secret).
  std::string register_secret;
  // Map the pool's KV slab when the daemon owns the KV memory (kv_buffers()).
  // Connect fails when it cannot; a tool that only allocates may say false.
  bool map_kv_slab = true;
  // Register the session resumable (RegisterRequest.resumable): when this
  // process dies, or Detach lets go, the daemon keeps the session (pages,
  // checkpoints, quota) until its lease runs out, for Client::Resume from
  // another process. Off: its pages go back to the pool at once.
  bool resumable = false;

  // ---- Reconnect after the daemon's death (Client, "Reconnect").
  //
  // How long to try to get the session back once the daemon's memory
  // socket closed without a word (the daemon died): 0 is off (the session
  // is gone at once, UNAVAILABLE "the daemon went away"); positive, at
  // most this long. The default, kReconnectIfStateKept, reconnects for the
  // daemon's lease when the daemon advertises PoolInfo.state_kept and is
  // off otherwise: a daemon that keeps no state across its restart can
  // only answer "session gone", so waiting for it would only delay that
  // answer, and one that keeps state keeps a session that long without its
  // client.
  absl::Duration reconnect_timeout = kReconnectIfStateKept;
  // Waits between attempts: from the initial one, doubling, at most the
  // largest (each attempt: dial, Resume, the memory socket).
  absl::Duration reconnect_initial_backoff = absl::Milliseconds(50);
  absl::Duration reconnect_max_backoff = absl::Seconds(1);

  static constexpr absl::Duration kReconnectIfStateKept = absl::Nanoseconds(-1);
};

// Per-call options.
struct CallOptions {
  // Slots in the response (host memory) instead of the ring.
  bool return_inline = false;
  // Answer as soon as the launch is queued (CUDA backend; same as sync on
  // CPU): before a kernel reads the slots, its stream must be ordered after
  // the launch with Client::OrderAfter (or OrderAfterCompletion).
  bool async_completion = false;
  // Operations applied first, in this order, as part of the same call (one
  // round trip for a whole scheduler step): free these pages (as
  // FreePages), then take a checkpoint (as Checkpoint). When the free is
  // refused the call fails as a whole and nothing changes. The pages must
  // stay valid during the call.
  absl::Span<const int64_t> free_pages_first;
  bool checkpoint_first = false;
  // Admit every request of the call or none (AllocOptions.all_or_nothing):
  // when one does not fit, each request is refused (RESOURCE_EXHAUSTED)
  // and nothing changes, as SGLang's alloc_extend / alloc_decode return
  // None.
  bool all_or_nothing = false;
};

// One request's result, as Allocation::operator[] reads it.
struct RequestSlots {
  absl::Status status;  // OK, or why this request alone was refused
  // `count` slots: into the mapped ring (a device pointer on the CUDA
  // backend), or into the Allocation's own host storage when inline.
  const int64_t* slots = nullptr;
  int64_t count = 0;
  int64_t new_pages = 0;
};

// The result of one allocation call: one answer shape from the daemon's
// reply to the C ABI, a struct of arrays with one entry per request, over
// the ring (or the Allocation's own host storage for inline results). The
// C ABI's pagealloc_allocation_view points at these arrays. Ring slots stay
// valid until the Allocation is released (Client::Release), which lets the
// daemon reuse that ring space.
class Allocation {
 public:
  Allocation() = default;
  // Move-only: slots_ may point into inline_slots_, whose buffer a move
  // keeps and a copy would not.
  Allocation(Allocation&&) = default;
  Allocation& operator=(Allocation&&) = default;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  size_t size() const { return codes_.size(); }
  // Request i's result, built from the arrays.
  RequestSlots operator[](size_t i) const;
  // OK when every request succeeded; else the first refusal.
  absl::Status status() const;

  // Per request: 0 when it got its slots, else the absl::StatusCode it was
  // refused with.
  absl::Span<const int32_t> codes() const { return codes_; }
  // Per request: its first slot (null when refused).
  absl::Span<const int64_t* const> slots() const { return slots_; }
  // Per request: its slot count (0 when refused).
  absl::Span<const int64_t> counts() const { return counts_; }
  // Per request: the pages it was given.
  absl::Span<const int64_t> new_pages() const { return new_pages_; }
  // Per request: why it was refused ("" when accepted).
  const std::vector<std::string>& messages() const { return messages_; }
  int64_t num_refused() const { return num_refused_; }
  // The accepted requests' slots as one run, when they lie one after
  // another in memory (always when none was refused, and inline): its
  // start (null when empty) and length; -1 when they do not.
  const int64_t* all_slots() const { return all_slots_; }
  int64_t num_slots() const { return num_slots_; }

  // Ring position after this call's region (0 for inline results).
  int64_t ring_end() const { return ring_end_; }
  // Requests in the launch that carried this call (the batching factor).
  int32_t batch_requests() const { return batch_requests_; }
  bool on_device() const { return on_device_; }
  // Pages freed by CallOptions.free_pages_first.
  int64_t pages_freed_first() const { return pages_freed_first_; }
  // The value the pool's completion counter reaches once this call's slots
  // are written (AllocResponse.completion_value); Client::OrderAfter waits
  // for it.
  uint64_t completion_value() const { return completion_value_; }
  // The client's link to the daemon the call was answered on
  // (Client::link_epoch): ring positions (ring_end) count within one link.
  uint64_t link_epoch() const { return link_epoch_; }

 private:
  friend class Client;
  std::vector<int32_t> codes_;
  std::vector<const int64_t*> slots_;
  std::vector<int64_t> counts_;
  std::vector<int64_t> new_pages_;
  std::vector<std::string> messages_;
  // Inline results' slots; slots_ points into it. Its buffer does not move
  // when the Allocation does.
  std::vector<int64_t> inline_slots_;
  int64_t num_refused_ = 0;
  const int64_t* all_slots_ = nullptr;
  int64_t num_slots_ = 0;
  int64_t ring_end_ = 0;
  int64_t pages_freed_first_ = 0;
  uint64_t completion_value_ = 0;
  uint64_t link_epoch_ = 0;
  int32_t batch_requests_ = 0;
  bool on_device_ = false;
};

class RingView;           // the mapped output ring (client/ring_view.h)
class CompletionCounter;  // the mapped completion counter (ditto)
class ReleaseWordWriter;  // the session's release word (ditto)
class FastChannelClient;  // client/fast_channel_client.h
namespace fast_channel {
enum class CallKind : uint32_t;  // fast_channel/layout.h
class ChannelCodec;              // fast_channel/codec.h
struct CallView;                 // ditto
}  // namespace fast_channel

class Client {
 public:
  // Connects, registers a session, receives its memory, maps its ring and
  // starts the KeepAlive thread. Returns the daemon's status (e.g.
  // UNAVAILABLE when nothing listens at the target, UNAUTHENTICATED when
  // its memory socket refuses the session), FAILED_PRECONDITION when the
  // ring cannot be had (a client on another host, or in a container without
  // the daemon's socket directory, cannot reach the memory socket; a GPU
  // daemon's GPU is not visible to this process).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options);

  // Takes back the live session `session_id` (its `session_token`) instead
  // of registering one: a scheduler restarted within its lease, a tool
  // acting for a session (pagealloc-cli resume). The session keeps its
  // pages, checkpoints and quota; its output ring and fast channel are new
  // (the old process's allocations are not readable here). `options` gives
  // the target, the transport wishes (ring_capacity_slots, fast_channel),
  // the register secret and reconnect; client_name, quota_pages and
  // resumable are the session's own and ignored. Errors: NOT_FOUND
  // (unknown, expired, or reclaimed: a session that was not resumable goes
  // with its process), UNAUTHENTICATED (token, register secret),
  // FAILED_PRECONDITION while another process holds the session's memory
  // socket connection, unless `take_over` (that process is told its
  // session was taken, ABORTED), and Connect's. A failure after the daemon
  // resumed the session leaves it to its lease (never closes it).
  static absl::StatusOr<std::unique_ptr<Client>> Resume(
      const ClientOptions& options, uint64_t session_id,
      std::string session_token, bool take_over = false);

  // Closes the session (its pages are freed) unless already lost, closed or
  // detached.
  ~Client();

  absl::StatusOr<Allocation> AllocExtend(absl::Span<const int64_t> prefix_lens,
                                         absl::Span<const int64_t> seq_lens,
                                         absl::Span<const int64_t> last_locs,
                                         const CallOptions& options = {});
  absl::StatusOr<Allocation> AllocDecode(absl::Span<const int64_t> seq_lens,
                                         absl::Span<const int64_t> last_locs,
                                         const CallOptions& options = {});
  absl::StatusOr<Allocation> Alloc(absl::Span<const int64_t> num_tokens,
                                   const CallOptions& options = {});

  // Frees the distinct pages of `slots` / the `pages`; returns pages freed.
  absl::StatusOr<int64_t> FreeSlots(absl::Span<const int64_t> slots);
  absl::StatusOr<int64_t> FreePages(absl::Span<const int64_t> pages);
  // The same, putting the pages back in `order` (FreeRequest.order:
  // ascending is SGLang's free, first appearance its free_segment).
  absl::StatusOr<int64_t> FreeSlots(absl::Span<const int64_t> slots,
                                    v1::FreeOrder order);
  absl::StatusOr<int64_t> FreePages(absl::Span<const int64_t> pages,
                                    v1::FreeOrder order);

  // The release fence (docs/design.md, "The release fence"): frees ordered
  // after the GPU work that reads the pages. The frees above are ordered
  // as the host calls them, which is what a caller whose work on the pages
  // is done (a host sync, the CPU backend) needs.
  //
  // Queues on `cuda_stream` (a cudaStream_t; null: the legacy default
  // stream) the write of the session's next release value to its release
  // word, behind the work queued there, and returns that value; the host
  // does not wait. On the CPU backend the word is written at once. A free
  // carrying the value (FreePagesAfter) keeps its pages the session's
  // until the stream has passed the write. The word is one per session: it
  // orders frees after one stream. Frees fenced on several streams must
  // make those streams wait for each other first (a later value passing
  // on one stream passes every earlier one). FAILED_PRECONDITION without
  // a fast channel (the word lives in it) or when CUDA cannot write host
  // memory from a stream here; INTERNAL when CUDA refuses the write.
  absl::StatusOr<uint64_t> QueueRelease(void* cuda_stream)
      ABSL_LOCKS_EXCLUDED(release_mu_);
  // Frees the pages / the distinct pages of the slots once the work queued
  // on `cuda_stream` before this call is done: QueueRelease, then the free
  // carrying its value. Returns the pages freed (pending until then).
  absl::StatusOr<int64_t> FreePages(
      absl::Span<const int64_t> pages, void* cuda_stream,
      v1::FreeOrder order = v1::FREE_ORDER_DEFAULT);
  absl::StatusOr<int64_t> FreeSlots(
      absl::Span<const int64_t> slots, void* cuda_stream,
      v1::FreeOrder order = v1::FREE_ORDER_DEFAULT);
  // A free whose pages stay the session's, pending, until its release word
  // reaches `release_value` (a value QueueRelease returned, or the largest
  // of several); 0 is an ordinary free. Checked at once like any free.
  // Values stay good across a reconnect: they go on counting, and the new
  // link's word starts where the old one's had passed.
  absl::StatusOr<int64_t> FreePagesAfter(
      absl::Span<const int64_t> pages, uint64_t release_value,
      v1::FreeOrder order = v1::FREE_ORDER_DEFAULT);
  absl::StatusOr<int64_t> FreeSlotsAfter(
      absl::Span<const int64_t> slots, uint64_t release_value,
      v1::FreeOrder order = v1::FREE_ORDER_DEFAULT);
  // The last value QueueRelease returned (0: none yet).
  uint64_t last_release_value() const {
    return last_release_value_.load(std::memory_order_relaxed);
  }

  // Collects the frees of one scheduler step into one call.
  class FreeGroup {
   public:
    explicit FreeGroup(Client* client) : client_(client) {}
    void Add(absl::Span<const int64_t> slots) {
      slots_.insert(slots_.end(), slots.begin(), slots.end());
    }
    // Sends one Free call with everything added (nothing when empty).
    absl::StatusOr<int64_t> End();

   private:
    Client* client_;
    std::vector<int64_t> slots_;
  };
  FreeGroup BeginFreeGroup() { return FreeGroup(this); }

  // Pushes a checkpoint on the session's stack (at most 64; a 65th ends
  // the oldest).
  absl::Status Checkpoint();
  // The same, returning the checkpoint's id for Rollback(id).
  absl::StatusOr<uint64_t> CheckpointId();
  // Rolls back to the latest checkpoint, which ends; returns the pages
  // returned to the free list.
  absl::StatusOr<int64_t> Rollback();
  // Rolls back to checkpoint `checkpoint_id`: later checkpoints end, this
  // one stays (it can be rolled back to again, as SGLang's restore_state
  // of one saved state). FAILED_PRECONDITION when it is not active.
  absl::StatusOr<int64_t> Rollback(uint64_t checkpoint_id);

  // Frees every page of the session and ends its checkpoints; the session
  // stays. Returns the pages freed (see ClearSessionRequest).
  absl::StatusOr<int64_t> ClearSession();
  // The session's pages as the daemon has them, ascending (ListPages), in
  // order with the session's earlier calls. After a call that failed
  // UNAVAILABLE because the daemon restarted during it (whether it took
  // effect is unknown), the caller reconciles with this: pages it does not
  // know of came from an allocation whose answer was lost, pages it freed
  // that are listed were not freed.
  absl::StatusOr<std::vector<int64_t>> ListPages();

  // ---- Shared prefix pages (docs/integration.md, "Shared prefix pages").
  // Keys are exactly 32 bytes each, computed by the caller (a chained block
  // hash); pages shared are read-only for every session.

  // What Publish did: pages[i] is the page keys[i] is published under now
  // (the caller's pages[i], or the existing page when existing[i]: the
  // caller's page stays its own, to free).
  struct PublishResult {
    std::vector<int64_t> pages;
    std::vector<bool> existing;
    int64_t newly_published = 0;
  };
  // Publishes pages this session owns under `keys` (keys[0]'s parent is
  // `parent_key`, empty at a chain's start; keys[i]'s is keys[i - 1]); the
  // session keeps one reference on each, dropped by FreePages/FreeSlots.
  // REQUIRES: the GPU work that writes the pages' KV is complete
  // (synchronize the stream that fills them first); whole pages only.
  // With `pin` the pages are never evicted while pinned (a per-session
  // bound: RESOURCE_EXHAUSTED beyond it). All or nothing.
  absl::StatusOr<PublishResult> Publish(absl::Span<const int64_t> pages,
                                        absl::Span<const std::string> keys,
                                        absl::string_view parent_key = "",
                                        bool pin = false);
  // Returns the pages of the longest prefix of `keys` published or cached;
  // with `adopt` the session takes a reference on each in the same step
  // (FreePages drops them). Through the fast channel when the session has
  // one and it holds the chain (at most its max_requests keys, each 32
  // bytes), else over gRPC; the answers are the same.
  absl::StatusOr<std::vector<int64_t>> MatchPrefix(
      absl::Span<const std::string> keys, bool adopt = true);
  // MatchPrefix of the chain's keys back to back, 32 bytes each (as the C
  // ABI and Python hold them): the fast channel takes them in one copy, with
  // no string made per key. INVALID_ARGUMENT when `keys` is not a whole
  // number of keys.
  absl::StatusOr<std::vector<int64_t>> MatchPrefixPacked(absl::string_view keys,
                                                         bool adopt = true);
  // Removes this session's pins from `pages`; returns the pins removed.
  absl::StatusOr<int64_t> UnpinPrefix(absl::Span<const int64_t> pages);
  // (An operator resets the cache with ResetDaemonPrefixCache,
  // client/admin.h: it needs no session.)

  // Lets the daemon reuse the ring space of `allocation` and of every
  // allocation before it. Sent with the next allocation call, or now by
  // FlushRelease.
  void Release(const Allocation& allocation) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status FlushRelease() ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<v1::GetStatsResponse> GetStats(bool include_sessions = false);

  // Ends the session now; later calls fail with FAILED_PRECONDITION. When
  // it returns OK the daemon has freed the session's pages.
  absl::Status Close() ABSL_LOCKS_EXCLUDED(mu_);
  // Lets go of a resumable session without ending it: waits (up to the call
  // timeout) for the fenced frees' streams, stops renewing the lease and
  // closes the memory socket connection, so that the daemon keeps the
  // session until its lease runs out, for Client::Resume from another
  // process; returns once the daemon's stats show it detached (a Resume
  // from then on does not find it still connected), DEADLINE_EXCEEDED when
  // they do not within the call timeout. Later calls fail with
  // FAILED_PRECONDITION and the destructor leaves the session alone.
  // FAILED_PRECONDITION for a session that is not resumable (Close it
  // instead) or that is gone already.
  absl::Status Detach() ABSL_LOCKS_EXCLUDED(mu_);

  // OK while the session lives; else why it is gone (its slots are void).
  absl::Status session_status() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t session_id() const { return session_id_; }
  // Whether the session is resumable (RegisterRequest.resumable).
  bool resumable() const { return resumable_; }
  // The session's secret; hand it only to tools acting for this session.
  const std::string& session_token() const { return session_token_; }
  const v1::PoolInfo& pool() const { return pool_; }
  int64_t lease_ms() const { return lease_ms_; }
  // The session's quota in pages, as the daemon set it (0: none).
  int64_t quota_pages() const { return quota_pages_; }
  // The session's fast channel, for the words of its page reserve
  // (client/page_reserve.h); null without a fast channel.
  const fast_channel::ChannelCodec* reserve_channel() const;
  // For calls made with async_completion on the CUDA backend: makes
  // `cuda_stream` (a cudaStream_t; null is the legacy default stream) wait,
  // on the GPU, until the launch that wrote `allocation`'s slots is done:
  // cuStreamWaitValue64(stream, counter, allocation.completion_value(),
  // GEQ) on the pool's completion counter. The host does not wait. Work
  // queued on the stream afterwards may read the slots. A no-op on the CPU
  // backend and for inline results. INTERNAL when CUDA refuses the wait.
  absl::Status OrderAfter(const Allocation& allocation,
                          void* cuda_stream) const;
  // The same for every allocation call this client has had answered so
  // far: waits for the largest completion value seen.
  absl::Status OrderAfterCompletion(void* cuda_stream) const;
  // Whether allocation calls go through the fast channel.
  bool uses_fast_channel() const {
    return fast_.load(std::memory_order_acquire) != nullptr;
  }
  // The mapped output ring: ring_capacity_slots() slots from ring_slots()
  // (a device pointer when ring_on_device()). Every ring result of an
  // allocation lies inside it; bindings use it to check their views.
  const int64_t* ring_slots() const;
  int64_t ring_capacity_slots() const;
  bool ring_on_device() const;
  // The pool's KV buffers, mapped at Connect (client/kv_buffers.h): empty
  // when the daemon hands out slot indices only (or map_kv_slab was off).
  const std::vector<KvBuffer>& kv_buffers() const;
  // The mapped slab itself, or null.
  const KvSlabView* kv_slab() const { return kv_slab_.get(); }
  // Copies `count` slots at `slots` (from a RequestSlots) into host memory.
  absl::Status CopyToHost(const int64_t* slots, int64_t count,
                          int64_t* out) const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Reconnect.
  //
  // With a reconnect timeout (ClientOptions.reconnect_timeout), the close of
  // the daemon's memory socket without a word (the daemon died) starts a
  // reconnect instead of ending the session: the client re-dials with
  // backoff and calls Resume with its id and token until the timeout; a
  // restarted daemon that kept the session answers it, the client takes
  // the new memory socket connection and maps the new output ring and
  // fast channel (link_epoch() grows by one), and keeps its KV slab mapping
  // when the daemon's slab_id is the one it mapped. The session is gone,
  // and session_status() says why, when the daemon answers that it does
  // not know the session (NOT_FOUND "session gone: the daemon restarted
  // without this session's state"), when the slab is another (DATA_LOSS:
  // the session's KV is lost; the client closes the session) or the pool
  // another, or when the timeout passes (UNAVAILABLE).
  //
  // Calls while reconnecting wait for it, up to their call timeout, then
  // run on the new link (or fail as the session did). A call in flight
  // when the daemon died is sent again on the new link, with the call id
  // it was first sent with (docs/design.md, "Retries by call id"): the
  // calls that change the session's pages (AllocExtend, AllocDecode,
  // Alloc, FreeSlots, FreePages and their fenced forms, Checkpoint,
  // Rollback, ClearSession) carry one, and the restarted daemon answers a
  // call that took effect as it was (an allocation whose answer was lost
  // is given its pages again) and does one that did not, so neither is
  // done twice. Such a call fails, once, only when the daemon cannot tell:
  // ABORTED when a later call of the session took effect first (two calls
  // in flight on different threads), or when the daemon keeps no call ids
  // (RegisterResponse.retries_kept false: a state taken over from an older
  // release); the caller then reconciles with ListPages. The other calls
  // (Publish, MatchPrefix, UnpinPrefix, ReleaseRing, ListPages) are not
  // sent again: one in flight when the daemon died fails once with
  // UNAVAILABLE "the daemon restarted during this call; whether it took
  // effect is unknown", except GetStats, which changes nothing and is
  // retried once on the new link. Before it Resumes, the client waits (up to
  // its call timeout) for the streams of its fenced frees to pass their release
  // values, since the daemon releases the pages of pending fenced frees at
  // Resume.
  //
  // What a caller holds across a reconnect: every ring this client mapped
  // stays mapped until the client is destroyed (one ring per restart), so
  // the slots of Allocations (and C ABI and Python views) from earlier
  // links never fault. They hold what the daemon wrote as long as the
  // daemon that made the ring has not let it go: one that died cannot; a
  // live one that resumed the session releases the old ring once its calls
  // are done (the slots then read zeros). So copy out what you keep, as
  // before a Release. Their ring space needs no release (it went with the
  // old ring; Release of such an allocation changes nothing), and
  // OrderAfter refuses them (FAILED_PRECONDITION: the old completion
  // counter will not move again). ring_slots() and reserve_channel() are
  // the current link's. A PageReserve made before a reconnect carries on:
  // its pages are the session's, and it reports itself and answers the
  // daemon's asks on the new channel. Release values go on counting, and
  // the new link's word starts where the old one had passed, so a value
  // from before the reconnect still fences a free (FreePagesAfter).

  // Whether a reconnect is under way now.
  bool reconnecting() const ABSL_LOCKS_EXCLUDED(mu_);
  // Calls sent again after the daemon restarted under them (see above),
  // since the client was made.
  int64_t calls_sent_again() const {
    return calls_sent_again_.load(std::memory_order_relaxed);
  }
  // The current link: 0 for Connect's or Resume's, one more after each
  // reconnect.
  uint64_t link_epoch() const {
    return link_epoch_.load(std::memory_order_acquire);
  }
  // The reconnect timeout in force (the option resolved against
  // PoolInfo.state_kept; zero: off).
  absl::Duration reconnect_timeout() const { return reconnect_timeout_; }

 private:
  // One link to the daemon: what Connect, Resume and each reconnect map.
  // Kept until the client is destroyed, so that what callers hold into an
  // earlier link's ring stays mapped.
  struct Link {
    uint64_t epoch = 0;
    std::unique_ptr<RingView> ring;
    // The pool's completion counter (CUDA backend; null on the CPU one).
    std::unique_ptr<CompletionCounter> completion_counter;
    // The fast channel (null when not used).
    std::unique_ptr<FastChannelClient> fast;
    // The release word's writer (null without a fast channel; declared
    // after `fast`, whose mapping holds the word, so that it goes first),
    // or why there is none.
    std::unique_ptr<ReleaseWordWriter> release_writer;
    absl::Status release_writer_status;
    // The memory socket's connection (invalid when the daemon's memory
    // socket was out of reach, and once the link is lost).
    UniqueFd memory_connection;
  };
  // A call's id in the session and whether it is sent again
  // (SessionRef.call_id and retry).
  struct CallTag {
    uint64_t id = 0;
    bool retry = false;
  };
  // What a call runs on, taken when it starts (Begin).
  struct CallStart {
    uint64_t epoch = 0;
    absl::Time deadline;
    std::shared_ptr<v1::PageAllocator::Stub> stub;  // gRPC calls only
    const RingView* ring = nullptr;
    int64_t release_up_to = 0;  // the ring released so far
  };

  explicit Client(const ClientOptions& options);
  // Connect and Resume: dials, then Register or (with `resume`) Resume,
  // then Attach.
  static absl::StatusOr<std::unique_ptr<Client>> Open(
      const ClientOptions& options, const v1::ResumeRequest* resume);
  // Keeps what the calls need of a Register or Resume answer.
  void Accept(const v1::RegisterResponse& response);
  // Takes a Register's or Resume's word on call ids: whether the daemon
  // answers retries, and the latest id it kept (ids go on after it).
  void NoteCalls(const v1::RegisterResponse& response);
  // Receives the session's memory for `response` over the memory socket and
  // maps it as a link (the KV slab too when `map_kv_slab`, into kv_slab_).
  absl::StatusOr<std::unique_ptr<Link>> MapLink(
      const v1::RegisterResponse& response, bool map_kv_slab,
      absl::Duration timeout);
  // Makes `link` the current one (the calls' from now on).
  void Install(std::unique_ptr<Link> link)
      ABSL_LOCKS_EXCLUDED(release_mu_, fast_mu_, mu_);
  // Where this client reaches the daemon's memory socket: beside its Unix
  // target, else where Register said ("" when neither).
  std::string MemorySocketPath(const v1::RegisterResponse& registered) const;
  // A gRPC channel to the target (options_.channel when given).
  std::shared_ptr<grpc::Channel> Dial(bool own_subchannels = false) const;
  void KeepAliveLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits on the current link's memory socket connection until the daemon
  // ends the session or goes away (then marks the session gone, or
  // reconnects, and wakes a fast call waiting for its answer), or until
  // StopWatching.
  void WatchDaemon() ABSL_LOCKS_EXCLUDED(mu_);
  // The reconnect (see "Reconnect"), on the watcher's thread: OK once a
  // new link is installed; else why the session is gone.
  absl::Status Reconnect() ABSL_LOCKS_EXCLUDED(mu_);
  // One attempt: dial, Resume, map. `retry` says whether another attempt
  // may succeed (the daemon unreachable or not answering yet).
  absl::Status ReconnectOnce(absl::Time give_up, bool* retry)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Sleeps `wait` unless StopWatching comes first (then false).
  bool SleepUnlessStopped(absl::Duration wait);
  void StopWatching() ABSL_LOCKS_EXCLUDED(mu_);
  // Starts a call: waits while a reconnect is under way (up to the call
  // timeout), then OK with what the call runs on, or why it cannot run
  // (the session gone or closed; DEADLINE_EXCEEDED still reconnecting).
  absl::StatusOr<CallStart> Begin(bool grpc) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the link a call started on (`epoch`) was lost: a reconnect is
  // under way or done, or the current link's memory socket has closed.
  bool LinkLost(uint64_t epoch) const ABSL_LOCKS_EXCLUDED(mu_);
  // The fast call's liveness check: the session's status, or UNAVAILABLE
  // once the link of `epoch` is lost.
  absl::Status LinkAlive(uint64_t epoch) const ABSL_LOCKS_EXCLUDED(mu_);
  // Runs a call that changes the session's pages under a new call id
  // (SessionRef.call_id): `attempt(tag)` sends it once, on either
  // transport. When the daemon restarted under it (a Restarted status),
  // waits for the new link and sends it again with the same id and
  // `retry` (the daemon answers a call that took effect as it was, and
  // does one that did not), up to kMaxCallSends times in all. Without
  // retries kept by the daemon (RegisterResponse.retries_kept), or when
  // the session is gone, the first error is the answer.
  template <typename T, typename Attempt>
  absl::StatusOr<T> Tagged(Attempt attempt) ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr int kMaxCallSends = 8;
  // Waits, up to the call timeout, for a link after `epoch` (the daemon
  // restarted); false when the session ended or the wait timed out.
  bool WaitForLinkAfter(uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  // Ref() with the call's tag.
  v1::SessionRef TaggedRef(CallTag tag) const;
  // Fills the common fields, sends, and turns the response into slots.
  template <typename Request, typename Method>
  absl::StatusOr<Allocation> CallAlloc(Request& request,
                                       const CallOptions& options,
                                       Method method, CallTag tag);
  // The same call through the fast channel: `kind` and its arrays (in0 may
  // be empty); nullopt when it cannot carry it (too many requests).
  std::optional<absl::StatusOr<Allocation>> FastCall(
      fast_channel::CallKind kind, absl::Span<const int64_t> in0,
      absl::Span<const int64_t> in1, absl::Span<const int64_t> in2,
      const CallOptions& options, CallTag tag)
      ABSL_LOCKS_EXCLUDED(fast_mu_, mu_);
  // Free / Checkpoint / Rollback through the fast channel: the operation's
  // count (pages freed or returned); nullopt when it cannot carry it.
  std::optional<absl::StatusOr<int64_t>> FastOp(
      fast_channel::CallKind kind, absl::Span<const int64_t> values,
      uint32_t option_bits, uint64_t release_value, CallTag tag)
      ABSL_LOCKS_EXCLUDED(fast_mu_, mu_);
  // MatchPrefix through the fast channel, of packed keys: the pages
  // matched; nullopt when it cannot carry the chain (too many keys).
  std::optional<absl::StatusOr<std::vector<int64_t>>> FastMatch(
      absl::string_view keys, bool adopt) ABSL_LOCKS_EXCLUDED(fast_mu_, mu_);
  // MatchPrefix over gRPC.
  absl::StatusOr<std::vector<int64_t>> GrpcMatch(
      absl::Span<const std::string> keys, bool adopt);
  // The fast channel a fast call may use now, with what it runs on: null
  // when there is none or it was abandoned (the call goes through gRPC),
  // or the call's failure to start (`*start` not OK).
  FastChannelClient* BeginFast(absl::StatusOr<CallStart>* start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(fast_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // A free of slots or pages on either transport, with a release value
  // (0: none).
  absl::StatusOr<int64_t> Free(bool slots, absl::Span<const int64_t> values,
                               v1::FreeOrder order, uint64_t release_value);
  // The body of each tagged call (one send).
  absl::StatusOr<Allocation> AllocExtendOnce(
      absl::Span<const int64_t> prefix_lens, absl::Span<const int64_t> seq_lens,
      absl::Span<const int64_t> last_locs, const CallOptions& options,
      CallTag tag);
  absl::StatusOr<Allocation> AllocDecodeOnce(
      absl::Span<const int64_t> seq_lens, absl::Span<const int64_t> last_locs,
      const CallOptions& options, CallTag tag);
  absl::StatusOr<Allocation> AllocOnce(absl::Span<const int64_t> num_tokens,
                                       const CallOptions& options, CallTag tag);
  absl::StatusOr<int64_t> FreeOnce(bool slots, absl::Span<const int64_t> values,
                                   v1::FreeOrder order, uint64_t release_value,
                                   CallTag tag);
  absl::StatusOr<uint64_t> CheckpointOnce(CallTag tag);
  absl::StatusOr<int64_t> RollbackOnce(uint64_t checkpoint_id, CallTag tag);
  absl::StatusOr<int64_t> ClearSessionOnce(CallTag tag);
  // Waits, up to the call timeout, until the release word has reached the
  // last value queued, so that the pages freed with a fence (which the
  // daemon reclaims with the session, and releases at a Resume) are no
  // longer read by this process's queued work. Before Close, Detach and a
  // reconnect's Resume.
  void WaitForReleases() ABSL_LOCKS_EXCLUDED(release_mu_);
  // Posts `call` on `fast` (with the ring released so far) and waits for
  // its answer; then its whole-call status (observed for session loss). A
  // transport error (deadline, session gone, link lost) abandons the
  // channel.
  absl::Status PostFastCall(FastChannelClient& fast, const CallStart& start,
                            const fast_channel::CallView& call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(fast_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Turns an answer's per-request arrays into an Allocation (both paths).
  struct AnswerArrays {
    absl::Span<const int32_t> codes;
    absl::Span<const int64_t> ring_offsets, counts, new_pages;
    std::vector<absl::string_view> messages;  // one per refused request
    absl::Span<const int64_t> inline_slots;
    int64_t ring_end = 0;
    int64_t pages_freed_first = 0;
    int32_t batch_requests = 0;
    uint64_t completion_value = 0;
  };
  absl::StatusOr<Allocation> ToAllocation(const AnswerArrays& answer,
                                          const CallOptions& options,
                                          const CallStart& start) const;
  // Sends a Free carrying slots or pages; returns pages freed.
  absl::StatusOr<int64_t> SendFree(v1::FreeRequest& request, CallTag tag);
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Time deadline) const;
  // Records `status` as the session's end when it says the session is gone.
  // A failure of a call whose link was lost (`start`) is the daemon's
  // restart instead: UNAVAILABLE, "whether it took effect is unknown".
  absl::Status Observe(absl::Status status, const CallStart& start)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the KeepAlive thread, cancelling its stream if it is blocked.
  void StopKeepAlive() ABSL_LOCKS_EXCLUDED(mu_);
  // Records why the session ended (the first reason wins).
  void MarkGone(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // The stale-answer fence (fast_channel/layout.h), after a successful
  // answer is read on either transport: NOT_FOUND once the daemon has ended
  // the session (recorded as its end), so that an answer that waited while
  // this process was paused past its lease is never taken for a success.
  // OK without a fast channel (nothing to check).
  absl::Status Fence() ABSL_LOCKS_EXCLUDED(mu_);
  // `answer`, unless it is a success the fence refuses.
  template <typename T>
  absl::StatusOr<T> Fenced(absl::StatusOr<T> answer) ABSL_LOCKS_EXCLUDED(mu_) {
    if (!answer.ok()) return answer;
    if (absl::Status live = Fence(); !live.ok()) return live;
    return answer;
  }
  v1::SessionRef Ref() const;
  // The current gRPC stub.
  std::shared_ptr<v1::PageAllocator::Stub> stub() const
      ABSL_LOCKS_EXCLUDED(mu_);

  const ClientOptions options_;
  // Fixed once Connect or Resume has answered.
  uint64_t session_id_ = 0;
  std::string session_token_;
  bool resumable_ = false;
  v1::PoolInfo pool_;
  int64_t lease_ms_ = 0;
  int64_t quota_pages_ = 0;
  absl::Duration reconnect_timeout_;
  std::unique_ptr<KvSlabView> kv_slab_;  // null without a KV slab

  // The current link's parts, for the calls (the Link in links_ owns
  // them). Set under release_mu_, fast_mu_ and mu_ (Install).
  std::atomic<const RingView*> ring_{nullptr};
  std::atomic<const CompletionCounter*> completion_counter_{nullptr};
  std::atomic<FastChannelClient*> fast_{nullptr};
  std::atomic<const ReleaseWordWriter*> release_writer_{nullptr};
  std::atomic<uint64_t> link_epoch_{0};
  // The next call id (Tagged), and whether the daemon answers retries
  // (RegisterResponse.retries_kept; each Resume says again).
  std::atomic<uint64_t> next_call_id_{1};
  std::atomic<bool> retries_kept_{false};
  std::atomic<int64_t> calls_sent_again_{0};
  // The largest completion value answered on the current link
  // (OrderAfterCompletion).
  mutable std::atomic<uint64_t> last_completion_value_{0};

  // Values are handed out and queued in one order (QueueRelease).
  absl::Mutex release_mu_ ABSL_ACQUIRED_BEFORE(fast_mu_);
  absl::Status release_writer_status_ ABSL_GUARDED_BY(release_mu_);
  std::atomic<uint64_t> last_release_value_{0};

  // One fast call at a time.
  absl::Mutex fast_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Set when a call gave up waiting: the channel may still be answered
  // into, so later calls go through gRPC (until the next link).
  bool fast_abandoned_ ABSL_GUARDED_BY(fast_mu_) = false;

  mutable absl::Mutex mu_;
  mutable absl::CondVar link_changed_;  // reconnecting_ or the status
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<v1::PageAllocator::Stub> stub_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Link>> links_ ABSL_GUARDED_BY(mu_);
  absl::Status session_status_ ABSL_GUARDED_BY(mu_);
  bool reconnecting_ ABSL_GUARDED_BY(mu_) = false;
  int64_t release_up_to_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Why calls fail after Close or Detach.
  absl::Status closed_status_ ABSL_GUARDED_BY(mu_);
  // The KeepAlive thread's current stream context, and the reconnect's
  // current Resume, for StopKeepAlive and StopWatching.
  grpc::ClientContext* keepalive_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  grpc::ClientContext* reconnect_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Notification stop_keepalive_;
  std::thread keepalive_;

  // The watcher thread (on the current link's memory socket connection,
  // and the reconnect), and the eventfd StopWatching rings.
  UniqueFd stop_watching_;
  std::atomic<bool> stopping_watch_{false};
  std::thread watcher_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_CLIENT_CLIENT_H_
