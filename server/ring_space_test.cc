#include "server/ring_space.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

TEST(RingSpaceTest, ReservesContiguousRegionsAndSkipsTheLapEnd) {
  RingSpace ring(10);
  EXPECT_THAT(ring.Reserve(4), IsOkAndHolds(0));
  EXPECT_THAT(ring.Reserve(4), IsOkAndHolds(4));
  // 2 slots left before the end: a 3-slot region starts the next lap, which
  // needs slots 0..2 released first.
  EXPECT_THAT(ring.Reserve(3),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("8 of 10 are still reserved")));
  EXPECT_OK(ring.Release(4));
  EXPECT_THAT(ring.Reserve(3), IsOkAndHolds(10));  // physical offset 0
  EXPECT_EQ(ring.end(), 13);
  EXPECT_EQ(ring.reserved(), 9);  // 4..8 in use, 8..10 padding, 10..13
}

TEST(RingSpaceTest, ZeroSlotsReserveNothing) {
  RingSpace ring(4);
  EXPECT_THAT(ring.Reserve(0), IsOkAndHolds(0));
  EXPECT_EQ(ring.reserved(), 0);
}

TEST(RingSpaceTest, RefusesWhatCanNeverFit) {
  RingSpace ring(4);
  EXPECT_THAT(ring.Reserve(5),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("more than the ring's capacity of 4")));
}

TEST(RingSpaceTest, ReleaseIsMonotonicAndBounded) {
  RingSpace ring(8);
  ASSERT_THAT(ring.Reserve(6), IsOkAndHolds(0));
  EXPECT_OK(ring.Release(4));
  EXPECT_OK(ring.Release(2));  // earlier position: nothing to do
  EXPECT_EQ(ring.reserved(), 2);
  EXPECT_THAT(ring.Release(7),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("up_to (7) is past the ring's last reserved "
                                 "position (6)")));
  EXPECT_THAT(ring.Release(-1), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("up_to (-1) is negative")));
  EXPECT_EQ(ring.reserved(), 2);
}

TEST(RingSpaceTest, UnreserveUndoesTheLastReservation) {
  RingSpace ring(8);
  ASSERT_THAT(ring.Reserve(3), IsOkAndHolds(0));
  ASSERT_THAT(ring.Reserve(4), IsOkAndHolds(3));
  ring.Unreserve(3, 4);
  EXPECT_EQ(ring.end(), 3);
  EXPECT_THAT(ring.Reserve(5), IsOkAndHolds(3));
}

}  // namespace
}  // namespace pagealloc
