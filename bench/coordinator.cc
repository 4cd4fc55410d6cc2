#include "bench/coordinator.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/control.h"
#include "bench/daemon.h"
#include "bench/floors.h"
#include "bench/phase.h"
#include "bench/report.h"
#include "common/status_macros.h"
#include "server/server.h"
#include "tests/socket_dir.h"

namespace pagealloc::bench {
namespace {

// `w` in the completion mode `name` (Workload::mode()'s names).
absl::StatusOr<Workload> WithMode(const Workload& w, const std::string& name) {
  Workload mode = w;
  if (name == "sync" || name == "async") {
    mode.gpu_ordered = false;
  } else if (name == "gpu" || name == "sync_gpu") {
    mode.gpu_ordered = true;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--sweep_completion: bad mode '", name,
                     "' (sync, async, gpu or sync_gpu)"));
  }
  mode.async_completion = name == "async" || name == "gpu";
  return mode;
}

// The spin of the daemon's batcher thread: its --batcher_spin_us among
// `server_flags` when set there (>= 0), else the daemon's default for this
// machine (ServerOptions.batcher).
absl::Duration DaemonBatcherSpin(const std::vector<std::string>& server_flags) {
  absl::Duration spin = ServerOptions().batcher.spin;
  for (const std::string& flag : server_flags) {
    for (absl::string_view prefix :
         {"--batcher_spin_us=", "-batcher_spin_us="}) {
      int64_t us = 0;
      if (absl::StartsWith(flag, prefix) &&
          absl::SimpleAtoi(absl::string_view(flag).substr(prefix.size()),
                           &us) &&
          us >= 0) {
        spin = absl::Microseconds(us);
      }
    }
  }
  return spin;
}

}  // namespace

namespace {

// RunCoordinator's run once its directory `dir` is made.
absl::Status RunInDirectory(const BenchOptions& options,
                            const std::vector<int>& client_counts,
                            const std::vector<Workload>& modes,
                            const std::string& dir);

}  // namespace

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
  if (options.echo_clients < 0 || options.echo_clients > kMaxClients) {
    return absl::InvalidArgumentError(
        absl::StrCat("--echo_clients must be 0..", kMaxClients));
  }
  if (options.floor_threads < 1 || options.floor_threads > 256) {
    return absl::InvalidArgumentError("--floor_threads must be 1..256");
  }
  const Workload& w = options.workload;
  RETURN_IF_ERROR(w.Validate());
  std::vector<Workload> modes;
  for (const std::string& name : options.sweep_completion) {
    ASSIGN_OR_RETURN(Workload mode, WithMode(w, name));
    modes.push_back(mode);
  }
  if (modes.empty()) modes.push_back(w);
  // Unix socket paths are limited to 107 bytes: a short private directory,
  // which also holds the daemon's and the workers' logs.
  char pattern[] = "/tmp/pagealloc-bench-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    return absl::InternalError("mkdtemp for the benchmark's socket");
  }
  const std::string dir = pattern;
  const absl::Status status =
      RunInDirectory(options, client_counts, modes, dir);
  if (status.ok()) {
    testing::RemoveDirectoryTree(dir);
    return status;
  }
  // Kept for whoever reads why the run failed.
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), " (logs in ", dir, ")"));
}

namespace {

absl::Status RunInDirectory(const BenchOptions& options,
                            const std::vector<int>& client_counts,
                            const std::vector<Workload>& modes,
                            const std::string& dir) {
  const Workload& w = options.workload;
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
      MeasureInProcessDecode(
          options.daemon.backend, w, options.daemon.num_pages,
          options.daemon.page_size, options.floor_s, options.seed,
          options.floor_threads, &floors.executor, &floors.in_process_enqueue));
  floors.in_process_threads = options.floor_threads;
  if (options.echo_floor) {
    const int echo_clients =
        options.echo_clients > 0
            ? options.echo_clients
            : *std::max_element(client_counts.begin(), client_counts.end());
    if (options.progress) {
      std::fprintf(stderr, "measuring the gRPC echo floor (%.1f s each)...\n",
                   options.floor_s);
    }
    ASSIGN_OR_RETURN(
        floors.echo,
        MeasureEchoFloor(SelfPath(), dir, w, options.daemon.page_size,
                         DaemonBatcherSpin(options.daemon.server_flags),
                         echo_clients, options.floor_s, options.seed));
  }

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
  const int of = client_counts.size() * modes.size();
  for (int clients : client_counts) {
    for (const Workload& mode : modes) {
      PhaseOptions phase;
      phase.dir = dir;
      phase.clients = clients;
      phase.number = phases.size() + 1;
      phase.of = of;
      phase.seed = options.seed;
      phase.duration_s = options.duration_s;
      phase.progress = options.progress;
      phase.worker_flags = options.worker_flags;
      // Later flags win: the phase's mode over the run's.
      phase.worker_flags.push_back(absl::StrCat(
          "--async_completion=", mode.async_completion ? "true" : "false"));
      phase.worker_flags.push_back(
          absl::StrCat("--gpu_ordered=", mode.gpu_ordered ? "true" : "false"));
      ASSIGN_OR_RETURN(PhaseResult result, RunPhase(daemon, phase));
      result.workload = mode;
      phases.push_back(std::move(result));
    }
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

}  // namespace
}  // namespace pagealloc::bench
