// The real pagealloc-server binary on a real Unix socket, driven by the
// client library and by real client processes: sockets and their modes,
// draining, death on either side (a SIGKILLed client is reclaimed, and the
// clients of a SIGKILLed daemon fail, at once: both timed over 20 kills),
// memory handed over as descriptors and never named in /dev/shm, rings
// refused when their memory cannot be reserved, and the sweep of leftovers
// of earlier versions.

#include <dlfcn.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/admin.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/daemon_stats.h"
#include "tests/host_files.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Client> ConnectTo(const std::string& target) {
  ClientOptions options;
  options.target = target;
  options.client_name = "process-test";
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_OK(client.status());
  return client.ok() ? *std::move(client) : nullptr;
}

// The 50th and 99th percentiles of `samples` (nearest rank), and the
// largest.
struct Percentiles {
  absl::Duration p50, p99, max;
};
Percentiles Summarize(std::vector<absl::Duration> samples) {
  std::sort(samples.begin(), samples.end());
  auto rank = [&](double q) {
    const size_t n = samples.size();
    const size_t i = static_cast<size_t>(q * n + 0.999999);
    return samples[std::clamp<size_t>(i, 1, n) - 1];
  };
  return {rank(0.50), rank(0.99), samples.back()};
}

// GetStats over one channel kept open, so that polling it is cheap.
class StatsProbe {
 public:
  explicit StatsProbe(const std::string& target) {
    options_.channel =
        grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  }
  absl::StatusOr<v1::GetStatsResponse> Get() {
    return GetDaemonStats(options_);
  }

 private:
  AdminOptions options_;
};

// Waits (bounded) until `client` finds its session gone; returns why (OK
// when it never did).
absl::Status WaitForSessionEnd(Client& client) {
  absl::Status session = absl::OkStatus();
  WaitFor(
      [&] {
        session = client.session_status();
        return !session.ok();
      },
      absl::Seconds(6));
  return session;
}

TEST(ServerProcessTest, ServesTheClientLibraryOverAUnixSocket) {
  ASSERT_OK_AND_ASSIGN(Daemon daemon,
                       StartDaemon("serve", {"--num_pages=128", "--page_size=4",
                                             "--debug_checks"}));
  struct stat st;
  ASSERT_EQ(stat(daemon.socket_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660);

  auto client = ConnectTo(daemon.target);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->pool().num_pages(), 128);
  const char* backend = std::getenv("PAGEALLOC_TEST_BACKEND");
  const bool cuda = backend != nullptr && std::string(backend) == "cuda";
  EXPECT_EQ(client->pool().backend(),
            cuda ? v1::BACKEND_CUDA : v1::BACKEND_CPU);
  ASSERT_OK_AND_ASSIGN(Allocation a, client->AllocExtend({0}, {6}, {-1}));
  ASSERT_OK(a.status());
  EXPECT_EQ(a.on_device(), cuda);
  // Device pointers on the CUDA backend: read through the library.
  std::vector<int64_t> slots(a[0].count);
  ASSERT_OK(client->CopyToHost(a[0].slots, a[0].count, slots.data()));
  EXPECT_THAT(slots, ElementsAre(4, 5, 6, 7, 8, 9));
  ASSERT_OK_AND_ASSIGN(Allocation d, client->AllocDecode({7}, {9}));
  int64_t decoded = 0;
  ASSERT_OK(client->CopyToHost(d[0].slots, 1, &decoded));
  EXPECT_EQ(decoded, 10);
  EXPECT_THAT(client->FreeSlots({4, 8}), IsOkAndHolds(2));
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, DaemonStats(daemon.target));
  EXPECT_EQ(stats.used_pages(), 0);
  EXPECT_EQ(stats.sessions_active(), 1);
}

