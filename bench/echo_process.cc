#include "bench/echo_process.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tests/daemon_process.h"
#include "tests/wait_for.h"

namespace pagealloc::bench {
namespace {

constexpr absl::string_view kUnixScheme = "unix://";

// The signals that stop the child.
sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}

absl::Status ErrnoError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// The child's work, from blocking the stop signals to removing the target
// file after one of them came.
absl::Status ServeUntilStopped(const EchoServerProcessOptions& options) {
  const sigset_t stop = StopSignals();
  // Before any thread starts: gRPC's threads and the hand-off thread
  // inherit the mask, so the signals wait for sigwait below.
  if (const int error = pthread_sigmask(SIG_BLOCK, &stop, nullptr);
      error != 0) {
    return absl::InternalError(
        absl::StrCat("pthread_sigmask: ", std::strerror(error)));
  }
  if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) {
    return ErrnoError("prctl(PR_SET_PDEATHSIG)");
  }
  if (options.parent_pid != 0 && getppid() != options.parent_pid) {
    return absl::AbortedError(
        absl::StrCat("the benchmark that started this echo server (pid ",
                     options.parent_pid, ") has ended"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<EchoServer> server,
                   EchoServer::Start(options.server));
  server->set_answer(options.answer);
  RETURN_IF_ERROR(WriteEchoTarget(options.target_file, server->target()));
  int signal = 0;
  if (const int error = sigwait(&stop, &signal); error != 0) {
    return absl::InternalError(absl::StrCat("sigwait: ", std::strerror(error)));
  }
  // The server's destructor waits for the calls in flight and removes its
  // socket and directory.
  server.reset();
  unlink(options.target_file.c_str());
  return absl::OkStatus();
}

}  // namespace

std::string EchoAnswerName(EchoAnswer answer) {
  return answer == EchoAnswer::kHandedOff ? "handed_off" : "inline";
}

absl::StatusOr<EchoAnswer> ParseEchoAnswer(absl::string_view name) {
  if (name == "inline") return EchoAnswer::kInline;
  if (name == "handed_off") return EchoAnswer::kHandedOff;
  return absl::InvalidArgumentError(absl::StrCat(
      "--echo_answer: bad answer '", name, "' (inline or handed_off)"));
}

absl::Status WriteEchoTarget(const std::string& path,
                             const std::string& target) {
  const std::string partial = path + ".partial";
  std::FILE* file = std::fopen(partial.c_str(), "w");
  if (file == nullptr) return ErrnoError(absl::StrCat("open ", partial));
  const bool written = std::fprintf(file, "%s\n", target.c_str()) > 0;
  if (std::fclose(file) != 0 || !written) {
    unlink(partial.c_str());
    return ErrnoError(absl::StrCat("write ", partial));
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    unlink(partial.c_str());
    return ErrnoError(absl::StrCat("rename ", partial, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadEchoTarget(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no ", path));
  std::stringstream text;
  text << in.rdbuf();
  std::string target = text.str();
  if (!absl::EndsWith(target, "\n")) {
    return absl::DataLossError(
        absl::StrCat(path, ": '", target, "' is not one line"));
  }
  target.pop_back();
  if (!absl::StartsWith(target, kUnixScheme) ||
      target.size() == kUnixScheme.size() ||
      target.find('\n') != std::string::npos) {
    return absl::DataLossError(
        absl::StrCat(path, ": '", target, "' is not one unix:// target"));
  }
  return target;
}

int RunEchoServerProcess(const EchoServerProcessOptions& options) {
  const absl::Status status = ServeUntilStopped(options);
  if (!status.ok()) {
    std::fprintf(stderr, "pagealloc-bench --echo_server: %s\n",
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}

absl::StatusOr<EchoServerProcess> EchoServerProcess::Start(
    const std::string& binary, const std::string& dir, EchoAnswer answer,
    const EchoServer::Options& server) {
  const std::string name = EchoAnswerName(answer);
  const std::string target_file = absl::StrCat(dir, "/echo-", name, ".target");
  EchoServerProcess child;
  child.log_path_ = absl::StrCat(dir, "/echo-", name, ".log");
  // A target left by an earlier child in `dir` is not this one's.
  unlink(target_file.c_str());
  const std::vector<std::string> argv = {
      binary,
      "--echo_server",
      "--echo_answer=" + name,
      absl::StrCat("--echo_handoff_spin_us=",
                   absl::ToInt64Microseconds(server.handoff_spin)),
      absl::StrCat("--page_size=", server.page_size),
      "--echo_target_file=" + target_file,
      absl::StrCat("--echo_parent_pid=", getpid()),
  };
  ASSIGN_OR_RETURN(child.process_,
                   testing::Subprocess::Start(argv, child.log_path_));
  absl::StatusOr<std::string> target = absl::NotFoundError("");
  testing::WaitFor(
      [&] {
        target = ReadEchoTarget(target_file);
        return !absl::IsNotFound(target.status()) || !child.process_.running();
      },
      absl::Seconds(30), absl::Milliseconds(5));
  if (!target.ok()) {
    std::string why;
    if (!absl::IsNotFound(target.status())) {
      why = std::string(target.status().message());
    } else if (absl::StatusOr<int> exit =
                   child.process_.Wait(absl::ZeroDuration());
               exit.ok()) {
      why = absl::StrCat("it ", testing::DescribeWaitStatus(*exit));
    } else {
      why = absl::StrCat("it wrote no target to ", target_file, " within 30 s");
    }
    return absl::UnavailableError(
        absl::StrCat("the gRPC echo server (", name, ") did not start: ", why,
                     "\n", testing::ReadLog(child.log_path_)));
  }
  child.target_ = *std::move(target);
  return child;
}

absl::Status EchoServerProcess::Stop() {
  process_.Signal(SIGTERM);
  absl::StatusOr<int> exit = process_.Wait(absl::Seconds(20));
  if (!exit.ok() || *exit != 0) {
    return absl::InternalError(absl::StrCat(
        "the gRPC echo server did not exit cleanly (",
        exit.ok() ? testing::DescribeWaitStatus(*exit) : "still running",
        "):\n", testing::ReadLog(log_path_)));
  }
  return absl::OkStatus();
}

}  // namespace pagealloc::bench
