// The floors every phase is compared with, measured on the same machine in
// the same run: an empty unary gRPC call to the daemon
// (grpc.health.v1.Health/Check), the workers' decode steps made directly on
// a PagePool in this process (no RPC), and the gRPC echo floor: the same
// calls carried by gRPC to a server in a process of its own that does no
// daemon work (bench/grpc_echo.h, bench/echo_process.h).

#ifndef PAGEALLOC_BENCH_FLOORS_H_
#define PAGEALLOC_BENCH_FLOORS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/latency_histogram.h"
#include "bench/workload.h"

namespace pagealloc::bench {

struct Latency {
  LatencyHistogram histogram;
  double seconds = 0;  // how long the measurement ran
};

// The daemon's CPU at rest: `sessions` sessions open (each made one call,
// then stays quiet with its KeepAlive stream running) for `seconds`.
struct IdleCost {
  int sessions = 0;
  bool fast_channel = true;  // the sessions have fast channels
  double seconds = 0;        // 0: not measured
  double cpu_seconds = -1;   // the daemon's over `seconds`; -1: unknown

  // The daemon's CPU as a share of one core; -1 when unknown.
  double core_share() const {
    return seconds > 0 && cpu_seconds >= 0 ? cpu_seconds / seconds : -1;
  }
};

// The CPU a server process and the host spent over one measurement's timed
// window.
struct WindowCpu {
  // The server process's user + system time; -1: unknown.
  double server_cpu_seconds = -1;
  // The host's busy CPUs on average (HostCpusBusy, bench/cpu_time.h), of
  // host_cpus; -1: unknown.
  double host_cpus_busy = -1;
  int host_cpus = 0;

  // The server's CPU per call in microseconds, over `calls` calls; -1 when
  // unknown.
  double server_us_per_call(int64_t calls) const {
    return server_cpu_seconds >= 0 && calls > 0
               ? server_cpu_seconds * 1e6 / calls
               : -1;
  }
};

// gRPC carrying the benchmark's calls with no daemon work (bench/grpc_echo.h):
// an EchoServer built as the daemon's, in a child process as the daemon
// runs, one client at a time, then several at once.
struct EchoFloor {
  bool measured = false;
  // The hand-off thread's spin (the daemon's batcher spin).
  absl::Duration handoff_spin;
  Latency empty;  // Health/Check on the echo server
  // AllocDecode of the workload's batch, answered on the gRPC thread that
  // read it (kInline), and from the hand-off thread (kHandedOff).
  Latency inline_decode;
  Latency handed_off;
  // `clients` clients at once, each on its own connection, answered from
  // the hand-off thread: every call in one histogram; 0: not measured.
  int clients = 0;
  Latency clients_handed_off;
  // The echo server child's and the host's CPU over each measurement's
  // timed window, per call over the calls in its histogram.
  WindowCpu empty_cpu;
  WindowCpu inline_cpu;
  WindowCpu handed_off_cpu;
  WindowCpu clients_cpu;

  // The clients' calls per second together; 0 when not measured.
  double clients_calls_per_s() const {
    return clients_handed_off.seconds > 0
               ? clients_handed_off.histogram.count() /
                     clients_handed_off.seconds
               : 0;
  }
};

struct Floors {
  Latency health;
  Latency in_process;
  // The same decode steps timed until Allocate returns, before the
  // executor's Synchronize: what a scheduler linking the allocator would
  // wait with its slots left on the GPU (on the CPU executor, the same as
  // in_process).
  Latency in_process_enqueue;
  std::string executor;  // the in-process floor's: "cpu" or "cuda"
  // The threads that took turns at the in-process floor's steps
  // (MeasureInProcessDecode's `threads`).
  int in_process_threads = 1;
  IdleCost idle;   // measured with --idle_s only
  EchoFloor echo;  // measured with --echo_floor only
};

// Times grpc.health.v1.Health/Check on `target`, one call at a time on one
// channel (the client library's channel arguments), for `seconds`: what
// any unary call costs on this socket before the daemon does any work. The
// first 100 calls (connection set-up) are not recorded. UNAVAILABLE when a
// call fails.
absl::StatusOr<Latency> MeasureHealthCheck(const std::string& target,
                                           double seconds);

// Times the decode steps a worker sends as AllocDecode (`w.batch`
// sequences, the same length model and seed) made directly on a PagePool
// of `num_pages` pages of `page_size` tokens with the `backend` executor
// ("cpu", or "cuda" where built with CUDA): planning, the launch and its
// completion (Allocate + Synchronize, what the daemon's batcher does per
// launch in sync mode), no RPC. Admissions and frees happen outside the
// timed region; the first 20 steps are not recorded. With `threads` > 1
// the timed steps run on that many threads in turn, each asleep between
// its turns, as gRPC's callback threads take turns at the calls they read:
// what a launch costs on a thread that has not launched lately. Sets
// `executor_name`, and `enqueue` (when given) to the same steps timed until
// Allocate returns. FAILED_PRECONDITION for "cuda" in a build without CUDA.
absl::StatusOr<Latency> MeasureInProcessDecode(
    const std::string& backend, const Workload& w, int64_t num_pages,
    int64_t page_size, double seconds, uint64_t seed, int threads,
    std::string* executor_name, Latency* enqueue = nullptr);

// Starts `binary` (the benchmark binary) as an echo server child
// (EchoServerProcess, its target file and log in `dir`; answers shaped for
// `page_size`, the hand-off thread spinning up to `handoff_spin`) for each
// answer, and times on it, each for `seconds` with one client: on the
// inline child Health/Check and AllocDecode(w.batch); on the handed-off
// child the same AllocDecode, then, when `clients` > 1, from that many
// clients at once. Reads the child's CPU time and the host's busy CPUs at
// each measurement's timed window's start and end. Stops each child after
// its measurements. The children's errors (with their logs), or
// MeasureEchoCalls's.
absl::StatusOr<EchoFloor> MeasureEchoFloor(const std::string& binary,
                                           const std::string& dir,
                                           const Workload& w, int64_t page_size,
                                           absl::Duration handoff_spin,
                                           int clients, double seconds,
                                           uint64_t seed);

// Opens `sessions` sessions on `target` (with fast channels when
// `fast_channel`), makes one Alloc of `page_size` tokens on each, then reads
// the daemon's CPU time (`pid`) over `seconds` while they sit idle, and
// closes them. cpu_seconds stays -1 when the pid is unknown. The first
// second after the calls is not measured (spins and timers settle). Errors
// are the client's.
absl::StatusOr<IdleCost> MeasureIdleDaemon(const std::string& target, int pid,
                                           int sessions, bool fast_channel,
                                           int64_t page_size, double seconds);

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_FLOORS_H_
