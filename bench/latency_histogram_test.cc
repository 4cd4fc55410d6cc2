#include "bench/latency_histogram.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace pagealloc {
namespace {

// Percentiles against exact sorted samples: never below the true value and
// within the histogram's 1/64 relative resolution above it.
TEST(LatencyHistogramTest, PercentilesMatchSortedSamplesWithinResolution) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(10.0, 1.5);  // ~22 us median
  std::vector<int64_t> samples;
  LatencyHistogram h;
  for (int i = 0; i < 100000; ++i) {
    const int64_t v = static_cast<int64_t>(dist(rng));
    samples.push_back(v);
    h.Record(v);
  }
  std::sort(samples.begin(), samples.end());
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    const int64_t exact = samples[static_cast<size_t>(q * samples.size()) - 1];
    const int64_t got = h.Percentile(q);
    EXPECT_GE(got, exact) << "q=" << q;
    EXPECT_LE(got, exact + exact / 64 + 1) << "q=" << q;
  }
  EXPECT_EQ(h.Percentile(1.0), samples.back());
  EXPECT_EQ(h.max_nanos(), samples.back());
}

TEST(LatencyHistogramTest, SmallValuesAreExact) {
  LatencyHistogram h;
  for (int v = 0; v < 100; ++v) h.Record(v);
  EXPECT_EQ(h.Percentile(0.5), 49);
  EXPECT_EQ(h.Percentile(0.01), 0);
  EXPECT_DOUBLE_EQ(h.mean_nanos(), 49.5);
}

TEST(LatencyHistogramTest, SerializeParseMergeEqualsRecordingIntoOne) {
  LatencyHistogram a, b, both;
  for (int64_t v : {5, 1000, 123456, 99999999}) {
    a.Record(v);
    both.Record(v);
  }
  for (int64_t v : {7, 2000, 7654321}) {
    b.Record(v);
    both.Record(v);
  }
  absl::StatusOr<LatencyHistogram> parsed =
      LatencyHistogram::Parse(b.Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  a.Merge(*parsed);
  EXPECT_EQ(a.Serialize(), both.Serialize());
  EXPECT_EQ(a.count(), 7);
}

TEST(LatencyHistogramTest, ParseRejectsCountsThatDoNotAddUp) {
  EXPECT_EQ(LatencyHistogram::Parse("3 30 10 5:1").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LatencyHistogram::Parse("1 5 5 99999:1").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LatencyHistogramTest, EmptyReportsZero) {
  LatencyHistogram h;
  EXPECT_EQ(h.Percentile(0.99), 0);
  EXPECT_EQ(h.count(), 0);
}

}  // namespace
}  // namespace pagealloc
