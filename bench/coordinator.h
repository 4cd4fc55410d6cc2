// The coordinator: what pagealloc-bench does without --worker. It starts
// (or attaches to) the daemon, measures the floors, runs one phase per
// client count, prints the report and writes the JSON, and stops the
// daemon it started.

#ifndef PAGEALLOC_BENCH_COORDINATOR_H_
#define PAGEALLOC_BENCH_COORDINATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/daemon.h"
#include "bench/workload.h"

namespace pagealloc::bench {

struct BenchOptions {
  DaemonOptions daemon;
  // One phase per count of sweep_clients ("1", "2", ...), or one phase of
  // `clients` when it is empty.
  std::vector<std::string> sweep_clients;
  int clients = 1;
  // For each client count, one phase per completion mode ("sync", "async",
  // "gpu", "sync_gpu": Workload::mode()), in this order; empty: the
  // workload's own mode.
  std::vector<std::string> sweep_completion;
  double duration_s = 5;
  double floor_s = 2;
  // The in-process floor's timed steps run on this many threads in turn
  // (MeasureInProcessDecode); 1: one thread.
  int floor_threads = 1;
  // Seconds of the idle-daemon measurement (IdleCost), with
  // `idle_sessions` sessions open; 0: skipped.
  double idle_s = 0;
  int idle_sessions = 8;
  // The gRPC echo floor (MeasureEchoFloor), each of its measurements
  // floor_s long; its several-client measurement with `echo_clients`
  // clients (0: the most clients of any phase; skipped when that is 1).
  bool echo_floor = true;
  int echo_clients = 0;
  Workload workload;
  bool fast_channel = true;  // recorded in the JSON; workers get it below
  uint64_t seed = 1;
  bool progress = true;
  std::string json;  // where to write the JSON; empty: nowhere
  // Flags every worker gets (the workload and client settings).
  std::vector<std::string> worker_flags;
};

// Runs the benchmark. INVALID_ARGUMENT for a bad client count, completion
// mode or workload; otherwise the error of whatever broke (the daemon, a
// worker, writing the JSON). Never fails on a number.
absl::Status RunCoordinator(const BenchOptions& options);

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_COORDINATOR_H_
