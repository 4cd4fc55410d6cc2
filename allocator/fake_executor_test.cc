// FakeExecutor on hand-built plans: golden slots, ring wrap-around, its
// refusals, and the failure switch. kernels/cpu_executor_test.cc holds it
// to the CPU reference on random plans.

#include "allocator/fake_executor.h"

#include <cstdint>
#include <vector>

#include "allocator/requests.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kPoison = -7;

// A plan over a ring of `capacity` entries starting at `head`.
BatchPlan MakePlan(int64_t page_size, int64_t capacity, int64_t head) {
  BatchPlan plan;
  plan.page_size = page_size;
  plan.free_ring_capacity = capacity;
  plan.free_ring_head = head;
  return plan;
}

// Appends a request as the pool would, after the plan's earlier requests.
void AddRequest(BatchPlan& plan, int64_t prefix_len, int64_t seq_len,
                int64_t last_loc, int64_t* destination) {
  PlannedRequest& request = plan.requests.emplace_back();
  request.prefix_len = prefix_len;
  request.seq_len = seq_len;
  request.last_loc = last_loc;
  request.first_new_page = plan.num_new_pages;
  request.output_offset = plan.num_slots;
  request.destination = destination;
  plan.num_new_pages +=
      NewPagesNeeded({prefix_len, seq_len, last_loc}, plan.page_size);
  plan.num_slots += seq_len - prefix_len;
}

class FakeExecutorTest : public ::testing::Test {
 protected:
  void SetRing(const std::vector<int64_t>& ring) {
    ASSERT_OK(executor_.InitFreeRing(ring.size()));
    ASSERT_OK(executor_.WriteFreeRing(0, ring));
  }

  FakeExecutor executor_;
};

// The seed's worked example: page_size 4, prefix 2, seq 11, last_loc 1,
// free pages [3, 4].
TEST_F(FakeExecutorTest, SeedGoldenVector) {
  SetRing({3, 4});
  std::vector<int64_t> out(9, kPoison);
  BatchPlan plan = MakePlan(4, 2, 0);
  AddRequest(plan, 2, 11, 1, out.data());
  ASSERT_OK(executor_.Execute(plan));
  EXPECT_THAT(out, ElementsAre(2, 3, 12, 13, 14, 15, 16, 17, 18));
}

// Requests read consecutive ring positions from the head, wrapping at the
// capacity; one that stays inside its prefix's page takes no page.
TEST_F(FakeExecutorTest, RequestsReadTheRingFromTheHeadAndWrap) {
  SetRing({5, 6, 7, 8});
  std::vector<int64_t> a(4, kPoison), b(1, kPoison), c(3, kPoison);
  BatchPlan plan = MakePlan(2, 4, 3);
  AddRequest(plan, 0, 4, -1, a.data());  // pages at positions 3, 0
  AddRequest(plan, 2, 3, 3, b.data());   // starts a page: position 1
  AddRequest(plan, 1, 4, 2, c.data());   // slot 3, then position 2
  ASSERT_OK(executor_.Execute(plan));
  EXPECT_THAT(a, ElementsAre(16, 17, 10, 11));
  EXPECT_THAT(b, ElementsAre(12));
  EXPECT_THAT(c, ElementsAre(3, 14, 15));
}

TEST_F(FakeExecutorTest, PageSizeOneTakesAPagePerSlot) {
  SetRing({9, 2, 4});
  std::vector<int64_t> out(3, kPoison);
  BatchPlan plan = MakePlan(1, 3, 1);
  AddRequest(plan, 5, 8, 11, out.data());
  ASSERT_OK(executor_.Execute(plan));
  EXPECT_THAT(out, ElementsAre(2, 4, 9));
}

TEST_F(FakeExecutorTest, FailureSwitchFailsExactlyTheNextLaunches) {
  SetRing({3, 4});
  std::vector<int64_t> out(8, kPoison);
  BatchPlan plan = MakePlan(4, 2, 0);
  AddRequest(plan, 0, 8, -1, out.data());
  executor_.FailNextLaunches(2, absl::InternalError("device lost"));
  EXPECT_EQ(executor_.failures_pending(), 2);
  for (int launch = 0; launch < 2; ++launch) {
    EXPECT_THAT(executor_.Execute(plan), StatusIs(absl::StatusCode::kInternal,
                                                  HasSubstr("device lost")));
    EXPECT_THAT(out, Each(kPoison));
  }
  EXPECT_EQ(executor_.failures_pending(), 0);
  ASSERT_OK(executor_.Execute(plan));
  EXPECT_THAT(out, ElementsAre(12, 13, 14, 15, 16, 17, 18, 19));
  EXPECT_EQ(executor_.launches(), 3);
}

TEST_F(FakeExecutorTest, FailureSwitchOfZeroLaunchesDisarms) {
  SetRing({1});
  std::vector<int64_t> out(1, kPoison);
  BatchPlan plan = MakePlan(1, 1, 0);
  AddRequest(plan, 0, 1, -1, out.data());
  executor_.FailNextLaunches(3, absl::UnavailableError("busy"));
  executor_.FailNextLaunches(0, absl::UnavailableError("busy"));
  ASSERT_OK(executor_.Execute(plan));
  EXPECT_THAT(out, ElementsAre(1));
}

TEST_F(FakeExecutorTest, RefusesAPlanForAnotherRing) {
  SetRing({3, 4});
  std::vector<int64_t> out(4, kPoison);
  BatchPlan plan = MakePlan(4, 3, 0);
  AddRequest(plan, 0, 4, -1, out.data());
  EXPECT_THAT(executor_.Execute(plan),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("plan ring capacity 3 differs")));
  EXPECT_THAT(out, Each(kPoison));
}

TEST_F(FakeExecutorTest, MirrorsRingWritesAndRefusesOutOfRange) {
  EXPECT_THAT(
      executor_.InitFreeRing(0),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("capacity (0)")));
  ASSERT_OK(executor_.InitFreeRing(4));
  ASSERT_OK(executor_.WriteFreeRing(1, std::vector<int64_t>{7, 8}));
  EXPECT_THAT(executor_.ReadFreeRing(), IsOkAndHolds(ElementsAre(0, 7, 8, 0)));
  EXPECT_THAT(executor_.WriteFreeRing(3, std::vector<int64_t>{1, 2}),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("[3, 5) outside capacity 4")));
  EXPECT_THAT(executor_.WriteFreeRing(-1, std::vector<int64_t>{1}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("[-1, 0)")));
  EXPECT_THAT(executor_.ReadFreeRing(), IsOkAndHolds(ElementsAre(0, 7, 8, 0)));
}

}  // namespace
}  // namespace pagealloc
