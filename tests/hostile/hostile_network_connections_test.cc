// Hostile network: the real pagealloc-server against connections that
// hold its resources. Silent connections are closed after the idle
// timeout; a hung client's connection is cut by keepalive; connections
// over --max_connections are closed at once; and a flood of connections
// that runs the daemon short of descriptors makes /healthz say so (503)
// while the sessions it has keep working, then it accepts again by itself
// once the connections are gone. In each case the daemon stays up and
// other sessions keep working.
//
// Elsewhere: slow HTTP clients dripping headers to /metrics while /healthz
// answers (server/metrics_http_server_test.cc,
// StalledClientsDoNotBlockHealthz), and a second daemon on a taken metrics
// port failing with a message naming the port
// (server/metrics_http_server_test.cc and tests/command_line_test.cc).

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/unique_fd.h"
#include "tests/daemon_process.h"
#include "tests/daemon_stats.h"
#include "tests/hostile/hostile_daemon.h"
#include "tests/status_matchers.h"
#include "tests/subprocess.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kWait = kHostileWait;

// The sum of pagealloc_requests_total's series for `rpc` and `code`.
int64_t RequestsTotal(int port, absl::string_view rpc, absl::string_view code) {
  return static_cast<int64_t>(MetricSum(port, "pagealloc_requests_total",
                                        {absl::StrCat("rpc=\"", rpc, "\""),
                                         absl::StrCat("code=\"", code, "\"")}));
}

// A raw connection to the daemon's gRPC socket that sends nothing.
UniqueFd RawConnect(const Daemon& daemon) {
  return ConnectUnix(daemon.socket_path, SOCK_STREAM);
}

// What the daemon did with a raw connection: gRPC speaks first (its HTTP/2
// settings), so a connection it serves becomes readable with data; one the
// daemon refused is closed without a byte.
enum class Fate { kPending, kServed, kClosedAtOnce };
Fate FateOf(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return Fate::kServed;
  if (n == 0) return Fate::kClosedAtOnce;
  return Fate::kPending;
}

TEST(HostileNetworkConnectionsTest, SilentConnectionsAreClosedSessionsAreNot) {
  ASSERT_OK_AND_ASSIGN(Daemon daemon,
                       StartDaemon("idle", {"--max_connection_idle_ms=300",
                                            "--lease_ms=60000"}));
  std::unique_ptr<Client> session = ConnectTo(daemon, "idle-survivor");
  ASSERT_NE(session, nullptr);
  ASSERT_OK(RoundTrip(*session));

  // Connects and never sends a byte: closed once idle for 300 ms.
  UniqueFd silent = RawConnect(daemon);
  ASSERT_TRUE(silent.valid());
  EXPECT_TRUE(WaitFor([&] { return ClosedByPeer(silent.get()); }, kWait))
      << "a silent connection was never closed";

  // The session was idle as long, but its KeepAlive stream is a call in
  // progress: it lives on, and works.
  EXPECT_OK(session->session_status());
  EXPECT_OK(RoundTrip(*session));
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, DaemonStats(daemon.target));
  EXPECT_EQ(stats.sessions_active(), 1);
  EXPECT_TRUE(daemon.process.running());
}

TEST(HostileNetworkConnectionsTest, AHungClientsConnectionIsCutByKeepalive) {
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon("hung", {"--keepalive_time_ms=200",
                           "--keepalive_timeout_ms=200", "--lease_ms=60000"}));
  int port = -1;
  ASSERT_TRUE(WaitFor([&] { return (port = MetricsPort(daemon)) > 0; }, kWait));
  std::unique_ptr<Client> bystander = ConnectTo(daemon, "bystander");
  ASSERT_NE(bystander, nullptr);

  ASSERT_OK_AND_ASSIGN(Subprocess hung,
                       Subprocess::Start({RunfilePath("client/pagealloc-cli"),
                                          "--target=" + daemon.target, "alloc",
                                          "--tokens=16", "--hold_s=600"}));
  ASSERT_OK(WaitForStats(
                daemon.target,
                [](const v1::GetStatsResponse& s) {
                  return s.sessions_active() == 2;
                },
                kWait)
                .status());
  const int64_t streams_ended = RequestsTotal(port, "KeepAlive", "OK");
  // Stopped, its process keeps its sockets open but answers no ping: a
  // half-open connection as far as the daemon can tell.
  hung.Signal(SIGSTOP);
  EXPECT_TRUE(WaitFor(
      [&] { return RequestsTotal(port, "KeepAlive", "OK") > streams_ended; },
      kWait))
      << "the hung client's KeepAlive stream was never cut";
  // The cut ends the stream, not the session: its lease decides that.
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, DaemonStats(daemon.target));
  EXPECT_EQ(stats.sessions_active(), 2);
  // The bystander, pinged as often, answered and kept its stream.
  EXPECT_OK(bystander->session_status());
  EXPECT_OK(RoundTrip(*bystander));
  hung.Signal(SIGKILL);
  EXPECT_TRUE(daemon.process.running());
}

