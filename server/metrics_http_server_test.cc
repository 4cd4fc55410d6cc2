// The metrics HTTP server against clients that misbehave: a second daemon
// on the same port, clients that open connections and never finish their
// request, requests that are not ours to answer, and slow scrapes.

#include "server/metrics_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<MetricsHttpServer> StartOn(int port) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(
          "127.0.0.1", port, [] { return std::string("pagealloc_up 1\n"); },
          [] { return absl::OkStatus(); });
  EXPECT_OK(server.status());
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(MetricsHttpServerTest, ASecondServerOnTheSamePortFailsNamingIt) {
  std::unique_ptr<MetricsHttpServer> first = StartOn(0);
  ASSERT_NE(first, nullptr);
  EXPECT_THAT(MetricsHttpServer::Start(
                  "127.0.0.1", first->port(), [] { return std::string(); },
                  [] { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("127.0.0.1:", first->port()))));
}

TEST(MetricsHttpServerTest, HealthzSaysWhyItIsUnhealthy) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(
          "127.0.0.1", 0, [] { return std::string(); },
          [] {
            return absl::UnavailableError(
                "not accepting gRPC connections (for 5 ms): /x.sock: why");
          });
  ASSERT_OK(server.status());
  httplib::Client client("127.0.0.1", (*server)->port());
  httplib::Result health = client.Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(health->body,
            "not accepting gRPC connections (for 5 ms): /x.sock: why\n");
}

// Opens a TCP connection to `port` and sends the start of a request that
// never ends.
int DripOneLine(int port) {
  const int sock = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(sock, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
      0) {
    close(sock);
    return -1;
  }
  const std::string partial = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
  (void)!write(sock, partial.data(), partial.size());
  return sock;
}

TEST(MetricsHttpServerTest, StalledClientsDoNotBlockHealthz) {
  std::unique_ptr<MetricsHttpServer> server = StartOn(0);
  ASSERT_NE(server, nullptr);
  std::vector<int> stalled;
  for (int i = 0; i < 16; ++i) {
    const int sock = DripOneLine(server->port());
    ASSERT_GE(sock, 0);
    stalled.push_back(sock);
  }
  // Stalled clients hold nothing /healthz needs: no worker, no queue.
  httplib::Client client("127.0.0.1", server->port());
  client.set_connection_timeout(10);
  client.set_read_timeout(10);
  httplib::Result health = client.Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body, HasSubstr("pagealloc_up 1"));
  for (int sock : stalled) close(sock);
}

// A request's head must arrive whole within the header deadline: one that
// drips is closed, however steadily it drips.
TEST(MetricsHttpServerTest, AClientDrippingItsHeadIsClosedAtTheDeadline) {
  MetricsHttpServer::Options options;
  options.header_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(
          "127.0.0.1", 0, [] { return std::string(); },
          [] { return absl::OkStatus(); }, options);
  ASSERT_OK(server.status());
  const int sock = DripOneLine((*server)->port());
  ASSERT_GE(sock, 0);
  // One more header byte every 50 ms (well within any per-read timeout)
  // until the server closes it; bounded at 30 s.
  bool closed = false;
  for (int i = 0; i < 600 && !closed; ++i) {
    closed = send(sock, "X", 1, MSG_NOSIGNAL) < 0;
    char byte;
    closed = closed || recv(sock, &byte, 1, MSG_DONTWAIT) == 0;
    usleep(50000);
  }
  EXPECT_TRUE(closed);
  EXPECT_EQ((*server)->timed_out(), 1);
  close(sock);
}

// Over the per-address bound, a newcomer closes the oldest connection
// still sending its request: the probe gets in.
TEST(MetricsHttpServerTest, ANewConnectionOverTheBoundClosesTheOldest) {
  MetricsHttpServer::Options options;
  options.max_connections_per_address = 4;
  options.header_timeout = absl::Hours(1);
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(
          "127.0.0.1", 0, [] { return std::string(); },
          [] { return absl::OkStatus(); }, options);
  ASSERT_OK(server.status());
  std::vector<int> stalled;
  for (int i = 0; i < 8; ++i) stalled.push_back(DripOneLine((*server)->port()));
  httplib::Client client("127.0.0.1", (*server)->port());
  httplib::Result health = client.Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  // 8 stalled and the probe, 4 at a time: the 5 oldest were closed.
  EXPECT_EQ((*server)->shed(), 5);
  for (int i = 0; i < 8; ++i) {
    // Closed (end of file, or a reset: it had sent bytes never read).
    char byte;
    const ssize_t n = recv(stalled[i], &byte, 1, MSG_DONTWAIT);
    const bool gone = n == 0 || (n < 0 && errno != EAGAIN);
    EXPECT_EQ(gone, i < 5) << "connection " << i;
    close(stalled[i]);
  }
}

// What is not a GET of /metrics or /healthz gets the right code at once.
TEST(MetricsHttpServerTest, OtherRequestsGetTheirCodes) {
  std::unique_ptr<MetricsHttpServer> server = StartOn(0);
  ASSERT_NE(server, nullptr);
  httplib::Client client("127.0.0.1", server->port());
  httplib::Result missing = client.Get("/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  httplib::Result post = client.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  // A body over the bound is refused from its Content-Length alone.
  const int sock = DripOneLine(server->port());
  ASSERT_GE(sock, 0);
  const std::string rest = "Content-Length: 1048576\r\n\r\n";
  ASSERT_EQ(write(sock, rest.data(), rest.size()), ssize_t(rest.size()));
  std::string answer;
  char buffer[512];
  for (ssize_t n; (n = read(sock, buffer, sizeof(buffer))) > 0;) {
    answer.append(buffer, n);
  }
  close(sock);
  EXPECT_THAT(answer, HasSubstr("413 Payload Too Large"));
  EXPECT_THAT(answer, HasSubstr("body of 1048576 bytes, over 65536"));
  httplib::Result query = client.Get("/healthz?verbose=1");
  ASSERT_TRUE(query);
  EXPECT_EQ(query->status, 200);
  httplib::Result head = client.Head("/metrics");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->body, "");
}

// /healthz is answered while a scrape renders, and scrapes that queue
// meanwhile share the next rendering.
TEST(MetricsHttpServerTest, HealthIsAnsweredAheadOfASlowScrape) {
  absl::Notification rendering, release;
  std::atomic<int> renders{0};
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(
          "127.0.0.1", 0,
          [&] {
            if (renders.fetch_add(1) == 0) {
              rendering.Notify();
              release.WaitForNotification();
            }
            return std::string("pagealloc_up 1\n");
          },
          [] { return absl::OkStatus(); });
  ASSERT_OK(server.status());
  const int port = (*server)->port();
  std::vector<std::thread> scrapes;
  std::atomic<int> scraped{0};
  scrapes.emplace_back([&] {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(60);
    if (auto r = client.Get("/metrics"); r && r->status == 200) ++scraped;
  });
  rendering.WaitForNotification();
  for (int i = 0; i < 3; ++i) {
    scrapes.emplace_back([&] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(60);
      if (auto r = client.Get("/metrics"); r && r->status == 200) ++scraped;
    });
  }
  // The first scrape is stuck in its rendering; health does not wait.
  httplib::Client client("127.0.0.1", port);
  httplib::Result health = client.Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  release.Notify();
  for (std::thread& scrape : scrapes) scrape.join();
  EXPECT_EQ(scraped, 4);
  EXPECT_LE(renders, 4);
}

}  // namespace
}  // namespace pagealloc
