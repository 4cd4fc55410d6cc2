#include "bench/phase.h"

#include <cstdio>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/clock.h"
#include "bench/control.h"
#include "bench/cpu_time.h"
#include "bench/snapshot.h"
#include "common/status_macros.h"
#include "tests/daemon_process.h"
#include "tests/subprocess.h"
#include "tests/wait_for.h"

namespace pagealloc::bench {
namespace {

// The mean of the daemon's AllocDecode latency over the phase, whichever
// transport carried the calls (the histogram is per transport); -1 when
// unknown or nothing was observed.
double DecodeRpcMean(const Snapshot& before, const Snapshot& after) {
  double sum = 0;
  double count = 0;
  for (const char* transport : {"grpc", "fast_channel"}) {
    const std::string labels =
        absl::StrFormat("{rpc=\"AllocDecode\",transport=\"%s\"}", transport);
    const double mean =
        MetricMean(before, after, "pagealloc_rpc_duration_seconds", labels);
    if (mean < 0) continue;
    const std::string key =
        absl::StrCat("pagealloc_rpc_duration_seconds_count", labels);
    const double n = after.metrics.at(key) -
                     (before.metrics.count(key) ? before.metrics.at(key) : 0);
    sum += mean * n;
    count += n;
  }
  return count > 0 ? sum / count : -1;
}

class Phase {
 public:
  Phase(const DaemonHandle& daemon, const PhaseOptions& options)
      : daemon_(daemon), o_(options) {}

  absl::StatusOr<PhaseResult> Run() {
    const std::string control_path =
        absl::StrCat(o_.dir, "/control-", o_.number);
    ASSIGN_OR_RETURN(Control * control, MapControl(control_path, true));
    std::vector<testing::Subprocess> workers;
    std::vector<std::string> outs, logs;
    const std::string self = SelfPath();
    for (int i = 0; i < o_.clients; ++i) {
      outs.push_back(
          absl::StrCat(o_.dir, "/worker-", o_.number, "-", i, ".out"));
      logs.push_back(
          absl::StrCat(o_.dir, "/worker-", o_.number, "-", i, ".log"));
      std::vector<std::string> argv = {
          self,
          "--worker",
          "--target=" + daemon_.target,
          absl::StrCat("--worker_index=", i),
          "--control_file=" + control_path,
          "--worker_out=" + outs.back(),
          absl::StrCat("--seed=", o_.seed + 1000 * o_.number)};
      argv.insert(argv.end(), o_.worker_flags.begin(), o_.worker_flags.end());
      ASSIGN_OR_RETURN(testing::Subprocess worker,
                       testing::Subprocess::Start(argv, logs.back()));
      workers.push_back(std::move(worker));
    }
    // Wait until every worker has connected and admitted its sequences.
    RETURN_IF_ERROR(WaitAll(control, kReady, logs, absl::Seconds(60)));
    // The CPU window: the workers' and the host's CPU are read between the
    // daemon's snapshots, right around `seconds` (the snapshots' own calls
    // fall outside it).
    ASSIGN_OR_RETURN(Snapshot before, Snap());
    const Cpu cpu_before = ReadCpu(workers);
    const int64_t start = NowNanos();
    control->go.store(1);
    int64_t last_calls = 0, last_time = start;
    double rate = 0;
    while (NowNanos() - start < o_.duration_s * 1e9) {
      absl::SleepFor(absl::Milliseconds(250));
      int64_t calls = 0;
      for (int i = 0; i < o_.clients; ++i) {
        calls += control->workers[i].calls.load();
      }
      const int64_t now = NowNanos();
      rate = (calls - last_calls) / ((now - last_time) / 1e9);
      last_calls = calls;
      last_time = now;
      if (o_.progress) {
        std::fprintf(stderr,
                     "\r[phase %d/%d] %d clients  %5.1f/%.1f s  %lld calls  "
                     "%.0f calls/s    ",
                     o_.number, o_.of, o_.clients, (now - start) / 1e9,
                     o_.duration_s, static_cast<long long>(calls), rate);
      }
      for (int i = 0; i < o_.clients; ++i) {
        if (control->workers[i].state.load() == kFailed) {
          return WorkerFailure(i, logs[i]);
        }
      }
    }
    control->stop.store(1);
    RETURN_IF_ERROR(WaitAll(control, kDone, logs, absl::Seconds(60)));
    PhaseResult result;
    result.clients = o_.clients;
    result.seconds = (NowNanos() - start) / 1e9;
    // A worker may have exited since it was done; until Wait reaps it its
    // /proc entry still holds its whole CPU time.
    const Cpu cpu_after = ReadCpu(workers);
    if (o_.progress) std::fprintf(stderr, "\n");
    ASSIGN_OR_RETURN(Snapshot after, Snap());
    for (int i = 0; i < o_.clients; ++i) {
      absl::StatusOr<int> status = workers[i].Wait(absl::Seconds(30));
      if (!status.ok() || *status != 0) return WorkerFailure(i, logs[i]);
      RETURN_IF_ERROR(ReadWorker(outs[i], &result.workers));
    }
    UnmapControl(control);
    const WorkerReport& w = result.workers;
    result.launches =
        after.stats.launches_total() - before.stats.launches_total();
    result.alloc_calls = w.alloc_calls();
    if (before.cpu_seconds >= 0 && after.cpu_seconds >= 0) {
      result.server_cpu_seconds = after.cpu_seconds - before.cpu_seconds;
    }
    if (cpu_before.clients_seconds >= 0 && cpu_after.clients_seconds >= 0) {
      result.clients_cpu_seconds =
          cpu_after.clients_seconds - cpu_before.clients_seconds;
    }
    result.host_cpus_busy = HostCpusBusy(cpu_before.host, cpu_after.host);
    result.host_cpus = cpu_after.host.cpus;
    result.server_decode_rpc_mean = DecodeRpcMean(before, after);
    result.server_queue_wait_mean =
        MetricMean(before, after, "pagealloc_queue_wait_seconds", "");
    result.server_execute_mean =
        MetricMean(before, after, "pagealloc_execute_seconds", "");
    result.server_complete_mean =
        MetricMean(before, after, "pagealloc_complete_seconds", "");
    result.server_batch_requests_mean =
        MetricMean(before, after, "pagealloc_batch_requests", "");
    return result;
  }

