// Reading a daemon's GetStats without a session: how tests and the
// benchmark watch a daemon from the outside (used and free pages, live
// sessions, launches) while clients come and go.
//
// Each call goes through the client library's session-less GetDaemonStats
// (client/admin.h) on a fresh channel, so that looking never registers a
// session and never changes what it reads.

#ifndef PAGEALLOC_TESTS_DAEMON_STATS_H_
#define PAGEALLOC_TESTS_DAEMON_STATS_H_

#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/pagealloc.pb.h"

namespace pagealloc::testing {

// Returns GetStats (sessions included) of the daemon at `target`, or the
// call's status: UNAVAILABLE when nothing serves there, DEADLINE_EXCEEDED
// when it does not answer within `deadline`.
absl::StatusOr<v1::GetStatsResponse> DaemonStats(
    const std::string& target, absl::Duration deadline = absl::Seconds(2));

// Polls DaemonStats (up to `timeout`, see WaitFor) until `done` holds for
// the stats, and returns the last stats either way: the caller asserts on
// the numbers it needs, so a timeout shows the values that were wrong.
// Returns the first failed GetStats's status at once.
absl::StatusOr<v1::GetStatsResponse> WaitForStats(
    const std::string& target,
    absl::FunctionRef<bool(const v1::GetStatsResponse&)> done,
    absl::Duration timeout);

// WaitForStats until no page is used and no session is active.
absl::StatusOr<v1::GetStatsResponse> WaitUntilEmpty(const std::string& target,
                                                    absl::Duration timeout);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_DAEMON_STATS_H_
