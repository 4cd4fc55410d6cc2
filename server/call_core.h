// CallCore: the daemon's calls, whichever transport carries them. The gRPC
// service (server/grpc_service.h) and the fast channel's pollers
// (server/fast_channel_server.h) are thin adapters over it: they turn their
// wire form into the plain inputs below and the answers back, and nothing
// else. The core authenticates, decodes and validates, reserves ring space,
// queues work on the batcher in order with the session's other work,
// records each call's metrics, opens and closes sessions, and reclaims
// expired ones.
//
// Answers. Every call is answered through a Reply exactly once, possibly on
// the calling thread before the submitting method returns (the thread that
// submits often drives the batcher itself: server/batcher.h). An allocation
// call's AllocReply also receives the per-request results (Deliver) before
// it completes. A reply serving one call after another (a fast channel's)
// keeps its per-call storage warm between calls.
//
// This class is thread-safe.

#ifndef PAGEALLOC_SERVER_CALL_CORE_H_
#define PAGEALLOC_SERVER_CALL_CORE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "allocator/page_pool.h"
#include "allocator/prefix_index.h"
#include "server/backend.h"
#include "server/batcher.h"
#include "server/histogram.h"
#include "server/release_queue.h"
#include "server/request_decoding.h"
#include "server/rpc_metrics.h"
#include "server/session.h"
#include "server/session_hooks.h"
#include "spdlog/spdlog.h"

namespace pagealloc {

class CallCore;

// How a Resume ended, for metrics.
enum class ResumeOutcome : int {
  kResumed = 0,      // a session not connected (detached, or awaiting)
  kTakenOver,        // a connected session, with take_over
  kNotFound,         // unknown or expired
  kUnauthenticated,  // wrong token or register secret
  kStillConnected,   // connected, without take_over
  kRefused,          // anything else (a bad ring size, budgets, draining)
};
inline constexpr int kNumResumeOutcomes = 6;
// "resumed", "taken_over", "not_found", "unauthenticated",
// "still_connected", "refused": the metric's label.
const char* ResumeOutcomeName(ResumeOutcome outcome);

// Sessions opened, closed, reclaimed, detached and resumed, for logs,
// stats and metrics.
struct SessionCounters {
  std::atomic<int64_t> sessions_opened{0};
  std::atomic<int64_t> sessions_closed{0};
  std::atomic<int64_t> sessions_reclaimed{0};
  std::atomic<int64_t> pages_reclaimed{0};
  // Resumable sessions kept when their client's connection closed.
  std::atomic<int64_t> sessions_detached{0};
  // Resumes, by outcome (ResumeOutcome).
  std::array<std::atomic<int64_t>, kNumResumeOutcomes> resumes{};
};

// Receives one call's answer.
class Reply {
 public:
  virtual ~Reply() = default;
  // The call is over; `status` is its status. Called once per call.
  virtual void Complete(const absl::Status& status) = 0;

  // Free: pages freed; Checkpoint: the checkpoint's id; Rollback: pages
  // returned; ClearSession, ClearPool: pages freed; other calls: 0. Set
  // before Complete(OK).
  int64_t value() const { return value_; }
  void set_value(int64_t value) { value_ = value; }

 private:
  int64_t value_ = 0;
};

// A reply for a caller that waits: Wait returns the call's status once it
// completed (at once when the caller's own thread completed it).
class PendingReply final : public Reply {
 public:
  void Complete(const absl::Status& status) override {
    status_ = status;
    done_.Notify();
  }
  absl::Status Wait() {
    done_.WaitForNotification();
    return status_;
  }

 private:
  absl::Notification done_;
  absl::Status status_;  // written once, before done_ is notified
};

// An allocation call's results once its launch is done, as the transport
// writes them into its answer. The spans live until Deliver returns.
struct AllocAnswer {
  absl::Span<const AllocResult> results;  // one per request
  // Each request's first slot in the session's ring (by the request's shape,
  // so that offsets stay prefix sums across refused requests); empty when
  // the slots go inline.
  absl::Span<const int64_t> ring_offsets;
  // return_inline: the accepted requests' slots, concatenated in order.
  absl::Span<const int64_t> inline_slots;
  bool inline_results = false;
  int64_t ring_end = 0;  // 0 when inline
  int64_t pages_freed_first = 0;
  const LaunchInfo* launch = nullptr;
};

// Receives an allocation call's answer: Deliver, then Complete(OK) when the
// call ran; only Complete(error) when it was refused as a whole. It is also
// the call's state between PrepareAlloc and its completion (the batcher's
// AllocCompletion), so it must live until Complete.
class AllocReply : public Reply, private AllocCompletion {
 public:
  virtual void Deliver(const AllocAnswer& answer) = 0;

