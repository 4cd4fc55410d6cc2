#include "tests/daemon_process.h"

#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "tests/daemon_stats.h"
#include "tests/socket_dir.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {

std::string ReadLog(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<Daemon> StartDaemon(const std::string& name,
                                   const std::vector<std::string>& flags,
                                   const std::vector<std::string>& wrapper) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  static const std::string* socket_dir = new std::string(MakeSocketDir("test"));
  Daemon daemon;
  daemon.socket_path = absl::StrFormat("%s/%s.sock", *socket_dir, name);
  daemon.target = "unix://" + daemon.socket_path;
  daemon.log_path = absl::StrFormat("%s/%s.log", dir, name);
  // PAGEALLOC_TEST_BACKEND=cuda runs the same tests on a GPU daemon.
  const char* backend = std::getenv("PAGEALLOC_TEST_BACKEND");
  std::vector<std::string> argv = {
      RunfilePath("server/pagealloc-server"),
      absl::StrFormat("--backend=%s", backend != nullptr ? backend : "cpu"),
      "--listen=" + daemon.target, "--metrics_host=127.0.0.1",
      "--metrics_port=0"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.begin(), wrapper.begin(), wrapper.end());
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv, daemon.log_path);
  if (!process.ok()) return process.status();
  daemon.process = *std::move(process);
  bool answered = false;
  WaitFor(
      [&] {
        answered = DaemonStats(daemon.target).ok();
        return answered || !daemon.process.running();
      },
      absl::Seconds(20));
  if (answered) return daemon;
  if (!daemon.process.running()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "pagealloc-server exited at start:\n%s", ReadLog(daemon.log_path)));
  }
  return absl::DeadlineExceededError(
      absl::StrFormat("pagealloc-server did not answer within 20 s:\n%s",
                      ReadLog(daemon.log_path)));
}

}  // namespace pagealloc::testing
