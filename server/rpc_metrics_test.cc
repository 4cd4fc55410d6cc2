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

std::vector<Transport> AllTransports() {
  return {Transport::kGrpc, Transport::kFastChannel};
}

// The methods whose calls have a latency (KeepAlive's is a stream's life).
std::vector<Method> TimedRpcs() {
  std::vector<Method> rpcs;
  for (Method rpc : AllRpcs()) {
    if (rpc != Method::kKeepAlive) rpcs.push_back(rpc);
  }
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

TEST(TransportTest, NamesAndMethodsCarried) {
  EXPECT_STREQ(TransportName(Transport::kGrpc), "grpc");
  EXPECT_STREQ(TransportName(Transport::kFastChannel), "fast_channel");
  for (Method rpc : AllRpcs()) {
    EXPECT_TRUE(TransportCarries(Transport::kGrpc, rpc)) << MethodName(rpc);
  }
  // The fast channel's call kinds (fast_channel/layout.h's CallKind).
  std::set<std::string> fast;
  for (Method rpc : AllRpcs()) {
    if (TransportCarries(Transport::kFastChannel, rpc)) {
      fast.insert(MethodName(rpc));
    }
  }
  EXPECT_EQ(fast, (std::set<std::string>{"AllocExtend", "AllocDecode", "Alloc",
                                         "Free", "Checkpoint", "Rollback",
                                         "MatchPrefix"}));
}

TEST(RpcMetricsTest, StartsAtZero) {
  const RpcMetrics metrics;
  for (Method rpc : AllRpcs()) {
    for (Transport transport : AllTransports()) {
      for (absl::StatusCode code : AllCodes()) {
        EXPECT_EQ(metrics.count(rpc, transport, code), 0)
            << MethodName(rpc) << " " << TransportName(transport) << " "
            << absl::StatusCodeToString(code);
      }
      const AtomicHistogram::Snapshot latency =
          metrics.latency(rpc, transport).Take();
      EXPECT_EQ(latency.count, 0u);
      EXPECT_EQ(latency.sum, 0);
    }
  }
  EXPECT_EQ(metrics.keepalive_stream().Take().count, 0u);
}

TEST(RpcMetricsTest, LatencyBucketsSpanOneMicrosecondToEightSeconds) {
  const RpcMetrics metrics;
  const std::vector<double> bounds =
      metrics.latency(Method::kRegister, Transport::kGrpc).Take().upper_bounds;
  ASSERT_EQ(bounds.size(), 24u);
  EXPECT_EQ(bounds.front(), 1e-6);
  EXPECT_EQ(bounds.back(), 1e-6 * (1 << 23));  // about 8.4 s
}

TEST(RpcMetricsTest, KeepAliveBucketsSpanTenMillisecondsToAWeek) {
  const RpcMetrics metrics;
  const std::vector<double> bounds =
      metrics.keepalive_stream().Take().upper_bounds;
  ASSERT_EQ(bounds.size(), 14u);
  EXPECT_EQ(bounds.front(), 0.01);
  EXPECT_GT(bounds.back(), 7 * 24 * 3600);
}

// One Record moves exactly one counter and one histogram: its own.
TEST(RpcMetricsTest, RecordCountsOnlyItsRpcTransportAndCode) {
  RpcMetrics metrics;
  metrics.Record(Method::kFree, Transport::kFastChannel,
                 absl::StatusCode::kNotFound, absl::Microseconds(3));
  for (Method rpc : AllRpcs()) {
    for (Transport transport : AllTransports()) {
      const bool mine =
          rpc == Method::kFree && transport == Transport::kFastChannel;
      for (absl::StatusCode code : AllCodes()) {
        EXPECT_EQ(metrics.count(rpc, transport, code),
                  mine && code == absl::StatusCode::kNotFound ? 1 : 0)
            << MethodName(rpc) << " " << TransportName(transport) << " "
            << absl::StatusCodeToString(code);
      }
      EXPECT_EQ(metrics.latency(rpc, transport).Take().count, mine ? 1u : 0u)
          << MethodName(rpc) << " " << TransportName(transport);
    }
  }
  EXPECT_EQ(metrics.keepalive_stream().Take().count, 0u);
  const AtomicHistogram::Snapshot latency =
      metrics.latency(Method::kFree, Transport::kFastChannel).Take();
  // 3 us is over the 2 us bound and under the 4 us one.
  EXPECT_EQ(latency.cumulative_counts[1], 0u);
  EXPECT_EQ(latency.cumulative_counts[2], 1u);
  EXPECT_EQ(latency.sum, absl::ToDoubleSeconds(absl::Microseconds(3)));
}

// A KeepAlive stream is counted by code like any call, but its lifetime
// goes to its own histogram: no latency histogram sees it.
TEST(RpcMetricsTest, KeepAliveStreamsStayOutOfTheLatencyHistograms) {
  RpcMetrics metrics;
  metrics.Record(Method::kKeepAlive, Transport::kGrpc, absl::StatusCode::kOk,
                 absl::Hours(5));
  metrics.Record(Method::kKeepAlive, Transport::kGrpc,
                 absl::StatusCode::kNotFound, absl::Seconds(1));
  EXPECT_EQ(metrics.count(Method::kKeepAlive, Transport::kGrpc,
                          absl::StatusCode::kOk),
            1);
  EXPECT_EQ(metrics.count(Method::kKeepAlive, Transport::kGrpc,
                          absl::StatusCode::kNotFound),
            1);
  for (Method rpc : AllRpcs()) {
    for (Transport transport : AllTransports()) {
      EXPECT_EQ(metrics.latency(rpc, transport).Take().count, 0u)
          << MethodName(rpc) << " " << TransportName(transport);
    }
  }
  const AtomicHistogram::Snapshot streams = metrics.keepalive_stream().Take();
  EXPECT_EQ(streams.count, 2u);
  EXPECT_EQ(streams.sum, 5 * 3600 + 1);
  // 1 s is over the 0.64 s bound and under the 2.56 s one; 5 h (18000 s)
  // over 10486 s and under 41943 s.
  EXPECT_EQ(streams.cumulative_counts[3], 0u);
  EXPECT_EQ(streams.cumulative_counts[4], 1u);
  EXPECT_EQ(streams.cumulative_counts[10], 1u);
  EXPECT_EQ(streams.cumulative_counts[11], 2u);
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
    metrics.Record(Method::kAlloc, Transport::kGrpc, absl::StatusCode::kOk,
                   c.latency);
    const AtomicHistogram::Snapshot latency =
        metrics.latency(Method::kAlloc, Transport::kGrpc).Take();
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
  const Transport fast = Transport::kFastChannel;
  metrics.Record(Method::kRollback, fast, static_cast<absl::StatusCode>(42),
                 absl::Microseconds(1));
  metrics.Record(Method::kRollback, fast, static_cast<absl::StatusCode>(-1),
                 absl::Microseconds(1));
  EXPECT_EQ(metrics.count(Method::kRollback, fast, absl::StatusCode::kUnknown),
            2);
  EXPECT_EQ(metrics.latency(Method::kRollback, fast).Take().count, 2u);
  for (Method rpc : AllRpcs()) {
    for (Transport transport : AllTransports()) {
      if (rpc == Method::kRollback && transport == fast) continue;
      for (absl::StatusCode code : AllCodes()) {
        EXPECT_EQ(metrics.count(rpc, transport, code), 0)
            << MethodName(rpc) << " " << absl::StatusCodeToString(code);
      }
    }
  }
}

// Threads record every (rpc, transport, code) triple in turn. Latencies
// are whole seconds, so the latency sums are exact in a double.
TEST(RpcMetricsTest, ConcurrentRecordsGiveExactTotals) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 500;
  RpcMetrics metrics;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&metrics, t] {
      for (int round = 0; round < kRounds; ++round) {
        for (Method rpc : AllRpcs()) {
          for (Transport transport : AllTransports()) {
            for (absl::StatusCode code : AllCodes()) {
              // 1 s for thread 0, 2 s for thread 1, ...
              metrics.Record(rpc, transport, code, absl::Seconds(t + 1));
            }
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  const uint64_t per_thread = uint64_t{kRounds} * kNumStatusCodes;
  for (Method rpc : AllRpcs()) {
    for (Transport transport : AllTransports()) {
      for (absl::StatusCode code : AllCodes()) {
        EXPECT_EQ(metrics.count(rpc, transport, code), kThreads * kRounds)
            << MethodName(rpc) << " " << absl::StatusCodeToString(code);
      }
    }
  }
  for (Method rpc : TimedRpcs()) {
    for (Transport transport : AllTransports()) {
      const AtomicHistogram::Snapshot latency =
          metrics.latency(rpc, transport).Take();
      EXPECT_EQ(latency.count, kThreads * per_thread) << MethodName(rpc);
      // Every latency is 1..4 s: all under the last bound (8.4 s), none
      // under the 0.52 s bound.
      EXPECT_EQ(latency.cumulative_counts[19], 0u) << MethodName(rpc);
      EXPECT_EQ(latency.cumulative_counts[23], kThreads * per_thread);
      EXPECT_EQ(latency.sum, static_cast<double>(per_thread * (1 + 2 + 3 + 4)))
          << MethodName(rpc);
    }
  }
  // KeepAlive, both transports.
  const AtomicHistogram::Snapshot streams = metrics.keepalive_stream().Take();
  EXPECT_EQ(streams.count, kNumTransports * kThreads * per_thread);
  EXPECT_EQ(streams.sum,
            static_cast<double>(kNumTransports * per_thread * (1 + 2 + 3 + 4)));
}

}  // namespace
}  // namespace pagealloc
