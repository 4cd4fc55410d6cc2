// Batcher: drives the pool, one thread at a time. Handlers queue work; the
// driving thread takes everything queued since the last launch (up to
// max_batch_requests / max_batch_tokens, optionally waiting batch_window for
// more), runs the allocation calls of all sessions as one pool batch (one
// executor launch) and the other operations around it, and completes each
// piece of work.
//
// Who drives. When nothing is running and no batch window is set, the thread
// that submits work drives at once, on its own stack: its call and whatever
// else is queued become the next launch, and the answer leaves without a
// hand-off to another thread (each hand-off is a futex wake-up, tens of
// microseconds on a virtual machine). Work submitted while a launch runs
// waits in the queue; the driver takes it next, for at most
// kMaxInlineRounds launches, and then leaves the rest to the batcher's own
// thread so that a handler thread returns to gRPC in bounded time. With a
// batch window, only the batcher thread drives (it is the one that waits);
// with Options.spin too (it is the one that spins), except for a lone
// client's call submitted by a dedicated thread (Options.lone_client_drives,
// AllocCall.submitter_is_dedicated): when one session alone has called
// lately and nothing is queued or running, its submitter drives as above,
// and the batcher thread, finding nothing to do, stops spinning.
// The daemon chooses among these modes in one place,
// server/scheduling_policy.h, which fills Options.
//
// Spinning adapts (common/adaptive_spin.h): Options.spin is the longest the
// batcher thread spins after a launch; it spins about twice the gaps it
// has lately seen between launches when those are shorter than that, and
// not at all when they are longer. An idle batcher thread sleeps on the
// mutex (thread_asleep()).
//
// Ordering: the work of one session applies in the order it was queued. An
// operation (free, checkpoint, rollback, close) of a session that has an
// allocation waiting in the current launch flushes that launch first;
// operations of other sessions may run before the launch, which only ever
// gives the launch more free pages.
//
// This class is thread-safe.

#ifndef PAGEALLOC_SERVER_BATCHER_H_
#define PAGEALLOC_SERVER_BATCHER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "allocator/page_pool.h"
#include "common/adaptive_spin.h"
#include "server/backend.h"
#include "server/histogram.h"

