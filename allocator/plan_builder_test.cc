#include "allocator/plan_builder.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pagealloc {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr OwnerId kAlice = 1;
constexpr OwnerId kBob = 2;

MATCHER_P3(CopyIs, ring_offset, count, destination, "") {
  return arg.ring_offset == ring_offset && arg.count == count &&
         arg.destination == destination;
}

MATCHER_P2(RunIs, owner, pages, "") {
  return arg.owner == owner && arg.pages == pages;
}

MATCHER_P5(PlannedIs, prefix_len, seq_len, first_new_page, output_offset,
           destination, "") {
  return arg.prefix_len == prefix_len && arg.seq_len == seq_len &&
         arg.first_new_page == first_new_page &&
         arg.output_offset == output_offset && arg.destination == destination;
}

class PlanBuilderTest : public ::testing::Test {
 protected:
  PlanStorage storage_;
  int64_t out_[64] = {};
};

TEST_F(PlanBuilderTest, StartsEmptyWithTheRingPosition) {
  // Leftovers of an earlier launch in the storage are cleared.
  storage_.plan.ring_copies.push_back({0, 3, out_});
  storage_.plan.requests.emplace_back();
  storage_.plan.scrub_pages.push_back(9);
  storage_.admitted.push_back(4);
  storage_.owner_runs.push_back({kAlice, 3});
  storage_.plan.num_new_pages = 3;
  PlanBuilder builder(&storage_, /*page_size=*/16, /*free_ring_head=*/7,
                      /*free_ring_capacity=*/40, /*ring_copies=*/false, 4);
  EXPECT_TRUE(builder.empty());
  const BatchPlan& plan = builder.Finish();
  EXPECT_EQ(plan.page_size, 16);
  EXPECT_EQ(plan.free_ring_head, 7);
  EXPECT_EQ(plan.free_ring_capacity, 40);
  EXPECT_EQ(plan.num_new_pages, 0);
  EXPECT_EQ(plan.num_slots, 0);
  EXPECT_THAT(plan.requests, IsEmpty());
  EXPECT_THAT(plan.ring_copies, IsEmpty());
  EXPECT_THAT(plan.scrub_pages, IsEmpty());
  EXPECT_THAT(storage_.admitted, IsEmpty());
  EXPECT_THAT(storage_.owner_runs, IsEmpty());
}

TEST_F(PlanBuilderTest, RequestPlansCountPagesAndSlotsInAdmissionOrder) {
  PlanBuilder builder(&storage_, 16, 0, 100, /*ring_copies=*/false, 3);
  // A decode that continues its page, an extend of two new pages after a
  // partial one, and a whole-page alloc.
  EXPECT_EQ(builder.AddRequest(0, {4, 5, 16 + 3}, out_, 0), 1);
  EXPECT_EQ(builder.AddRequest(2, {8, 40, 32 + 7}, out_ + 1, 2), 32);
  EXPECT_EQ(builder.AddRequest(5, {0, 32, -1}, out_ + 33, 2), 32);
  EXPECT_FALSE(builder.empty());
  EXPECT_EQ(builder.planned_pages(), 4);
  EXPECT_EQ(builder.planned_slots(), 65);
  const BatchPlan& plan = builder.Finish();
  EXPECT_EQ(plan.num_new_pages, 4);
  EXPECT_EQ(plan.num_slots, 65);
  EXPECT_THAT(plan.requests, ElementsAre(PlannedIs(4, 5, 0, 0, out_),
                                         PlannedIs(8, 40, 0, 1, out_ + 1),
                                         PlannedIs(0, 32, 2, 33, out_ + 33)));
  EXPECT_EQ(plan.requests[1].last_loc, 32 + 7);
  EXPECT_THAT(storage_.admitted, ElementsAre(0, 2, 5));
  EXPECT_THAT(plan.ring_copies, IsEmpty());
  EXPECT_THAT(storage_.owner_runs, IsEmpty());
}

