// pagealloc-bench: the end-to-end load generator and benchmark.
//
// It starts a daemon (or drives --target), measures its floors on the same
// machine (an empty unary gRPC call, grpc.health.v1.Health/Check, the
// allocator called in-process with no RPC, and the gRPC echo floor: the
// calls carried by gRPC with no daemon work, to an echo server that is this
// binary with --echo_server), then runs one phase per
// client count: K worker processes (this binary with --worker) behave like
// schedulers, each with --batch live sequences: decode steps, prefill chunks,
// speculative steps (checkpoint, draft, rollback), frees of finished
// sequences and admission of new ones. A client either copies its slots to
// the host after each call or, as an engine does, keeps them on the GPU:
// its own stream ordered after the call (Client::OrderAfter) and a kernel
// there reading them (--gpu_ordered, --sweep_completion; bench/README.md).
// Every call's latency goes into a log-linear histogram per RPC; workers
// hand theirs to the coordinator, which merges them and adds what only the
// daemon knows: launches (GetStats), its CPU time (/proc/<pid>/stat) and its
// own stage histograms (/metrics).
//
// The benchmark reports; it fails only when something breaks (a worker's
// error, a daemon that does not start), never on a number.
//
// This file holds the flags and turns them into the options of the jobs in
// bench/: daemon.h (start or attach), floors.h (and echo_process.h, the
// echo server's process), worker.h and phase.h (the
// workers and the coordinator's side of them), snapshot.h (what the daemon
// reports), report.h (tables and JSON), coordinator.h (the run).

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/coordinator.h"
#include "bench/echo_process.h"
#include "bench/worker.h"
#include "bench/workload.h"
#include "common/command_line.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, target, "",
          "Daemon to drive (e.g. unix:///run/pagealloc/gpu0.sock); empty "
          "starts one on a private Unix socket.");
ABSL_FLAG(std::string, server_binary, "",
          "pagealloc-server to start (default: from this binary's runfiles).");
ABSL_FLAG(std::string, backend, "cpu",
          "cpu or cuda: the started daemon's --backend and the executor of "
          "the in-process floor.");
ABSL_FLAG(int64_t, num_pages, 1 << 20, "Pool size of the started daemon.");
ABSL_FLAG(int64_t, page_size, 16, "Page size of the started daemon.");
ABSL_FLAG(std::vector<std::string>, server_flags, {},
          "Extra flags for the started daemon, comma-separated.");
ABSL_FLAG(int, server_pid, 0,
          "With --target: the daemon's pid, to read its CPU time.");
ABSL_FLAG(std::string, metrics_address, "",
          "With --target: the daemon's metrics host:port.");
ABSL_FLAG(int, clients, 1, "Client processes.");
ABSL_FLAG(std::vector<std::string>, sweep_clients, {},
          "One phase per client count, e.g. 1,2,4,8,16 (overrides --clients).");
ABSL_FLAG(int, batch, 256,
          "Live sequences per client: the requests of one decode step.");
ABSL_FLAG(double, duration_s, 5, "Length of each phase, seconds.");
ABSL_FLAG(int, decode_weight, 80, "Share of steps that decode every sequence.");
ABSL_FLAG(int, prefill_weight, 10,
          "Share of steps that extend --prefill_requests sequences by a "
          "chunk.");
ABSL_FLAG(int, spec_weight, 10,
          "Share of steps that checkpoint, draft --draft_tokens per sequence "
          "and roll back.");
ABSL_FLAG(int, prefill_chunk, 256,
          "Tokens of a prefill chunk (and most tokens a new sequence starts "
          "with).");
ABSL_FLAG(int, prefill_requests, 4, "Sequences extended per prefill step.");
ABSL_FLAG(int, draft_tokens, 4, "Draft tokens per sequence per spec step.");
ABSL_FLAG(int, max_seq_len, 2048,
          "A sequence finishes (its pages are freed) at a random length up "
          "to this; a new one takes its place.");
ABSL_FLAG(bool, async_completion, false,
          "Allocation calls ask for async completion; the client orders its "
          "slot reads after the daemon's completion event.");
ABSL_FLAG(bool, gpu_ordered, false,
          "Clients keep their slots on the GPU, as an engine does: after "
          "each allocation call they order their own CUDA stream after it "
          "(Client::OrderAfter) and a kernel there reads the slots; the "
          "call is timed until OrderAfter returns. The slots reach the host "
          "(for the benchmark's bookkeeping) before the lane's next step. "
          "On the CPU backend the slots are read on the host.");
ABSL_FLAG(int, lanes, 0,
          "Sets of --batch sequences per client, stepped in turn (as "
          "SGLang's overlap scheduler keeps two batches); 0: 2 with "
          "--gpu_ordered (a lane's slots come back while the other calls), "
          "else 1.");