TEST(ServerProcessTest, SocketModeAndGroupAreConfigurable) {
  const gid_t group = getgid();
  struct group* entry = getgrgid(group);
  ASSERT_NE(entry, nullptr);
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon("mode", {"--socket_mode=0600",
                           std::string("--socket_group=") + entry->gr_name}));
  struct stat st;
  ASSERT_EQ(stat(daemon.socket_path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_EQ(st.st_gid, group);
}

TEST(ServerProcessTest, RefusesToStartOverALiveSocketAndReplacesAStaleOne) {
  ASSERT_OK_AND_ASSIGN(Daemon first, StartDaemon("live", {}));
  ASSERT_OK_AND_ASSIGN(
      Subprocess second,
      Subprocess::Start({RunfilePath("server/pagealloc-server"),
                         "--backend=cpu", "--listen=" + first.target},
                        first.log_path + ".second"));
  ASSERT_OK_AND_ASSIGN(int second_status, second.Wait(absl::Seconds(15)));
  EXPECT_TRUE(WIFEXITED(second_status) && WEXITSTATUS(second_status) == 1)
      << DescribeWaitStatus(second_status);
  EXPECT_THAT(ReadLog(first.log_path + ".second"),
              HasSubstr("another process is serving on"));
  EXPECT_TRUE(DaemonStats(first.target).ok());  // the first one still serves

  // A socket file nobody listens on (a crashed daemon's) is replaced.
  const std::string stale = first.socket_path + ".stale";
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, stale.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
  std::vector<std::string> argv = {RunfilePath("server/pagealloc-server"),
                                   "--backend=cpu", "--listen=unix://" + stale};
  ASSERT_OK_AND_ASSIGN(Subprocess replacing,
                       Subprocess::Start(argv, first.log_path + ".stale"));
  EXPECT_TRUE(WaitFor([&] { return DaemonStats("unix://" + stale).ok(); },
                      absl::Seconds(10)))
      << ReadLog(first.log_path + ".stale");
  EXPECT_THAT(ReadLog(first.log_path + ".stale"),
              HasSubstr("removing stale socket"));
}

TEST(ServerProcessTest, CudaBackendWithoutAGpuSaysSo) {
  const std::string log = ::testing::TempDir() + "/cuda.log";
  ASSERT_OK_AND_ASSIGN(
      Subprocess server,
      Subprocess::Start({RunfilePath("server/pagealloc-server"),
                         "--backend=cuda", "--listen=127.0.0.1:0"},
                        log));
  absl::StatusOr<int> status = server.Wait(absl::Seconds(10));
  if (!status.ok()) {
    GTEST_SKIP() << "a GPU is present: the CUDA backend started";
  }
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1)
      << DescribeWaitStatus(*status);
  const std::string text = ReadLog(log);
  EXPECT_THAT(text, HasSubstr("cannot start: FAILED_PRECONDITION"));
  EXPECT_TRUE(text.find("no CUDA GPU") != std::string::npos ||
              text.find("built without CUDA") != std::string::npos)
      << text;
  // Without the driver library the reason is that, in those words (not the
  // CUDA runtime's "driver version is insufficient").
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver != nullptr) {
    dlclose(driver);
  } else if (text.find("no CUDA GPU") != std::string::npos) {
    EXPECT_THAT(text, HasSubstr("no CUDA GPU: no NVIDIA driver"));
  }
}

TEST(ServerProcessTest, SigtermDrainsAndRemovesTheSocket) {
  ASSERT_OK_AND_ASSIGN(Daemon daemon, StartDaemon("drain", {"--lease_ms=600"}));
  auto client = ConnectTo(daemon.target);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Alloc({16}).status());
  daemon.process.Signal(SIGTERM);
  ASSERT_OK_AND_ASSIGN(int status, daemon.process.Wait(absl::Seconds(15)));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << DescribeWaitStatus(status) << "\n"
      << ReadLog(daemon.log_path);
  struct stat st;
  EXPECT_NE(stat(daemon.socket_path.c_str(), &st), 0);
  EXPECT_THAT(ReadLog(daemon.log_path), HasSubstr("draining"));
  // The daemon is gone, and the library says so, with whichever notice it
  // had first: the session's end in its fast channel (NOT_FOUND: the
  // session ended, "the daemon is shutting down"; the daemon writes it to
  // every channel before it exits) or the connection (UNAVAILABLE).
  const auto gone =
      ::testing::AnyOf(StatusIs(absl::StatusCode::kUnavailable, ::testing::_),
                       StatusIs(absl::StatusCode::kNotFound,
                                HasSubstr("the daemon is shutting down")));
  EXPECT_THAT(client->Alloc({16}).status(), gone);
  const absl::Status session = WaitForSessionEnd(*client);
  EXPECT_THAT(session, ::testing::AnyOf(
                           StatusIs(absl::StatusCode::kUnavailable,
                                    HasSubstr("the daemon is shutting down")),
                           StatusIs(absl::StatusCode::kNotFound,
                                    HasSubstr("the daemon is shutting down"))));
}

