#include "bench/daemon.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "tests/daemon_process.h"
#include "tests/daemon_stats.h"
#include "tests/wait_for.h"

namespace pagealloc::bench {
namespace {

// pagealloc-server beside us: `flag` (--server_binary), else our runfiles,
// else the bazel-bin layout (bench/ and server/ side by side).
std::string FindServer(const std::string& flag) {
  if (!flag.empty()) return flag;
  const std::string self = SelfPath();
  std::vector<std::string> candidates;
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (const char* dir = std::getenv(var)) {
      candidates.push_back(
          absl::StrCat(dir, "/pagealloc/server/pagealloc-server"));
    }
  }
  candidates.push_back(self + ".runfiles/pagealloc/server/pagealloc-server");
  candidates.push_back(self.substr(0, self.rfind('/')) +
                       "/../server/pagealloc-server");
  for (const std::string& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return "";
}

// A TCP port nothing listens on right now, for the daemon's /metrics.
absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 ||
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return absl::InternalError("cannot find a free port for /metrics");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : "";
}

absl::StatusOr<DaemonHandle> StartOrAttach(const DaemonOptions& options,
                                           const std::string& dir) {
  DaemonHandle daemon;
  if (!options.target.empty()) {
    daemon.target = options.target;
    daemon.pid = options.server_pid;
    daemon.metrics_address = options.metrics_address;
    RETURN_IF_ERROR(testing::DaemonStats(daemon.target).status());
    return daemon;
  }
  const std::string server = FindServer(options.server_binary);
  if (server.empty()) {
    return absl::NotFoundError(
        "pagealloc-server not found; pass --server_binary or --target");
  }
  ASSIGN_OR_RETURN(int port, FreePort());
  daemon.target = absl::StrCat("unix://", dir, "/daemon.sock");
  daemon.metrics_address = absl::StrCat("127.0.0.1:", port);
  daemon.log_path = dir + "/daemon.log";
  std::vector<std::string> argv = {
      server,
      "--backend=" + options.backend,
      "--listen=" + daemon.target,
      "--metrics_host=127.0.0.1",
      absl::StrCat("--metrics_port=", port),
      absl::StrCat("--num_pages=", options.num_pages),
      absl::StrCat("--page_size=", options.page_size),
      "--log_level=warn"};
  for (const std::string& f : options.server_flags) argv.push_back(f);
  ASSIGN_OR_RETURN(daemon.process,
                   testing::Subprocess::Start(argv, daemon.log_path));
  daemon.pid = daemon.process.pid();
  bool answered = false;
  testing::WaitFor(
      [&] {
        answered = testing::DaemonStats(daemon.target).ok();
        return answered || !daemon.process.running();
      },
      absl::Seconds(30));
  if (!answered) {
    return absl::UnavailableError(
        absl::StrCat("pagealloc-server did not start:\n",
                     testing::ReadLog(daemon.log_path)));
  }
  return daemon;
}

absl::Status StopDaemon(DaemonHandle& daemon) {
  if (daemon.process.pid() <= 0) return absl::OkStatus();
  daemon.process.Signal(SIGTERM);
  absl::StatusOr<int> exit = daemon.process.Wait(absl::Seconds(20));
  if (!exit.ok() || *exit != 0) {
    return absl::InternalError(absl::StrCat(
        "pagealloc-server did not exit cleanly (",
        exit.ok() ? testing::DescribeWaitStatus(*exit) : "still running",
        "):\n", testing::ReadLog(daemon.log_path)));
  }
  return absl::OkStatus();
}

}  // namespace pagealloc::bench
