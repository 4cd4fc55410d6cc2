// /metrics and /healthz of an in-process daemon: the exposition's content,
// its format (checked by Debian's promtool), health while draining, and the
// shipped alerting rules and example scrape configuration.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "server/server.h"
#include "tests/in_process_server.h"
#include "tests/status_matchers.h"
#include "tests/subprocess.h"

namespace pagealloc {
namespace {

using ::testing::HasSubstr;

// Runs `command` with `input` on stdin; returns its exit status and output.
std::pair<int, std::string> RunWithInput(const std::string& command,
                                         const std::string& input) {
  const std::string in_path = ::testing::TempDir() + "/stdin.txt";
  const std::string out_path = ::testing::TempDir() + "/stdout.txt";
  std::ofstream(in_path) << input;
  const int status = std::system(
      absl::StrFormat("%s < %s > %s 2>&1", command, in_path, out_path).c_str());
  std::ifstream out(out_path);
  std::stringstream text;
  text << out.rdbuf();
  return {status, text.str()};
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.backend = "cpu";
    options.pool = {100, 16, FreePolicy::kLifo};
    options.metrics_port = 0;
    ASSERT_OK_AND_ASSIGN(server_, testing::InProcessServer::Start(options));
    ASSERT_GT(server_->server().metrics_port(), 0);
    http_ = std::make_unique<httplib::Client>("127.0.0.1",
                                              server_->server().metrics_port());
  }

  std::unique_ptr<Client> Connect(const std::string& name) {
    ClientOptions options;
    options.client_name = name;
    absl::StatusOr<std::unique_ptr<Client>> client = server_->Connect(options);
    EXPECT_OK(client.status());
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<testing::InProcessServer> server_;
  std::unique_ptr<httplib::Client> http_;
};

TEST_F(MetricsTest, ExposesPoolSessionRequestAndBatchFigures) {
  auto alice = Connect("scheduler-a");
  ASSERT_OK(alice->Alloc({64}).status());                   // 4 pages
  ASSERT_OK(alice->AllocExtend({0}, {20}, {-1}).status());  // 2 pages
  EXPECT_FALSE(alice->FreePages({99}).ok());  // a refused call counts too
  ASSERT_OK_AND_ASSIGN(Allocation refused, alice->Alloc({16 * 95}));
  EXPECT_FALSE(refused.status().ok());

  httplib::Result response = http_->Get("/metrics");
  ASSERT_TRUE(response) << "no answer from /metrics";
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->get_header_value("Content-Type"),
            "text/plain; version=0.0.4; charset=utf-8");
  const std::string& body = response->body;
  EXPECT_THAT(body, HasSubstr("# TYPE pagealloc_pool_pages gauge"));
  EXPECT_THAT(body, HasSubstr("pagealloc_pool_pages{state=\"used\"} 6"));
  EXPECT_THAT(body, HasSubstr("pagealloc_pool_pages{state=\"free\"} 94"));
  EXPECT_THAT(body, HasSubstr("pagealloc_pool_capacity_pages 100"));
  EXPECT_THAT(body, HasSubstr("pagealloc_pool_usage_ratio 0.06"));
  EXPECT_THAT(body, HasSubstr("pagealloc_page_size_tokens 16"));
  EXPECT_THAT(
      body,
      HasSubstr("pagealloc_build_info{version=\"0.1.0\",backend=\"cpu\""));
  EXPECT_THAT(body,
              HasSubstr("pagealloc_session_pages{client=\"scheduler-a\"} 6"));
  EXPECT_THAT(body, HasSubstr("pagealloc_sessions_active 1"));
  EXPECT_THAT(body, HasSubstr("pagealloc_sessions_opened_total 1"));
  EXPECT_THAT(body, HasSubstr("pagealloc_slots_allocated_total 84"));
  EXPECT_THAT(body, HasSubstr("pagealloc_out_of_pages_total 1"));
  EXPECT_THAT(
      body, HasSubstr("pagealloc_requests_total{rpc=\"Alloc\",code=\"OK\"} 2"));
  EXPECT_THAT(body, HasSubstr("pagealloc_requests_total{rpc=\"Free\",code="
                              "\"FAILED_PRECONDITION\"} 1"));
  EXPECT_THAT(body, HasSubstr("# TYPE pagealloc_rpc_duration_seconds "
                              "histogram"));
  EXPECT_THAT(body, HasSubstr("pagealloc_rpc_duration_seconds_count{rpc="
                              "\"AllocExtend\"} 1"));
  EXPECT_THAT(body, HasSubstr("pagealloc_batch_requests_count 3"));
  EXPECT_THAT(body, HasSubstr("pagealloc_queue_wait_seconds_bucket"));
  EXPECT_THAT(body, HasSubstr("pagealloc_execute_seconds_sum"));
  EXPECT_THAT(body, HasSubstr("pagealloc_complete_seconds_count"));
}

TEST_F(MetricsTest, PromtoolAcceptsTheExposition) {
  auto client = Connect("promtool");
  ASSERT_OK(client->Alloc({32}).status());
  httplib::Result response = http_->Get("/metrics");
  ASSERT_TRUE(response);
  auto [status, output] =
      RunWithInput("/usr/bin/promtool check metrics", response->body);
  EXPECT_EQ(status, 0) << output;
}

TEST_F(MetricsTest, HealthzIsServiceableUntilDraining) {
  httplib::Result up = http_->Get("/healthz");
  ASSERT_TRUE(up);
  EXPECT_EQ(up->status, 200);
  server_->server().core().StartDraining();
  httplib::Result draining = http_->Get("/healthz");
  ASSERT_TRUE(draining);
  EXPECT_EQ(draining->status, 503);
  EXPECT_EQ(draining->body, "draining\n");
}

TEST_F(MetricsTest, ClientLabelsAreCapped) {
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < MetricsExporter::kMaxClientLabels + 5; ++i) {
    clients.push_back(Connect(absl::StrFormat("client-%03d", i)));
  }
  const std::string body = server_->server().metrics().Render();
  int series = 0;
  for (size_t at = body.find("pagealloc_session_pages{");
       at != std::string::npos;
       at = body.find("pagealloc_session_pages{", at + 1)) {
    ++series;
  }
  EXPECT_EQ(series, MetricsExporter::kMaxClientLabels + 1);  // + "other"
  EXPECT_THAT(body, HasSubstr("pagealloc_session_pages{client=\"other\"} 0"));
}

TEST(DeployPrometheusTest, AlertingRulesAndScrapeConfigAreValid) {
  const std::string rules =
      testing::RunfilePath("deploy/prometheus/alerts.yml");
  auto [rules_status, rules_output] =
      RunWithInput("/usr/bin/promtool check rules " + rules, "");
  EXPECT_EQ(rules_status, 0) << rules_output;
  EXPECT_THAT(rules_output, HasSubstr("SUCCESS: 4 rules found"));
  const std::string config =
      testing::RunfilePath("deploy/prometheus/prometheus.yml");
  auto [config_status, config_output] =
      RunWithInput("/usr/bin/promtool check config " + config, "");
  EXPECT_EQ(config_status, 0) << config_output;
}

}  // namespace
}  // namespace pagealloc
