// The fast channel's adapter over the call core (fast_channel/layout.h): one
// channel per session that asked for one (anonymous shared memory and an
// eventfd doorbell of its own, handed to the client by the memory socket,
// server/memory_socket_server.h), and poller threads that take the calls
// posted in their channels through the codec (fast_channel/codec.h), run
// them through the call core (the same authentication, validation and ring
// space as gRPC calls) and submit the allocation calls to the batcher
// together, so that calls posted at the same time share a launch. Free,
// Checkpoint, Rollback and MatchPrefix go to the batcher as the session's
// operations, through the core's entry points the gRPC handlers use.
//
// A poller spins after the last call it saw, so that a client issuing
// calls back to back never waits for a wake-up; then it sleeps in
// epoll_wait on its channels' doorbells and uses no CPU until a client
// rings one. How long it spins adapts (common/adaptive_spin.h): about twice
// the gaps between calls it has lately seen when those are shorter than
// Options.spin (the cap), and not at all when they are longer, as for a
// scheduler that calls once per forward pass. A doorbell wakes only the poller
// of its own channel, and a wake-up that finds no call sends the poller back to
// sleep without spinning. A poller submitting while another drives the batcher
// only queues: the driver takes those calls into its next launch
// (server/batcher.h).
//
// Fairness. Each round a poller looks at its channels in turn, starting one
// further each round, and takes at most one call from each (a channel
// whose call is being answered is not read again until the answer is out),
// so another session's call waits at most for one call of each session
// on its poller: one batch.
//
// Abuse. An honest client rings its doorbell at most once per call and
// posts a call only once the previous one is answered; the poller counts a
// strike each time it sees otherwise: a doorbell drained with more rings
// than the calls taken can explain, a call whose sequence number skipped
// some (posted more than once since the last call taken), or an answer
// published after its client had already posted again. At
// Options::throttle_strikes the session is throttled: its doorbell no longer
// wakes the poller and its calls are taken at most once per
// Options::throttled_interval, until Options::throttle_time passes without a
// strike (its strikes are then forgiven). At Options::drop_strikes it is
// dropped: the call core reclaims it (its client is told why over the memory
// socket, and by its channel's session_ended word). Each is counted, by reason,
// and logged (throttles at most once a second).
//
// Ending. When a session ends, for whatever reason, its channel's
// session_ended word is set before its pages are freed (the stale-answer
// fence, fast_channel/layout.h); Stop sets it in every channel.
//
// This class is thread-safe.

#ifndef PAGEALLOC_SERVER_FAST_CHANNEL_SERVER_H_
#define PAGEALLOC_SERVER_FAST_CHANNEL_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "fast_channel/codec.h"
#include "fast_channel/layout.h"
#include "memory/shared_region.h"
#include "memory/unique_fd.h"
#include "server/call_core.h"
#include "server/histogram.h"
#include "server/memory_budget.h"
#include "server/retired_channel_headers.h"
#include "server/session_hooks.h"

namespace pagealloc {

class FastChannelServer final : public SessionChannels {
 public:
  struct Options {
    // Most requests in one call (the daemon's per-call limit).
    int32_t max_requests = 8192;
    int32_t message_bytes = 64 << 10;
    // The longest a poller keeps spinning after the last call it saw (the
    // cap of its adaptive spin).
    absl::Duration spin = absl::Microseconds(200);
    // Poller threads; channels are dealt to them in turn. More than one
    // lets taking and checking calls (per-request work) run in parallel
    // with the launch another poller drives.
    int pollers = 1;
    // Strikes (see Abuse above) that throttle a session, and that drop it;
    // 0: never.
    int64_t throttle_strikes = 100;
    int64_t drop_strikes = 1000;
    // A throttled session's calls are taken at most once per
    // throttled_interval (it also bounds how often its strikes are
    // counted); it stays throttled until throttle_time passes without a
    // strike.
    absl::Duration throttled_interval = absl::Milliseconds(10);
    absl::Duration throttle_time = absl::Seconds(1);
    // Charged each channel's memory, when not null (it must outlive the
    // server): a channel past it is refused.
    MemoryBudget* budget = nullptr;
    // Ended sessions' header pages kept for clients that still map their
    // channel (server/retired_channel_headers.h): at most this many, each
    // for at most this long.
    int64_t retired_headers_max = 1024;
    absl::Duration retired_header_life = absl::Seconds(10);
  };

  // Why a session was throttled or dropped: most of its strikes were
  // doorbell rings no call explains, or calls posted before their answers.
  enum class Abuse { kDoorbell = 0, kFlood = 1 };
  static constexpr int kNumAbuses = 2;
  // "doorbell", "flood": the metrics' reason label.
  static const char* AbuseName(Abuse abuse);

  // Starts the pollers. `core` must outlive this.
  static absl::StatusOr<std::unique_ptr<FastChannelServer>> Create(
      const Options& options, CallCore* core);
  // Stops the pollers (Stop); every channel's memory goes with the last
  // process that maps it.
  ~FastChannelServer() override;

