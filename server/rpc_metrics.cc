#include "server/rpc_metrics.h"

namespace pagealloc {

const char* MethodName(Method method) {
  static constexpr const char* kNames[kNumMethods] = {"Register",
                                                      "KeepAlive",
                                                      "AllocExtend",
                                                      "AllocDecode",
                                                      "Alloc",
                                                      "Free",
                                                      "Checkpoint",
                                                      "Rollback",
                                                      "ReleaseRing",
                                                      "GetStats",
                                                      "ClearSession",
                                                      "ClearPool",
                                                      "GetFreeLists",
                                                      "Publish",
                                                      "MatchPrefix",
                                                      "UnpinPrefix",
                                                      "ResetPrefixCache",
                                                      "Resume",
                                                      "ListPages"};
  return kNames[static_cast<int>(method)];
}

const char* TransportName(Transport transport) {
  return transport == Transport::kGrpc ? "grpc" : "fast_channel";
}

bool TransportCarries(Transport transport, Method method) {
  if (transport == Transport::kGrpc) return true;
  // The fast channel's call kinds (fast_channel::CallKind).
  switch (method) {
    case Method::kAllocExtend:
    case Method::kAllocDecode:
    case Method::kAlloc:
    case Method::kFree:
    case Method::kCheckpoint:
    case Method::kRollback:
    case Method::kMatchPrefix:
      return true;
    default:
      return false;
  }
}

RpcMetrics::RpcMetrics()
    // 10 ms to about 7.8 days: a stream lives as long as its session.
    : keepalive_stream_(AtomicHistogram::Exponential(0.01, 4, 14)) {
  for (auto& count : counts_) count = 0;
  for (auto& histogram : latency_) {
    // 1 us to about 8 s.
    histogram = std::make_unique<AtomicHistogram>(
        AtomicHistogram::Exponential(1e-6, 2, 24));
  }
}

}  // namespace pagealloc
