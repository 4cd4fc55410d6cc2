// The metrics HTTP server against clients that misbehave: a second daemon
// on the same port, and clients that open connections and never finish
// their request.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "server/metrics.h"
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
  // Each stalled client holds a worker until the server's read timeout; a
  // server with fewer workers than stalled clients would not answer this
  // within the client's own timeout.
  httplib::Client client("127.0.0.1", server->port());
  client.set_connection_timeout(10);
  client.set_read_timeout(1);
  httplib::Result health = client.Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body, HasSubstr("pagealloc_up 1"));
  for (int sock : stalled) close(sock);
}

}  // namespace
}  // namespace pagealloc
