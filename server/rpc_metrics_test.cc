#include "server/rpc_metrics.h"

#include <cstdint>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "proto/pagealloc.pb.h"

namespace pagealloc {
namespace {

std::vector<Method> AllRpcs() {
  std::vector<Method> rpcs;
  for (int i = 0; i < kNumMethods; ++i) rpcs.push_back(static_cast<Method>(i));
  return rpcs;
}

std::vector<absl::StatusCode> AllCodes() {
  std::vector<absl::StatusCode> codes;
  for (int c = 0; c < kNumStatusCodes; ++c) {
    codes.push_back(static_cast<absl::StatusCode>(c));
  }
  return codes;
}

// The metrics' method names label series that dashboards join with gRPC's
// own: each must be a method of the service, and every method must have one.
TEST(RpcNameTest, NamesEveryMethodOfTheService) {
  // Linking the generated messages registers the file's descriptors.
  v1::RegisterRequest link_the_descriptors;
  (void)link_the_descriptors;
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "pagealloc.v1.PageAllocator");
  ASSERT_NE(service, nullptr);
  EXPECT_EQ(service->method_count(), kNumMethods);
  std::set<std::string> names;
  for (Method rpc : AllRpcs()) {
    const std::string name = MethodName(rpc);
    EXPECT_NE(service->FindMethodByName(name), nullptr) << name;
    names.insert(name);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kNumMethods));
  EXPECT_STREQ(MethodName(Method::kAllocExtend), "AllocExtend");
  EXPECT_STREQ(MethodName(Method::kGetStats), "GetStats");
}

TEST(RpcMetricsTest, StartsAtZero) {
  const RpcMetrics metrics;
  for (Method rpc : AllRpcs()) {
    for (absl::StatusCode code : AllCodes()) {
      EXPECT_EQ(metrics.count(rpc, code), 0)
          << MethodName(rpc) << " " << absl::StatusCodeToString(code);
    }
    const AtomicHistogram::Snapshot latency = metrics.latency(rpc).Take();
    EXPECT_EQ(latency.count, 0u);
    EXPECT_EQ(latency.sum, 0);
  }
}

TEST(RpcMetricsTest, LatencyBucketsSpanOneMicrosecondToEightSeconds) {
  const RpcMetrics metrics;
  const std::vector<double> bounds =
      metrics.latency(Method::kRegister).Take().upper_bounds;
  ASSERT_EQ(bounds.size(), 24u);
  EXPECT_EQ(bounds.front(), 1e-6);
  EXPECT_EQ(bounds.back(), 1e-6 * (1 << 23));  // about 8.4 s
}

// One Record moves exactly one counter and one histogram: its own.
TEST(RpcMetricsTest, RecordCountsOnlyItsRpcAndCode) {
  RpcMetrics metrics;
  metrics.Record(Method::kFree, absl::StatusCode::kNotFound,
                 absl::Microseconds(3));
  for (Method rpc : AllRpcs()) {
    for (absl::StatusCode code : AllCodes()) {
      const bool recorded =
          rpc == Method::kFree && code == absl::StatusCode::kNotFound;
      EXPECT_EQ(metrics.count(rpc, code), recorded ? 1 : 0)
          << MethodName(rpc) << " " << absl::StatusCodeToString(code);
    }
    EXPECT_EQ(metrics.latency(rpc).Take().count, rpc == Method::kFree ? 1u : 0u)
        << MethodName(rpc);
  }
  const AtomicHistogram::Snapshot latency =
      metrics.latency(Method::kFree).Take();
  // 3 us is over the 2 us bound and under the 4 us one.
  EXPECT_EQ(latency.cumulative_counts[1], 0u);
  EXPECT_EQ(latency.cumulative_counts[2], 1u);
  EXPECT_EQ(latency.sum, absl::ToDoubleSeconds(absl::Microseconds(3)));
}

