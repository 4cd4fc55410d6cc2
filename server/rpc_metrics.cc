#include "server/rpc_metrics.h"

namespace pagealloc {

const char* MethodName(Method method) {
  static constexpr const char* kNames[kNumMethods] = {
      "Register", "KeepAlive",  "AllocExtend", "AllocDecode", "Alloc",
      "Free",     "Checkpoint", "Rollback",    "ReleaseRing", "GetStats"};
  return kNames[static_cast<int>(method)];
}

RpcMetrics::RpcMetrics() {
  for (auto& count : counts_) count = 0;
  for (auto& histogram : latency_) {
    // 1 us to about 8 s.
    histogram = std::make_unique<AtomicHistogram>(
        AtomicHistogram::Exponential(1e-6, 2, 24));
  }
}

}  // namespace pagealloc
