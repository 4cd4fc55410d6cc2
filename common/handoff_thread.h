// HandoffThread: one thread that runs the closures handed to it, in the
// order they were handed over. It exists to take work off a thread that
// must not do it: the batcher thread hands it the sending of gRPC answers
// (server/grpc_service.h), so that the one thread that drives the pool
// spends its time on launches.
//
// Between closures the thread spins (common/adaptive_spin.h) for at most
// the configured time, so that work flowing steadily is handed over
// without a wake-up (a futex wake, tens of microseconds on a virtual
// machine), then sleeps; an idle HandoffThread sleeps.
//
// This class is thread-safe.

#ifndef PAGEALLOC_COMMON_HANDOFF_THREAD_H_
#define PAGEALLOC_COMMON_HANDOFF_THREAD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/adaptive_spin.h"

namespace pagealloc {

class HandoffThread {
 public:
  // Starts the thread. `max_spin`: the longest it spins for the next
  // closure before it sleeps (0: it sleeps at once).
  explicit HandoffThread(absl::Duration max_spin);
  // Stop().
  ~HandoffThread();

  HandoffThread(const HandoffThread&) = delete;
  HandoffThread& operator=(const HandoffThread&) = delete;

  // Queues `work` for the thread. Once Stop has begun, runs it on the
  // calling thread before returning instead.
  void Run(std::function<void()> work) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs what is queued, then joins the thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Whether the thread sleeps waiting for work (not spinning, not running).
  bool asleep() const ABSL_LOCKS_EXCLUDED(mu_);
  // Times the thread went to sleep since it started.
  int64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }
  // How long the thread spins now after a closure (its adaptive budget).
  absl::Duration spin_budget() const {
    return absl::Nanoseconds(spin_budget_ns_.load(std::memory_order_relaxed));
  }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  std::vector<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool asleep_ ABSL_GUARDED_BY(mu_) = false;
  // queue_.size(), readable without mu_ by the spinning thread.
  std::atomic<int64_t> queued_{0};
  std::atomic<int64_t> sleeps_{0};
  AdaptiveSpin spin_;  // the thread's own
  std::atomic<int64_t> spin_budget_ns_;
  std::thread thread_;
};

// HandoffThreads: a fixed set of HandoffThreads taken in turn, for pieces
// of work that do not depend on each other (the answers of one launch, each
// to its own client): pieces handed to different threads run at the same
// time, in no order between them, so the last of several pieces is done
// about when the first is instead of after all the others.
//
// This class is thread-safe.
class HandoffThreads {
 public:
  // Starts `count` (>= 1) threads, each spinning at most `max_spin`.
  HandoffThreads(int count, absl::Duration max_spin);

  HandoffThreads(const HandoffThreads&) = delete;
  HandoffThreads& operator=(const HandoffThreads&) = delete;

  // Queues `work` on the next thread in turn (HandoffThread::Run).
  void Run(std::function<void()> work);

  // Stops every thread (HandoffThread::Stop). Idempotent.
  void Stop();

  int size() const { return static_cast<int>(threads_.size()); }
  const HandoffThread& thread(int i) const { return *threads_[i]; }

 private:
  std::vector<std::unique_ptr<HandoffThread>> threads_;
  std::atomic<uint64_t> next_{0};
};

}  // namespace pagealloc

#endif  // PAGEALLOC_COMMON_HANDOFF_THREAD_H_
