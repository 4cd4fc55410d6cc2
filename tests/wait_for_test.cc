#include "tests/wait_for.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace pagealloc::testing {
namespace {

TEST(WaitForTest, APredicateThatHoldsIsCheckedOnce) {
  int calls = 0;
  EXPECT_TRUE(WaitFor(
      [&] {
        ++calls;
        return true;
      },
      absl::Minutes(1)));
  EXPECT_EQ(calls, 1);
}

TEST(WaitForTest, KeepsTryingUntilThePredicateHolds) {
  int calls = 0;
  EXPECT_TRUE(WaitFor([&] { return ++calls == 3; }, absl::Minutes(1),
                      absl::Milliseconds(1)));
  EXPECT_EQ(calls, 3);
}

TEST(WaitForTest, AZeroTimeoutIsASingleCheck) {
  int calls = 0;
  EXPECT_FALSE(WaitFor(
      [&] {
        ++calls;
        return false;
      },
      absl::ZeroDuration()));
  EXPECT_EQ(calls, 1);
}

TEST(WaitForTest, GivesUpOnlyAfterTheTimeoutAndAFinalCheck) {
  int calls = 0;
  const absl::Time start = absl::Now();
  absl::Time last_call;
  EXPECT_FALSE(WaitFor(
      [&] {
        ++calls;
        last_call = absl::Now();
        return false;
      },
      absl::Milliseconds(30), absl::Milliseconds(5)));
  EXPECT_GE(calls, 1);
  // The last call starts at or after the deadline, never before it.
  EXPECT_GE(last_call - start, absl::Milliseconds(30));
}

TEST(WaitForTest, SeesWhatAnotherThreadMakesTrue) {
  std::atomic<bool> flag{false};
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(10));
    flag.store(true);
  });
  EXPECT_TRUE(WaitFor([&] { return flag.load(); }, absl::Minutes(1),
                      absl::Milliseconds(1)));
  setter.join();
}

}  // namespace
}  // namespace pagealloc::testing
