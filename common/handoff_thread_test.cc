#include "common/handoff_thread.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace pagealloc {
namespace {

TEST(HandoffThreadTest, RunsClosuresInOrderOnItsOwnThread) {
  constexpr int kClosures = 2000;
  std::vector<int> order;  // written by the handoff thread only
  std::atomic<int> on_caller{0};
  const std::thread::id caller = std::this_thread::get_id();
  {
    HandoffThread thread(absl::Microseconds(200));
    for (int i = 0; i < kClosures; ++i) {
      thread.Run([&, i] {
        order.push_back(i);
        if (std::this_thread::get_id() == caller) ++on_caller;
      });
    }
    thread.Stop();  // runs what is queued
  }
  ASSERT_EQ(order.size(), kClosures);
  for (int i = 0; i < kClosures; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(on_caller.load(), 0);
}

TEST(HandoffThreadTest, StopRunsWhatIsQueuedThenRunRunsOnTheCaller) {
  HandoffThread thread(absl::ZeroDuration());
  absl::Notification release;
  std::atomic<int> ran{0};
  // The first closure holds the thread while more queue behind it.
  thread.Run([&] {
    release.WaitForNotification();
    ++ran;
  });
  for (int i = 0; i < 10; ++i) thread.Run([&] { ++ran; });
  release.Notify();
  thread.Stop();
  EXPECT_EQ(ran.load(), 11);
  std::thread::id ran_on;
  thread.Run([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  thread.Stop();  // idempotent
}

// Spinning or not, a thread with nothing to do ends up asleep, and wakes
// for the next closure.
class HandoffThreadIdleTest : public ::testing::TestWithParam<bool> {};

TEST_P(HandoffThreadIdleTest, AnIdleThreadSleepsAndWakesForWork) {
  HandoffThread thread(GetParam() ? absl::Microseconds(200)
                                  : absl::ZeroDuration());
  for (int round = 0; round < 3; ++round) {
    absl::Notification done;
    thread.Run([&] { done.Notify(); });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    // The spin is bounded (200 us): the thread soon sleeps.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!thread.asleep() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_TRUE(thread.asleep());
  }
  EXPECT_GE(thread.sleeps(), 3);
}

INSTANTIATE_TEST_SUITE_P(SleepingAndSpinning, HandoffThreadIdleTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Spinning" : "Sleeping";
                         });

// Many threads hand work over at once: every closure runs exactly once.
TEST(HandoffThreadTest, ManyProducersEveryClosureRunsOnce) {
  constexpr int kProducers = 4;
  constexpr int kEach = 5000;
  std::atomic<int> ran{0};
  HandoffThread thread(absl::Microseconds(50));
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) thread.Run([&] { ++ran; });
    });
  }
  for (std::thread& producer : producers) producer.join();
  thread.Stop();
  EXPECT_EQ(ran.load(), kProducers * kEach);
}

TEST(HandoffThreadsTest, TakesItsThreadsInTurn) {
  constexpr int kThreads = 3;
  constexpr int kClosures = 30;
  std::vector<std::thread::id> ran_on(kClosures);
  HandoffThreads threads(kThreads, absl::Microseconds(50));
  ASSERT_EQ(threads.size(), kThreads);
  for (int i = 0; i < kClosures; ++i) {
    threads.Run([&ran_on, i] { ran_on[i] = std::this_thread::get_id(); });
  }
  threads.Stop();
  for (int i = 0; i < kClosures; ++i) {
    EXPECT_NE(ran_on[i], std::this_thread::get_id()) << i;
    EXPECT_EQ(ran_on[i], ran_on[i % kThreads]) << i;
    if (i > 0 && i < kThreads) {
      EXPECT_NE(ran_on[i], ran_on[0]) << i;
    }
  }
}

// The point of several threads: a piece of work does not wait for the one
// handed over before it. The first closure waits until the second has run,
// which only another thread can do.
TEST(HandoffThreadsTest, PiecesOnDifferentThreadsRunAtTheSameTime) {
  HandoffThreads threads(2, absl::ZeroDuration());
  absl::Notification second_ran;
  std::atomic<bool> first_saw_second{false};
  threads.Run([&] {
    first_saw_second =
        second_ran.WaitForNotificationWithTimeout(absl::Seconds(60));
  });
  threads.Run([&] { second_ran.Notify(); });
  threads.Stop();
  EXPECT_TRUE(first_saw_second.load());
  threads.Stop();  // idempotent
}

}  // namespace
}  // namespace pagealloc
