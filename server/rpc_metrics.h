// Per-RPC counters (by status code) and latency histograms, recorded without
// locks by the service and read at scrape time.

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

enum class Rpc : int {
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
};
inline constexpr int kNumRpcs = 10;
inline constexpr int kNumStatusCodes = 17;  // google.rpc.Code 0..16

// The method name as in the .proto ("AllocExtend").
const char* RpcName(Rpc rpc);

// This class is thread-safe.
class RpcMetrics {
 public:
  RpcMetrics();

  void Record(Rpc rpc, absl::StatusCode code, absl::Duration latency) {
    const int c = static_cast<int>(code);
    counts_[Index(rpc, c >= 0 && c < kNumStatusCodes ? c : 2)].fetch_add(
        1, std::memory_order_relaxed);
    latency_[static_cast<int>(rpc)]->Observe(absl::ToDoubleSeconds(latency));
  }

  int64_t count(Rpc rpc, absl::StatusCode code) const {
    return counts_[Index(rpc, static_cast<int>(code))].load(
        std::memory_order_relaxed);
  }
  const AtomicHistogram& latency(Rpc rpc) const {
    return *latency_[static_cast<int>(rpc)];
  }

 private:
  static int Index(Rpc rpc, int code) {
    return static_cast<int>(rpc) * kNumStatusCodes + code;
  }
  std::array<std::atomic<int64_t>, kNumRpcs * kNumStatusCodes> counts_;
  std::array<std::unique_ptr<AtomicHistogram>, kNumRpcs> latency_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_RPC_METRICS_H_