 private:
  friend class CallCore;

  // AllocCompletion, for the batcher (call_core.cc).
  absl::Status Before() final;
  void Cancel(const absl::Status& status) final;
  void Done(absl::Span<const AllocResult> results,
            absl::Span<const int64_t> inline_slots,
            const LaunchInfo& launch) final;

  // The call in flight, from PrepareAlloc until Complete. The vectors keep
  // their capacity from call to call.
  CallCore* core_ = nullptr;
  Method method_ = Method::kAllocDecode;
  Transport transport_ = Transport::kGrpc;
  absl::Time start_;
  std::shared_ptr<Session> session_;
  DecodedCall decoded_;
  std::vector<int64_t> ring_offsets_;
  int64_t ring_start_ = 0;
  int64_t ring_end_ = 0;
  bool ring_reserved_ = false;
  // The ring the call's slots go to, held until they are written (a
  // Resume may give the session another meanwhile).
  std::shared_ptr<RingMemory> ring_;
  bool inline_results_ = false;
  absl::Span<const int64_t> free_pages_first_;
  bool checkpoint_first_ = false;
  CallTag call_;
  int64_t pages_freed_first_ = 0;
};

// A Publish or MatchPrefix call's answer, filled before Complete(OK):
// Publish: PublishOutcome's pages, existing and newly_published (value());
// MatchPrefix: the pages found.
class PrefixReply : public Reply {
 public:
  std::vector<int64_t> pages;
  std::vector<bool> existing;
  // ListPages: the shared pages the session holds.
  std::vector<int64_t> shared;
};

// A Publish call as it arrived. The views must stay valid during
// SubmitPublish only (the core parses the keys before it returns).
struct PublishInput {
  uint64_t session_id = 0;
  absl::string_view session_token;
  std::vector<int64_t> pages;
  std::vector<absl::string_view> keys;
  absl::string_view parent_key;  // empty: the chain starts here
  bool pin = false;
};

// One allocation call as it arrived, from either transport.
struct AllocCallInput {
  Method method = Method::kAllocDecode;
  Transport transport = Transport::kGrpc;  // what carried it, for metrics
  uint64_t session_id = 0;
  absl::string_view session_token;
  CallArrays arrays;  // must stay valid during PrepareAlloc only
  int64_t release_ring_up_to = 0;
  bool return_inline = false;
  bool async_completion = false;
  // AllocOptions.free_pages_first and checkpoint_first. The pages must stay
  // valid until the reply completes.
  absl::Span<const int64_t> free_pages_first;
  bool checkpoint_first = false;
  // AllocOptions.all_or_nothing: admit every request of the call or none.
  bool all_or_nothing = false;
  // SessionRef.call_id and retry (docs/design.md, "Retries by call id").
  CallTag call;
};

// What Free frees: slots (their pages) or pages.
enum class FreeUnit { kSlots, kPages };

// A new session as Register asks for it.
struct SessionRequest {
  std::string client_name;
  int64_t ring_capacity_slots = 0;  // 0: the daemon's default
  int64_t quota_pages = 0;          // 0: no quota
  // RegisterRequest.register_secret (checked against
  // CallCore::Options.register_secret).
  std::string register_secret;
  // RegisterRequest.resumable: kept when its connection closes.
  bool resumable = false;
};

// A Resume as it arrived (ResumeRequest).
struct ResumeRequestInput {
  uint64_t session_id = 0;
  std::string session_token;
  int64_t ring_capacity_slots = 0;  // the fresh ring's; 0: the default
  bool take_over = false;
  std::string register_secret;
};

// The pool as every session sees it.
struct PoolDescription {
  int64_t page_size = 0;
  int64_t num_pages = 0;
  FreePolicy free_policy = FreePolicy::kLifo;
  Semantics semantics = Semantics::kPagealloc;
  DeviceDescription device;
  // The KV memory the daemon owns; null when it hands out indices only.
  const KvSlab* kv_slab = nullptr;
  // The daemon keeps its state across its own restart (PoolInfo.state_kept;
  // --keep_state).
  bool state_kept = false;
};

class CallCore {
 public:
  struct Options {
    // Most requests and slots in one call (a call must fit one launch).
    int64_t max_call_requests = 8192;
    int64_t max_call_tokens = 1 << 21;
    // Whether ClearPool may be forced while sessions hold pages (it voids
    // their slots): an operator's choice, off by default.
    bool allow_forced_clear = false;
    // When not empty, Register must carry this secret
    // (--register_secret_file): UNAUTHENTICATED otherwise.
    std::string register_secret;
    // The daemon keeps the pool across its restarts (--keep_state), so a
    // client whose daemon died reconnects by default (PoolInfo.state_kept).
    bool state_kept = false;
    // Calls' tags are kept where a successor finds them: no kept state
    // (nothing outlives this process), or a kept state in a format that
    // holds them (KeptState::KeepsCallTags). When false, tags are dropped
    // and retries refused: a successor could not tell a done call from
    // one never done.
    bool call_tags_kept = true;
  };
  // (The per-session pin bound is the pool's:
  // PoolOptions.max_pinned_pages_per_owner.)