// Nothing queued, two clients connected: one closed its session and keeps
// its (idle) connection, the other holds a session and its KeepAlive
// stream. Neither has work in flight, so the daemon stops at once instead
// of waiting out gRPC's shutdown deadline (5 s) for them. The lease is long
// so that no KeepAlive message arrives during the test to end a stream.
TEST(ServerProcessTest, SigtermDoesNotWaitForIdleConnections) {
  ASSERT_OK_AND_ASSIGN(Daemon daemon,
                       StartDaemon("idle", {"--lease_ms=60000"}));
  auto closed = ConnectTo(daemon.target);
  auto open = ConnectTo(daemon.target);
  ASSERT_NE(closed, nullptr);
  ASSERT_NE(open, nullptr);
  ASSERT_OK(closed->Alloc({16}).status());
  ASSERT_OK(open->Alloc({16}).status());
  ASSERT_OK(closed->Close());
  const absl::Time signalled = absl::Now();
  daemon.process.Signal(SIGTERM);
  ASSERT_OK_AND_ASSIGN(int status, daemon.process.Wait(absl::Seconds(15)));
  const absl::Duration took = absl::Now() - signalled;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << DescribeWaitStatus(status) << "\n"
      << ReadLog(daemon.log_path);
  // Generous for a loaded machine; a wait for the deadline takes 5 s.
  EXPECT_LT(took, absl::Seconds(4)) << ReadLog(daemon.log_path);
}

// A SIGKILLed client process has its sockets closed by the kernel: the
// daemon sees its memory socket close and reclaims the session at once.
// The lease (a minute here) plays no part. Timed over 20 kills, from the
// kill to the first GetStats that shows the session and its pages gone
// (a bound, not a target, is asserted: CI has 2 busy cores).
TEST(ServerProcessTest, KilledClientsAreReclaimedAtOnce) {
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon("reclaim", {"--lease_ms=60000", "--num_pages=512",
                              "--page_size=16", "--debug_checks"}));
  auto survivor = ConnectTo(daemon.target);
  ASSERT_NE(survivor, nullptr);
  ASSERT_OK_AND_ASSIGN(Allocation kept, survivor->Alloc({32}));
  ASSERT_OK(kept.status());
  StatsProbe probe(daemon.target);
  constexpr int kKills = 20;
  std::vector<absl::Duration> reclaim;
  for (int i = 0; i < kKills; ++i) {
    const std::string log = absl::StrFormat("%s.victim%d", daemon.log_path, i);
    ASSERT_OK_AND_ASSIGN(
        Subprocess victim,
        Subprocess::Start(
            {RunfilePath("tests/load_client"), "--target=" + daemon.target,
             "--duration_ms=60000", "--report_ready",
             "--client_index=" + std::to_string(i + 1)},
            log));
    ASSERT_TRUE(
        WaitFor([&] { return ReadLog(log).find("READY") != std::string::npos; },
                absl::Seconds(30), absl::Milliseconds(5)))
        << ReadLog(log);
    ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse before, probe.Get());
    ASSERT_EQ(before.sessions_active(), 2);
    const absl::Time killed = absl::Now();
    victim.Signal(SIGKILL);
    absl::StatusOr<v1::GetStatsResponse> after;
    while (absl::Now() - killed < absl::Seconds(30)) {
      after = probe.Get();
      ASSERT_OK(after.status());
      if (after->sessions_active() == 1 && after->used_pages() == 2) break;
    }
    reclaim.push_back(absl::Now() - killed);
    ASSERT_EQ(after->sessions_active(), 1) << ReadLog(daemon.log_path);
    ASSERT_EQ(after->used_pages(), 2);  // only the survivor's pages remain
    ASSERT_OK(victim.Wait(absl::Seconds(5)).status());
  }
  const Percentiles p = Summarize(reclaim);
  std::printf(
      "reclaim after SIGKILL of a client, %d kills: p50 %s, p99 %s, max %s\n",
      kKills, absl::FormatDuration(p.p50).c_str(),
      absl::FormatDuration(p.p99).c_str(), absl::FormatDuration(p.max).c_str());
  EXPECT_LE(p.max, absl::Seconds(2));
  EXPECT_OK(survivor->session_status());
  const std::string text = ReadLog(daemon.log_path);
  EXPECT_THAT(text, HasSubstr("client went away"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("lost its lease")));
  ASSERT_OK_AND_ASSIGN(Allocation more, survivor->Alloc({16}));
  EXPECT_OK(more.status());
}

