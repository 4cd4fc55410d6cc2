// What a worker measures per RPC, and how it hands that to the coordinator:
// a text report (one line per RPC) that the coordinator parses and merges
// across workers exactly (histograms add up bucket by bucket).

#ifndef PAGEALLOC_BENCH_RPC_STATS_H_
#define PAGEALLOC_BENCH_RPC_STATS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bench/latency_histogram.h"

namespace pagealloc::bench {

// The RPCs a worker makes. Admissions of new sequences are AllocExtend
// calls as well, counted apart (kAdmit) so that the AllocExtend row holds
// prefill chunks and speculative drafts alone.
enum RpcKind {
  kDecode,
  kExtend,
  kFree,
  kCheckpoint,
  kRollback,
  kAdmit,
  kNumRpcKinds
};
inline constexpr const char* kRpcNames[kNumRpcKinds] = {
    "AllocDecode", "AllocExtend", "Free",
    "Checkpoint",  "Rollback",    "AllocExtend_admit"};

struct RpcStats {
  LatencyHistogram latency;
  int64_t slots = 0;
  int64_t requests = 0;  // batch entries sent (allocation calls)
};

// One worker's numbers over a phase, or several workers' merged.
struct WorkerReport {
  RpcStats rpcs[kNumRpcKinds];
  // Requests refused for lack of pages.
  int64_t refused = 0;

  // Calls of every kind.
  int64_t total_calls() const;
  // Allocation calls (decode, extend, admission), their slots and requests.
  int64_t alloc_calls() const;
  int64_t alloc_slots() const;
  int64_t alloc_requests() const;

  // Adds `other`'s counts and histograms to this report's.
  void Merge(const WorkerReport& other);

  // The text form: "<rpc> <slots> <requests> <histogram>" per RPC, then
  // "refused <n>", one per line.
  std::string Serialize() const;
  // Parses Serialize's text. DATA_LOSS when a line is malformed or an RPC
  // is missing.
  static absl::StatusOr<WorkerReport> Parse(absl::string_view text);
};

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_RPC_STATS_H_