  // GetFreeLists: pages of each list returned when the caller names no
  // bound, and the most it may ask for.
  static constexpr int64_t kDefaultFreeListPages = 4096;
  static constexpr int64_t kMaxFreeListPages = int64_t{1} << 20;

  // Every pointer must outlive the core.
  CallCore(const Options& options, PagePool* pool, Backend* backend,
           SessionRegistry* sessions, Batcher* batcher);

  // Adds an observer of session ends. Set before serving; must outlive the
  // core's calls.
  void AddSessionObserver(SessionObserver* observer) {
    observers_.push_back(observer);
  }

  // From now on every call but Stats gets UNAVAILABLE.
  void StartDraining() { draining_ = true; }
  bool draining() const { return draining_; }

  // ---- Sessions.

  // Opens a session and makes it an owner in the pool. `peer` goes to the
  // log. Errors: UNAUTHENTICATED when the pool requires a Register secret
  // and the request's differs (compared in constant time),
  // SessionRegistry::Open's, UNAVAILABLE while draining.
  absl::StatusOr<std::shared_ptr<Session>> OpenSession(
      const SessionRequest& request, absl::string_view peer);
  // Authenticates a session (UNAVAILABLE while draining, NOT_FOUND or
  // PERMISSION_DENIED otherwise: SessionRegistry::Authenticate).
  absl::StatusOr<std::shared_ptr<Session>> Authenticate(
      uint64_t session_id, absl::string_view token);
  // Ends a session: forgets it and frees its pages (in order with its queued
  // work), then runs `freed` (when given; on whichever thread frees them,
  // possibly this one before CloseSession returns). `reason` goes to the
  // log. Returns false when it was already gone (`freed` does not run).
  bool CloseSession(uint64_t session_id, const std::string& reason,
                    std::function<void()> freed = nullptr);
  // Ends a session whose client is gone (its memory socket closed: the
  // process died) and reclaims its pages, counted and logged as a reclaim
  // with `reason`. Returns false when it was already gone.
  bool ReclaimSession(uint64_t session_id, const std::string& reason);
  // The memory socket connection of session `session_id`'s link
  // `generation` closed, for `reason`. A connection a Resume took the
  // session from changes nothing; a resumable session is kept, detached,
  // until its lease runs out or a Resume takes it, when `keep_if_resumable`
  // (its client went away; a client that broke the protocol is not kept);
  // any other is reclaimed (ReclaimSession). Returns whether it was ended.
  bool DisconnectSession(uint64_t session_id, uint64_t generation,
                         bool keep_if_resumable, const std::string& reason);
  // Resume: authenticates the session, checks the register secret, and
  // gives it a fresh ring and a new link (Session::ReplaceRing); fenced
  // frees still pending are released into the pool (their fence's writer
  // was the old process); observers hear SessionResumed, the memory
  // socket closing a taken-over connection. The lease is renewed. Errors:
  // UNAVAILABLE while draining, UNAUTHENTICATED (register secret, token),
  // NOT_FOUND, FAILED_PRECONDITION ("session 7 is still connected")
  // without take_over, MakeRing's; nothing changes then. `peer` goes to
  // the log.
  absl::StatusOr<std::shared_ptr<Session>> ResumeSession(
      const ResumeRequestInput& request, absl::string_view peer);
  // Frees the pages of sessions whose lease has run out; returns how many
  // sessions were reclaimed. Called periodically by the server.
  int ReclaimExpired(absl::Time now);
  absl::Duration lease() const { return sessions_->options().lease; }
  // The id of the session's latest call the pool kept (0: none or an
  // unknown session), for a Resume's answer.
  uint64_t LastCallId(uint64_t session_id) const {
    return pool_->LastCallId(session_id).value_or(0);
  }
  // Options.call_tags_kept.
  bool call_tags_kept() const { return options_.call_tags_kept; }

