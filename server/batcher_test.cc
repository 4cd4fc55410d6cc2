// The batcher on its own, with a real pool and the CPU backend: who drives
// (the submitting thread when idle, the batcher thread with a window or past
// the round limit), which calls share a launch, per-session order, one
// driver at a time, and draining on Stop.

#include "server/batcher.h"

#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "allocator/page_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backend.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::pagealloc::testing::WaitFor;

constexpr int64_t kPageSize = 4;

class BatcherTest : public ::testing::Test {
 protected:
  void Start(Batcher::Options options) {
    backend_ = MakeCpuBackend();
    ASSERT_OK_AND_ASSIGN(pool_,
                         PagePool::Create({4096, kPageSize, FreePolicy::kLifo},
                                          backend_->executor()));
    for (OwnerId owner = 1; owner <= 8; ++owner) {
      ASSERT_OK(pool_->AddOwner(owner, 0));
    }
    options.debug_checks = true;
    ASSERT_OK_AND_ASSIGN(batcher_,
                         Batcher::Create(options, pool_.get(), backend_.get()));
  }

  // A one-token alloc call for `owner`, returned inline (no ring needed);
  // its completion records the launch and the thread it ran on.
  struct Completion final : public AllocCompletion {
    absl::Status Before() override { return absl::OkStatus(); }
    void Cancel(const absl::Status& cancelled) override {
      status = cancelled;
      done.Notify();
    }
    void Done(absl::Span<const AllocResult> results,
              absl::Span<const int64_t> slots,
              const LaunchInfo& launch) override {
      if (on_done) on_done();
      status = results[0].status;
      inline_slots.assign(slots.begin(), slots.end());
      launch_id = launch.launch_id;
      batch_requests = launch.batch_requests;
      thread = std::this_thread::get_id();
      done.Notify();
    }

    AllocRequest request;  // the call's one request (the call points here)
    std::function<void()> on_done;  // runs first in Done, when set
    absl::Notification done;
    uint64_t launch_id = 0;
    int32_t batch_requests = 0;
    std::thread::id thread;
    absl::Status status;
    std::vector<int64_t> inline_slots;
  };
  AllocCall DecodeCall(OwnerId owner, Completion* completion) {
    AllocCall call;
    call.session_id = owner;
    AllocRequest& request = completion->request;
    request.kind = RequestKind::kAlloc;
    request.owner = owner;
    request.seq_len = kPageSize;
    call.requests = absl::MakeSpan(&request, 1);
    call.num_slots = kPageSize;
    call.return_inline = true;
    call.completion = completion;
    return call;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<Batcher> batcher_;
};

TEST_F(BatcherTest, IdleBatcherRunsTheCallOnTheSubmittingThread) {
  Start({});
  Completion completion;
  ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(1, &completion)));
  // Done before SubmitAlloc returned, on this thread: no hand-off.
  ASSERT_TRUE(completion.done.HasBeenNotified());
  EXPECT_EQ(completion.thread, std::this_thread::get_id());
  EXPECT_OK(completion.status);
  EXPECT_EQ(batcher_->launches(), 1u);
}

TEST_F(BatcherTest, WithABatchWindowTheBatcherThreadDrives) {
  Batcher::Options options;
  options.batch_window = absl::Milliseconds(2);
  Start(options);
  Completion completion;
  ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(1, &completion)));
  completion.done.WaitForNotification();
  EXPECT_NE(completion.thread, std::this_thread::get_id());
  EXPECT_OK(completion.status);
}

TEST_F(BatcherTest, WithASpinTheBatcherThreadDrivesEveryLaunch) {
  Batcher::Options options;
  options.spin = absl::Milliseconds(1);
  Start(options);
  std::vector<Completion> completions(20);
  for (Completion& completion : completions) {
    ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(1, &completion)));
    completion.done.WaitForNotification();
    EXPECT_NE(completion.thread, std::this_thread::get_id());
    EXPECT_OK(completion.status);
  }
  // Calls after the spin ran out wake the sleeping thread.
  absl::SleepFor(absl::Milliseconds(20));
  Completion late;
  ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(1, &late)));
  late.done.WaitForNotification();
  EXPECT_OK(late.status);
  batcher_->Stop();
  EXPECT_EQ(pool_->Stats().used_pages, 21);
}

