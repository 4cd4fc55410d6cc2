#include "bench/rpc_stats.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc::bench {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

WorkerReport Example(int64_t scale) {
  WorkerReport report;
  for (int r = 0; r < kNumRpcKinds; ++r) {
    report.rpcs[r].slots = scale * (r + 1);
    report.rpcs[r].requests = scale * (r + 2);
    for (int i = 0; i <= r; ++i) report.rpcs[r].latency.Record(scale * 1000);
  }
  report.refused = scale * 7;
  return report;
}

TEST(WorkerReportTest, SurvivesItsTextForm) {
  const WorkerReport report = Example(3);
  ASSERT_OK_AND_ASSIGN(WorkerReport parsed,
                       WorkerReport::Parse(report.Serialize()));
  for (int r = 0; r < kNumRpcKinds; ++r) {
    SCOPED_TRACE(kRpcNames[r]);
    EXPECT_EQ(parsed.rpcs[r].slots, report.rpcs[r].slots);
    EXPECT_EQ(parsed.rpcs[r].requests, report.rpcs[r].requests);
    EXPECT_EQ(parsed.rpcs[r].latency.Serialize(),
              report.rpcs[r].latency.Serialize());
  }
  EXPECT_EQ(parsed.refused, 21);
  EXPECT_EQ(parsed.total_calls(), 1 + 2 + 3 + 4 + 5 + 6);
  // Decode, extend and admission are the allocation calls.
  EXPECT_EQ(parsed.alloc_calls(), 1 + 2 + 6);
  EXPECT_EQ(parsed.alloc_slots(), 3 * (1 + 2 + 6));
  EXPECT_EQ(parsed.alloc_requests(), 3 * (2 + 3 + 7));
}

TEST(WorkerReportTest, AnEmptyReportSurvivesToo) {
  ASSERT_OK_AND_ASSIGN(WorkerReport parsed,
                       WorkerReport::Parse(WorkerReport().Serialize()));
  EXPECT_EQ(parsed.total_calls(), 0);
  EXPECT_EQ(parsed.refused, 0);
}

TEST(WorkerReportTest, MergeAddsEverything) {
  WorkerReport merged = Example(1);
  merged.Merge(Example(2));
  EXPECT_EQ(merged.rpcs[kDecode].slots, 1 + 2);
  EXPECT_EQ(merged.rpcs[kRollback].requests, 6 + 12);
  EXPECT_EQ(merged.rpcs[kExtend].latency.count(), 2 + 2);
  EXPECT_EQ(merged.rpcs[kExtend].latency.max_nanos(), 2000);
  EXPECT_EQ(merged.refused, 7 + 14);
}

TEST(WorkerReportTest, RefusesWhatIsNotAReport) {
  std::string text = Example(1).Serialize();
  EXPECT_THAT(WorkerReport::Parse(text.substr(0, text.find("Free"))),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("no line for")));
  EXPECT_THAT(WorkerReport::Parse("Bogus 1 2 0 0 0\n" + text),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad line")));
  EXPECT_THAT(WorkerReport::Parse("AllocDecode x 2 0 0 0\n"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad line")));
  EXPECT_THAT(WorkerReport::Parse("AllocDecode 1 2 5 0 0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("histogram buckets hold 0 samples")));
}

}  // namespace
}  // namespace pagealloc::bench
