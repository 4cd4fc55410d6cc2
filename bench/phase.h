// One phase of a run: K worker processes (this binary with --worker)
// against the daemon for a fixed time, their reports merged, and what only
// the daemon knows added from snapshots taken before and after.

#ifndef PAGEALLOC_BENCH_PHASE_H_
#define PAGEALLOC_BENCH_PHASE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/daemon.h"
#include "bench/rpc_stats.h"
#include "bench/workload.h"

namespace pagealloc::bench {

struct PhaseOptions {
  std::string dir;    // private directory for control and worker files
  int clients = 1;    // worker processes, 1..kMaxClients
  int number = 1;     // this phase's number, 1..of (progress, file names)
  int of = 1;         // phases in the run
  uint64_t seed = 1;  // the run's; each phase adds 1000 * number
  double duration_s = 5;
  bool progress = true;  // a refreshing progress line on stderr
  // Flags every worker gets ("--batch=256", ...): the workload and client
  // settings, as given to this run.
  std::vector<std::string> worker_flags;
};

struct PhaseResult {
  int clients = 0;
  // The workload the workers ran (its completion mode and lanes may differ
  // from phase to phase of a run).
  Workload workload;
  double seconds = 0;
  WorkerReport workers;  // every worker's, merged
  int64_t launches = 0;
  int64_t alloc_calls = 0;
  // The daemon's user + system CPU time over the phase; -1: unknown.
  double server_cpu_seconds = -1;
  // The workers' user + system CPU time together, and the host's busy CPUs
  // on average (of host_cpus), over the same window as the daemon's: from
  // just before the workers start their timed calls until all are done
  // (`seconds`). -1: unknown.
  double clients_cpu_seconds = -1;
  double host_cpus_busy = -1;
  int host_cpus = 0;
  // Means of the daemon's own histograms over the phase (seconds), -1 when
  // its /metrics could not be read.
  double server_decode_rpc_mean = -1;
  double server_queue_wait_mean = -1;
  double server_execute_mean = -1;
  double server_complete_mean = -1;
  double server_batch_requests_mean = -1;
};

// Runs a phase against `daemon`: starts the workers, waits (up to 60 s)
// until all have admitted their sequences, lets them run for duration_s,
// stops them and merges their reports. INTERNAL (with its log) when a
// worker fails, DEADLINE_EXCEEDED when one does not get ready or done in
// time; GetStats's error when the daemon does not answer.
absl::StatusOr<PhaseResult> RunPhase(const DaemonHandle& daemon,
                                     const PhaseOptions& options);

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_PHASE_H_