TEST_F(BatcherTest, CallsQueuedDuringALaunchShareTheNextOne) {
  Start({});
  absl::Notification blocking, release;
  std::thread driver([&] {
    ASSERT_OK(batcher_->SubmitOp(1, [&] {
      blocking.Notify();
      release.WaitForNotification();
    }));
  });
  blocking.WaitForNotification();
  // The driver is busy: these queue and return at once.
  Completion a, b, c;
  ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(2, &a)));
  ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(3, &b)));
  ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(4, &c)));
  EXPECT_FALSE(a.done.HasBeenNotified());
  release.Notify();
  driver.join();
  for (Completion* completion : {&a, &b, &c}) {
    ASSERT_TRUE(completion->done.HasBeenNotified());
    EXPECT_OK(completion->status);
    EXPECT_EQ(completion->launch_id, a.launch_id);
    EXPECT_EQ(completion->batch_requests, 3);
  }
  EXPECT_EQ(batcher_->launches(), 1u);
}

TEST_F(BatcherTest, TheSubmitterDrivesBoundedRoundsThenHandsOff) {
  Batcher::Options options;
  options.max_batch_requests = 1;  // one call per launch: one round each
  Start(options);
  absl::Notification blocking, release;
  std::thread::id driver_thread;
  std::thread driver([&] {
    driver_thread = std::this_thread::get_id();
    ASSERT_OK(batcher_->SubmitOp(1, [&] {
      blocking.Notify();
      release.WaitForNotification();
    }));
  });
  blocking.WaitForNotification();
  constexpr int kCalls = 2 * Batcher::kMaxInlineRounds;
  std::vector<Completion> completions(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(2, &completions[i])));
  }
  release.Notify();
  driver.join();
  for (Completion& completion : completions) {
    completion.done.WaitForNotification();
    EXPECT_OK(completion.status);
  }
  // Round 1 was the blocking op; rounds 2..kMaxInlineRounds took one call
  // each on the driver's thread; the batcher thread ran the rest.
  const int inline_calls = Batcher::kMaxInlineRounds - 1;
  for (int i = 0; i < kCalls; ++i) {
    if (i < inline_calls) {
      EXPECT_EQ(completions[i].thread, driver_thread) << "call " << i;
    } else {
      EXPECT_NE(completions[i].thread, driver_thread) << "call " << i;
    }
    if (i > 0) {
      EXPECT_GT(completions[i].launch_id, completions[i - 1].launch_id);
    }
  }
}

TEST_F(BatcherTest, ManySubmittersOneDriverAtATimeAndPerSessionOrder) {
  Start({});
  constexpr int kThreads = 8;
  constexpr int kStepsPerThread = 400;
  std::atomic<int> drivers_inside{0};
  std::atomic<bool> overlapped{false};
  absl::Mutex mu;
  std::vector<std::vector<int>> order(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const OwnerId owner = t + 1;
      std::vector<std::unique_ptr<Completion>> completions;
      for (int step = 0; step < kStepsPerThread; ++step) {
        if (step % 2 == 0) {
          ASSERT_OK(batcher_->SubmitOp(owner, [&, t, step] {
            if (drivers_inside.fetch_add(1) != 0) overlapped = true;
            {
              absl::MutexLock lock(&mu);
              order[t].push_back(step);
            }
            drivers_inside.fetch_sub(1);
          }));
        } else {
          completions.push_back(std::make_unique<Completion>());
          Completion* completion = completions.back().get();
          completion->on_done = [&, t, step] {
            absl::MutexLock lock(&mu);
            order[t].push_back(step);
          };
          ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(owner, completion)));
        }
      }
      for (auto& completion : completions) {
        completion->done.WaitForNotification();
        EXPECT_OK(completion->status);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  batcher_->Stop();
  EXPECT_FALSE(overlapped.load());
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(order[t].size(), static_cast<size_t>(kStepsPerThread));
    for (int step = 0; step < kStepsPerThread; ++step) {
      EXPECT_EQ(order[t][step], step) << "session " << t + 1;
    }
  }
  // Each alloc took one page; nothing was lost or doubled.
  EXPECT_OK(pool_->CheckInvariants());
  EXPECT_EQ(pool_->Stats().used_pages, kThreads * kStepsPerThread / 2);
}

