// Per-method counters (by transport and status code) and latency
// histograms, recorded without locks by the call core and read at scrape
// time.

#ifndef PAGEALLOC_SERVER_RPC_METRICS_H_
#define PAGEALLOC_SERVER_RPC_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/histogram.h"

namespace pagealloc {

// The API's methods (pagealloc.v1.PageAllocator): the identity of a call
// whichever transport carries it (a gRPC method, or a fast-channel call of
// the same kind).
enum class Method : int {
  kRegister,
  kKeepAlive,
  kAllocExtend,
  kAllocDecode,
  kAlloc,
  kFree,
  kCheckpoint,
  kRollback,
  kReleaseRing,
  kGetStats,
  kClearSession,
  kClearPool,
  kGetFreeLists,
  kPublish,
  kMatchPrefix,
  kUnpinPrefix,
  kResetPrefixCache,
  kResume,
  kListPages,
};
inline constexpr int kNumMethods = 19;
inline constexpr int kNumStatusCodes = 17;  // google.rpc.Code 0..16

// The method name as in the .proto ("AllocExtend").
const char* MethodName(Method method);

// What carried a call: a gRPC method, or the session's fast channel (shared
// memory, fast_channel/layout.h).
enum class Transport : int { kGrpc, kFastChannel };
inline constexpr int kNumTransports = 2;

// The label value: "grpc" or "fast_channel".
const char* TransportName(Transport transport);

// Whether `transport` carries calls of `method`: gRPC carries every method,
// the fast channel the allocation calls, Free, Checkpoint, Rollback and
// MatchPrefix.
bool TransportCarries(Transport transport, Method method);

// This class is thread-safe.
class RpcMetrics {
 public:
  RpcMetrics();

  // Counts one call of `method` that came through `transport` and ended
  // with `code` (a code outside 0..16 counts as UNKNOWN), and records its
  // latency: arrival to answer. A KeepAlive call is a stream: its latency
  // is how long the stream was open, which goes to keepalive_stream(), not
  // to latency(), so that stream lifetimes (seconds to days) do not swamp
  // the per-call latencies.
  void Record(Method method, Transport transport, absl::StatusCode code,
              absl::Duration latency) {
    const int c = static_cast<int>(code);
    counts_[Index(method, transport, c >= 0 && c < kNumStatusCodes ? c : 2)]
        .fetch_add(1, std::memory_order_relaxed);
    const double seconds = absl::ToDoubleSeconds(latency);
    if (method == Method::kKeepAlive) {
      keepalive_stream_.Observe(seconds);
    } else {
      latency_[LatencyIndex(method, transport)]->Observe(seconds);
    }
  }

  int64_t count(Method method, Transport transport,
                absl::StatusCode code) const {
    return counts_[Index(method, transport, static_cast<int>(code))].load(
        std::memory_order_relaxed);
  }
  // Latencies of `method`'s calls through `transport` (empty for
  // KeepAlive, whose streams go to keepalive_stream()).
  const AtomicHistogram& latency(Method method, Transport transport) const {
    return *latency_[LatencyIndex(method, transport)];
  }
  // How long KeepAlive streams were open, one observation per stream.
  const AtomicHistogram& keepalive_stream() const { return keepalive_stream_; }

 private:
  static int LatencyIndex(Method method, Transport transport) {
    return static_cast<int>(method) * kNumTransports +
           static_cast<int>(transport);
  }
  static int Index(Method method, Transport transport, int code) {
    return LatencyIndex(method, transport) * kNumStatusCodes + code;
  }
  std::array<std::atomic<int64_t>,
             kNumMethods * kNumTransports * kNumStatusCodes>
      counts_;
  std::array<std::unique_ptr<AtomicHistogram>, kNumMethods * kNumTransports>
      latency_;
  AtomicHistogram keepalive_stream_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_RPC_METRICS_H_