TEST(ServerProcessTest, HungClientLosesItsPages) {
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon, StartDaemon("hang", {"--lease_ms=300", "--debug_checks"}));
  ASSERT_OK_AND_ASSIGN(
      Subprocess sleeper,
      Subprocess::Start(
          {RunfilePath("tests/load_client"), "--target=" + daemon.target,
           "--duration_ms=60000", "--report_ready"},
          daemon.log_path + ".sleeper"));
  // Wait until it holds pages, then freeze it (a hung scheduler).
  ASSERT_OK_AND_ASSIGN(
      v1::GetStatsResponse holding,
      WaitForStats(
          daemon.target,
          [](const v1::GetStatsResponse& s) { return s.used_pages() > 0; },
          absl::Seconds(5)));
  ASSERT_GT(holding.used_pages(), 0);
  sleeper.Signal(SIGSTOP);
  // Wait for the session to go and its pages to be back: used pages alone
  // can touch 0 while the session lives (a Free the client posted just
  // before it froze), and the session leaves the registry just before its
  // pages are freed (in order with its queued work).
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse reclaimed,
                       WaitForStats(
                           daemon.target,
                           [](const v1::GetStatsResponse& s) {
                             return s.sessions_active() == 0 &&
                                    s.used_pages() == 0;
                           },
                           absl::Seconds(4)));
  EXPECT_EQ(reclaimed.sessions_active(), 0)
      << "a frozen client's session outlived its lease";
  EXPECT_EQ(reclaimed.used_pages(), 0)
      << "a frozen client's pages were not reclaimed";
  // Thawed, the client's calls refer to a session the daemon no longer
  // knows: nothing it does can take pages back or touch another's.
  sleeper.Signal(SIGCONT);
  for (int i = 0; i < 25; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats,
                         DaemonStats(daemon.target));
    EXPECT_EQ(stats.used_pages(), 0);
    EXPECT_EQ(stats.sessions_active(), 0);
  }
  // (Whether the thawed process then exits promptly is not asserted: under
  // load, Debian's gRPC 1.51 has been seen to leave a blocking call that was
  // in flight across SIGSTOP/SIGCONT waiting past its deadline. The library's
  // reporting of a lost session is covered by ClientsSeeADeadDaemon and by
  // service_test's expired-lease case.)
  sleeper.Signal(SIGKILL);
}

TEST(ServerProcessTest, ClientsSeeADeadDaemon) {
  ASSERT_OK_AND_ASSIGN(Daemon daemon, StartDaemon("dead", {"--lease_ms=500"}));
  auto client = ConnectTo(daemon.target);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Alloc({16}).status());
  daemon.process.Signal(SIGKILL);
  ASSERT_OK(daemon.process.Wait(absl::Seconds(5)).status());
  const absl::Status session = WaitForSessionEnd(*client);
  EXPECT_THAT(session, StatusIs(absl::StatusCode::kUnavailable,
                                HasSubstr("the daemon went away")));
  EXPECT_THAT(client->Alloc({16}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("session")));
  // A restarted daemon does not know the old session.
  ASSERT_OK_AND_ASSIGN(Daemon restarted, StartDaemon("dead", {}));
  EXPECT_THAT(client->Alloc({16}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("session")));
}