namespace pagealloc {

// What one launch was, for responses and metrics.
struct LaunchInfo {
  uint64_t launch_id = 0;
  // The pool's completion counter once the launch's slots are written
  // (Backend::CompleteLaunch); a launch that wrote nothing carries the
  // value of the last one that did.
  uint64_t completion_value = 0;
  int32_t batch_calls = 0;     // allocation calls in the launch
  int32_t batch_requests = 0;  // requests in the launch, all calls together
  int64_t batch_slots = 0;
  absl::Duration queue_wait;    // this call's wait before the launch began
  absl::Duration execute_time;  // plan + launch (+ wait, in sync mode)
};

// What the batcher records about each launch.
struct BatcherMetrics {
  AtomicHistogram requests_per_batch{AtomicHistogram::Exponential(1, 2, 14)};
  AtomicHistogram tokens_per_batch{AtomicHistogram::Exponential(1, 4, 12)};
  // Per call: from queueing to the start of its launch.
  AtomicHistogram queue_wait_seconds{AtomicHistogram::Exponential(1e-6, 2, 22)};
  // Per launch: planning, the executor's launch and, in sync mode, its wait.
  AtomicHistogram execute_seconds{AtomicHistogram::Exponential(1e-6, 2, 22)};
  // Per launch, the part of execute spent completing it: the host's wait
  // for the GPU in sync mode, queuing the completion counter's write in
  // async mode.
  AtomicHistogram complete_seconds{AtomicHistogram::Exponential(1e-6, 2, 22)};
};

// How the batcher hands an allocation call back to whoever submitted it.
// The driving thread calls, in order: Before (only when the call has
// operations that come first), then exactly one of Cancel (Before failed;
// the call was not launched) or Done (the launch ran, or was refused).
class AllocCompletion {
 public:
  virtual ~AllocCompletion() = default;
  // Runs the session's operations that come first in this call
  // (AllocOptions.free_pages_first, checkpoint_first), in order with the
  // session's other work. When it fails the call is not launched.
  virtual absl::Status Before() = 0;
  virtual void Cancel(const absl::Status& status) = 0;
  // One result per request. inline_slots (return_inline) holds the slots of
  // the accepted requests, concatenated in request order. The spans live
  // until Done returns.
  virtual void Done(absl::Span<const AllocResult> results,
                    absl::Span<const int64_t> inline_slots,
                    const LaunchInfo& launch) = 0;
};

// One allocation call of one session.
struct AllocCall {
  uint64_t session_id = 0;
  // The requests, owned by the submitter, which keeps them alive until the
  // call completes. Destinations already point into the session's ring,
  // except when return_inline is set: then the pool writes the slots into
  // the batcher's host memory itself, with no launch (Expansion::kPool), or,
  // when the pool scrubs, the launch writes them to the batcher's scratch
  // buffer and the batcher copies them back; either way they are handed
  // over as `inline_slots`.
  absl::Span<AllocRequest> requests;
  int64_t num_slots = 0;
  bool return_inline = false;
  bool async_completion = false;
  // Admit every request of the call or none (PagePool's CallSpan).
  bool all_or_nothing = false;
  // The client's tag for the call (PagePool's CallSpan; id 0: untagged).
  CallTag call;
  // Whether completion->Before must run first.
  bool has_before = false;
  // The submitting thread serves calls for good (a fast-channel poller),
  // rather than being one of a pool that takes turns (gRPC's callback
  // threads). Only such a thread drives a lone client's call itself
  // (Options.lone_client_drives): a launch's CUDA calls and its walk over
  // the pool cost about twice as much on a thread that has not launched
  // lately (docs/performance.md, "The gRPC path on the H200"), more than
  // handing the call to the spinning batcher thread.
  bool submitter_is_dedicated = false;
  // Must live until Cancel or Done has returned.
  AllocCompletion* completion = nullptr;
};

class Batcher {
 public:
  // The batcher's own settings. The daemon's defaults, and the rules
  // between these fields and the other threads' settings, live in
  // server/scheduling_policy.h, which fills this struct.
  struct Options {
    int64_t max_batch_requests = 8192;
    int64_t max_batch_tokens = 1 << 21;
    // The longest the batcher thread holds queued work for more calls to
    // join the launch (measured from when the oldest queued work arrived).
    absl::Duration batch_window = absl::ZeroDuration();
    // With a window: stop waiting as soon as this many allocation calls are
    // queued, capped at half (rounded up) the sessions that submitted
    // allocation calls in the last active_session_window, so that one or two
    // clients never wait for company that is not coming. 0: wait the whole
    // window.
    int min_batch_calls = 0;
    // A session counts as active (for min_batch_calls) this long after its
    // last allocation call.
    absl::Duration active_session_window = absl::Milliseconds(2);
    // With spin > 0 the batcher thread is the only driver: submitters just
    // queue and return (a fast-channel poller goes back to taking calls
    // while a launch runs), and after each batch the thread polls the
    // queue for this long before it sleeps, so a hand-off costs no
    // wake-up while work flows. Costs a core while busy. This is the
    // adaptive spin's cap (see the class comment).
    absl::Duration spin = absl::ZeroDuration();
    // With spin: a lone client's call is driven by its submitter when that
    // is a dedicated thread (AllocCall.submitter_is_dedicated; see "Who
    // drives"). Needs a window with min_batch_calls (the active sessions
    // are tracked only then).
    bool lone_client_drives = true;
    // Check the pool's invariants after every batch; abort on a violation
    // (a bug, never a bad request). Slow: for tests and debugging.
    bool debug_checks = false;
  };

  // `pool` and `backend` must outlive the batcher. Creates the scratch
  // buffer for inline results (max_batch_tokens slots).
  static absl::StatusOr<std::unique_ptr<Batcher>> Create(const Options& options,
                                                         PagePool* pool,
                                                         Backend* backend);

