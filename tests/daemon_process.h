// Starting the real pagealloc-server binary for process-level tests.

#ifndef PAGEALLOC_TESTS_DAEMON_PROCESS_H_
#define PAGEALLOC_TESTS_DAEMON_PROCESS_H_

#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/pagealloc.pb.h"
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
absl::StatusOr<Daemon> StartDaemon(const std::string& name,
                                   const std::vector<std::string>& flags);

// GetStats from `target`.
absl::StatusOr<v1::GetStatsResponse> DaemonStats(const std::string& target);

// Polls GetStats (up to `timeout`) until `done` holds for the stats; returns
// the last stats, or the first failed GetStats's status.
absl::StatusOr<v1::GetStatsResponse> WaitForStats(
    const std::string& target,
    absl::FunctionRef<bool(const v1::GetStatsResponse&)> done,
    absl::Duration timeout);

// Polls GetStats (up to `timeout`) until no page is used and no session is
// active; returns the last stats.
absl::StatusOr<v1::GetStatsResponse> WaitUntilEmpty(const std::string& target,
                                                    absl::Duration timeout);

// The daemon's log so far (for failure messages).
std::string ReadLog(const std::string& path);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_DAEMON_PROCESS_H_
