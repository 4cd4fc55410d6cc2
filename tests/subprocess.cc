#include "tests/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tests/wait_for.h"

extern char** environ;

namespace pagealloc::testing {

absl::StatusOr<Subprocess> Subprocess::Start(
    const std::vector<std::string>& argv, const std::string& log_path,
    const SpawnOptions& options) {
  std::vector<char*> args;
  for (const std::string& arg : argv)
    args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  for (size_t i = 0; i < options.passed_fds.size(); ++i) {
    posix_spawn_file_actions_adddup2(&actions, options.passed_fds[i],
                                     3 + static_cast<int>(i));
  }
  // The parent's environment, each of options.environment replacing the
  // variable of its name.
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string variable(*entry);
    const std::string name = variable.substr(0, variable.find('='));
    bool replaced = false;
    for (const std::string& extra : options.environment) {
      if (extra.substr(0, extra.find('=')) == name) replaced = true;
    }
    if (!replaced) environment.push_back(variable);
  }
  environment.insert(environment.end(), options.environment.begin(),
                     options.environment.end());
  std::vector<char*> envp;
  for (std::string& variable : environment) envp.push_back(variable.data());
  envp.push_back(nullptr);
  pid_t pid;
  const int error =
      posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    return absl::InternalError(
        absl::StrFormat("posix_spawn %s: %s", argv[0], std::strerror(error)));
  }
  return Subprocess(pid);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_), status_(other.status_) {
  other.pid_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  std::swap(pid_, other.pid_);
  std::swap(status_, other.status_);
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !status_.has_value()) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
}

void Subprocess::Signal(int signal) {
  if (pid_ > 0 && !status_.has_value()) kill(pid_, signal);
}

bool Subprocess::running() {
  if (status_.has_value()) return false;
  int status;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    status_ = status;
    return false;
  }
  return true;
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (!WaitFor([this] { return !running(); }, timeout, absl::Milliseconds(5))) {
    return absl::DeadlineExceededError(
        absl::StrFormat("process %d still runs", pid_));
  }
  return *status_;
}

std::string RunfilePath(const std::string& relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return relative;
  return absl::StrFormat("%s/%s/%s", srcdir,
                         workspace != nullptr ? workspace : "pagealloc",
                         relative);
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status))
    return absl::StrFormat("exited %d", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrFormat("killed by signal %d", WTERMSIG(status));
  }
  return absl::StrFormat("wait status %d", status);
}

}  // namespace pagealloc::testing
