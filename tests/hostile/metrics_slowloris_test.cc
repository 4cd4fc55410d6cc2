// Hostile HTTP: slowloris on the metrics port. Connections dripping their
// request one header byte a second, reconnecting as soon as the daemon
// closes them, 64 and then 512 at once, against the real pagealloc-server.
// Every /healthz probe meanwhile answers 200 within the Kubernetes
// manifest's probe timeout (5 s), scrapes work, sessions work, and the
// daemon logs what it closed. 512 connections exceed the daemon's total
// bound of 256: newcomers, the probe's included, close the oldest.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/unique_fd.h"
#include "tests/daemon_process.h"
#include "tests/hostile/hostile_daemon.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

using ::testing::HasSubstr;

// deploy/kubernetes's livenessProbe.timeoutSeconds.
constexpr absl::Duration kProbeTimeout = absl::Seconds(5);

// `n` connections to 127.0.0.1:`port` from `sources` addresses other than
// the probe's (127.0.1.1, 127.0.1.2, ...: other pods, as kubelet sees
// them), each sending one byte of a request head a second from a thread of
// its own; a connection the daemon closes is opened again at the next
// second. (From the probe's own address, see
// //server:metrics_http_server_test's
// ANewConnectionOverTheBoundClosesTheOldest.)
class Dripper {
 public:
  Dripper(int port, int n, int sources)
      : port_(port), sources_(sources), fds_(n) {
    thread_ = std::thread([this] { Drip(); });
  }
  ~Dripper() {
    stop_.Notify();
    thread_.join();
  }
  // Connections the daemon closed under it (and it opened again).
  int64_t reopened() const { return reopened_.load(); }
  int64_t rounds() const { return rounds_.load(); }

 private:
  static constexpr absl::string_view kHead =
      "GET /metrics HTTP/1.1\r\nHost: pagealloc\r\nX-Padding: "
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

  void Open(size_t i) {
    fds_[i].fd.reset(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
    fds_[i].sent = 0;
    sockaddr_in source{};
    source.sin_family = AF_INET;
    source.sin_addr.s_addr =
        htonl((127u << 24) | (1u << 8) | (1 + i % sources_));
    (void)bind(fds_[i].fd.get(), reinterpret_cast<sockaddr*>(&source),
               sizeof(source));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port_);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // Non-blocking: a full backlog must not stall the drip (EINPROGRESS;
    // sends fail with EAGAIN until it connects).
    (void)connect(fds_[i].fd.get(), reinterpret_cast<sockaddr*>(&address),
                  sizeof(address));
  }

  void Drip() {
    for (size_t i = 0; i < fds_.size(); ++i) Open(i);
    while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(1))) {
      for (size_t i = 0; i < fds_.size(); ++i) {
        Conn& conn = fds_[i];
        char byte;
        const ssize_t got = recv(conn.fd.get(), &byte, 1, MSG_DONTWAIT);
        const bool closed =
            got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
        if (!closed) {
          const char next = kHead[conn.sent % kHead.size()];
          if (send(conn.fd.get(), &next, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
            ++conn.sent;
            continue;
          }
          if (errno == EAGAIN || errno == EWOULDBLOCK) continue;
        }
        ++reopened_;
        Open(i);
      }
      ++rounds_;
    }
  }

  struct Conn {
    UniqueFd fd;
    size_t sent = 0;
  };
  const int port_;
  const int sources_;
  std::vector<Conn> fds_;
  absl::Notification stop_;
  std::atomic<int64_t> reopened_{0};
  std::atomic<int64_t> rounds_{0};
  std::thread thread_;
};

class MetricsSlowlorisTest : public ::testing::TestWithParam<int> {};

TEST_P(MetricsSlowlorisTest, HealthzAnswersEveryProbeWhileConnectionsDrip) {
  const int connections = GetParam();
  ASSERT_OK_AND_ASSIGN(Daemon daemon,
                       StartDaemon(absl::StrCat("slowloris", connections), {}));
  int port = -1;
  ASSERT_TRUE(
      WaitFor([&] { return (port = MetricsPort(daemon)) > 0; }, kHostileWait));
  std::unique_ptr<Client> session = ConnectTo(daemon, "during-the-drip");
  ASSERT_NE(session, nullptr);

  // 32 per address: the daemon's per-address bound; 512 of them are twice
  // its total bound.
  Dripper dripper(port, connections, connections / 32);
  // Probes over at least 6 rounds of drips (three header deadlines, every
  // connection closed and reopened meanwhile), bounded at 60 probes.
  int probes = 0;
  for (; probes < 60 && (probes < 12 || dripper.rounds() < 6); ++probes) {
    const auto [status, body] = Get(port, "/healthz", kProbeTimeout);
    ASSERT_EQ(status, 200) << "probe " << probes << ": " << body << "\n"
                           << ReadLog(daemon.log_path);
    absl::SleepFor(absl::Milliseconds(500));
  }
  EXPECT_GE(dripper.rounds(), 6) << probes << " probes";
  const auto [status, body] = Get(port, "/metrics", kProbeTimeout);
  EXPECT_EQ(status, 200) << body;
  EXPECT_THAT(body, HasSubstr("pagealloc_pool_pages"));
  EXPECT_OK(RoundTrip(*session));
  // The daemon closed drippers (at their deadline or for newer ones) and
  // said so.
  EXPECT_GT(dripper.reopened(), 0);
  EXPECT_TRUE(WaitFor(
      [&] {
        return ReadLog(daemon.log_path).find("metrics port: closed") !=
               std::string::npos;
      },
      kHostileWait));
  EXPECT_TRUE(daemon.process.running());
}

INSTANTIATE_TEST_SUITE_P(Connections, MetricsSlowlorisTest,
                         ::testing::Values(64, 512));

}  // namespace
}  // namespace pagealloc::testing
