// The gRPC echo server in a process of its own, as the daemon runs: the
// benchmark binary started with --echo_server hosts one EchoServer
// (bench/grpc_echo.h) and nothing else, so the echo floor's server shares
// no gRPC threads, poller or CPU cache with the clients that time it.
//
// The child (RunEchoServerProcess) starts the server, writes its target
// to a file the parent names, and serves until SIGTERM, SIGINT or SIGHUP,
// or until the thread that started it ends (PR_SET_PDEATHSIG): it never
// outlives the benchmark. The parent (EchoServerProcess) starts it, waits
// for the target, and stops it with SIGTERM.

#ifndef PAGEALLOC_BENCH_ECHO_PROCESS_H_
#define PAGEALLOC_BENCH_ECHO_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bench/grpc_echo.h"
#include "tests/subprocess.h"

namespace pagealloc::bench {

// "inline" or "handed_off", as the --echo_answer flag spells them.
std::string EchoAnswerName(EchoAnswer answer);
// The answer `name` spells; INVALID_ARGUMENT for any other name.
absl::StatusOr<EchoAnswer> ParseEchoAnswer(absl::string_view name);

// Writes `target` and a newline to `path`, through a file beside it renamed
// into place, so that a reader never sees part of it. INTERNAL when the
// file cannot be written or renamed.
absl::Status WriteEchoTarget(const std::string& path,
                             const std::string& target);
// Reads the target WriteEchoTarget wrote to `path`. NOT_FOUND while there
// is no file; DATA_LOSS when it is not one "unix://" line.
absl::StatusOr<std::string> ReadEchoTarget(const std::string& path);

// What the child runs (pagealloc-bench --echo_server).
struct EchoServerProcessOptions {
  EchoAnswer answer = EchoAnswer::kInline;
  EchoServer::Options server;
  // Where the target goes (WriteEchoTarget).
  std::string target_file;
  // The parent's pid: the child exits at once when its parent is another
  // one already (the parent ended before PR_SET_PDEATHSIG took hold);
  // 0: not checked.
  pid_t parent_pid = 0;
};

// Runs the child: blocks SIGTERM, SIGINT and SIGHUP (before any thread
// starts, so every thread inherits the mask), asks for SIGTERM when its
// parent's thread ends, starts an EchoServer answering as
// `options.answer`, writes its target, and waits for one of those signals.
// Then destroys the server (its socket and directory go) and removes the
// target file. Returns the process exit status: 0, or 1 after printing why
// on stderr.
int RunEchoServerProcess(const EchoServerProcessOptions& options);

// The parent's handle on one echo server child. Destroying it kills
// (SIGKILL) a child still running; Stop() is the clean way.
//
// This class is thread-compatible.
class EchoServerProcess {
 public:
  // Starts `binary` (the benchmark binary) with --echo_server and the
  // flags of `options` (its target file and log in `dir`, named after the
  // answer), and waits up to 30 s for its target. UNAVAILABLE, with the
  // child's log, when it exits first or does not write it in time; the
  // Subprocess's error when it cannot be started.
  static absl::StatusOr<EchoServerProcess> Start(
      const std::string& binary, const std::string& dir, EchoAnswer answer,
      const EchoServer::Options& server);

  EchoServerProcess(EchoServerProcess&&) = default;
  EchoServerProcess& operator=(EchoServerProcess&&) = default;

  // The child's gRPC target ("unix:///tmp/pagealloc-echo-XXXXXX/echo.sock").
  const std::string& target() const { return target_; }
  pid_t pid() const { return process_.pid(); }

  // Sends SIGTERM and waits up to 20 s for the child to exit. INTERNAL,
  // with its log, when it does not exit 0.
  absl::Status Stop();

 private:
  EchoServerProcess() = default;

  testing::Subprocess process_;
  std::string target_;
  std::string log_path_;
};

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_ECHO_PROCESS_H_