TEST(HostileNetworkConnectionsTest, ConnectionsOverTheCapAreClosedAtOnce) {
  ASSERT_OK_AND_ASSIGN(Daemon daemon,
                       StartDaemon("cap", {"--max_connections=6"}));
  int port = -1;
  ASSERT_TRUE(WaitFor([&] { return (port = MetricsPort(daemon)) > 0; }, kWait));
  std::unique_ptr<Client> session = ConnectTo(daemon, "under-the-cap");
  ASSERT_NE(session, nullptr);

  std::vector<UniqueFd> flood;
  Fate fate = Fate::kServed;
  while (fate == Fate::kServed && flood.size() < 50) {
    flood.push_back(RawConnect(daemon));
    ASSERT_TRUE(flood.back().valid());
    const int fd = flood.back().get();
    ASSERT_TRUE(
        WaitFor([&] { return (fate = FateOf(fd)) != Fate::kPending; }, kWait));
  }
  ASSERT_EQ(fate, Fate::kClosedAtOnce) << "50 connections and none refused";
  EXPECT_LE(flood.size(), 6u);
  // The cap is policy, not failure: /healthz stays 200, the session works.
  EXPECT_EQ(Get(port, "/healthz").first, 200);
  EXPECT_OK(RoundTrip(*session));

  // Once the flood is gone, new clients get in.
  flood.clear();
  std::unique_ptr<Client> later = ConnectTo(daemon, "after-the-flood");
  ASSERT_NE(later, nullptr);
  EXPECT_OK(RoundTrip(*later));
  EXPECT_TRUE(daemon.process.running());
}

TEST(HostileNetworkConnectionsTest, DescriptorExhaustionIsReportedAndHealed) {
  // 160 descriptors: the daemon keeps the last 32 for itself, and the
  // connections take the rest.
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon("exhausted", {"--max_connections=100000"},
                  {"/usr/bin/prlimit", "--nofile=160:160", "--"}));
  int port = -1;
  ASSERT_TRUE(WaitFor([&] { return (port = MetricsPort(daemon)) > 0; }, kWait));
  std::unique_ptr<Client> session = ConnectTo(daemon, "holding-on");
  ASSERT_NE(session, nullptr);
  ASSERT_OK(RoundTrip(*session));
  EXPECT_EQ(Get(port, "/healthz").first, 200);

  std::vector<UniqueFd> flood;
  Fate fate = Fate::kServed;
  while (fate == Fate::kServed && flood.size() < 400) {
    flood.push_back(RawConnect(daemon));
    ASSERT_TRUE(flood.back().valid()) << "the test ran out of descriptors";
    const int fd = flood.back().get();
    ASSERT_TRUE(
        WaitFor([&] { return (fate = FateOf(fd)) != Fate::kPending; }, kWait));
  }
  ASSERT_EQ(fate, Fate::kClosedAtOnce) << "400 connections and none refused";

  // Unhealthy, and says why; the descriptors it kept serve /healthz, and
  // the session it has keeps working.
  const auto [code, body] = Get(port, "/healthz");
  EXPECT_EQ(code, 503);
  EXPECT_THAT(body, HasSubstr("not accepting gRPC connections"));
  EXPECT_THAT(body, HasSubstr(daemon.socket_path));
  EXPECT_THAT(body, HasSubstr("descriptors nearly exhausted"));
  EXPECT_OK(RoundTrip(*session));

  // The flood goes away: healthy again without a restart, and new clients
  // register.
  flood.clear();
  EXPECT_TRUE(
      WaitFor([&] { return Get(port, "/healthz").first == 200; }, kWait))
      << ReadLog(daemon.log_path);
  std::unique_ptr<Client> later = ConnectTo(daemon, "after-the-flood");
  ASSERT_NE(later, nullptr);
  EXPECT_OK(RoundTrip(*later));
  EXPECT_OK(RoundTrip(*session));
  EXPECT_TRUE(daemon.process.running());
  EXPECT_THAT(ReadLog(daemon.log_path),
              HasSubstr("accepting gRPC connections "));
}

}  // namespace
}  // namespace pagealloc::testing
