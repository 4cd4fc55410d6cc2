// Hostile memory socket: a peer that may connect to `<socket>.fd` opens
// connections and never sends its Hello, to block honest clients from
// their sessions' memory. The real pagealloc-server holds at most
// --memory_socket_max_pending_per_peer such connections per process and
// --memory_socket_max_pending in all, sheds the oldest when a new one
// comes, closes each after --memory_socket_hello_timeout_ms, and counts
// and logs what it shed. Honest clients, which send their Hello at once,
// register and work throughout; the daemon stays up.

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/memory_socket.h"
#include "memory/unique_fd.h"
#include "tests/daemon_process.h"
#include "tests/daemon_stats.h"
#include "tests/hostile/hostile_daemon.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kShed[] = "pagealloc_memory_socket_shed_total";
constexpr char kPending[] = "pagealloc_memory_socket_pending_hellos";

// Silent connections to the memory socket, opened from this process.
std::vector<UniqueFd> OpenSilent(const std::string& path, int n) {
  std::vector<UniqueFd> fds;
  for (int i = 0; i < n; ++i) {
    UniqueFd fd = ConnectUnix(path, SOCK_SEQPACKET);
    EXPECT_TRUE(fd.valid()) << "connection " << i << ": " << strerror(errno);
    fds.push_back(std::move(fd));
  }
  return fds;
}

// Flooder processes: each opens `per_process` silent connections, reports
// it has (one byte on `ready`), and holds them until killed.
std::vector<pid_t> ForkFlooders(const std::string& path, int processes,
                                int per_process, int ready) {
  std::vector<pid_t> pids;
  for (int p = 0; p < processes; ++p) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::vector<UniqueFd> held;
      for (int i = 0; i < per_process; ++i) {
        held.push_back(ConnectUnix(path, SOCK_SEQPACKET));
      }
      const char byte = 1;
      (void)!write(ready, &byte, 1);
      while (true) pause();
    }
    pids.push_back(pid);
  }
  return pids;
}

void KillAll(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) kill(pid, SIGKILL);
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
}

// The flood from one process and from many, with no deadline in play (an
// hour): what is shed is the bounds' doing, so the counts are exact.
TEST(MemorySocketFloodTest, HonestClientsGetThroughAFloodOfSilentConnections) {
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon("flood", {"--memory_socket_hello_timeout_ms=3600000",
                            "--memory_socket_max_pending=256",
                            "--memory_socket_max_pending_per_peer=16"}));
  int port = -1;
  ASSERT_TRUE(
      WaitFor([&] { return (port = MetricsPort(daemon)) > 0; }, kHostileWait));
  const std::string path = memory_socket::MemorySocketPath(daemon.socket_path);

  // One process, 64 connections: it keeps its newest 16.
  std::vector<UniqueFd> mine = OpenSilent(path, 64);
  ASSERT_TRUE(WaitFor(
      [&] {
        return MetricSum(port, kShed, {"reason=\"peer_bound\""}) == 48 &&
               MetricSum(port, kPending) == 16;
      },
      kHostileWait))
      << MetricSum(port, kShed, {"reason=\"peer_bound\""}) << " shed, "
      << MetricSum(port, kPending) << " pending";
  int closed = 0;
  for (const UniqueFd& fd : mine) closed += ClosedByPeer(fd.get()) ? 1 : 0;
  EXPECT_EQ(closed, 48);
  EXPECT_TRUE(ClosedByPeer(mine.front().get()));  // oldest first
  EXPECT_FALSE(ClosedByPeer(mine.back().get()));

  // 24 processes of 12 each, within the per-peer bound: 16 + 288 = 304
  // waiting, 48 over the total bound.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const std::vector<pid_t> flooders = ForkFlooders(path, 24, 12, pipe_fds[1]);
  for (size_t i = 0; i < flooders.size(); ++i) {
    char byte;
    ASSERT_EQ(read(pipe_fds[0], &byte, 1), 1);
  }
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  ASSERT_TRUE(WaitFor(
      [&] {
        return MetricSum(port, kShed, {"reason=\"total_bound\""}) == 48 &&
               MetricSum(port, kPending) == 256;
      },
      kHostileWait))
      << MetricSum(port, kShed, {"reason=\"total_bound\""}) << " shed, "
      << MetricSum(port, kPending) << " pending";
  // This process's 16 were the oldest: all gone.
  closed = 0;
  for (const UniqueFd& fd : mine) closed += ClosedByPeer(fd.get()) ? 1 : 0;
  EXPECT_EQ(closed, 64);

  // With the bound full, honest clients register, get their memory and
  // work, one after another and all held at once.
  std::vector<std::unique_ptr<Client>> honest;
  for (int i = 0; i < 8; ++i) {
    honest.push_back(ConnectTo(daemon, absl::StrCat("honest-", i)));
    ASSERT_NE(honest.back(), nullptr) << ReadLog(daemon.log_path);
    EXPECT_OK(RoundTrip(*honest.back()));
  }
  for (auto& client : honest) EXPECT_OK(RoundTrip(*client));
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, DaemonStats(daemon.target));
  EXPECT_EQ(stats.sessions_active(), 8);
  EXPECT_GE(MetricSum(port, kShed, {"reason=\"total_bound\""}), 48);

  // Said in the log, with the numbers and the flag to change.
  ASSERT_TRUE(WaitFor(
      [&] {
        return ReadLog(daemon.log_path).find("that sent no Hello") !=
               std::string::npos;
      },
      kHostileWait));
  EXPECT_THAT(ReadLog(daemon.log_path),
              HasSubstr("over --memory_socket_max_pending_per_peer=16"));

  KillAll(flooders);
  mine.clear();
  ASSERT_TRUE(
      WaitFor([&] { return MetricSum(port, kPending) == 0; }, kHostileWait));
  for (auto& client : honest) EXPECT_OK(RoundTrip(*client));
  EXPECT_TRUE(daemon.process.running());
}

// A silent connection is closed at its Hello deadline; a session that
// connects afterwards works.
TEST(MemorySocketFloodTest, ASilentConnectionIsClosedAtItsHelloDeadline) {
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon("deadline", {"--memory_socket_hello_timeout_ms=300"}));
  int port = -1;
  ASSERT_TRUE(
      WaitFor([&] { return (port = MetricsPort(daemon)) > 0; }, kHostileWait));
  std::vector<UniqueFd> silent =
      OpenSilent(memory_socket::MemorySocketPath(daemon.socket_path), 3);
  for (const UniqueFd& fd : silent) {
    EXPECT_TRUE(WaitFor([&] { return ClosedByPeer(fd.get()); }, kHostileWait));
  }
  ASSERT_TRUE(WaitFor(
      [&] { return MetricSum(port, kShed, {"reason=\"hello_timeout\""}) == 3; },
      kHostileWait));
  EXPECT_EQ(MetricSum(port, kPending), 0);
  std::unique_ptr<Client> later = ConnectTo(daemon, "after-the-deadline");
  ASSERT_NE(later, nullptr);
  EXPECT_OK(RoundTrip(*later));
  EXPECT_TRUE(WaitFor(
      [&] {
        return ReadLog(daemon.log_path)
                   .find("past --memory_socket_hello_timeout_ms=300") !=
               std::string::npos;
      },
      kHostileWait));
}

}  // namespace
}  // namespace pagealloc::testing
