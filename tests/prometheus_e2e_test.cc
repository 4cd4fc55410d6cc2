// End to end with a real Prometheus: Debian's prometheus server scrapes a
// running daemon on loopback, and its HTTP API returns the pool and request
// figures the test produced.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "server/server.h"
#include "tests/in_process_server.h"
#include "tests/status_matchers.h"
#include "tests/subprocess.h"
#include "tests/wait_for.h"

namespace pagealloc {
namespace {

// A loopback port nobody listens on right now.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t length = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  close(fd);
  return ntohs(addr.sin_port);
}

// The value of an instant query's first sample, or "" when it has none yet.
std::string QueryValue(httplib::Client& prometheus, const std::string& query) {
  httplib::Result response = prometheus.Get(
      "/api/v1/query", httplib::Params{{"query", query}}, httplib::Headers{});
  if (!response || response->status != 200) return "";
  // The body holds ..."value":[<time>,"<value>"]...; a search is enough.
  const std::string& body = response->body;
  const size_t at = body.find("\"value\":[");
  if (at == std::string::npos) return "";
  const size_t open = body.find(",\"", at);
  const size_t close =
      open == std::string::npos ? std::string::npos : body.find('"', open + 2);
  if (close == std::string::npos) return "";
  return body.substr(open + 2, close - open - 2);
}

TEST(PrometheusEndToEndTest, ScrapedFiguresMatchWhatTheTestDid) {
  ServerOptions options;
  options.backend = "cpu";
  options.pool = {200, 16, FreePolicy::kLifo};
  options.metrics_port = 0;
  ASSERT_OK_AND_ASSIGN(auto server, testing::InProcessServer::Start(options));

  ClientOptions client_options;
  client_options.client_name = "e2e-scheduler";
  ASSERT_OK_AND_ASSIGN(auto client, server->Connect(client_options));
  ASSERT_OK(client->Alloc({16 * 5}).status());
  ASSERT_OK(client->AllocExtend({0, 0}, {17, 3}, {-1, -1}).status());  // 3
  ASSERT_OK(client->AllocDecode({1}, {-1}).status());                  // 1

  const std::string dir = ::testing::TempDir();
  const std::string config = dir + "/prometheus.yml";
  std::ofstream(config) << absl::StrFormat(
      "global:\n"
      "  scrape_interval: 1s\n"
      "scrape_configs:\n"
      "  - job_name: pagealloc\n"
      "    static_configs:\n"
      "      - targets: ['127.0.0.1:%d']\n",
      server->server().metrics_port());
  const int web_port = FreePort();
  ASSERT_OK_AND_ASSIGN(
      testing::Subprocess prometheus,
      testing::Subprocess::Start(
          {"/usr/bin/prometheus", "--config.file=" + config,
           "--storage.tsdb.path=" + dir + "/tsdb",
           absl::StrFormat("--web.listen-address=127.0.0.1:%d", web_port),
           "--log.level=warn"},
          dir + "/prometheus.log"));
  httplib::Client api("127.0.0.1", web_port);

  // Wait (bounded) for a scrape that saw the allocations.
  std::string used, requests, sessions, up;
  bool exited = false;
  testing::WaitFor(
      [&] {
        exited = !prometheus.running();
        if (exited) return true;
        used = QueryValue(api, R"(pagealloc_pool_pages{state="used"})");
        requests = QueryValue(
            api, R"(pagealloc_requests_total{rpc="AllocExtend",code="OK"})");
        sessions = QueryValue(
            api, R"(pagealloc_session_pages{client="e2e-scheduler"})");
        up = QueryValue(api, R"(up{job="pagealloc"})");
        return used == "9" && !requests.empty() && !sessions.empty();
      },
      absl::Seconds(60), absl::Milliseconds(250));
  ASSERT_FALSE(exited) << "prometheus exited";
  EXPECT_EQ(up, "1");
  EXPECT_EQ(used, "9");  // 5 + 2 + 1 + 1 pages
  EXPECT_EQ(requests, "1");
  EXPECT_EQ(sessions, "9");
  EXPECT_EQ(QueryValue(api, "pagealloc_pool_capacity_pages"), "200");
  EXPECT_EQ(QueryValue(api, "pagealloc_slots_allocated_total"), "101");
  EXPECT_EQ(QueryValue(api, "pagealloc_sessions_active"), "1");
}

}  // namespace
}  // namespace pagealloc