// --batch_min_calls: with a window, a launch waits for company only when
// other sessions have been calling; a lone client never waits. Both the
// sleeping (mutex) and the spinning batcher thread.
class BatcherMinCallsTest : public BatcherTest,
                            public ::testing::WithParamInterface<bool> {
 protected:
  void StartWithWindow() {
    Batcher::Options options;
    options.batch_window = absl::Seconds(30);
    options.min_batch_calls = 4;
    // Sessions stay active for the whole test, however slow the machine.
    options.active_session_window = absl::Seconds(60);
    if (GetParam()) options.spin = absl::Milliseconds(50);
    Start(options);
  }
  // Makes sessions 1..n active: one call each, submitted together (so
  // that none of them waits for the others).
  void MakeActive(int n) {
    std::vector<Completion> completions(n);
    std::vector<AllocCall> calls;
    for (int i = 0; i < n; ++i) {
      calls.push_back(DecodeCall(i + 1, &completions[i]));
    }
    ASSERT_OK(batcher_->SubmitAllocs(std::move(calls)));
    for (Completion& completion : completions) {
      ASSERT_TRUE(
          completion.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
    }
  }
};

TEST_P(BatcherMinCallsTest, ALoneSessionNeverWaitsForTheWindow) {
  StartWithWindow();
  for (int i = 0; i < 3; ++i) {
    Completion completion;
    ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(1, &completion)));
    // Far less than the 30 s window.
    ASSERT_TRUE(
        completion.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
    EXPECT_OK(completion.status);
  }
}

