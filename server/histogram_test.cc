#include "server/histogram.h"

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pagealloc {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

TEST(AtomicHistogramTest, ExponentialBoundsMultiplyFromTheStart) {
  EXPECT_THAT(AtomicHistogram::Exponential(1, 2, 4), ElementsAre(1, 2, 4, 8));
  EXPECT_THAT(AtomicHistogram::Exponential(3, 4, 3), ElementsAre(3, 12, 48));
  EXPECT_THAT(AtomicHistogram::Exponential(1, 2, 0), ElementsAre());
}

TEST(AtomicHistogramTest, AFreshHistogramIsEmpty) {
  const AtomicHistogram histogram({1, 2, 4});
  const AtomicHistogram::Snapshot snapshot = histogram.Take();
  EXPECT_THAT(snapshot.upper_bounds, ElementsAre(1, 2, 4));
  // One count per bound, then +Inf.
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(0, 0, 0, 0));
  EXPECT_EQ(snapshot.count, 0u);
  EXPECT_EQ(snapshot.sum, 0);
}

// Prometheus buckets are "less than or equal": a value on a bound counts in
// that bound's bucket, a value just above it in the next one.
TEST(AtomicHistogramTest, ValuesOnABoundLandInThatBoundsBucket) {
  struct Case {
    double value;
    std::vector<uint64_t> cumulative;  // le 1, le 2, le 4, +Inf
  };
  const std::vector<Case> cases = {
      {-5, {1, 1, 1, 1}},     // below every bound
      {0, {1, 1, 1, 1}},      // below every bound
      {1, {1, 1, 1, 1}},      // on the first bound
      {1.5, {0, 1, 1, 1}},    // between the first two
      {2, {0, 1, 1, 1}},      // on a middle bound
      {2.001, {0, 0, 1, 1}},  // just past it
      {4, {0, 0, 1, 1}},      // on the last bound
      {4.001, {0, 0, 0, 1}},  // past every bound: +Inf only
      {1e300, {0, 0, 0, 1}},  // far past every bound
  };

  for (const Case& c : cases) {
    AtomicHistogram histogram({1, 2, 4});
    histogram.Observe(c.value);
    const AtomicHistogram::Snapshot snapshot = histogram.Take();
    EXPECT_THAT(snapshot.cumulative_counts, ElementsAreArray(c.cumulative))
        << "value " << c.value;
    EXPECT_EQ(snapshot.count, 1u) << "value " << c.value;
    EXPECT_EQ(snapshot.sum, c.value);
  }
}

TEST(AtomicHistogramTest, CountsAccumulateAndSumAddsUp) {
  AtomicHistogram histogram({10, 100});
  for (double value : {5.0, 10.0, 50.0, 100.0, 100.5, 1000.0, 7.5}) {
    histogram.Observe(value);
  }
  const AtomicHistogram::Snapshot snapshot = histogram.Take();
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(3, 5, 7));
  EXPECT_EQ(snapshot.count, 7u);
  EXPECT_EQ(snapshot.sum, 5.0 + 10.0 + 50.0 + 100.0 + 100.5 + 1000.0 + 7.5);
}

TEST(AtomicHistogramTest, NoBoundsMeansOneInfiniteBucket) {
  AtomicHistogram histogram({});
  histogram.Observe(3);
  histogram.Observe(-1);
  const AtomicHistogram::Snapshot snapshot = histogram.Take();
  EXPECT_THAT(snapshot.upper_bounds, ElementsAre());
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(2));
  EXPECT_EQ(snapshot.count, 2u);
  EXPECT_EQ(snapshot.sum, 2);
}

// Several writers and a reader at once. The values are small integers, so
// every partial sum is exact in a double and the totals must match exactly;
// the reader checks each snapshot's own consistency, whatever it catches.
TEST(AtomicHistogramTest, ConcurrentObservationsGiveExactTotals) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 20000;
  AtomicHistogram histogram({1, 2, 3});

  std::atomic<bool> writers_done{false};
  std::vector<std::string> reader_failures;
  int snapshots_read = 0;
  std::thread reader([&] {
    uint64_t last_count = 0;
    double last_sum = 0;
    // At least one snapshot, however fast the writers are.
    do {
      const AtomicHistogram::Snapshot s = histogram.Take();
      ++snapshots_read;
      if (s.cumulative_counts.size() != 4) {
        reader_failures.push_back("wrong number of buckets");
        break;
      }
      for (size_t i = 1; i < s.cumulative_counts.size(); ++i) {
        if (s.cumulative_counts[i] < s.cumulative_counts[i - 1]) {
          reader_failures.push_back("cumulative counts decrease");
        }
      }
      if (s.count != s.cumulative_counts.back()) {
        reader_failures.push_back("count differs from the +Inf bucket");
      }
      // Each bucket and the sum only grow, and one thread's later loads of
      // an atomic never see an older value than its earlier loads.
      if (s.count < last_count) reader_failures.push_back("count went down");
      if (s.sum < last_sum) reader_failures.push_back("sum went down");
      if (s.count > uint64_t{kThreads} * kPerThread) {
        reader_failures.push_back("count exceeds the observations made");
      }
      last_count = s.count;
      last_sum = s.sum;
    } while (!writers_done.load(std::memory_order_acquire) &&
             reader_failures.empty());
  });

  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&histogram, t] {
      // Values 0..4 in turn, offset per thread.
      for (int i = 0; i < kPerThread; ++i) histogram.Observe((i + t) % 5);
    });
  }
  for (std::thread& writer : writers) writer.join();
  writers_done.store(true, std::memory_order_release);
  reader.join();

  EXPECT_THAT(reader_failures, ElementsAre());
  EXPECT_GE(snapshots_read, 1);
  // kPerThread is a multiple of 5: each thread observes each of 0..4
  // kPerThread / 5 times.
  const uint64_t each = uint64_t{kThreads} * kPerThread / 5;
  const AtomicHistogram::Snapshot snapshot = histogram.Take();
  // le 1: {0, 1}; le 2: {2}; le 3: {3}; +Inf: {4}.
  EXPECT_THAT(snapshot.cumulative_counts,
              ElementsAre(2 * each, 3 * each, 4 * each, 5 * each));
  EXPECT_EQ(snapshot.count, 5 * each);
  EXPECT_EQ(snapshot.sum, static_cast<double>(each * (0 + 1 + 2 + 3 + 4)));
}

}  // namespace
}  // namespace pagealloc
