#include "bench/snapshot.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pagealloc::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

TEST(SnapshotTest, ParsesTheExpositionsSamples) {
  EXPECT_THAT(ParseMetrics("# HELP x y\n"
                           "# TYPE pagealloc_batch_requests histogram\n"
                           "pagealloc_batch_requests_sum 12\n"
                           "pagealloc_rpc_duration_seconds_count{rpc=\"A B\"} "
                           "3\n"
                           "no_value\n"
                           "bad_value abc\n"
                           "\n"
                           "pagealloc_pool_usage_ratio 0.25"),
              ElementsAre(Pair("pagealloc_batch_requests_sum", 12),
                          Pair("pagealloc_pool_usage_ratio", 0.25),
                          Pair("pagealloc_rpc_duration_seconds_count{rpc=\"A "
                               "B\"}",
                               3)));
}

TEST(SnapshotTest, MetricMeanIsTheMeanOfTheObservationsBetween) {
  Snapshot before, after;
  before.metrics = {{"h_sum{rpc=\"x\"}", 1.0}, {"h_count{rpc=\"x\"}", 2}};
  after.metrics = {{"h_sum{rpc=\"x\"}", 4.0},
                   {"h_count{rpc=\"x\"}", 8},
                   {"g_sum", 1.0},
                   {"g_count", 0}};
  EXPECT_DOUBLE_EQ(MetricMean(before, after, "h", "{rpc=\"x\"}"), 0.5);
  // Missing before: counted from zero.
  EXPECT_DOUBLE_EQ(MetricMean(Snapshot(), after, "h", "{rpc=\"x\"}"), 0.5);
  // Unknown: not in `after`, or nothing observed.
  EXPECT_EQ(MetricMean(before, after, "h", ""), -1);
  EXPECT_EQ(MetricMean(before, after, "g", ""), -1);
}

}  // namespace
}  // namespace pagealloc::bench