  // What the batcher has recorded about its launches.
  const BatcherMetrics& metrics() const { return metrics_; }
  ~Batcher();

  // Launches the calling thread drives, at most, before handing the queue
  // to the batcher thread.
  static constexpr int kMaxInlineRounds = 4;

  // Queues an allocation call. REQUIRES: call.requests.size() <=
  // max_batch_requests, call.num_slots <= max_batch_tokens (the call core
  // refuses larger calls) and call.completion is set. Returns UNAVAILABLE
  // once Stop has begun. The completion may run on the calling thread
  // before this returns (see "Who drives"), so the caller must hold no lock
  // that the completion or other queued work takes.
  absl::Status SubmitAlloc(AllocCall call) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues several calls at once, in order, so that they share a launch
  // (unless one is running); all or none (UNAVAILABLE once Stop has begun).
  absl::Status SubmitAllocs(std::vector<AllocCall> calls)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Queues `op`, which runs in order with the session's other work, possibly
  // on the calling thread before this returns (as for SubmitAlloc). Returns
  // UNAVAILABLE once Stop has begun.
  absl::Status SubmitOp(uint64_t session_id, std::function<void()> op)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Sets work the driving thread runs before each launch's admission, in
  // order with everything else it drives (the call core frees the pages
  // whose release fence has passed there, so a starving allocation sees
  // them). Set before any work is submitted.
  void SetBeforeLaunch(std::function<void()> hook) {
    before_launch_ = std::move(hook);
  }

  // Refuses new work, finishes everything queued, and joins the thread.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t launches() const ABSL_LOCKS_EXCLUDED(mu_);

  // Whether the batcher thread is asleep waiting for work (not spinning,
  // not driving).
  bool thread_asleep() const ABSL_LOCKS_EXCLUDED(mu_);
  // Times the batcher thread went to sleep since start.
  int64_t thread_sleeps() const {
    return thread_sleeps_.load(std::memory_order_relaxed);
  }
  // How long the batcher thread spins now after a launch (its adaptive
  // budget; 0 without Options.spin).
  absl::Duration spin_budget() const {
    return absl::Nanoseconds(spin_budget_ns_.load(std::memory_order_relaxed));
  }

 private:
  struct Work {
    uint64_t session_id = 0;
    absl::Time queued_at;
    std::unique_ptr<AllocCall> alloc;  // or:
    std::function<void()> op;
  };

  Batcher(const Options& options, PagePool* pool, Backend* backend,
          std::unique_ptr<RingMemory> scratch);

