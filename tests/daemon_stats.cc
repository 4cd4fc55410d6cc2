#include "tests/daemon_stats.h"

#include "absl/time/clock.h"
#include "client/admin.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {

absl::StatusOr<v1::GetStatsResponse> DaemonStats(const std::string& target,
                                                 absl::Duration deadline) {
  AdminOptions options;
  options.target = target;
  options.timeout = deadline;
  return GetDaemonStats(options, /*include_sessions=*/true);
}

absl::StatusOr<v1::GetStatsResponse> WaitForStats(
    const std::string& target,
    absl::FunctionRef<bool(const v1::GetStatsResponse&)> done,
    absl::Duration timeout) {
  absl::StatusOr<v1::GetStatsResponse> stats;
  WaitFor(
      [&] {
        stats = DaemonStats(target);
        return !stats.ok() || done(*stats);
      },
      timeout);
  return stats;
}

absl::StatusOr<v1::GetStatsResponse> WaitUntilEmpty(const std::string& target,
                                                    absl::Duration timeout) {
  return WaitForStats(
      target,
      [](const v1::GetStatsResponse& stats) {
        return stats.used_pages() == 0 && stats.sessions_active() == 0;
      },
      timeout);
}

}  // namespace pagealloc::testing