  // ---- Allocation calls.

  // Prepares an allocation call: authenticates, decodes and validates,
  // releases and reserves ring space, and fills `call` for SubmitPrepared.
  // `reply` must live until it completes. On refusal the reply is completed
  // (and the call counted) at once and false is returned.
  bool PrepareAlloc(const AllocCallInput& input, AllocReply* reply,
                    AllocCall* call);
  // Queues prepared calls together (they share a launch unless one is
  // running); each reply completes when its launch is done.
  void SubmitPrepared(std::vector<AllocCall> calls);

  // ---- Operations: each reply completes once the operation ran in order
  // with the session's other work (or was refused). The spans must stay
  // valid until then. `transport` is what carried the call, for metrics.

  // Frees `values` (slots or pages) of the session, putting the pages back
  // in `order` (PagePool::FreeSlots); the reply's value is the pages freed.
  // With a `release_value` (the release fence, not 0) the free is checked
  // now, as any other, but its pages stay the session's, pending, until
  // the session's release word reaches the value (ReleaseQueues); the
  // reply's value counts them. FAILED_PRECONDITION for a release value on
  // a session without a release word (no fast channel). A page pending
  // already is a double free (FAILED_PRECONDITION), fenced or not.
  //
  // `call` is the call's tag (SessionRef.call_id and retry; PagePool's
  // tagged operations say what a retry does). A retry while the kept state
  // cannot hold tags (Options.call_tags_kept false) is refused with
  // ABORTED; a tag is then not kept either.
  void SubmitFree(uint64_t session_id, absl::string_view token, FreeUnit unit,
                  absl::Span<const int64_t> values, Transport transport,
                  Reply* reply, FreeOrder order = FreeOrder::kDefault,
                  uint64_t release_value = 0, CallTag call = {});
  // Pushes a checkpoint; the reply's value is its id.
  void SubmitCheckpoint(uint64_t session_id, absl::string_view token,
                        Transport transport, Reply* reply, CallTag call = {});
  // Rolls back to checkpoint `checkpoint_id` (0: the latest, which ends:
  // PagePool::Rollback); the reply's value is the pages returned.
  void SubmitRollback(uint64_t session_id, absl::string_view token,
                      Transport transport, Reply* reply,
                      uint64_t checkpoint_id = 0, CallTag call = {});
  // Frees every page of the session and ends its checkpoints
  // (PagePool::ClearOwner); the reply's value is the pages freed.
  void SubmitClearSession(uint64_t session_id, absl::string_view token,
                          Transport transport, Reply* reply, CallTag call = {});
  // The session's pages (PagePool::PagesOwnedBy), in order with its queued
  // work: `reply->pages` the owned ones, `reply->shared` the shared ones.
  void SubmitListPages(uint64_t session_id, absl::string_view token,
                       Transport transport, PrefixReply* reply);
  // Clears the whole pool (PagePool::ClearPool), in order with the work
  // queued before it. An operator's call: it needs no session.
  // PERMISSION_DENIED for `force` unless Options.allow_forced_clear; the
  // pool's FAILED_PRECONDITION without `force` while pages are owned. The
  // reply's value is the pages freed.
  void SubmitClearPool(bool force, Transport transport, Reply* reply);
  // The free list's front and the parked pages, at most `max_pages` of each
  // (0: kDefaultFreeListPages). INVALID_ARGUMENT for a negative bound or one
  // over kMaxFreeListPages. A debug read: it needs no session.
  absl::StatusOr<FreeListsView> FreeLists(int64_t max_pages,
                                          Transport transport);
  // ---- Shared prefix pages (PagePool::Publish, MatchPrefix, Unpin,
  // ResetPrefixCache), each in order with the session's other work. Keys
  // are parsed before anything is queued: a key of another size than
  // kPrefixKeyBytes or a chain longer than the pool's pages is
  // INVALID_ARGUMENT naming keys[i]. A key repeated is the pool's to refuse
  // (PagePool::Publish, PagePool::MatchPrefix), with the same code.

