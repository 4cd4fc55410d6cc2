#include "bench/report.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "bench/rpc_stats.h"
#include "common/build_info.h"
#include "common/version.h"

namespace pagealloc::bench {
namespace {

double Us(int64_t nanos) { return nanos / 1e3; }
double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

constexpr double kQuantiles[] = {0.5,  0.75,  0.9,   0.95,
                                 0.99, 0.995, 0.999, 0.9999};

std::string LatencyJson(const LatencyHistogram& h) {
  std::vector<std::string> curve;
  for (double q : kQuantiles) {
    curve.push_back(absl::StrFormat("[%g, %.3f]", q, Us(h.Percentile(q))));
  }
  return absl::StrFormat(
      "\"count\": %d, \"mean_us\": %.3f, \"p50_us\": %.3f, \"p90_us\": %.3f, "
      "\"p99_us\": %.3f, \"p999_us\": %.3f, \"max_us\": %.3f, "
      "\"percentiles_us\": [%s]",
      h.count(), h.mean_nanos() / 1e3, Us(h.Percentile(0.5)),
      Us(h.Percentile(0.9)), Us(h.Percentile(0.99)), Us(h.Percentile(0.999)),
      Us(h.max_nanos()), absl::StrJoin(curve, ", "));
}

// -1 (unknown) stays -1; seconds become microseconds.
double MetricUs(double seconds) { return seconds < 0 ? -1 : seconds * 1e6; }

// CPU seconds spent over `seconds` of wall time, as CPUs busy on average;
// -1 when unknown.
double CpusOver(double cpu_seconds, double seconds) {
  return cpu_seconds >= 0 && seconds > 0 ? cpu_seconds / seconds : -1;
}

// CPU seconds per call in microseconds; -1 when unknown.
double PerCallUs(double cpu_seconds, int64_t calls) {
  return cpu_seconds >= 0 && calls > 0 ? cpu_seconds * 1e6 / calls : -1;
}

// Where a phase's CPU went, on one line: the host's busy CPUs, the
// workers' and the daemon's; the parts that are known.
std::string PhaseCpuLine(const PhaseResult& p) {
  std::vector<std::string> parts;
  if (p.host_cpus_busy >= 0) {
    parts.push_back(absl::StrFormat("host CPU %.1f of %d busy",
                                    p.host_cpus_busy, p.host_cpus));
  }
  if (p.clients_cpu_seconds >= 0) {
    parts.push_back(absl::StrFormat(
        "clients %.1f CPUs (%.0f us per call)",
        CpusOver(p.clients_cpu_seconds, p.seconds),
        PerCallUs(p.clients_cpu_seconds, p.workers.total_calls())));
  }
  if (p.server_cpu_seconds >= 0) {
    parts.push_back(
        absl::StrFormat("daemon %.1f CPUs (%.0f us per allocation call)",
                        CpusOver(p.server_cpu_seconds, p.seconds),
                        PerCallUs(p.server_cpu_seconds, p.alloc_calls)));
  }
  return absl::StrJoin(parts, "; ");
}

// A measurement's CPU as JSON fields, to go inside its object.
std::string WindowCpuJson(const WindowCpu& cpu, const LatencyHistogram& h) {
  return absl::StrFormat(
      "\"server_cpu_s\": %.4f, \"server_cpu_us_per_call\": %.3f, "
      "\"host_cpus_busy\": %.3f, \"host_cpus\": %d",
      cpu.server_cpu_seconds, cpu.server_us_per_call(h.count()),
      cpu.host_cpus_busy, cpu.host_cpus);
}

std::string PhaseJson(const PhaseResult& p, const Floors& floors) {
  std::vector<std::string> rpcs;
  for (int r = 0; r < kNumRpcKinds; ++r) {
    const RpcStats& s = p.workers.rpcs[r];
    rpcs.push_back(absl::StrFormat(
        "\"%s\": {\"calls_per_s\": %.1f, \"slots_per_s\": %.1f, \"slots\": "
        "%d, %s}",
        kRpcNames[r], s.latency.count() / p.seconds, s.slots / p.seconds,
        s.slots, LatencyJson(s.latency)));
  }
  const LatencyHistogram& decode = p.workers.rpcs[kDecode].latency;
  const double cpu_us_per_rpc =
      p.server_cpu_seconds < 0
          ? -1
          : Ratio(p.server_cpu_seconds * 1e6, p.workers.total_calls());
  const double cpu_us_per_alloc =
      p.server_cpu_seconds < 0
          ? -1
          : Ratio(p.server_cpu_seconds * 1e6, p.alloc_calls);
  // With the echo floor: the daemon's AllocDecode against gRPC carrying
  // the same call with no daemon work.
  std::string echo_ratios;
  if (floors.echo.measured) {
    const LatencyHistogram& inline_decode = floors.echo.inline_decode.histogram;
    const LatencyHistogram& handed_off = floors.echo.handed_off.histogram;
    echo_ratios = absl::StrFormat(
        ", \"decode_p50_vs_echo_inline_p50\": %.6g, "
        "\"decode_p99_vs_echo_inline_p99\": %.6g, "
        "\"decode_p50_vs_echo_handed_off_p50\": %.6g, "
        "\"decode_p99_vs_echo_handed_off_p99\": %.6g",
        Ratio(decode.Percentile(0.5), inline_decode.Percentile(0.5)),
        Ratio(decode.Percentile(0.99), inline_decode.Percentile(0.99)),
        Ratio(decode.Percentile(0.5), handed_off.Percentile(0.5)),
        Ratio(decode.Percentile(0.99), handed_off.Percentile(0.99)));
  }
  return absl::StrFormat(
      "{\"clients\": %d, \"mode\": \"%s\", \"async_completion\": %s, "
      "\"gpu_ordered\": %s, \"lanes\": %d, \"seconds\": %.3f, "
      "\"calls\": %d, \"calls_per_s\": %.1f, \"alloc_calls\": %d, "
      "\"alloc_calls_per_s\": %.1f, \"alloc_slots_per_s\": %.1f, "
      "\"launches\": %d, \"launches_per_s\": %.1f, \"calls_per_launch\": %.3f, "
      "\"requests_per_launch\": %.3f, \"refused_requests\": %d, "
      "\"server_cpu_s\": %.3f, \"server_cpu_us_per_rpc\": %.3f, "
      "\"server_cpu_us_per_alloc_call\": %.3f, \"server_cpus\": %.3f, "
      "\"clients_cpu_s\": %.3f, \"clients_cpu_us_per_call\": %.3f, "
      "\"clients_cpus\": %.3f, \"host_cpus_busy\": %.3f, "
      "\"host_cpus\": %d, "
      "\"server_metrics\": {\"alloc_decode_rpc_mean_us\": %.3f, "
      "\"queue_wait_mean_us\": %.3f, \"execute_mean_us\": %.3f, "
      "\"complete_mean_us\": %.3f, \"batch_requests_mean\": %.3f}, "
      "\"ratios\": {\"decode_p50_vs_health_p50\": %.6g, "
      "\"decode_p99_vs_health_p99\": %.6g, "
      "\"decode_p50_vs_in_process_p50\": %.6g, "
      "\"decode_p99_vs_in_process_p99\": %.6g%s}, "
      "\"rpcs\": {%s}}",
      p.clients, p.workload.mode(),
      p.workload.async_completion ? "true" : "false",
      p.workload.gpu_ordered ? "true" : "false", p.workload.effective_lanes(),
      p.seconds, p.workers.total_calls(), p.workers.total_calls() / p.seconds,
      p.alloc_calls, p.alloc_calls / p.seconds,
      p.workers.alloc_slots() / p.seconds, p.launches, p.launches / p.seconds,
      Ratio(p.alloc_calls, p.launches),
      Ratio(p.workers.alloc_requests(), p.launches), p.workers.refused,
      p.server_cpu_seconds, cpu_us_per_rpc, cpu_us_per_alloc,
      CpusOver(p.server_cpu_seconds, p.seconds), p.clients_cpu_seconds,
      PerCallUs(p.clients_cpu_seconds, p.workers.total_calls()),
      CpusOver(p.clients_cpu_seconds, p.seconds), p.host_cpus_busy, p.host_cpus,
      MetricUs(p.server_decode_rpc_mean), MetricUs(p.server_queue_wait_mean),
      MetricUs(p.server_execute_mean), MetricUs(p.server_complete_mean),
      p.server_batch_requests_mean,
      Ratio(decode.Percentile(0.5), floors.health.histogram.Percentile(0.5)),
      Ratio(decode.Percentile(0.99), floors.health.histogram.Percentile(0.99)),
      Ratio(decode.Percentile(0.5),
            floors.in_process.histogram.Percentile(0.5)),
      Ratio(decode.Percentile(0.99),
            floors.in_process.histogram.Percentile(0.99)),
      echo_ratios, absl::StrJoin(rpcs, ", "));
}

void PrintLatencyRow(const char* name, const LatencyHistogram& h,
                     double seconds) {
  std::printf("%-28s %9lld %10.0f %8.1f %8.1f %8.1f %8.1f\n", name,
              static_cast<long long>(h.count()), h.count() / seconds,
              Us(h.Percentile(0.5)), Us(h.Percentile(0.9)),
              Us(h.Percentile(0.99)), Us(h.Percentile(0.999)));
}

// The echo floor's rows and ratios, under the floors' header.
void PrintEchoFloor(const EchoFloor& echo, const Workload& w) {
  std::printf(
      "gRPC echo (server in a child process, no daemon work; hand-off thread "
      "spins "
      "up to %.0f us):\n",
      absl::ToDoubleMicroseconds(echo.handoff_spin));
  PrintLatencyRow("  Health/Check", echo.empty.histogram, echo.empty.seconds);
  const std::string decode = absl::StrFormat("  AllocDecode(%d)", w.batch);
  PrintLatencyRow((decode + " inline").c_str(), echo.inline_decode.histogram,
                  echo.inline_decode.seconds);
  PrintLatencyRow((decode + " handed off").c_str(), echo.handed_off.histogram,
                  echo.handed_off.seconds);
  if (echo.clients > 0) {
    PrintLatencyRow(
        absl::StrFormat("  %d clients, handed off", echo.clients).c_str(),
        echo.clients_handed_off.histogram, echo.clients_handed_off.seconds);
  }
  const LatencyHistogram& empty = echo.empty.histogram;
  std::printf(
      "  echo AllocDecode(%d) vs echo Health/Check: inline p50 %.2fx, "
      "p99 %.2fx; handed off p50 %.2fx, p99 %.2fx\n",
      w.batch,
      Ratio(echo.inline_decode.histogram.Percentile(0.5),
            empty.Percentile(0.5)),
      Ratio(echo.inline_decode.histogram.Percentile(0.99),
            empty.Percentile(0.99)),
      Ratio(echo.handed_off.histogram.Percentile(0.5), empty.Percentile(0.5)),
      Ratio(echo.handed_off.histogram.Percentile(0.99),
            empty.Percentile(0.99)));
  if (echo.clients > 0) {
    std::printf("  %d echo clients: %.0f AllocDecode calls/s together\n",
                echo.clients, echo.clients_calls_per_s());
  }
  // The echo server child's CPU per call, and the host's busy CPUs while
  // the most clients called.
  if (echo.inline_cpu.server_cpu_seconds >= 0) {
    std::string line = absl::StrFormat(
        "  echo server CPU per call: Health/Check %.0f us, inline %.0f us, "
        "handed off %.0f us",
        echo.empty_cpu.server_us_per_call(echo.empty.histogram.count()),
        echo.inline_cpu.server_us_per_call(
            echo.inline_decode.histogram.count()),
        echo.handed_off_cpu.server_us_per_call(
            echo.handed_off.histogram.count()));
    if (echo.clients > 0) {
      absl::StrAppendFormat(&line, ", %d clients %.0f us", echo.clients,
                            echo.clients_cpu.server_us_per_call(
                                echo.clients_handed_off.histogram.count()));
    }
    const WindowCpu& busiest =
        echo.clients > 0 ? echo.clients_cpu : echo.handed_off_cpu;
    if (busiest.host_cpus_busy >= 0) {
      absl::StrAppendFormat(&line, "; host %.1f of %d CPUs busy at %d client%s",
                            busiest.host_cpus_busy, busiest.host_cpus,
                            std::max(echo.clients, 1),
                            echo.clients > 1 ? "s" : "");
    }
    std::printf("%s\n", line.c_str());
  }
}

std::string EchoJson(const EchoFloor& echo) {
  if (!echo.measured) return "{\"measured\": false}";
  const LatencyHistogram& empty = echo.empty.histogram;
  const LatencyHistogram& inline_decode = echo.inline_decode.histogram;
  const LatencyHistogram& handed_off = echo.handed_off.histogram;
  return absl::StrFormat(
      "{\"measured\": true, \"handoff_spin_us\": %.1f,\n"
      "    \"health_check\": {%s, %s},\n"
      "    \"alloc_decode_inline\": {%s, %s},\n"
      "    \"alloc_decode_handed_off\": {%s, %s},\n"
      "    \"ratios\": {\"inline_p50_vs_health_p50\": %.6g, "
      "\"inline_p99_vs_health_p99\": %.6g, "
      "\"handed_off_p50_vs_health_p50\": %.6g, "
      "\"handed_off_p99_vs_health_p99\": %.6g},\n"
      "    \"clients_handed_off\": {\"clients\": %d, \"seconds\": %.3f, "
      "\"calls_per_s\": %.1f, %s, %s}}",
      absl::ToDoubleMicroseconds(echo.handoff_spin), LatencyJson(empty),
      WindowCpuJson(echo.empty_cpu, empty), LatencyJson(inline_decode),
      WindowCpuJson(echo.inline_cpu, inline_decode), LatencyJson(handed_off),
      WindowCpuJson(echo.handed_off_cpu, handed_off),
      Ratio(inline_decode.Percentile(0.5), empty.Percentile(0.5)),
      Ratio(inline_decode.Percentile(0.99), empty.Percentile(0.99)),
      Ratio(handed_off.Percentile(0.5), empty.Percentile(0.5)),
      Ratio(handed_off.Percentile(0.99), empty.Percentile(0.99)), echo.clients,
      echo.clients_handed_off.seconds, echo.clients_calls_per_s(),
      LatencyJson(echo.clients_handed_off.histogram),
      WindowCpuJson(echo.clients_cpu, echo.clients_handed_off.histogram));
}

}  // namespace

void PrintReport(const Floors& floors, const std::vector<PhaseResult>& phases,
                 const Workload& w) {
  const char* header = "%-28s %9s %10s %8s %8s %8s %8s\n";
  std::printf("\n== floors (same socket, same machine)\n");
  std::printf(header, "", "calls", "calls/s", "p50 us", "p90 us", "p99 us",
              "p99.9 us");
  PrintLatencyRow("Health/Check (empty unary)", floors.health.histogram,
                  floors.health.seconds);
  std::string in_process =
      absl::StrFormat("in-process decode(%d) %s", w.batch, floors.executor);
  if (floors.in_process_threads > 1) {
    absl::StrAppend(&in_process, ", ", floors.in_process_threads,
                    " threads in turn");
  }
  PrintLatencyRow(in_process.c_str(), floors.in_process.histogram,
                  floors.in_process.seconds);
  PrintLatencyRow("  until Allocate returns",
                  floors.in_process_enqueue.histogram,
                  floors.in_process_enqueue.seconds);
  if (floors.echo.measured) PrintEchoFloor(floors.echo, w);
  if (floors.idle.seconds > 0) {
    std::printf(
        "idle daemon, %d session(s) open (%s): %.2f%% of a core over %.1f s\n",
        floors.idle.sessions,
        floors.idle.fast_channel ? "fast channel" : "gRPC only",
        100 * floors.idle.core_share(), floors.idle.seconds);
  }
  for (const PhaseResult& p : phases) {
    std::printf(
        "\n== %d client(s), batch %d, %s (%s completion, slots read on the "
        "%s, %d lane(s)), %.1f s\n",
        p.clients, w.batch, p.workload.mode(),
        p.workload.async_completion ? "async" : "sync",
        p.workload.gpu_ordered ? "GPU" : "host", p.workload.effective_lanes(),
        p.seconds);
    std::printf(header, "rpc", "calls", "calls/s", "p50 us", "p90 us", "p99 us",
                "p99.9 us");
    for (int r = 0; r < kNumRpcKinds; ++r) {
      PrintLatencyRow(kRpcNames[r], p.workers.rpcs[r].latency, p.seconds);
    }
    std::printf(
        "allocation calls/s %.0f, slots/s %.0f, launches/s %.0f, "
        "calls/launch %.2f, requests/launch %.1f, refused %lld\n",
        p.alloc_calls / p.seconds, p.workers.alloc_slots() / p.seconds,
        p.launches / p.seconds, Ratio(p.alloc_calls, p.launches),
        Ratio(p.workers.alloc_requests(), p.launches),
        static_cast<long long>(p.workers.refused));
    if (p.server_cpu_seconds >= 0) {
      std::printf(
          "server CPU %.2f s: %.1f us per RPC, %.1f us per "
          "allocation call\n",
          p.server_cpu_seconds,
          Ratio(p.server_cpu_seconds * 1e6, p.workers.total_calls()),
          Ratio(p.server_cpu_seconds * 1e6, p.alloc_calls));
    }
    if (const std::string cpu = PhaseCpuLine(p); !cpu.empty()) {
      std::printf("%s\n", cpu.c_str());
    }
    if (p.server_execute_mean >= 0) {
      std::printf(
          "daemon means: AllocDecode rpc_duration %.1f us, "
          "queue_wait %.1f us, execute %.1f us (completing %.1f us)\n",
          MetricUs(p.server_decode_rpc_mean),
          MetricUs(p.server_queue_wait_mean), MetricUs(p.server_execute_mean),
          MetricUs(p.server_complete_mean));
    }
    const LatencyHistogram& d = p.workers.rpcs[kDecode].latency;
    std::printf(
        "AllocDecode p50 = %.2fx Health/Check p50, %.2fx in-process; "
        "p99 = %.2fx, %.2fx\n",
        Ratio(d.Percentile(0.5), floors.health.histogram.Percentile(0.5)),
        Ratio(d.Percentile(0.5), floors.in_process.histogram.Percentile(0.5)),
        Ratio(d.Percentile(0.99), floors.health.histogram.Percentile(0.99)),
        Ratio(d.Percentile(0.99),
              floors.in_process.histogram.Percentile(0.99)));
    if (floors.echo.measured) {
      // What the daemon adds to gRPC carrying the same call.
      const LatencyHistogram& inline_decode =
          floors.echo.inline_decode.histogram;
      const LatencyHistogram& handed_off = floors.echo.handed_off.histogram;
      std::printf(
          "AllocDecode p50 = %.2fx echo AllocDecode inline, %.2fx handed "
          "off; p99 = %.2fx, %.2fx\n",
          Ratio(d.Percentile(0.5), inline_decode.Percentile(0.5)),
          Ratio(d.Percentile(0.5), handed_off.Percentile(0.5)),
          Ratio(d.Percentile(0.99), inline_decode.Percentile(0.99)),
          Ratio(d.Percentile(0.99), handed_off.Percentile(0.99)));
    }
  }
  if (phases.size() > 1) {
    std::printf("\n== sweep\n%8s %9s %14s %12s %13s %12s %12s\n", "clients",
                "mode", "alloc calls/s", "slots/s", "calls/launch",
                "decode p50", "decode p99");
    for (const PhaseResult& p : phases) {
      const LatencyHistogram& d = p.workers.rpcs[kDecode].latency;
      std::printf("%8d %9s %14.0f %12.0f %13.2f %12.1f %12.1f\n", p.clients,
                  p.workload.mode(), p.alloc_calls / p.seconds,
                  p.workers.alloc_slots() / p.seconds,
                  Ratio(p.alloc_calls, p.launches), Us(d.Percentile(0.5)),
                  Us(d.Percentile(0.99)));
    }
  }
}

absl::Status WriteJson(const std::string& path, const RunConfig& config,
                       const Floors& floors,
                       const std::vector<PhaseResult>& phases) {
  const Workload& w = config.workload;
  std::vector<std::string> phase_json;
  for (const PhaseResult& p : phases) {
    phase_json.push_back(PhaseJson(p, floors));
  }
  // What produced these numbers: the machine and the build.
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
#ifdef NDEBUG
  constexpr char kBuildMode[] = "opt";
#else
  constexpr char kBuildMode[] = "fastbuild";
#endif
  const std::string run = absl::StrFormat(
      "\"run\": {\"host\": \"%s\", \"cpus\": %d, \"version\": \"%s\", "
      "\"commit\": \"%s\", \"build_mode\": \"%s\", \"cuda_built\": %s},\n",
      absl::CEscape(host), std::thread::hardware_concurrency(),
      kPageallocVersion, BuildCommit(), kBuildMode,
      BuiltWithCuda() ? "true" : "false");
  const std::string text = absl::StrFormat(
      "{\n%s\"config\": {\"backend\": \"%s\", \"target\": \"%s\", "
      "\"batch\": %d, \"duration_s\": %g, \"decode_weight\": %d, "
      "\"prefill_weight\": %d, \"spec_weight\": %d, \"prefill_chunk\": %d, "
      "\"prefill_requests\": %d, \"draft_tokens\": %d, \"max_seq_len\": %d, "
      "\"async_completion\": %s, \"gpu_ordered\": %s, \"lanes\": %d, "
      "\"fast_channel\": %s, "
      "\"piggyback_ops\": %s, \"page_size\": %d, "
      "\"num_pages\": %d},\n"
      "\"floors\": {\"health_check\": {%s},\n"
      "  \"in_process_decode\": {\"executor\": \"%s\", %s},\n"
      "  \"in_process_enqueue\": {%s},\n"
      "  \"idle_daemon\": {\"sessions\": %d, \"fast_channel\": %s, "
      "\"seconds\": %.3f, \"cpu_s\": %.4f, \"core_share\": %.5f},\n"
      "  \"grpc_echo\": %s},\n"
      "\"phases\": [\n%s\n]\n}\n",
      run, config.backend, config.target, w.batch, config.duration_s,
      w.decode_weight, w.prefill_weight, w.spec_weight, w.prefill_chunk,
      w.prefill_requests, w.draft_tokens, w.max_seq_len,
      w.async_completion ? "true" : "false", w.gpu_ordered ? "true" : "false",
      w.lanes, config.fast_channel ? "true" : "false",
      w.piggyback_ops ? "true" : "false", config.page_size, config.num_pages,
      LatencyJson(floors.health.histogram), floors.executor,
      LatencyJson(floors.in_process.histogram),
      LatencyJson(floors.in_process_enqueue.histogram), floors.idle.sessions,
      floors.idle.fast_channel ? "true" : "false", floors.idle.seconds,
      floors.idle.cpu_seconds, floors.idle.core_share(), EchoJson(floors.echo),
      absl::StrJoin(phase_json, ",\n"));
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace pagealloc::bench