  // Queues `works`; then drives if nobody is driving (see "Who drives").
  absl::Status Submit(std::vector<Work> works) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the submitter of the last `submitted` works queued drives them
  // itself when nobody drives (see "Who drives"); `dedicated`: the
  // submitter is a dedicated thread (AllocCall.submitter_is_dedicated).
  bool SubmitterDrives(size_t submitted, bool dedicated) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The batcher thread: drives whenever work is queued and nobody else is.
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for the batch window (batcher thread only, without spin: the
  // spinning thread waits in SpinForCompany), then takes the next batch of
  // work off the queue. REQUIRES: this thread is the driver and the queue is
  // not empty.
  void TakeBatch(std::vector<Work>* batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How many queued allocation calls end the window's wait:
  // min_batch_calls capped at the active sessions, or no limit (wait the
  // whole window).
  int64_t CallsToWaitFor() const;
  // Only a window with min_batch_calls needs the active sessions: without
  // one, Submit and TakeBatch skip that bookkeeping.
  bool TracksActiveSessions() const {
    return options_.batch_window > absl::ZeroDuration() &&
           options_.min_batch_calls > 0;
  }
  // Spinning batcher thread: spins until CallsToWaitFor() allocation calls
  // are queued or the oldest work has waited batch_window.
  void SpinForCompany() ABSL_LOCKS_EXCLUDED(mu_);
  // While SpinForCompany waits: runs the queued operations that no queued
  // allocation call of their own session precedes (they need not wait for
  // the launch being gathered), leaving the calls queued. Returns whether it
  // ran any.
  bool RunOpsWhileGathering() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `batch` against the pool. REQUIRES: this thread is the driver.
  void RunBatch(std::vector<Work>* batch) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs the allocation calls gathered so far: the return_inline ones
  // expanded by the pool on the host (unless the pool scrubs), the others
  // as one launch.
  void Launch(std::vector<Work>* pending) ABSL_LOCKS_EXCLUDED(mu_);
  // Admits `pending` in one pool call whose slots `expansion` writes, and
  // answers each call. Empties `pending`.
  void LaunchCalls(std::vector<Work>* pending, Expansion expansion)
      ABSL_LOCKS_EXCLUDED(mu_);
  // LaunchCalls' steps. Collects the requests and call spans of `pending`
  // into launch_requests_ and launch_calls_, pointing the destinations of
  // return_inline calls into the scratch buffer (Expansion::kExecutor) or
  // host_slots_ (kPool).
  void GatherRequests(std::vector<Work>* pending, Expansion expansion);
  // Completes the launch the pool has just run (launch_results_): the
  // backend's completion (a host wait when any call needs one; none for
  // the pool's own expansion), the launch id, execute time and metrics in
  // `launch`. Returns the completion's status.
  absl::Status CompleteLaunch(const std::vector<Work>& pending,
                              absl::Time start, Expansion expansion,
                              LaunchInfo* launch) ABSL_LOCKS_EXCLUDED(mu_);
  // Hands `work`'s call its results (launch_results_ from `first`): a
  // failed completion fails its accepted requests, inline slots are copied
  // to the host (from the device scratch, or from host_slots_), then its
  // completion's Done runs.
  void FinishCall(const Work& work, size_t first,
                  const absl::Status& completion, absl::Time start,
                  Expansion expansion, LaunchInfo* launch);

  const Options options_;
  PagePool* const pool_;
  Backend* const backend_;
  const std::unique_ptr<RingMemory> scratch_;
  BatcherMetrics metrics_;

  mutable absl::Mutex mu_;
  std::deque<Work> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // A thread (the batcher's or a submitter's) is running work on the pool;
  // only that thread touches pool_ through this class until it clears this.
  bool driving_ ABSL_GUARDED_BY(mu_) = false;
  // queue_.size(), readable without mu_ by the spinning batcher thread.
  std::atomic<int64_t> queued_{0};
  // Allocation calls in queue_, likewise.
  std::atomic<int64_t> queued_calls_{0};
  int64_t queued_calls_locked_ ABSL_GUARDED_BY(mu_) = 0;
  // When the oldest queued work arrived (absl::ToUnixNanos), for the window.
  std::atomic<int64_t> oldest_queued_ns_{0};
  // When each session last submitted an allocation call; pruned to
  // Options.active_session_window whenever a batch is taken.
  absl::flat_hash_map<uint64_t, absl::Time> last_alloc_ ABSL_GUARDED_BY(mu_);
  // last_alloc_.size() after the last pruning.
  std::atomic<int64_t> active_sessions_{0};
  std::atomic<bool> stop_requested_{false};
  uint64_t launches_ ABSL_GUARDED_BY(mu_) = 0;
  // The batcher thread's spin (that thread only), and its budget for
  // spin_budget().
  AdaptiveSpin spin_;
  std::atomic<int64_t> spin_budget_ns_;
  bool thread_asleep_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> thread_sleeps_{0};
  // SetBeforeLaunch's hook (read by the driver only).
  std::function<void()> before_launch_;
  // Launch's buffers, kept between launches (the driver only).
  std::vector<AllocRequest> launch_requests_;
  std::vector<CallSpan> launch_calls_;
  std::vector<AllocResult> launch_results_;
  std::vector<int64_t> inline_slots_;
  // The return_inline calls of a batch, and the host memory the pool
  // expands their slots into (Expansion::kPool).
  std::vector<Work> host_pending_;
  std::vector<int64_t> host_slots_;
  // The sessions with a call in the batch's launch (Launch).
  absl::flat_hash_set<uint64_t> launch_sessions_;
  std::thread thread_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_BATCHER_H_