// With a reconnect timeout, a client whose daemon died re-dials and asks
// the daemon that comes back on its socket for its session. One that keeps
// no state does not know it: the client says so within the timeout, and
// does not hang. Calls made meanwhile wait for that answer; the slots it
// held stay readable (the dead daemon's ring is this process's mapping).
TEST(ServerProcessTest, AClientReconnectingToADaemonWithoutItsStateIsToldSo) {
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon("restart", {"--lease_ms=60000", "--page_size=4"}));
  ClientOptions options;
  options.target = daemon.target;
  options.client_name = "reconnects";
  options.reconnect_timeout = absl::Seconds(60);
  options.reconnect_initial_backoff = absl::Milliseconds(10);
  options.reconnect_max_backoff = absl::Milliseconds(200);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                       Client::Connect(options));
  ASSERT_OK_AND_ASSIGN(Allocation held, client->Alloc({8}));
  ASSERT_OK(held.status());
  std::vector<int64_t> slots(8);
  ASSERT_OK(client->CopyToHost(held[0].slots, 8, slots.data()));
  daemon.process.Signal(SIGKILL);
  ASSERT_OK(daemon.process.Wait(absl::Seconds(5)).status());
  ASSERT_TRUE(
      WaitFor([&] { return client->reconnecting(); }, absl::Seconds(10)))
      << client->session_status();
  EXPECT_OK(client->session_status());  // not gone yet: reconnecting
  // A call made while reconnecting waits for the outcome.
  absl::StatusOr<Allocation> waiting;
  std::thread caller([&] { waiting = client->Alloc({4}); });
  ASSERT_OK_AND_ASSIGN(Daemon restarted, StartDaemon("restart", {}));
  caller.join();
  const absl::Status session = WaitForSessionEnd(*client);
  EXPECT_THAT(session,
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("session gone: the daemon restarted without "
                                 "this session's state")));
  EXPECT_FALSE(client->reconnecting());
  EXPECT_THAT(waiting,
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("session gone")));
  EXPECT_THAT(client->Alloc({4}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("session gone")));
  std::vector<int64_t> again(8);
  ASSERT_OK(client->CopyToHost(held[0].slots, 8, again.data()));
  EXPECT_EQ(again, slots);
  // GetStats needs no session: it reaches the daemon that came back.
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, client->GetStats());
  EXPECT_EQ(stats.sessions_active(), 0);
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse fresh,
                       DaemonStats(restarted.target));
  EXPECT_EQ(fresh.used_pages(), 0);
}

// With reconnect on, a call in flight when the daemon dies fails once with
// UNAVAILABLE, saying that whether it took effect is unknown; it is not
// retried. (The call is in flight but for the rare run where the caller's
// thread starts after the kill; it then waits for the reconnect, which
// cannot succeed without a daemon, and fails with UNAVAILABLE too.)
TEST(ServerProcessTest, ACallInFlightWhenTheDaemonDiesIsNotRetried) {
  ASSERT_OK_AND_ASSIGN(Daemon daemon,
                       StartDaemon("inflight", {"--lease_ms=60000"}));
  ClientOptions options;
  options.target = daemon.target;
  options.client_name = "in-flight";
  options.reconnect_timeout = absl::Seconds(2);
  options.reconnect_initial_backoff = absl::Milliseconds(10);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                       Client::Connect(options));
  ASSERT_TRUE(client->uses_fast_channel());
  ASSERT_OK(client->Alloc({16}).status());
  daemon.process.Signal(SIGSTOP);
  int stopped = 0;
  ASSERT_EQ(waitpid(daemon.process.pid(), &stopped, WUNTRACED),
            daemon.process.pid());
  ASSERT_TRUE(WIFSTOPPED(stopped)) << DescribeWaitStatus(stopped);
  absl::StatusOr<Allocation> pending;
  std::thread caller([&] { pending = client->Alloc({16}); });
  absl::SleepFor(absl::Milliseconds(20));
  daemon.process.Signal(SIGKILL);
  caller.join();
  std::printf("the call in flight: %s\n", pending.status().ToString().c_str());
  EXPECT_THAT(pending,
              StatusIs(absl::StatusCode::kUnavailable,
                       ::testing::AnyOf(
                           HasSubstr("the daemon restarted during this call; "
                                     "whether it took effect is unknown"),
                           HasSubstr("could not be resumed within"))));
  // No daemon comes back: the session is gone once the timeout passes.
  ASSERT_TRUE(WaitFor([&] { return !client->session_status().ok(); },
                      absl::Seconds(30)));
  EXPECT_THAT(client->session_status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("could not be resumed within")));
  ASSERT_OK(daemon.process.Wait(absl::Seconds(5)).status());
}