ABSL_FLAG(std::vector<std::string>, sweep_completion, {},
          "For each client count, one phase per completion mode, e.g. "
          "sync,gpu: sync (slots copied to the host after a sync call), "
          "async (copied after the daemon's completion), gpu (async "
          "completion, slots read on the GPU: --gpu_ordered), sync_gpu. "
          "Overrides --async_completion and --gpu_ordered.");
ABSL_FLAG(bool, fast_channel, true,
          "Clients send allocation calls through the daemon's fast channel "
          "(shared memory) when it offers one; false: through gRPC.");
ABSL_FLAG(bool, piggyback_ops, true,
          "Clients send the pages of finished sequences and the checkpoint "
          "before a spec step with their next allocation call "
          "(CallOptions.free_pages_first, checkpoint_first) instead of "
          "separate Free and Checkpoint calls.");
ABSL_FLAG(int, client_spin_us, 500,
          "How long a client spins for a fast-channel answer before it "
          "sleeps on a futex (ClientOptions.fast_channel_spin).");
ABSL_FLAG(double, floor_s, 2, "Length of each floor measurement, seconds.");
ABSL_FLAG(int, floor_threads, 1,
          "Threads that take turns at the in-process floor's steps, each "
          "asleep between its turns (as gRPC's callback threads take turns); "
          "1: one thread.");
ABSL_FLAG(double, idle_s, 0,
          "Seconds to measure the daemon's CPU while --idle_sessions "
          "sessions sit open and quiet (after one call each); 0: skip.");
ABSL_FLAG(int, idle_sessions, 8, "Sessions open during --idle_s.");
ABSL_FLAG(bool, echo_floor, true,
          "Measure the gRPC echo floor: Health/Check and AllocDecode(--batch) "
          "on a gRPC server in a child process that answers with no daemon "
          "work, inline and from a hand-off thread, each for --floor_s.");
ABSL_FLAG(int, echo_clients, 0,
          "Clients at once for the echo floor's several-client measurement "
          "(each on its own connection); 0: the most of --clients and "
          "--sweep_clients, skipped when that is 1.");
ABSL_FLAG(std::string, json, "", "Write the results here as JSON.");
ABSL_FLAG(bool, progress, true, "Show one refreshing progress line on stderr.");
ABSL_FLAG(uint64_t, seed, 1, "Random seed (each client adds its index).");
// Internal: the coordinator starts workers with these.
ABSL_FLAG(bool, worker, false, "Internal: run as one client process.");
ABSL_FLAG(int, worker_index, 0, "Internal: this worker's slot.");
ABSL_FLAG(std::string, control_file, "", "Internal: the shared control block.");
ABSL_FLAG(std::string, worker_out, "", "Internal: where to write results.");
// Internal: the echo floor starts its gRPC echo servers with these (and
// --page_size).
ABSL_FLAG(bool, echo_server, false,
          "Internal: run as the gRPC echo floor's server process.");
ABSL_FLAG(std::string, echo_answer, "inline",
          "Internal: how the echo server answers AllocDecode: inline or "
          "handed_off.");
ABSL_FLAG(int64_t, echo_handoff_spin_us, 200,
          "Internal: the echo server's hand-off thread's spin.");
ABSL_FLAG(std::string, echo_target_file, "",
          "Internal: where the echo server writes its target.");
ABSL_FLAG(int, echo_parent_pid, 0,
          "Internal: the benchmark that starts the echo server.");