TEST_F(PlanBuilderTest, RingCopiesJoinFollowingDestinationsAndOwners) {
  PlanBuilder builder(&storage_, 1, 5, 100, /*ring_copies=*/true, 5);
  EXPECT_EQ(builder.AddRingCopy(0, kAlice, out_, 2), 2);
  EXPECT_EQ(builder.AddRingCopy(1, kAlice, out_ + 2, 3), 3);   // follows
  EXPECT_EQ(builder.AddRingCopy(2, kAlice, out_ + 10, 1), 1);  // a gap
  EXPECT_EQ(builder.AddRingCopy(3, kBob, out_ + 11, 4), 4);    // follows
  // No slots: accepted, nothing to copy.
  EXPECT_EQ(builder.AddRingCopy(4, kAlice, nullptr, 0), 0);
  const BatchPlan& plan = builder.Finish();
  EXPECT_EQ(plan.num_new_pages, 10);
  EXPECT_EQ(plan.num_slots, 10);
  EXPECT_THAT(plan.ring_copies,
              ElementsAre(CopyIs(0, 5, out_), CopyIs(5, 5, out_ + 10)));
  EXPECT_THAT(storage_.owner_runs,
              ElementsAre(RunIs(kAlice, 6), RunIs(kBob, 4)));
  EXPECT_THAT(storage_.admitted, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(plan.requests, IsEmpty());
}

TEST_F(PlanBuilderTest, TakeBackCallRestoresRunsThatGrewAcrossItsStart) {
  PlanBuilder builder(&storage_, 1, 0, 100, /*ring_copies=*/true, 6);
  builder.BeginCall();
  builder.AddRingCopy(0, kAlice, out_, 2);
  builder.AddScrubPage(7);
  builder.BeginCall();
  // The second call's first request extends the first call's copy and run.
  builder.AddRingCopy(1, kAlice, out_ + 2, 3);
  builder.AddScrubPage(8);
  builder.AddRingCopy(2, kBob, out_ + 20, 1);
  EXPECT_THAT(builder.call_admitted(), ElementsAre(1, 2));
  builder.TakeBackCall();
  EXPECT_THAT(builder.call_admitted(), IsEmpty());
  EXPECT_EQ(builder.planned_pages(), 2);
  EXPECT_EQ(builder.planned_slots(), 2);
  {
    const BatchPlan& plan = builder.Finish();
    EXPECT_THAT(plan.ring_copies, ElementsAre(CopyIs(0, 2, out_)));
    EXPECT_THAT(storage_.owner_runs, ElementsAre(RunIs(kAlice, 2)));
    EXPECT_THAT(plan.scrub_pages, ElementsAre(7));
    EXPECT_THAT(storage_.admitted, ElementsAre(0));
  }
  // The next call plans from where the first one ended.
  builder.BeginCall();
  builder.AddRingCopy(3, kBob, out_ + 30, 4);
  const BatchPlan& plan = builder.Finish();
  EXPECT_THAT(plan.ring_copies,
              ElementsAre(CopyIs(0, 2, out_), CopyIs(2, 4, out_ + 30)));
  EXPECT_THAT(storage_.owner_runs,
              ElementsAre(RunIs(kAlice, 2), RunIs(kBob, 4)));
  EXPECT_EQ(plan.num_new_pages, 6);
  EXPECT_THAT(storage_.admitted, ElementsAre(0, 3));
}

TEST_F(PlanBuilderTest, TakeBackCallOfRequestPlans) {
  PlanBuilder builder(&storage_, 16, 0, 100, /*ring_copies=*/false, 4);
  builder.BeginCall();
  builder.AddRequest(0, {0, 16, -1}, out_, 1);
  builder.BeginCall();
  builder.AddRequest(1, {0, 20, -1}, out_ + 16, 2);
  builder.AddScrubPage(3);
  builder.AddRequest(2, {4, 5, 16 + 3}, out_ + 36, 0);
  EXPECT_THAT(builder.call_admitted(), ElementsAre(1, 2));
  builder.TakeBackCall();
  builder.AddRequest(3, {0, 32, -1}, out_ + 16, 2);
  const BatchPlan& plan = builder.Finish();
  EXPECT_EQ(plan.num_new_pages, 3);
  EXPECT_EQ(plan.num_slots, 48);
  EXPECT_THAT(plan.requests, ElementsAre(PlannedIs(0, 16, 0, 0, out_),
                                         PlannedIs(0, 32, 1, 16, out_ + 16)));
  EXPECT_THAT(plan.scrub_pages, IsEmpty());
  EXPECT_THAT(storage_.admitted, ElementsAre(0, 3));
}

TEST_F(PlanBuilderTest, TakeBackOfAnEmptyCallChangesNothing) {
  PlanBuilder builder(&storage_, 1, 0, 100, /*ring_copies=*/true, 2);
  builder.BeginCall();
  builder.AddRingCopy(0, kAlice, out_, 2);
  builder.BeginCall();
  EXPECT_THAT(builder.call_admitted(), IsEmpty());
  builder.TakeBackCall();
  const BatchPlan& plan = builder.Finish();
  EXPECT_THAT(plan.ring_copies, ElementsAre(CopyIs(0, 2, out_)));
  EXPECT_THAT(storage_.owner_runs, ElementsAre(RunIs(kAlice, 2)));
  EXPECT_EQ(plan.num_new_pages, 2);
}

}  // namespace
}  // namespace pagealloc
