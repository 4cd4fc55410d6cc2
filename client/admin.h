// Calls that need no session: what operators, tools and tests ask a daemon
// without registering (and so without holding a ring or a lease).

#ifndef PAGEALLOC_CLIENT_ADMIN_H_
#define PAGEALLOC_CLIENT_ADMIN_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/pagealloc.pb.h"

namespace pagealloc {

struct AdminOptions {
  // gRPC target: "unix:///run/pagealloc/gpu0.sock" or "host:port"; empty:
  // where the daemon listens by default, as ClientOptions.target.
  std::string target;
  // Credentials for TCP targets (default: insecure, right for Unix sockets).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Use this channel instead of dialing `target` (in-process tests).
  std::shared_ptr<grpc::Channel> channel;
  // Deadline of the call.
  absl::Duration timeout = absl::Seconds(5);
};

// The daemon's GetStats: pool counters, sessions (with `include_sessions`,
// one row each) and launches. Errors are the call's (UNAVAILABLE when no
// daemon answers at `target`, DEADLINE_EXCEEDED after `timeout`);
// INVALID_ARGUMENT when neither a target nor a channel is given.
absl::StatusOr<v1::GetStatsResponse> GetDaemonStats(
    const AdminOptions& options, bool include_sessions = false);

// The daemon's ClearPool: resets the whole pool to its first state and
// returns the pages freed. Refused (FAILED_PRECONDITION, naming the
// sessions' pages) while any session holds pages unless `force`, which the
// daemon refuses (PERMISSION_DENIED) unless it runs with
// --allow_forced_clear. Like GetDaemonStats it needs no session: whoever
// may connect to the daemon's socket may call it.
absl::StatusOr<int64_t> ClearDaemonPool(const AdminOptions& options,
                                        bool force = false);

// The daemon's GetFreeLists: the front of its free list and its parked
// pages, at most `max_pages` of each (0: the daemon's default, 4096).
absl::StatusOr<v1::GetFreeListsResponse> GetDaemonFreeLists(
    const AdminOptions& options, int64_t max_pages = 0);

// The daemon's ResetPrefixCache: evicts every cached, unpinned shared
// prefix page and returns the pages evicted; published and pinned pages
// stay. Like ClearDaemonPool it needs no session.
absl::StatusOr<int64_t> ResetDaemonPrefixCache(const AdminOptions& options);

}  // namespace pagealloc

#endif  // PAGEALLOC_CLIENT_ADMIN_H_
