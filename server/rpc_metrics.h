// Per-method counters (by status code) and latency histograms, recorded
// without locks by the call core and read at scrape time.

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
};
inline constexpr int kNumMethods = 10;
inline constexpr int kNumStatusCodes = 17;  // google.rpc.Code 0..16

// The method name as in the .proto ("AllocExtend").
const char* MethodName(Method method);

// This class is thread-safe.
class RpcMetrics {
 public:
  RpcMetrics();

  void Record(Method method, absl::StatusCode code, absl::Duration latency) {
    const int c = static_cast<int>(code);
    counts_[Index(method, c >= 0 && c < kNumStatusCodes ? c : 2)].fetch_add(
        1, std::memory_order_relaxed);
    latency_[static_cast<int>(method)]->Observe(absl::ToDoubleSeconds(latency));
  }

  int64_t count(Method method, absl::StatusCode code) const {
    return counts_[Index(method, static_cast<int>(code))].load(
        std::memory_order_relaxed);
  }
  const AtomicHistogram& latency(Method method) const {
    return *latency_[static_cast<int>(method)];
  }

 private:
  static int Index(Method method, int code) {
    return static_cast<int>(method) * kNumStatusCodes + code;
  }
  std::array<std::atomic<int64_t>, kNumMethods * kNumStatusCodes> counts_;
  std::array<std::unique_ptr<AtomicHistogram>, kNumMethods> latency_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_RPC_METRICS_H_
