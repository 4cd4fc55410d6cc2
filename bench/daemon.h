// The daemon a benchmark run drives: started here (pagealloc-server on a
// private Unix socket, /metrics on a free loopback port) or given with
// --target.

#ifndef PAGEALLOC_BENCH_DAEMON_H_
#define PAGEALLOC_BENCH_DAEMON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/subprocess.h"

namespace pagealloc::bench {

struct DaemonOptions {
  // A running daemon to drive; empty starts one. With it, its pid (for its
  // CPU time; 0: unknown) and its metrics host:port (empty: unknown).
  std::string target;
  int server_pid = 0;
  std::string metrics_address;
  // The daemon to start: the binary (empty: from this binary's runfiles or
  // the bazel-bin layout), its backend and pool, and extra flags.
  std::string server_binary;
  std::string backend = "cpu";
  int64_t num_pages = 1 << 20;
  int64_t page_size = 16;
  std::vector<std::string> server_flags;
};

struct DaemonHandle {
  testing::Subprocess process;  // empty when attached to --target
  std::string target;
  int pid = 0;                  // 0: unknown
  std::string metrics_address;  // host:port, or empty
  std::string log_path;
};

// The path of this binary (/proc/self/exe).
std::string SelfPath();

// Attaches to options.target (checking that it answers GetStats), or
// starts pagealloc-server with its socket and log in `dir` and waits (up to
// 30 s) until it answers. NOT_FOUND when there is no server binary,
// UNAVAILABLE (with the daemon's log) when it does not come up.
absl::StatusOr<DaemonHandle> StartOrAttach(const DaemonOptions& options,
                                           const std::string& dir);

// Stops a daemon StartOrAttach started: SIGTERM, then up to 20 s for a
// clean exit. INTERNAL (with its log) when it does not exit 0. Does
// nothing to an attached one.
absl::Status StopDaemon(DaemonHandle& daemon);

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_DAEMON_H_