TEST_P(BatcherMinCallsTest, TwoSessionsNeverWait) {
  StartWithWindow();
  MakeActive(2);
  // min(4, half of 2 active) = 1: no waiting for the other session.
  Completion completion;
  ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(1, &completion)));
  EXPECT_TRUE(completion.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

TEST_P(BatcherMinCallsTest, ACallWaitsForHalfTheActiveSessions) {
  StartWithWindow();
  MakeActive(4);
  // min(4, half of 4 active) = 2 calls end the wait: session 1's call waits...
  Completion first, second;
  ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(1, &first)));
  EXPECT_FALSE(
      first.done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  // ...until session 2's arrives, and both share one launch.
  ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(2, &second)));
  ASSERT_TRUE(first.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_TRUE(second.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(first.launch_id, second.launch_id);
  EXPECT_EQ(first.batch_requests, 2);
}

TEST_P(BatcherMinCallsTest, OperationsDoNotWaitForCompany) {
  StartWithWindow();
  MakeActive(4);
  absl::Notification ran;
  ASSERT_OK(batcher_->SubmitOp(1, [&] { ran.Notify(); }));
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

TEST_P(BatcherMinCallsTest, OperationsRunWhileTheSpinningThreadGathers) {
  if (!GetParam()) {
    GTEST_SKIP() << "the sleeping batcher thread runs operations with the "
                    "launch it gathers";
  }
  StartWithWindow();
  MakeActive(4);
  // Session 1's call waits for company (4 sessions are active)...
  Completion waiting;
  ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(1, &waiting)));
  // ...session 1's operation stays behind its call; session 2's runs now.
  absl::Notification behind, other;
  ASSERT_OK(batcher_->SubmitOp(1, [&] { behind.Notify(); }));
  ASSERT_OK(batcher_->SubmitOp(2, [&] { other.Notify(); }));
  EXPECT_TRUE(other.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_FALSE(behind.HasBeenNotified());
  EXPECT_FALSE(waiting.done.HasBeenNotified());
  Completion company;
  ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(2, &company)));
  ASSERT_TRUE(waiting.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(behind.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(company.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

// A spinning batcher thread lets a lone client's dedicated submitter (a
// fast-channel poller) drive its call (no hand-off, and no thread spinning
// for one client), and drives again once other sessions call.
TEST_P(BatcherMinCallsTest, ALoneClientDrivesItsOwnCallsUnderASpinningThread) {
  if (!GetParam()) GTEST_SKIP() << "only the spinning thread hands calls over";
  StartWithWindow();
  for (int i = 0; i < 3; ++i) {
    Completion completion;
    AllocCall call = DecodeCall(1, &completion);
    call.submitter_is_dedicated = true;
    ASSERT_OK(batcher_->SubmitAlloc(std::move(call)));
    ASSERT_TRUE(completion.done.HasBeenNotified());
    EXPECT_EQ(completion.thread, std::this_thread::get_id());
  }
  MakeActive(2);
  // Two sessions active (for 60 s): the batcher thread drives.
  Completion completion;
  ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(1, &completion)));
  ASSERT_TRUE(completion.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_NE(completion.thread, std::this_thread::get_id());
}

// A lone client's call submitted by a thread that is not dedicated (one of
// gRPC's callback threads) goes to the spinning batcher thread.
TEST_P(BatcherMinCallsTest, ALoneClientOnASharedThreadHandsItsCallsOver) {
  if (!GetParam()) GTEST_SKIP() << "only the spinning thread hands calls over";
  StartWithWindow();
  for (int i = 0; i < 3; ++i) {
    Completion completion;
    ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(1, &completion)));
    ASSERT_TRUE(
        completion.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
    EXPECT_OK(completion.status);
    EXPECT_NE(completion.thread, std::this_thread::get_id());
  }
}

TEST_P(BatcherMinCallsTest, WithoutLoneClientDrivesTheThreadDrivesEveryCall) {
  if (!GetParam()) GTEST_SKIP() << "only the spinning thread hands calls over";
  Batcher::Options options;
  options.batch_window = absl::Seconds(30);
  options.min_batch_calls = 4;
  options.spin = absl::Milliseconds(50);
  options.lone_client_drives = false;
  Start(options);
  Completion completion;
  AllocCall call = DecodeCall(1, &completion);
  call.submitter_is_dedicated = true;
  ASSERT_OK(batcher_->SubmitAlloc(std::move(call)));
  ASSERT_TRUE(completion.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_NE(completion.thread, std::this_thread::get_id());
}

INSTANTIATE_TEST_SUITE_P(SleepingAndSpinning, BatcherMinCallsTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Spinning" : "Sleeping";
                         });

// An idle batcher thread sleeps, whether it spins while calls flow or not.
class BatcherIdleTest : public BatcherTest,
                        public ::testing::WithParamInterface<bool> {};

TEST_P(BatcherIdleTest, AnIdleBatcherThreadSleeps) {
  Batcher::Options options;
  if (GetParam()) options.spin = absl::Microseconds(200);
  Start(options);
  for (int i = 0; i < 5; ++i) {
    Completion completion;
    ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(1, &completion)));
    completion.done.WaitForNotification();
  }
  // A spin is bounded (200 us here): the thread soon sleeps, and stays
  // asleep while nothing is queued.
  ASSERT_TRUE(
      WaitFor([&] { return batcher_->thread_asleep(); }, absl::Seconds(30)));
  EXPECT_GE(batcher_->thread_sleeps(), 1);
}

INSTANTIATE_TEST_SUITE_P(SleepingAndSpinning, BatcherIdleTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Spinning" : "Sleeping";
                         });