// A SIGKILLed daemon's memory socket closes with it: a call waiting for its
// answer on the fast channel fails at once, and so does every later call.
// The daemon is stopped (SIGSTOP) first, so that the call is in flight when
// it dies. Timed over 20 daemons, from the kill to the call's return.
TEST(ServerProcessTest, ACallInFlightFailsAtOnceWhenTheDaemonDies) {
  constexpr int kKills = 20;
  std::vector<absl::Duration> failed;
  for (int i = 0; i < kKills; ++i) {
    ASSERT_OK_AND_ASSIGN(
        Daemon daemon,
        StartDaemon(absl::StrFormat("killed%d", i), {"--lease_ms=60000"}));
    auto client = ConnectTo(daemon.target);
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(client->uses_fast_channel());
    ASSERT_OK(client->Alloc({16}).status());
    daemon.process.Signal(SIGSTOP);
    // Stopped for sure (every thread) before the call is made.
    int stopped = 0;
    ASSERT_EQ(waitpid(daemon.process.pid(), &stopped, WUNTRACED),
              daemon.process.pid());
    ASSERT_TRUE(WIFSTOPPED(stopped)) << DescribeWaitStatus(stopped);
    absl::Time returned;
    absl::StatusOr<Allocation> pending;
    std::thread caller([&] {
      pending = client->Alloc({16});
      returned = absl::Now();
    });
    // Let the call reach its wait (were it later, it would fail at once
    // all the same: the session is gone by then).
    absl::SleepFor(absl::Milliseconds(20));
    const absl::Time killed = absl::Now();
    daemon.process.Signal(SIGKILL);
    caller.join();
    failed.push_back(std::max(returned - killed, absl::ZeroDuration()));
    EXPECT_THAT(pending, StatusIs(absl::StatusCode::kUnavailable,
                                  HasSubstr("the daemon went away")));
    EXPECT_THAT(client->session_status(),
                StatusIs(absl::StatusCode::kUnavailable,
                         HasSubstr("the daemon went away")));
    EXPECT_THAT(client->Alloc({16}),
                StatusIs(absl::StatusCode::kUnavailable,
                         HasSubstr("the daemon went away")));
    ASSERT_OK(daemon.process.Wait(absl::Seconds(5)).status());
  }
  const Percentiles p = Summarize(failed);
  std::printf(
      "a call in flight fails after SIGKILL of the daemon, %d kills: p50 %s, "
      "p99 %s, max %s\n",
      kKills, absl::FormatDuration(p.p50).c_str(),
      absl::FormatDuration(p.p99).c_str(), absl::FormatDuration(p.max).c_str());
  EXPECT_LE(p.max, absl::Seconds(2));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ServerProcessTest, NothingOfADaemonWithSessionsIsInDevShm) {
  if (const char* backend = std::getenv("PAGEALLOC_TEST_BACKEND");
      backend != nullptr && std::string(backend) == "cuda") {
    GTEST_SKIP() << "the CUDA backend's rings are device memory";
  }
  ASSERT_OK_AND_ASSIGN(Daemon daemon, StartDaemon("noshm", {}));
  auto a = ConnectTo(daemon.target);
  auto b = ConnectTo(daemon.target);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(a->uses_fast_channel());
  ASSERT_OK(a->Alloc({16}).status());
  ASSERT_OK(b->Alloc({16}).status());
  // No file in /dev/shm is the daemon's (it would name its pid)...
  const std::string pid = absl::StrFormat(".%d.", daemon.process.pid());
  for (const std::string& name : DevShmNames()) {
    EXPECT_FALSE(name.rfind("pagealloc-", 0) == 0 &&
                 name.find(pid) != std::string::npos)
        << name;
  }
  // ...and the daemon maps no file there: its sessions' memory is memfds.
  const std::string maps =
      ReadFile(absl::StrFormat("/proc/%d/maps", daemon.process.pid()));
  EXPECT_THAT(maps, ::testing::Not(HasSubstr("/dev/shm/")));
  EXPECT_THAT(maps, HasSubstr("/memfd:pagealloc-ring."));
  EXPECT_THAT(maps, HasSubstr("/memfd:pagealloc-channel."));
  // Nor does this client.
  EXPECT_THAT(ReadFile("/proc/self/maps"),
              ::testing::Not(HasSubstr("/dev/shm/pagealloc")));
}