  // SessionChannels: opens a channel for a session (its memory, reserved,
  // and its doorbell) and returns its capacity. RESOURCE_EXHAUSTED when the
  // memory cannot be had, INTERNAL for other system errors.
  absl::StatusOr<ChannelCapacity> SessionOpened(
      uint64_t session_id, const std::string& session_token) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // SessionChannels: whether `session_id` has a channel (for GetStats).
  bool HasChannel(uint64_t session_id) override ABSL_LOCKS_EXCLUDED(mu_);

  // What a session's client needs to use its channel: descriptors of the
  // channel's memory and of its doorbell (duplicates: the caller's to hand
  // over and close).
  struct ChannelFds {
    UniqueFd memory;
    uint64_t bytes = 0;
    UniqueFd doorbell;
  };
  // NOT_FOUND when the session has no channel; INTERNAL when a descriptor
  // cannot be duplicated (out of descriptors).
  absl::StatusOr<ChannelFds> ExportFds(uint64_t session_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Closes the daemon's descriptor of a session's channel memory once its
  // client holds it (the mapping stays); ExportFds then answers
  // FAILED_PRECONDITION.
  void CloseMemoryDescriptor(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops a session's channel (calls in flight still complete), after
  // setting its session_ended word with `reason`.
  void Close(uint64_t session_id, absl::string_view reason)
      ABSL_LOCKS_EXCLUDED(mu_);
  // SessionObserver: a session that ends loses its channel. The core calls
  // this before it frees the session's pages.
  void SessionClosed(uint64_t session_id, absl::string_view reason) override {
    Close(session_id, reason);
  }
  // SessionObserver: a Resume retires the session's channel (its
  // session_ended word set, so that a process still mapping it stops, and
  // its memory freed as at a session's end); the gRPC service opens a
  // fresh one when the Resume asks.
  void SessionResumed(uint64_t session_id, uint64_t, bool) override {
    Close(session_id, "the session was resumed by another process");
  }
  // SessionObserver: the pool could not serve a call of `session_id` (on
  // either transport): the others are asked for their unused reserves.
  void PoolShort(uint64_t session_id, int64_t requests) override {
    AskForReserves(session_id, requests);
  }
  // Stops the pollers: calls posted afterwards are never answered (clients
  // see the memory socket close, or their deadline). With kEnd it first
  // sets every channel's session_ended word ("the daemon is shutting
  // down"); with kKeep the sessions live on in a successor, and a client
  // must not read their end in a channel. Idempotent: only the first
  // call's `sessions` counts.
  void Stop(SessionsAtStop sessions = SessionsAtStop::kEnd)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Calls taken from channels since start, and poller sleeps.
  int64_t calls() const { return calls_.load(std::memory_order_relaxed); }
  int64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }
  // Sessions throttled (each time a throttle began) and dropped since
  // start, by reason.
  int64_t throttled(Abuse abuse) const {
    return throttled_[static_cast<int>(abuse)].load(std::memory_order_relaxed);
  }
  int64_t dropped(Abuse abuse) const {
    return dropped_[static_cast<int>(abuse)].load(std::memory_order_relaxed);
  }
  // Pollers asleep on their doorbells now, and whether poller `index` is.
  int pollers_asleep() const;
  bool poller_asleep(int index) const {
    return pollers_[index]->asleep.load(std::memory_order_relaxed);
  }
  int pollers() const { return static_cast<int>(pollers_.size()); }
  // How long poller `index` spins now after a call (its adaptive budget).
  // REQUIRES: 0 <= index < pollers().
  absl::Duration poller_spin_budget(int index) const;
  // Sessions throttled now.
  int64_t throttled_now() const {
    return throttled_now_.load(std::memory_order_relaxed);
  }

  // ---- Session page reserves (client/page_reserve.h).

  // The least time between two asks to one channel for its reserve.
  static constexpr absl::Duration kReclaimInterval = absl::Microseconds(100);
  // Asks every session with a channel but `starving` for its unused
  // reserve (the reclaim protocol, fast_channel/layout.h), `pages` being a
  // hint of what it lacks; a channel asked less than kReclaimInterval ago
  // is skipped. Returns the channels asked.
  int AskForReserves(uint64_t starving, int64_t pages) ABSL_LOCKS_EXCLUDED(mu_);
  // One session's reserve as its client reports it (hints, for metrics).
  struct SessionReserve {
    uint64_t session_id = 0;
    int64_t pages = 0;
    int64_t refills = 0;
    int64_t returns = 0;
  };
  std::vector<SessionReserve> SessionReserves() const ABSL_LOCKS_EXCLUDED(mu_);
  // Asks sent since start, asks answered by a return call, and the time
  // from an ask to the asked session's return call being taken.
  int64_t reclaim_asks() const {
    return reclaim_asks_.load(std::memory_order_relaxed);
  }
  int64_t reclaim_returns() const {
    return reclaim_returns_.load(std::memory_order_relaxed);
  }
  const AtomicHistogram& reclaim_latency() const { return reclaim_latency_; }

 private:
  struct Channel;
  class ChannelReply;
  class MatchReply;
  // One poller thread, and what it sleeps on: an epoll set holding its
  // channels' doorbells and its own wake-up eventfd (Stop, Close).
  struct Poller {
    UniqueFd epoll;
    UniqueFd wake;
    std::thread thread;
    // Its channels throttled now (its thread only).
    int throttled = 0;
    // Asleep in epoll_wait, and its spin budget, for stats.
    std::atomic<bool> asleep{false};
    std::atomic<int64_t> spin_budget_ns{0};
  };

  FastChannelServer(const Options& options, CallCore* core,
                    std::vector<std::unique_ptr<Poller>> pollers);
  // Poller `index`: serves the channels dealt to it.
  void Poll(int index);
  // Poll's steps (poller threads only). Whether a call waits in `channel`:
  // posted, not taken yet, and its previous call answered.
  static bool Posted(const Channel& channel);
  // Lists the channels dealt to poller `index` in `channels` and, by
  // session, in `by_session`, marking them awake; a throttled channel of
  // the old list that was closed is throttled no more.
  void CollectChannels(int index,
                       std::vector<std::shared_ptr<Channel>>* channels,
                       absl::flat_hash_map<uint64_t, Channel*>* by_session)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Marks `channels` asleep, looks at them once more, and sleeps in
  // epoll_wait on their doorbells unless a call (or a channel list newer
  // than `seen_generation`) waits; polices the channels whose doorbells
  // woke it, then marks them awake. Returns whether it slept.
  bool SleepOnDoorbells(
      Poller& me, const std::vector<std::shared_ptr<Channel>>& channels,
      const absl::flat_hash_map<uint64_t, Channel*>& by_session,
      uint64_t seen_generation);
  // Wakes poller `index` (it looks at its channel list again).
  void Wake(int index);
  // Takes the call posted in `channel` through the codec. An allocation
  // call is prepared and appended to `prepared`; an operation (Free,
  // Checkpoint, Rollback, MatchPrefix) is submitted at once, and a refused
  // call answered at once.
  void Take(const std::shared_ptr<Channel>& channel, uint32_t seq,
            std::vector<AllocCall>* prepared);
  // Take's parts: the taken allocation call of `c` prepared through the
  // core (appended to `prepared`, or answered when refused), and the taken
  // free submitted.
  void PrepareTakenAlloc(Channel& c, Method method, const CallArrays& arrays,
                         std::vector<AllocCall>* prepared);
  void SubmitTakenFree(Channel& c);
  // The taken kMatchPrefix of `c`, submitted through the core's MatchPrefix
  // (the gRPC handler's own entry point), answered by its MatchReply.
  void SubmitTakenMatch(Channel& c);
  // The last step of every answer into `c`, once the codec has written it:
  // lets the poller take the channel's next call, then publishes answer
  // `seq` (waking a sleeping client).
  static void PublishAnswer(Channel& c, uint32_t seq);
  // Reads the rings waiting on `channel`'s doorbell and counts a strike
  // when no call explains them (poller only).
  void CountRings(Channel& channel);
  // Throttles, lifts the throttle of, or drops `channel` by its strikes
  // (poller only; takes mu_ and may call into the core).
  void Police(Channel& channel, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Marks `channel` throttled or not, keeping the counts (poller only).
  void SetThrottled(Channel& channel, bool throttled);
  // Logs a throttle, at most once a second (the rest are counted).
  void LogThrottle(const Channel& channel, Abuse abuse, int64_t strikes);
  // A return call taken from `channel`: times the ask it answers, if any.
  void NoteReturn(Channel& channel);

  const Options options_;
  CallCore* const core_;
  // Shared with every channel, whose end retires its header here (a
  // channel may outlive the server while a reply holds it).
  const std::shared_ptr<RetiredChannelHeaders> retired_headers_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Channel>> channels_
      ABSL_GUARDED_BY(mu_);
  // Bumped on every Open / Close so the poller refreshes its list.
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> sleeps_{0};
  std::atomic<int64_t> throttled_[kNumAbuses] = {};
  std::atomic<int64_t> dropped_[kNumAbuses] = {};
  std::atomic<int64_t> throttled_now_{0};
  std::atomic<int64_t> reclaim_asks_{0};
  std::atomic<int64_t> reclaim_returns_{0};
  AtomicHistogram reclaim_latency_{AtomicHistogram::Exponential(1e-5, 2, 16)};
  absl::Mutex log_mu_;
  absl::Time last_throttle_log_ ABSL_GUARDED_BY(log_mu_) = absl::InfinitePast();
  int64_t unlogged_throttles_ ABSL_GUARDED_BY(log_mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  int next_poller_ ABSL_GUARDED_BY(mu_) = 0;
  // Fixed at construction; each thread is started by the constructor.
  std::vector<std::unique_ptr<Poller>> pollers_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_FAST_CHANNEL_SERVER_H_