  // Publishes input.pages under input.keys; the reply holds the outcome.
  void SubmitPublish(const PublishInput& input, Transport transport,
                     PrefixReply* reply);
  // Matches the chain `keys` (and with `adopt` takes the references); the
  // reply's pages are the pages found.
  void SubmitMatchPrefix(uint64_t session_id, absl::string_view token,
                         absl::Span<const absl::string_view> keys, bool adopt,
                         Transport transport, PrefixReply* reply);
  // The same for keys the caller has already taken as keys (the fast
  // channel's copy of its key area), walked where they lie: `keys` must
  // stay valid and unchanged until the reply completes. A chain longer
  // than the pool's pages is refused by the pool, with the same code and
  // message, once the session's earlier work is done.
  void SubmitTakenMatchPrefix(uint64_t session_id, absl::string_view token,
                              absl::Span<const PrefixKey> keys, bool adopt,
                              Transport transport, PrefixReply* reply);
  // Removes the session's pins from `pages` (valid until the reply
  // completes); the reply's value is the pins removed.
  void SubmitUnpinPrefix(uint64_t session_id, absl::string_view token,
                         absl::Span<const int64_t> pages, Transport transport,
                         Reply* reply);
  // Evicts every cached, unpinned page, in order with the work queued
  // before it. An operator's call: it needs no session. The reply's value
  // is the pages evicted.
  void SubmitResetPrefixCache(Transport transport, Reply* reply);

  // Releases the session's ring up to `up_to`; returns the slots still
  // reserved.
  absl::StatusOr<int64_t> ReleaseRing(uint64_t session_id,
                                      absl::string_view token, int64_t up_to,
                                      Transport transport);

  // ---- The release fence (docs/design.md, "The release fence").

  // Gives session `session_id` its release word (in its fast channel); the
  // pointer keeps that memory mapped until the session ends. Errors:
  // ReleaseQueues::Attach's.
  absl::Status AttachReleaseWord(uint64_t session_id, ReleaseQueues::Word word);
  // Frees the pending pages whose fence has passed, on the batcher's
  // driving thread (queued as an operation; nothing when none is
  // pending). The batcher also looks before each launch.
  void PollReleases();
  // The release poller, on a thread of the server's until
  // StopReleasePoller: while any page is pending it calls PollReleases
  // every kReleasePollInterval; otherwise it sleeps until a fenced free
  // leaves pages pending. So a passed fence frees its pages within about
  // one interval, or at the next launch if that comes first.
  void RunReleasePoller() ABSL_LOCKS_EXCLUDED(poller_mu_);
  void StopReleasePoller() ABSL_LOCKS_EXCLUDED(poller_mu_);
  static constexpr absl::Duration kReleasePollInterval = absl::Milliseconds(1);
  // Waits up to `timeout` for every pending page's fence to pass and the
  // release poller to free the page (a stop that keeps
  // the sessions: a successor then finds those pages free, not still the
  // sessions'). Returns the pages still pending. REQUIRES: the batcher
  // and the release poller run (before their Stop).
  int64_t WaitForReleases(absl::Duration timeout);
  // Pages freed with a fence that has not passed yet (owned by their
  // sessions): all, and session `session_id`'s.
  int64_t release_pending_pages() const { return releases_.pending_pages(); }
  int64_t release_pending_pages(uint64_t session_id) const {
    return releases_.pending_pages(session_id);
  }
  // Pages freed into the pool once their fence passed, since start, and
  // the time each fenced free waited for its fence.
  int64_t pages_released() const {
    return pages_released_.load(std::memory_order_relaxed);
  }
  const AtomicHistogram& release_wait() const { return release_wait_; }

  // ---- What the core knows, for stats and metrics.