// A ring whose memory cannot be reserved is refused at Register, and the
// daemon goes on serving. A file-size limit on the daemon (RLIMIT_FSIZE,
// inherited, with SIGXFSZ ignored) makes the reservation fail the way a
// full tmpfs or a memory cgroup at its limit does, without mounting
// anything: what this shows is that the ring's memory is reserved at
// Register, and that a refusal there is a clean RESOURCE_EXHAUSTED rather
// than a SIGBUS once the ring fills.
TEST(ServerProcessTest, ARingWhoseMemoryCannotBeReservedIsRefusedAtRegister) {
  if (const char* backend = std::getenv("PAGEALLOC_TEST_BACKEND");
      backend != nullptr && std::string(backend) == "cuda") {
    GTEST_SKIP() << "the CUDA backend's rings are device memory";
  }
  absl::StatusOr<Daemon> started = absl::UnknownError("not started");
  {
    // The daemon inherits the limit.
    ScopedFileSizeLimit limit(64 << 20);
    ASSERT_TRUE(limit.ok());
    started = StartDaemon("smallmem", {});
  }
  ASSERT_OK(started.status());
  Daemon& daemon = *started;

  ClientOptions big;
  big.target = daemon.target;
  big.client_name = "big-ring";
  big.ring_capacity_slots = int64_t{1} << 24;  // 128 MiB
  EXPECT_THAT(Client::Connect(big),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("cannot reserve 134217728 bytes")));
  // The daemon serves on, with no session left behind.
  auto small = ConnectTo(daemon.target);
  ASSERT_NE(small, nullptr);
  ASSERT_OK(small->Alloc({16}).status());
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, DaemonStats(daemon.target));
  EXPECT_EQ(stats.sessions_active(), 1);
  EXPECT_TRUE(daemon.process.running());
}

// Daemons of earlier versions named their memory in /dev/shm
// ("pagealloc-gpu<N>.<pid>.*") and left it there when killed. A daemon
// removes those of its GPU whose creator is dead at start, and keeps those
// of a process that runs.
TEST(ServerProcessTest, LeftoversOfDeadDaemonsAreRemovedAtStart) {
  // A pid that ran and is dead: a child that exited and was reaped.
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  constexpr int kGpu = 7;
  const std::string leftover = absl::StrFormat(
      "/dev/shm/pagealloc-gpu%d.%d.channel.12.deadbeef", kGpu, dead);
  const std::string live = absl::StrFormat(
      "/dev/shm/pagealloc-gpu%d.%d.34.cafecafe", kGpu, getpid());
  const std::string other_gpu = absl::StrFormat(
      "/dev/shm/pagealloc-gpu%d.%d.56.0badf00d", kGpu + 1, dead);
  for (const std::string& path : {leftover, live, other_gpu}) {
    const int fd = open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
    ASSERT_GE(fd, 0) << path;
    close(fd);
  }
  // The CPU backend whatever PAGEALLOC_TEST_BACKEND says: the sweep runs
  // before any backend, and a GPU host has no GPU 7.
  ASSERT_OK_AND_ASSIGN(Daemon daemon,
                       StartDaemon("sweep", {absl::StrFormat("--gpu=%d", kGpu),
                                             "--backend=cpu"}));
  struct stat st;
  EXPECT_NE(stat(leftover.c_str(), &st), 0) << "a dead daemon's file stayed";
  EXPECT_EQ(stat(live.c_str(), &st), 0) << "a live process's file went";
  EXPECT_EQ(stat(other_gpu.c_str(), &st), 0) << "another GPU's file went";
  EXPECT_THAT(ReadLog(daemon.log_path),
              HasSubstr("removed 1 leftover shared-memory segments"));
  unlink(live.c_str());
  unlink(other_gpu.c_str());
}

}  // namespace
}  // namespace pagealloc::testing