namespace pagealloc::bench {
namespace {

Workload WorkloadFromFlags() {
  Workload w;
  w.batch = absl::GetFlag(FLAGS_batch);
  w.decode_weight = absl::GetFlag(FLAGS_decode_weight);
  w.prefill_weight = absl::GetFlag(FLAGS_prefill_weight);
  w.spec_weight = absl::GetFlag(FLAGS_spec_weight);
  w.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  w.prefill_requests = absl::GetFlag(FLAGS_prefill_requests);
  w.draft_tokens = absl::GetFlag(FLAGS_draft_tokens);
  w.max_seq_len = absl::GetFlag(FLAGS_max_seq_len);
  w.async_completion = absl::GetFlag(FLAGS_async_completion);
  w.piggyback_ops = absl::GetFlag(FLAGS_piggyback_ops);
  w.gpu_ordered = absl::GetFlag(FLAGS_gpu_ordered);
  w.lanes = absl::GetFlag(FLAGS_lanes);
  return w;
}

WorkerOptions WorkerOptionsFromFlags() {
  WorkerOptions o;
  o.target = absl::GetFlag(FLAGS_target);
  o.index = absl::GetFlag(FLAGS_worker_index);
  o.control_file = absl::GetFlag(FLAGS_control_file);
  o.out_path = absl::GetFlag(FLAGS_worker_out);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.fast_channel = absl::GetFlag(FLAGS_fast_channel);
  o.client_spin_us = absl::GetFlag(FLAGS_client_spin_us);
  o.workload = WorkloadFromFlags();
  return o;
}

// The flags a worker needs to run the same workload as the coordinator was
// given, as "--name=value".
std::vector<std::string> WorkerFlags() {
  std::vector<std::string> args;
  for (const char* name :
       {"batch", "decode_weight", "prefill_weight", "spec_weight",
        "prefill_chunk", "prefill_requests", "draft_tokens", "max_seq_len",
        "async_completion", "fast_channel", "client_spin_us", "piggyback_ops",
        "gpu_ordered", "lanes"}) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    args.push_back(absl::StrCat("--", name, "=",
                                flag == nullptr ? "" : flag->CurrentValue()));
  }
  return args;
}

absl::StatusOr<EchoServerProcessOptions> EchoServerOptionsFromFlags() {
  EchoServerProcessOptions o;
  ASSIGN_OR_RETURN(o.answer, ParseEchoAnswer(absl::GetFlag(FLAGS_echo_answer)));
  o.server.handoff_spin =
      absl::Microseconds(absl::GetFlag(FLAGS_echo_handoff_spin_us));
  o.server.page_size = absl::GetFlag(FLAGS_page_size);
  o.target_file = absl::GetFlag(FLAGS_echo_target_file);
  if (o.target_file.empty()) {
    return absl::InvalidArgumentError("--echo_server needs --echo_target_file");
  }
  o.parent_pid = absl::GetFlag(FLAGS_echo_parent_pid);
  return o;
}

BenchOptions BenchOptionsFromFlags() {
  BenchOptions o;
  o.daemon.target = absl::GetFlag(FLAGS_target);
  o.daemon.server_pid = absl::GetFlag(FLAGS_server_pid);
  o.daemon.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  o.daemon.server_binary = absl::GetFlag(FLAGS_server_binary);
  o.daemon.backend = absl::GetFlag(FLAGS_backend);
  o.daemon.num_pages = absl::GetFlag(FLAGS_num_pages);
  o.daemon.page_size = absl::GetFlag(FLAGS_page_size);
  o.daemon.server_flags = absl::GetFlag(FLAGS_server_flags);
  o.sweep_clients = absl::GetFlag(FLAGS_sweep_clients);
  o.sweep_completion = absl::GetFlag(FLAGS_sweep_completion);
  o.clients = absl::GetFlag(FLAGS_clients);
  o.duration_s = absl::GetFlag(FLAGS_duration_s);
  o.floor_s = absl::GetFlag(FLAGS_floor_s);
  o.floor_threads = absl::GetFlag(FLAGS_floor_threads);
  o.idle_s = absl::GetFlag(FLAGS_idle_s);
  o.idle_sessions = absl::GetFlag(FLAGS_idle_sessions);
  o.echo_floor = absl::GetFlag(FLAGS_echo_floor);
  o.echo_clients = absl::GetFlag(FLAGS_echo_clients);
  o.workload = WorkloadFromFlags();
  o.fast_channel = absl::GetFlag(FLAGS_fast_channel);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.progress = absl::GetFlag(FLAGS_progress);
  o.json = absl::GetFlag(FLAGS_json);
  o.worker_flags = WorkerFlags();
  return o;
}

}  // namespace
}  // namespace pagealloc::bench

int main(int argc, char** argv) {
  // --help: the flags of this file (the worker's and the echo server's
  // internal ones left out);
  // usage errors exit 2 (common/command_line.h).
  pagealloc::ParseCommandLine(
      argc, argv,
      {"pagealloc-bench",
       "pagealloc-bench: the end-to-end load generator and benchmark "
       "(bench/README.md).\n"
       "  pagealloc-bench --backend=cpu --sweep_clients=1,2,4,8 "
       "--sweep_completion=sync,gpu --json=/tmp/sweep.json",
       "bench/pagealloc_bench_main.cc",
       {},
       {"worker", "worker_index", "control_file", "worker_out", "echo_server",
        "echo_answer", "echo_handoff_spin_us", "echo_target_file",
        "echo_parent_pid"}});
  // As the daemon does (server/main.cc): Debian's Abseil leaves Mutex
  // deadlock detection on, a global lock in every Lock; a scheduler linking
  // the client library should turn it off the same way.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::GetFlag(FLAGS_worker)) {
    return pagealloc::bench::RunWorker(
        pagealloc::bench::WorkerOptionsFromFlags());
  }
  if (absl::GetFlag(FLAGS_echo_server)) {
    absl::StatusOr<pagealloc::bench::EchoServerProcessOptions> options =
        pagealloc::bench::EchoServerOptionsFromFlags();
    if (!options.ok()) {
      std::fprintf(stderr, "pagealloc-bench: %s\n",
                   options.status().ToString().c_str());
      return pagealloc::kExitUsage;
    }
    return pagealloc::bench::RunEchoServerProcess(*options);
  }
  absl::Status status = pagealloc::bench::RunCoordinator(
      pagealloc::bench::BenchOptionsFromFlags());
  if (!status.ok()) {
    std::fprintf(stderr, "pagealloc-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