TEST(RpcMetricsTest, LatencyOnABoundCountsInThatBucket) {
  struct Case {
    absl::Duration latency;
    size_t first_bucket;  // the first cumulative count that includes it
  };
  const std::vector<Case> cases = {
      {absl::ZeroDuration(), 0},
      {absl::Microseconds(1), 0},  // on the first bound
      {absl::Microseconds(1) + absl::Nanoseconds(1), 1},
      {absl::Microseconds(4), 2},               // 1 us * 2^2
      {absl::Microseconds(1 << 23), 23},        // on the last bound
      {absl::Microseconds((1 << 23) + 1), 24},  // +Inf
      {absl::Seconds(60), 24},
  };
  for (const Case& c : cases) {
    RpcMetrics metrics;
    metrics.Record(Method::kAlloc, absl::StatusCode::kOk, c.latency);
    const AtomicHistogram::Snapshot latency =
        metrics.latency(Method::kAlloc).Take();
    ASSERT_EQ(latency.cumulative_counts.size(), 25u);
    for (size_t i = 0; i < latency.cumulative_counts.size(); ++i) {
      EXPECT_EQ(latency.cumulative_counts[i], i >= c.first_bucket ? 1u : 0u)
          << "latency " << c.latency << ", bucket " << i;
    }
  }
}

// A code outside google.rpc.Code's 0..16 (a corrupted status) is counted as
// UNKNOWN, never written out of bounds.
TEST(RpcMetricsTest, ACodeOutOfRangeCountsAsUnknown) {
  RpcMetrics metrics;
  metrics.Record(Method::kRollback, static_cast<absl::StatusCode>(42),
                 absl::Microseconds(1));
  metrics.Record(Method::kRollback, static_cast<absl::StatusCode>(-1),
                 absl::Microseconds(1));
  EXPECT_EQ(metrics.count(Method::kRollback, absl::StatusCode::kUnknown), 2);
  EXPECT_EQ(metrics.latency(Method::kRollback).Take().count, 2u);
  for (Method rpc : AllRpcs()) {
    if (rpc == Method::kRollback) continue;
    for (absl::StatusCode code : AllCodes()) {
      EXPECT_EQ(metrics.count(rpc, code), 0)
          << MethodName(rpc) << " " << absl::StatusCodeToString(code);
    }
  }
}

// Threads record every (rpc, code) pair in turn. Latencies are whole
// seconds, so the latency sums are exact in a double.
TEST(RpcMetricsTest, ConcurrentRecordsGiveExactTotals) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 500;
  RpcMetrics metrics;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&metrics, t] {
      for (int round = 0; round < kRounds; ++round) {
        for (Method rpc : AllRpcs()) {
          for (absl::StatusCode code : AllCodes()) {
            // 1 s for thread 0, 2 s for thread 1, ...
            metrics.Record(rpc, code, absl::Seconds(t + 1));
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  for (Method rpc : AllRpcs()) {
    for (absl::StatusCode code : AllCodes()) {
      EXPECT_EQ(metrics.count(rpc, code), kThreads * kRounds)
          << MethodName(rpc) << " " << absl::StatusCodeToString(code);
    }
    const AtomicHistogram::Snapshot latency = metrics.latency(rpc).Take();
    const uint64_t per_thread = uint64_t{kRounds} * kNumStatusCodes;
    EXPECT_EQ(latency.count, kThreads * per_thread) << MethodName(rpc);
    // Every latency is 1..4 s: all under the last bound (8.4 s), none under
    // the 0.52 s bound.
    EXPECT_EQ(latency.cumulative_counts[19], 0u) << MethodName(rpc);
    EXPECT_EQ(latency.cumulative_counts[23], kThreads * per_thread);
    EXPECT_EQ(latency.sum, static_cast<double>(per_thread * (1 + 2 + 3 + 4)))
        << MethodName(rpc);
  }
}

}  // namespace
}  // namespace pagealloc
