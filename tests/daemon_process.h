// Starting the real pagealloc-server binary for process-level tests.

#ifndef PAGEALLOC_TESTS_DAEMON_PROCESS_H_
#define PAGEALLOC_TESTS_DAEMON_PROCESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/subprocess.h"

namespace pagealloc::testing {

struct Daemon {
  Subprocess process;
  std::string target;  // unix:///...
  std::string socket_path;
  std::string log_path;
};

// Starts pagealloc-server on a fresh Unix socket with `flags` added, and
// waits (up to 20 s) until it answers GetStats. The backend is CPU unless
// the environment sets PAGEALLOC_TEST_BACKEND (e.g. "cuda" on a GPU host).
// `wrapper` runs the server ({"/usr/bin/prlimit", "--nofile=64:64",
// "--"}); none by default.
absl::StatusOr<Daemon> StartDaemon(
    const std::string& name, const std::vector<std::string>& flags,
    const std::vector<std::string>& wrapper = {});

// The daemon's log so far (for failure messages).
std::string ReadLog(const std::string& path);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_DAEMON_PROCESS_H_
