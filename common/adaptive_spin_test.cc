#include "common/adaptive_spin.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace pagealloc {
namespace {

constexpr absl::Duration kCap = absl::Microseconds(200);

absl::Duration Us(int64_t us) { return absl::Microseconds(us); }

TEST(AdaptiveSpinTest, StartsAtTheCap) {
  AdaptiveSpin spin(kCap);
  EXPECT_EQ(spin.budget(), kCap);
  EXPECT_EQ(spin.cap(), kCap);
}

TEST(AdaptiveSpinTest, ZeroCapNeverSpins) {
  AdaptiveSpin spin(absl::ZeroDuration());
  spin.Caught(Us(0));
  spin.Slept(Us(10));
  EXPECT_EQ(spin.budget(), absl::ZeroDuration());
  AdaptiveSpin negative(Us(-5));
  EXPECT_EQ(negative.budget(), absl::ZeroDuration());
}

TEST(AdaptiveSpinTest, GapsLongerThanTheCapHalveTheBudgetToZero) {
  AdaptiveSpin spin(kCap);
  // A scheduler calling once per forward pass: every gap is milliseconds.
  absl::Duration previous = spin.budget();
  int calls = 0;
  while (spin.budget() > absl::ZeroDuration()) {
    spin.Slept(absl::Milliseconds(5));
    ++calls;
    EXPECT_LT(spin.budget(), previous);
    EXPECT_TRUE(spin.budget() == previous / 2 ||
                spin.budget() == absl::ZeroDuration());
    previous = spin.budget();
    ASSERT_LE(calls, 10);
  }
  // 200 -> 100 -> 50 -> 25 -> 12.5 -> 6.25 -> 3.125 -> 1.5625 (< 2): 0.
  EXPECT_EQ(calls, 7);
  EXPECT_EQ(spin.slept(), 7);
  EXPECT_EQ(spin.caught(), 0);
}

TEST(AdaptiveSpinTest, ASleptGapWithinTheCapRaisesTheBudgetToCoverIt) {
  AdaptiveSpin spin(kCap);
  for (int i = 0; i < 10; ++i) spin.Slept(absl::Milliseconds(1));
  ASSERT_EQ(spin.budget(), absl::ZeroDuration());
  // Calls come back to back again: the first wakes the thread 30 us after
  // it went idle; the budget now covers twice that.
  spin.Slept(Us(30));
  EXPECT_EQ(spin.budget(), Us(60));
  spin.Caught(Us(40));
  EXPECT_EQ(spin.budget(), Us(80));
  // Never past the cap.
  spin.Slept(Us(150));
  EXPECT_EQ(spin.budget(), kCap);
}

TEST(AdaptiveSpinTest, CaughtGapsNeverShrinkTheBudget) {
  AdaptiveSpin spin(kCap);
  for (int i = 0; i < 100; ++i) spin.Caught(Us(5));
  // Spinning costs only the gaps it catches; the budget stays.
  EXPECT_EQ(spin.budget(), kCap);
  EXPECT_EQ(spin.caught(), 100);
}

TEST(AdaptiveSpinTest, MixedGapsSettleNearTwiceTheShortGap) {
  AdaptiveSpin spin(kCap);
  // Short gaps (20 us, caught) between long ones (5 ms): each long gap
  // wastes the budget, so the budget settles where it still covers the
  // short gaps after halving, at 2x-4x the short gap.
  for (int i = 0; i < 50; ++i) {
    spin.Slept(absl::Milliseconds(5));
    if (spin.budget() >= Us(20)) {
      spin.Caught(Us(20));
    } else {
      spin.Slept(Us(20));
    }
  }
  EXPECT_GE(spin.budget(), Us(40));
  EXPECT_LE(spin.budget(), Us(80));
}

}  // namespace
}  // namespace pagealloc
