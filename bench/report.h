// The run's results: a table on stdout (floors, the gRPC echo floor among
// them, then per phase and RPC: calls, rates, latency percentiles, launches,
// daemon CPU and stage means, ratios to the floors; a sweep summary when there
// are several phases), and the same as JSON for bench/plot.sh and comparisons.

#ifndef PAGEALLOC_BENCH_REPORT_H_
#define PAGEALLOC_BENCH_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/floors.h"
#include "bench/phase.h"
#include "bench/workload.h"

namespace pagealloc::bench {

// The settings the JSON's "config" records.
struct RunConfig {
  std::string backend;
  std::string target;  // the daemon actually driven
  double duration_s = 0;
  bool fast_channel = true;
  int64_t page_size = 0;
  int64_t num_pages = 0;
  Workload workload;
};

// Prints the report tables to stdout.
void PrintReport(const Floors& floors, const std::vector<PhaseResult>& phases,
                 const Workload& w);

// Writes the results as JSON to `path`. INTERNAL when it cannot.
absl::Status WriteJson(const std::string& path, const RunConfig& config,
                       const Floors& floors,
                       const std::vector<PhaseResult>& phases);

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_REPORT_H_
