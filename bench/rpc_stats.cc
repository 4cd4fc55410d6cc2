#include "bench/rpc_stats.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pagealloc::bench {

int64_t WorkerReport::total_calls() const {
  int64_t n = 0;
  for (const RpcStats& r : rpcs) n += r.latency.count();
  return n;
}

int64_t WorkerReport::alloc_calls() const {
  return rpcs[kDecode].latency.count() + rpcs[kExtend].latency.count() +
         rpcs[kAdmit].latency.count();
}

int64_t WorkerReport::alloc_slots() const {
  return rpcs[kDecode].slots + rpcs[kExtend].slots + rpcs[kAdmit].slots;
}

int64_t WorkerReport::alloc_requests() const {
  return rpcs[kDecode].requests + rpcs[kExtend].requests +
         rpcs[kAdmit].requests;
}

void WorkerReport::Merge(const WorkerReport& other) {
  for (int r = 0; r < kNumRpcKinds; ++r) {
    rpcs[r].latency.Merge(other.rpcs[r].latency);
    rpcs[r].slots += other.rpcs[r].slots;
    rpcs[r].requests += other.rpcs[r].requests;
  }
  refused += other.refused;
}

std::string WorkerReport::Serialize() const {
  std::string text;
  for (int r = 0; r < kNumRpcKinds; ++r) {
    absl::StrAppend(&text, kRpcNames[r], " ", rpcs[r].slots, " ",
                    rpcs[r].requests, " ", rpcs[r].latency.Serialize(), "\n");
  }
  absl::StrAppend(&text, "refused ", refused, "\n");
  return text;
}

absl::StatusOr<WorkerReport> WorkerReport::Parse(absl::string_view text) {
  WorkerReport report;
  bool seen[kNumRpcKinds] = {};
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> head =
        absl::StrSplit(line, absl::MaxSplits(' ', 3));
    if (head.size() == 2 && head[0] == "refused" &&
        absl::SimpleAtoi(head[1], &report.refused)) {
      continue;
    }
    int r = 0;
    while (r < kNumRpcKinds && head[0] != kRpcNames[r]) ++r;
    if (r == kNumRpcKinds || head.size() != 4 ||
        !absl::SimpleAtoi(head[1], &report.rpcs[r].slots) ||
        !absl::SimpleAtoi(head[2], &report.rpcs[r].requests)) {
      return absl::DataLossError(absl::StrCat("bad line '", line, "'"));
    }
    absl::StatusOr<LatencyHistogram> h = LatencyHistogram::Parse(head[3]);
    if (!h.ok()) return h.status();
    report.rpcs[r].latency = *std::move(h);
    seen[r] = true;
  }
  for (int r = 0; r < kNumRpcKinds; ++r) {
    if (!seen[r]) {
      return absl::DataLossError(absl::StrCat("no line for ", kRpcNames[r]));
    }
  }
  return report;
}

}  // namespace pagealloc::bench
