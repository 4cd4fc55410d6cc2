// What only the daemon knows, read before and after a phase: its GetStats
// (launches), its CPU time (CpuSeconds, bench/cpu_time.h) and its own /metrics
// histograms.

#ifndef PAGEALLOC_BENCH_SNAPSHOT_H_
#define PAGEALLOC_BENCH_SNAPSHOT_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "proto/pagealloc.pb.h"

namespace pagealloc::bench {

// Parses a Prometheus text exposition into "name{labels}" -> value;
// comments and lines without a number are skipped.
std::map<std::string, double> ParseMetrics(const std::string& text);

// The daemon's /metrics at `address` (host:port), parsed; empty when the
// address is empty or nothing answers there within 5 s.
std::map<std::string, double> ScrapeMetrics(const std::string& address);

struct Snapshot {
  v1::GetStatsResponse stats;
  double cpu_seconds = -1;  // -1: unknown
  std::map<std::string, double> metrics;
};

// Reads all three: the stats of `target` (their error is this call's), the
// CPU time of `pid` and the metrics at `metrics_address` (the last two may
// be unknown).
absl::StatusOr<Snapshot> TakeSnapshot(const std::string& target, int pid,
                                      const std::string& metrics_address);

// The mean of histogram `name` (with `labels`, e.g. "{rpc=\"Free\"}", or
// "") over the observations between `before` and `after`: the difference of
// its _sum over the difference of its _count. -1 when `after` lacks the
// histogram or nothing was observed.
double MetricMean(const Snapshot& before, const Snapshot& after,
                  const std::string& name, const std::string& labels);

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_SNAPSHOT_H_
