#include "bench/coordinator.h"

#include <stdlib.h>

#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/control.h"
#include "bench/floors.h"
#include "bench/phase.h"
#include "bench/report.h"
#include "common/status_macros.h"

namespace pagealloc::bench {

absl::Status RunCoordinator(const BenchOptions& options) {
  std::vector<int> client_counts;
  for (const std::string& c : options.sweep_clients) {
    int n = 0;
    if (!absl::SimpleAtoi(c, &n) || n < 1 || n > kMaxClients) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sweep_clients: bad count '", c, "'"));
    }
    client_counts.push_back(n);
  }
  if (client_counts.empty()) client_counts.push_back(options.clients);
  if (client_counts.front() < 1 || client_counts.front() > kMaxClients) {
    return absl::InvalidArgumentError(
        absl::StrCat("--clients must be 1..", kMaxClients));
  }
  const Workload& w = options.workload;
  RETURN_IF_ERROR(w.Validate());
  // Unix socket paths are limited to 107 bytes: a short private directory.
  char pattern[] = "/tmp/pagealloc-bench-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    return absl::InternalError("mkdtemp for the benchmark's socket");
  }
  const std::string dir = pattern;
  ASSIGN_OR_RETURN(DaemonHandle daemon, StartOrAttach(options.daemon, dir));

  Floors floors;
  if (options.progress) {
    std::fprintf(stderr, "measuring floors (%.1f s each)...\n",
                 options.floor_s);
  }
  ASSIGN_OR_RETURN(floors.health,
                   MeasureHealthCheck(daemon.target, options.floor_s));
  ASSIGN_OR_RETURN(
      floors.in_process,
      MeasureInProcessDecode(options.daemon.backend, w,
                             options.daemon.num_pages, options.daemon.page_size,
                             options.floor_s, options.seed, &floors.executor));

  if (options.idle_s > 0) {
    if (options.progress) {
      std::fprintf(stderr, "measuring the idle daemon (%.1f s)...\n",
                   options.idle_s);
    }
    ASSIGN_OR_RETURN(
        floors.idle,
        MeasureIdleDaemon(daemon.target, daemon.pid, options.idle_sessions,
                          options.fast_channel, options.daemon.page_size,
                          options.idle_s));
  }

  std::vector<PhaseResult> phases;
  for (size_t i = 0; i < client_counts.size(); ++i) {
    PhaseOptions phase;
    phase.dir = dir;
    phase.clients = client_counts[i];
    phase.number = i + 1;
    phase.of = client_counts.size();
    phase.seed = options.seed;
    phase.duration_s = options.duration_s;
    phase.progress = options.progress;
    phase.worker_flags = options.worker_flags;
    ASSIGN_OR_RETURN(PhaseResult result, RunPhase(daemon, phase));
    phases.push_back(std::move(result));
  }
  PrintReport(floors, phases, w);
  if (!options.json.empty()) {
    RunConfig config;
    config.backend = options.daemon.backend;
    config.target = daemon.target;
    config.duration_s = options.duration_s;
    config.fast_channel = options.fast_channel;
    config.page_size = options.daemon.page_size;
    config.num_pages = options.daemon.num_pages;
    config.workload = w;
    RETURN_IF_ERROR(WriteJson(options.json, config, floors, phases));
  }
  return StopDaemon(daemon);
}

}  // namespace pagealloc::bench
