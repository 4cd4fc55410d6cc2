// Helpers for the hostile tests that run the real pagealloc-server
// (tests/daemon_process.h): honest clients and their round trips, the
// metrics port and HTTP reads, raw gRPC connections and floods of them,
// raw Registers and raw Unix-socket connections, and a child memory cgroup
// to run a daemon in.

#ifndef PAGEALLOC_TESTS_HOSTILE_HOSTILE_DAEMON_H_
#define PAGEALLOC_TESTS_HOSTILE_HOSTILE_DAEMON_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "memory/unique_fd.h"
#include "proto/pagealloc.grpc.pb.h"
#include "tests/daemon_process.h"

namespace pagealloc::testing {

// Bounds on waits that normally end within milliseconds (CI has 2 cores).
inline constexpr absl::Duration kHostileWait = absl::Seconds(30);

// An honest client of the client library (fast channel on), or null (with
// a test failure) when it cannot connect.
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

// The value of the series `series` (name and labels, as exported) on
// /metrics, or -1 when it is not there.
double MetricValue(int port, const std::string& series);

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

// A raw connection to the daemon's gRPC socket that sends nothing.
UniqueFd RawConnect(const Daemon& daemon);

// What the daemon did with a raw connection: gRPC speaks first (its HTTP/2
// settings), so a connection it serves becomes readable with data; one the
// daemon refused is closed without a byte.
enum class Fate { kPending, kServed, kClosedAtOnce };
Fate FateOf(int fd);

// Opens raw connections, one at a time, until the daemon closes one at
// once (at most `most`); returns them. FAILED_PRECONDITION when none was
// refused or the test ran out of descriptors.
absl::StatusOr<std::vector<UniqueFd>> FloodUntilRefused(const Daemon& daemon,
                                                        int most);

// A stub on a connection of its own to the daemon.
std::unique_ptr<v1::PageAllocator::Stub> RawStub(const Daemon& daemon);

// Register through `stub`: the response, or the call's status.
absl::StatusOr<v1::RegisterResponse> RawRegister(
    v1::PageAllocator::Stub& stub, const std::string& name,
    int64_t ring_capacity_slots = 0, bool fast_channel = true);

// A memory cgroup made for a test under the test's own (cgroup v2's
// unified hierarchy where it has the memory controller, else v1's memory
// hierarchy), with a memory limit; removed when destroyed (after the
// processes in it are gone).
class ChildMemoryCgroup {
 public:
  // nullopt with `why` set when no memory cgroup can be made here (not
  // writable, no memory controller).
  static std::optional<ChildMemoryCgroup> Create(const std::string& name,
                                                 int64_t limit_bytes,
                                                 std::string* why);
  ChildMemoryCgroup(ChildMemoryCgroup&& other) noexcept
      : dir_(std::exchange(other.dir_, "")), v2_(other.v2_) {}
  ~ChildMemoryCgroup();

  // A wrapper for StartDaemon that moves the daemon into the cgroup before
  // it starts.
  std::vector<std::string> Wrapper() const;
  // OOM kills in the cgroup so far (v2 memory.events oom_kill, v1
  // memory.oom_control oom_kill).
  int64_t OomKills() const;
  const std::string& dir() const { return dir_; }

 private:
  ChildMemoryCgroup(std::string dir, bool v2) : dir_(std::move(dir)), v2_(v2) {}
  std::string dir_;
  bool v2_;
};

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_HOSTILE_HOSTILE_DAEMON_H_