// Gaps between launches longer than the spin (the cap) halve the batcher
// thread's spin; each gap here is at least the 100 ms slept (less only if
// the batcher thread stalls for 99 ms), against a 1 ms cap.
TEST_F(BatcherTest, LongGapsBetweenLaunchesShrinkTheSpin) {
  Batcher::Options options;
  options.spin = absl::Milliseconds(1);
  Start(options);
  EXPECT_EQ(batcher_->spin_budget(), absl::Milliseconds(1));
  for (int i = 1; i <= 3; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    Completion completion;
    ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(1, &completion)));
    completion.done.WaitForNotification();
    EXPECT_EQ(batcher_->spin_budget(), absl::Milliseconds(1) / (1 << i));
  }
}

TEST_F(BatcherTest, StopFinishesQueuedWorkThenRefuses) {
  Batcher::Options options;
  options.batch_window = absl::Milliseconds(50);
  Start(options);
  std::vector<Completion> completions(3);
  for (Completion& completion : completions) {
    ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(1, &completion)));
  }
  batcher_->Stop();
  for (Completion& completion : completions) {
    ASSERT_TRUE(completion.done.HasBeenNotified());
    EXPECT_OK(completion.status);
  }
  Completion late;
  EXPECT_THAT(batcher_->SubmitAlloc(DecodeCall(1, &late)),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_THAT(batcher_->SubmitOp(1, [] {}),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

// Forwards to another executor, counting its launches.
class CountingExecutor final : public PlanExecutor {
 public:
  explicit CountingExecutor(PlanExecutor* inner) : inner_(inner) {}
  absl::Status InitFreeRing(int64_t capacity) override {
    return inner_->InitFreeRing(capacity);
  }
  absl::Status WriteFreeRing(int64_t position,
                             absl::Span<const int64_t> pages) override {
    return inner_->WriteFreeRing(position, pages);
  }
  absl::Status Execute(const BatchPlan& plan) override {
    ++launches;
    return inner_->Execute(plan);
  }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  absl::StatusOr<std::vector<int64_t>> ReadFreeRing() override {
    return inner_->ReadFreeRing();
  }
  const char* name() const override { return inner_->name(); }

  std::atomic<int> launches{0};

 private:
  PlanExecutor* const inner_;
};

// A return_inline call (a reserve's refill) is answered from the pool's
// own expansion, without a launch, when it shares a batch with a call that
// launches, too; under --kv_scrub it goes through the executor, which
// zeroes pages changing owner.
class BatcherInlineTest : public BatcherTest,
                          public ::testing::WithParamInterface<bool> {};

TEST_P(BatcherInlineTest, InlineCallsNeedNoLaunchUnlessThePoolScrubs) {
  const bool scrub = GetParam();
  backend_ = MakeCpuBackend();
  CountingExecutor executor(backend_->executor());
  PoolOptions pool_options{64, kPageSize, FreePolicy::kLifo};
  pool_options.scrub = scrub;
  ASSERT_OK_AND_ASSIGN(pool_, PagePool::Create(pool_options, &executor));
  ASSERT_OK(pool_->AddOwner(1, 0));
  ASSERT_OK(pool_->AddOwner(2, 0));
  Batcher::Options options;
  options.debug_checks = true;
  ASSERT_OK_AND_ASSIGN(batcher_,
                       Batcher::Create(options, pool_.get(), backend_.get()));

  // One batch: a refill of two pages for session 1, and a call of one page
  // for session 2 into memory the caller owns (the CPU executor writes host
  // memory).
  Completion refill, ring;
  AllocCall refill_call = DecodeCall(1, &refill);
  refill.request.seq_len = 2 * kPageSize;
  refill_call.num_slots = 2 * kPageSize;
  std::vector<int64_t> ring_slots(kPageSize, -1);
  AllocCall ring_call = DecodeCall(2, &ring);
  ring_call.return_inline = false;
  ring.request.destination = ring_slots.data();
  std::vector<AllocCall> calls;
  calls.push_back(std::move(refill_call));
  calls.push_back(std::move(ring_call));
  ASSERT_OK(batcher_->SubmitAllocs(std::move(calls)));
  refill.done.WaitForNotification();
  ring.done.WaitForNotification();
  ASSERT_OK(refill.status);
  ASSERT_OK(ring.status);
  // One launch: the call into memory (under scrub the refill joins it).
  EXPECT_EQ(executor.launches.load(), 1);
  // The refill holds whole pages that session 1 owns, in order.
  ASSERT_EQ(refill.inline_slots.size(), 2u * kPageSize);
  for (int64_t k = 0; k < 2 * kPageSize; ++k) {
    const int64_t slot = refill.inline_slots[k];
    EXPECT_EQ(slot % kPageSize, k % kPageSize);
    EXPECT_EQ(pool_->OwnerOf(slot / kPageSize), 1u);
  }
  EXPECT_EQ(ring_slots[0] % kPageSize, 0);
  EXPECT_EQ(pool_->OwnerOf(ring_slots[0] / kPageSize), 2u);

  // A batch of refills alone launches nothing; under scrub it launches
  // (with nothing to zero: the pages go back to the session that freed them).
  ASSERT_OK(pool_->FreeSlots(1, refill.inline_slots).status());
  Completion again;
  ASSERT_OK(batcher_->SubmitAlloc(DecodeCall(1, &again)));
  again.done.WaitForNotification();
  ASSERT_OK(again.status);
  EXPECT_EQ(executor.launches.load(), scrub ? 2 : 1);
  ASSERT_EQ(again.inline_slots.size(), static_cast<size_t>(kPageSize));
  EXPECT_EQ(again.inline_slots[0], refill.inline_slots[0]);  // LIFO
  EXPECT_EQ(pool_->OwnerOf(again.inline_slots[0] / kPageSize), 1u);

  // A session with a call that launches and a refill in one batch keeps
  // both in the launch, in order: the refill's page follows the call's
  // (session 1 again: its own pages need no scrub).
  Completion first, second;
  std::vector<int64_t> first_slots(kPageSize, -1);
  AllocCall first_call = DecodeCall(1, &first);
  first_call.return_inline = false;
  first.request.destination = first_slots.data();
  calls.clear();
  calls.push_back(std::move(first_call));
  calls.push_back(DecodeCall(1, &second));
  ASSERT_OK(batcher_->SubmitAllocs(std::move(calls)));
  first.done.WaitForNotification();
  second.done.WaitForNotification();
  ASSERT_OK(first.status);
  ASSERT_OK(second.status);
  EXPECT_EQ(executor.launches.load(), scrub ? 3 : 2);
  EXPECT_EQ(first.launch_id, second.launch_id);
  ASSERT_EQ(second.inline_slots.size(), static_cast<size_t>(kPageSize));
  // The pool's front pages in admission order (LIFO: the freed page first).
  EXPECT_EQ(first_slots[0], refill.inline_slots[kPageSize]);
  EXPECT_NE(second.inline_slots[0], first_slots[0]);
  EXPECT_EQ(pool_->OwnerOf(second.inline_slots[0] / kPageSize), 1u);
  batcher_->Stop();
}

INSTANTIATE_TEST_SUITE_P(Scrub, BatcherInlineTest, ::testing::Bool());

TEST(BatcherMetricsTest, EveryHistogramHasAscendingBounds) {
  const BatcherMetrics metrics;
  for (const AtomicHistogram* histogram :
       {&metrics.requests_per_batch, &metrics.tokens_per_batch,
        &metrics.queue_wait_seconds, &metrics.execute_seconds,
        &metrics.complete_seconds}) {
    const std::vector<double> bounds = histogram->Take().upper_bounds;
    ASSERT_FALSE(bounds.empty());
    for (size_t i = 1; i < bounds.size(); ++i) {
      EXPECT_LT(bounds[i - 1], bounds[i]);
    }
  }
}

}  // namespace
}  // namespace pagealloc