  PoolDescription DescribePool() const;
  PoolStats PoolStatsSnapshot() const { return pool_->Stats(); }
  std::vector<std::shared_ptr<Session>> Sessions() const {
    return sessions_->List();
  }
  uint64_t launches() const { return batcher_->launches(); }
  const SessionCounters& counters() const { return counters_; }
  const RpcMetrics& rpc_metrics() const { return rpc_metrics_; }
  // Records a call the transport answered itself (GetStats, a KeepAlive
  // stream's end, a message it could not parse): RpcMetrics::Record.
  void Record(Method method, Transport transport, absl::StatusCode code,
              absl::Duration latency) {
    rpc_metrics_.Record(method, transport, code, latency);
  }

 private:
  friend class AllocReply;

  // Frees a removed session's pages after its queued work; counts and logs,
  // then runs `freed` (when given). `reclaimed`: the client did not end the
  // session itself (its lease ran out, or it went away), so its pages count
  // as reclaimed.
  void FreeSessionPages(std::shared_ptr<Session> session, bool reclaimed,
                        std::string reason,
                        std::function<void()> freed = nullptr);
  // Frees into the pool the pending pages whose fence has passed. Runs on
  // the batcher's driving thread only (before a launch, or as an
  // operation), so it is ordered with every session's work.
  void ReleasePassed();
  // Frees into the pool `pages` of `owner` whose wait for a release fence
  // is over, counting them (pages_released) or logging why not. Driving
  // thread.
  void FreeAwaited(uint64_t owner, absl::Span<const int64_t> pages);
  // Frees the pages the pool still marks as awaiting release for `owner`
  // (PagePool::AwaitRelease): those a restarted daemon recovered, at the
  // session's Resume, whose client waited for its fences first. Driving
  // thread.
  void FreeStillAwaited(uint64_t owner);
  // A fenced free's op: checks it, queues its pages, frees at once what
  // has passed. Driving thread.
  absl::Status FreeFenced(uint64_t owner, FreeUnit unit,
                          absl::Span<const int64_t> values, FreeOrder order,
                          uint64_t release_value, CallTag call, Reply* reply);
  // The tag a call goes to the pool with: `call` itself, or, when the kept
  // state cannot hold tags (Options.call_tags_kept), none, and ABORTED for
  // a retry.
  absl::StatusOr<CallTag> KeptTag(CallTag call) const;
  // The match entry points' common part: authenticates the session, then
  // answers `checked` (the caller's check of the chain) if it is an error,
  // else queues the match of `chain` for the session. `storage` is what
  // `chain` points into when the call core parsed it (it goes with the
  // queued operation), else empty and the caller keeps `chain` alive until
  // the reply completes.
  void QueueMatch(uint64_t session_id, absl::string_view token,
                  absl::Time start, absl::Status checked,
                  absl::Span<const PrefixKey> chain,
                  std::vector<PrefixKey> storage, bool adopt,
                  Transport transport, PrefixReply* reply);
  // Queues `op` for `session_id` on the batcher, in order with the session's
  // other work; `reply` completes with its status.
  void SubmitOp(Reply* reply, Method method, Transport transport,
                absl::Time start, uint64_t session_id,
                std::function<absl::Status()> op);
  // Tells the observers when `results` refused requests with
  // RESOURCE_EXHAUSTED (SessionObserver::PoolShort).
  void NotePoolShort(uint64_t session_id,
                     absl::Span<const AllocResult> results);
  // Counts a Resume's outcome and passes its answer on.
  absl::StatusOr<std::shared_ptr<Session>> CountResume(
      absl::StatusOr<std::shared_ptr<Session>> answer, bool was_connected);
  // Records the call's code and latency, then completes the reply.
  void Answer(Reply* reply, Method method, Transport transport,
              absl::Time start, const absl::Status& status);

  const Options options_;
  const CallLimits limits_;
  PagePool* const pool_;
  Backend* const backend_;
  SessionRegistry* const sessions_;
  Batcher* const batcher_;
  std::vector<SessionObserver*> observers_;
  std::atomic<bool> draining_{false};
  SessionCounters counters_;
  RpcMetrics rpc_metrics_;
  ReleaseQueues releases_;
  std::atomic<int64_t> pages_released_{0};
  // The release poller's sleep (RunReleasePoller).
  absl::Mutex poller_mu_;
  absl::CondVar poller_wake_;
  bool poller_stop_ ABSL_GUARDED_BY(poller_mu_) = false;
  AtomicHistogram release_wait_{AtomicHistogram::Exponential(1e-5, 2, 20)};
  std::shared_ptr<spdlog::logger> log_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_CALL_CORE_H_
