// Subprocess: a child process for multi-process tests (posix_spawn), with
// bounded waits. This class is thread-compatible.

#ifndef PAGEALLOC_TESTS_SUBPROCESS_H_
#define PAGEALLOC_TESTS_SUBPROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pagealloc::testing {

// What a child gets beyond argv (a service manager's start of a service).
struct SpawnOptions {
  // Added to (or replacing) the parent's environment: "NAME=value".
  std::vector<std::string> environment;
  // Passed as the child's descriptors 3, 4, ... in this order (as a
  // service manager passes socket-activation and stored descriptors).
  std::vector<int> passed_fds;
};

class Subprocess {
 public:
  // Starts `argv[0]` with `argv`; stdout and stderr go to `log_path` when
  // given, else are inherited.
  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv,
                                          const std::string& log_path = "",
                                          const SpawnOptions& options = {});
  Subprocess() = default;  // no process
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  // Kills (SIGKILL) and reaps a child still running.
  ~Subprocess();

  pid_t pid() const { return pid_; }
  void Signal(int signal);
  // Waits up to `timeout`; returns the wait status (as from waitpid), or
  // DEADLINE_EXCEEDED when it still runs.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  bool running();

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// Path of a binary in this test's runfiles ("server/pagealloc-server").
std::string RunfilePath(const std::string& relative);

// Describes a wait status: "exited 0", "killed by signal 9".
std::string DescribeWaitStatus(int status);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_SUBPROCESS_H_