 private:
  // The workers' and the host's CPU time at one moment.
  struct Cpu {
    double clients_seconds = -1;  // every worker's, summed; -1: unknown
    HostCpuTicks host;
  };

  static Cpu ReadCpu(const std::vector<testing::Subprocess>& workers) {
    Cpu cpu;
    cpu.host = ReadHostCpu();
    double sum = 0;
    for (const testing::Subprocess& worker : workers) {
      const double seconds = CpuSeconds(worker.pid());
      if (seconds < 0) return cpu;
      sum += seconds;
    }
    cpu.clients_seconds = sum;
    return cpu;
  }

  absl::StatusOr<Snapshot> Snap() const {
    return TakeSnapshot(daemon_.target, daemon_.pid, daemon_.metrics_address);
  }

  absl::Status WorkerFailure(int i, const std::string& log) const {
    return absl::InternalError(
        absl::StrFormat("worker %d of phase %d failed:\n%s", i, o_.number,
                        testing::ReadLog(log)));
  }

  // Waits until every worker is in `state`; fails as soon as one fails.
  absl::Status WaitAll(Control* control, WorkerState state,
                       const std::vector<std::string>& logs,
                       absl::Duration timeout) const {
    const absl::Time deadline = absl::Now() + timeout;
    for (int i = 0; i < o_.clients; ++i) {
      const std::atomic<int64_t>& worker_state = control->workers[i].state;
      testing::WaitFor(
          [&] {
            const int64_t s = worker_state.load();
            return s == state || s == kFailed;
          },
          deadline - absl::Now(), absl::Milliseconds(1));
      if (worker_state.load() == kFailed) return WorkerFailure(i, logs[i]);
      if (worker_state.load() != state) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "worker %d of phase %d did not get ready in time:\n%s", i,
            o_.number, testing::ReadLog(logs[i])));
      }
    }
    return absl::OkStatus();
  }

  // Adds the report a worker wrote at `path` to `merged`.
  static absl::Status ReadWorker(const std::string& path,
                                 WorkerReport* merged) {
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
    absl::StatusOr<WorkerReport> report = WorkerReport::Parse(text);
    if (!report.ok()) {
      return absl::DataLossError(absl::StrCat("bad worker output ", path, ": ",
                                              report.status().message()));
    }
    merged->Merge(*report);
    return absl::OkStatus();
  }

  const DaemonHandle& daemon_;
  const PhaseOptions o_;
};

}  // namespace

absl::StatusOr<PhaseResult> RunPhase(const DaemonHandle& daemon,
                                     const PhaseOptions& options) {
  return Phase(daemon, options).Run();
}

}  // namespace pagealloc::bench
