// What the hostile tests against a real pagealloc-server process share:
// honest sessions of the client library, the daemon's metrics port and
// its metrics read over HTTP, as an operator would see them.

#ifndef PAGEALLOC_TESTS_HOSTILE_HOSTILE_DAEMON_H_
#define PAGEALLOC_TESTS_HOSTILE_HOSTILE_DAEMON_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "memory/unique_fd.h"
#include "tests/daemon_process.h"

namespace pagealloc::testing {

// Bounds on waits that normally end within milliseconds (CI has 2 cores).
inline constexpr absl::Duration kHostileWait = absl::Seconds(30);

// An honest session (fast channel on), or null with a test failure.
std::unique_ptr<Client> ConnectTo(const Daemon& daemon,
                                  const std::string& name);

// Allocates a page and frees it: the session works end to end.
absl::Status RoundTrip(Client& client);

// The metrics port the daemon logged ("metrics on http://H:P/metrics"), or
// -1 while it has not.
int MetricsPort(const Daemon& daemon);

// GET `path` on 127.0.0.1:`port`: status and body, or status -1 and the
// error, within `timeout` for the connect and for each read.
std::pair<int, std::string> Get(int port, const std::string& path,
                                absl::Duration timeout = absl::Seconds(5));

// The sum of the series of metric `name` whose labels contain every one of
// `labels` (e.g. {"rpc=\"KeepAlive\"", "code=\"OK\""}), read from
// /metrics; -1 when the scrape fails.
double MetricSum(int port, absl::string_view name,
                 std::initializer_list<absl::string_view> labels = {});

// A raw connection of `type` (SOCK_STREAM, SOCK_SEQPACKET) to the Unix
// socket at `path`, that sends nothing; invalid when connect fails.
UniqueFd ConnectUnix(const std::string& path, int type);

// Whether the peer has closed `fd` (everything it sent read, then end of
// file).
bool ClosedByPeer(int fd);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_HOSTILE_HOSTILE_DAEMON_H_
