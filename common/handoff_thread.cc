#include "common/handoff_thread.h"

#include <utility>

#include "absl/time/clock.h"
#include "common/cpu_relax.h"

namespace pagealloc {

HandoffThread::HandoffThread(absl::Duration max_spin)
    : spin_(max_spin),
      spin_budget_ns_(absl::ToInt64Nanoseconds(spin_.budget())) {
  thread_ = std::thread([this] { Loop(); });
}

HandoffThread::~HandoffThread() { Stop(); }

void HandoffThread::Run(std::function<void()> work) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.push_back(std::move(work));
      queued_.store(queue_.size(), std::memory_order_release);
      return;
    }
  }
  work();
}

void HandoffThread::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool HandoffThread::asleep() const {
  absl::MutexLock lock(&mu_);
  return asleep_;
}

void HandoffThread::Loop() {
  std::vector<std::function<void()>> batch;
  absl::Time idle_since = absl::Now();
  while (true) {
    // Spin for the next closure, for at most the budget.
    const absl::Time deadline = idle_since + spin_.budget();
    while (queued_.load(std::memory_order_acquire) == 0 &&
           absl::Now() < deadline) {
      CpuRelax();
    }
    bool caught;
    {
      absl::MutexLock lock(&mu_);
      // Caught while spinning, or queued while the last batch ran.
      caught = !queue_.empty();
      if (!caught && !stopping_) {
        asleep_ = true;
        sleeps_.fetch_add(1, std::memory_order_relaxed);
        mu_.Await(absl::Condition(
            +[](HandoffThread* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) {
              return !t->queue_.empty() || t->stopping_;
            },
            this));
        asleep_ = false;
      }
      if (queue_.empty()) return;  // stopping, and nothing left
      batch.swap(queue_);
      queued_.store(0, std::memory_order_relaxed);
    }
    const absl::Duration gap = absl::Now() - idle_since;
    if (caught) {
      spin_.Caught(gap);
    } else {
      spin_.Slept(gap);
    }
    spin_budget_ns_.store(absl::ToInt64Nanoseconds(spin_.budget()),
                          std::memory_order_relaxed);
    for (std::function<void()>& work : batch) work();
    batch.clear();
    idle_since = absl::Now();
  }
}

HandoffThreads::HandoffThreads(int count, absl::Duration max_spin) {
  threads_.reserve(count);
  for (int i = 0; i < count; ++i) {
    threads_.push_back(std::make_unique<HandoffThread>(max_spin));
  }
}

void HandoffThreads::Run(std::function<void()> work) {
  const uint64_t turn = next_.fetch_add(1, std::memory_order_relaxed);
  threads_[turn % threads_.size()]->Run(std::move(work));
}

void HandoffThreads::Stop() {
  for (std::unique_ptr<HandoffThread>& thread : threads_) thread->Stop();
}

}  // namespace pagealloc
