// /metrics and /healthz of an in-process daemon: the exposition's content,
// its format (checked by Debian's promtool), health while draining, and the
// shipped alerting rules and example scrape configuration.

// GCC 12 warns inside <regex>'s own code, built with the sanitizers' -O1,
// that a std::function member may be used uninitialized: a false positive
// in the standard library, not in this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "server/process_stats.h"
#include "server/rpc_metrics.h"
#include "server/server.h"
#include "tests/grafana_dashboard.h"
#include "tests/in_process_server.h"
#include "tests/status_matchers.h"
#include "tests/subprocess.h"
#include "tests/wait_for.h"

namespace pagealloc {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

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

// An exposition's samples: "name{labels}" (as written) to value.
using Samples = std::map<std::string, double>;

Samples ParseSamples(const std::string& exposition) {
  Samples samples;
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space == absl::string_view::npos ||
        !absl::SimpleAtod(line.substr(space + 1), &value)) {
      ADD_FAILURE() << "cannot parse sample line: " << line;
      continue;
    }
    samples[std::string(line.substr(0, space))] = value;
  }
  return samples;
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

  // The samples of one scrape of /metrics over HTTP.
  Samples Scrape() {
    httplib::Result response = http_->Get("/metrics");
    EXPECT_TRUE(response) << "no answer from /metrics";
    return response ? ParseSamples(response->body) : Samples();
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
  // MPS is a CUDA matter: the label is there, empty.
  EXPECT_THAT(body, HasSubstr("device_uuid=\"\",cuda_mps=\"\",free_policy="));
  EXPECT_THAT(body,
              HasSubstr("pagealloc_session_pages{client=\"scheduler-a\"} 6"));
  EXPECT_THAT(body, HasSubstr("pagealloc_sessions_active 1"));
  EXPECT_THAT(body, HasSubstr("pagealloc_sessions_opened_total 1"));
  EXPECT_THAT(body, HasSubstr("pagealloc_slots_allocated_total 84"));
  EXPECT_THAT(body, HasSubstr("pagealloc_out_of_pages_total 1"));
  // The client's calls go through its fast channel; Register through gRPC.
  EXPECT_THAT(body, HasSubstr("pagealloc_requests_total{rpc=\"Alloc\",code="
                              "\"OK\",transport=\"fast_channel\"} 2"));
  EXPECT_THAT(body, HasSubstr("pagealloc_requests_total{rpc=\"Free\",code="
                              "\"FAILED_PRECONDITION\",transport=\"fast_"
                              "channel\"} 1"));
  EXPECT_THAT(body, HasSubstr("pagealloc_requests_total{rpc=\"Register\","
                              "code=\"OK\",transport=\"grpc\"} 1"));
  EXPECT_THAT(body, HasSubstr("# TYPE pagealloc_rpc_duration_seconds "
                              "histogram"));
  EXPECT_THAT(body, HasSubstr("pagealloc_rpc_duration_seconds_count{rpc="
                              "\"AllocExtend\",transport=\"fast_channel\"} "
                              "1"));
  EXPECT_THAT(body, HasSubstr("pagealloc_batch_requests_count 3"));
  EXPECT_THAT(body, HasSubstr("pagealloc_queue_wait_seconds_bucket"));
  EXPECT_THAT(body, HasSubstr("pagealloc_execute_seconds_sum"));
  EXPECT_THAT(body, HasSubstr("pagealloc_complete_seconds_count"));
}

// Every call counts under the transport that carried it: a fast-channel
// client's calls under fast_channel, a gRPC-only client's under grpc, each
// timed in its own histogram.
TEST_F(MetricsTest, CallsAreLabelledWithTheirTransport) {
  auto fast = Connect("fast");
  ClientOptions grpc_options;
  grpc_options.client_name = "grpc";
  grpc_options.fast_channel = false;
  ASSERT_OK_AND_ASSIGN(auto grpc_only, server_->Connect(grpc_options));
  ASSERT_TRUE(fast->uses_fast_channel());
  ASSERT_FALSE(grpc_only->uses_fast_channel());
  for (int i = 0; i < 3; ++i) ASSERT_OK(fast->Alloc({16}).status());
  ASSERT_OK(grpc_only->Alloc({16}).status());
  ASSERT_OK(fast->Checkpoint());
  ASSERT_OK(grpc_only->Checkpoint());
  ASSERT_OK(grpc_only->Checkpoint());

  const Samples samples = Scrape();
  auto sample = [&samples](const std::string& series) {
    auto it = samples.find(series);
    return it == samples.end() ? -1 : it->second;
  };
  EXPECT_EQ(sample(R"(pagealloc_requests_total{rpc="Alloc",code="OK",)"
                   R"(transport="fast_channel"})"),
            3);
  EXPECT_EQ(sample(R"(pagealloc_requests_total{rpc="Alloc",code="OK",)"
                   R"(transport="grpc"})"),
            1);
  EXPECT_EQ(sample(R"(pagealloc_requests_total{rpc="Checkpoint",code="OK",)"
                   R"(transport="fast_channel"})"),
            1);
  EXPECT_EQ(sample(R"(pagealloc_requests_total{rpc="Checkpoint",code="OK",)"
                   R"(transport="grpc"})"),
            2);
  EXPECT_EQ(sample(R"(pagealloc_rpc_duration_seconds_count{rpc="Alloc",)"
                   R"(transport="fast_channel"})"),
            3);
  EXPECT_EQ(sample(R"(pagealloc_rpc_duration_seconds_count{rpc="Alloc",)"
                   R"(transport="grpc"})"),
            1);
  // A series for each method a transport carries, from the start; none for
  // the methods it does not.
  for (int m = 0; m < kNumMethods; ++m) {
    const Method method = static_cast<Method>(m);
    for (const Transport transport :
         {Transport::kGrpc, Transport::kFastChannel}) {
      const std::string labels =
          absl::StrFormat(R"(rpc="%s",code="OK",transport="%s")",
                          MethodName(method), TransportName(transport));
      const bool carried = TransportCarries(transport, method);
      EXPECT_EQ(samples.count("pagealloc_requests_total{" + labels + "}"),
                carried ? 1 : 0)
          << labels;
      const std::string histogram = absl::StrFormat(
          R"(pagealloc_rpc_duration_seconds_count{rpc="%s",transport="%s"})",
          MethodName(method), TransportName(transport));
      EXPECT_EQ(samples.count(histogram),
                carried && method != Method::kKeepAlive ? 1 : 0)
          << histogram;
    }
  }
}

// KeepAlive streams are counted by code like calls, but how long they were
// open goes to pagealloc_keepalive_stream_seconds, never to the latency
// histogram.
TEST_F(MetricsTest, KeepAliveStreamsAreCountedButTimedApart) {
  auto client = Connect("short-lived");
  ASSERT_OK(client->Close());
  const std::string ended =
      R"(pagealloc_requests_total{rpc="KeepAlive",code="OK",transport="grpc"})";
  Samples samples;
  // The daemon records a stream as it finishes it; the client's background
  // stream may finish after Close returns.
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        samples = Scrape();
        return samples[ended] >= 1 &&
               samples[ended] ==
                   samples["pagealloc_keepalive_stream_seconds_count"];
      },
      absl::Seconds(30)));
  EXPECT_GE(samples["pagealloc_keepalive_stream_seconds_sum"], 0);
  for (const auto& [series, value] : samples) {
    EXPECT_THAT(series, Not(AllOf(HasSubstr("pagealloc_rpc_duration_seconds"),
                                  HasSubstr("KeepAlive"))));
  }
}

// The code label's values are google.rpc.Code's names (what dashboards and
// alerts match on), and a code out of range counts as UNKNOWN.
TEST_F(MetricsTest, StatusCodesAreLabelledWithTheirCanonicalNames) {
  // absl's names are the canonical ones; a few spelled out, so that a
  // label in another spelling fails here.
  std::vector<std::string> names;
  for (int code = 0; code < kNumStatusCodes; ++code) {
    names.push_back(
        absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
  }
  ASSERT_EQ(names[0], "OK");
  ASSERT_EQ(names[8], "RESOURCE_EXHAUSTED");
  ASSERT_EQ(names[16], "UNAUTHENTICATED");
  CallCore& core = server_->server().core();
  for (int code = 0; code < kNumStatusCodes; ++code) {
    core.Record(Method::kGetStats, Transport::kGrpc,
                static_cast<absl::StatusCode>(code), absl::Microseconds(1));
  }
  core.Record(Method::kGetStats, Transport::kGrpc,
              static_cast<absl::StatusCode>(99), absl::Microseconds(1));
  Samples samples = Scrape();
  for (const std::string& name : names) {
    EXPECT_EQ(samples[absl::StrFormat(
                  R"(pagealloc_requests_total{rpc="GetStats",code="%s",)"
                  R"(transport="grpc"})",
                  name)],
              name == "UNKNOWN" ? 2 : 1)
        << name;
  }
}

TEST_F(MetricsTest, ExportsTheStandardProcessMetrics) {
  const std::string body = server_->server().metrics().Render();
  EXPECT_THAT(body, HasSubstr("# TYPE process_cpu_seconds_total counter"));
  for (const char* gauge :
       {"process_resident_memory_bytes", "process_virtual_memory_bytes",
        "process_open_fds", "process_max_fds", "process_start_time_seconds"}) {
    EXPECT_THAT(body, HasSubstr(absl::StrFormat("# TYPE %s gauge", gauge)));
  }
  Samples samples = ParseSamples(body);
  ASSERT_OK_AND_ASSIGN(const ProcessStats now, ReadProcessStats());
  // This process is the daemon: the same start time, a plausible rest.
  EXPECT_NEAR(samples["process_start_time_seconds"], now.start_time_seconds,
              1e-3);
  EXPECT_EQ(samples["process_max_fds"], now.max_fds);
  EXPECT_GT(samples["process_cpu_seconds_total"], 0);
  EXPECT_LE(samples["process_cpu_seconds_total"], now.cpu_seconds);
  EXPECT_GT(samples["process_open_fds"], 3);  // stdio, sockets, the ring
  EXPECT_LT(samples["process_open_fds"], samples["process_max_fds"]);
  EXPECT_GT(samples["process_resident_memory_bytes"], 1 << 20);
  EXPECT_GE(samples["process_virtual_memory_bytes"],
            samples["process_resident_memory_bytes"]);
}

// A metric as the exposition or the documentation describes it.
struct MetricShape {
  std::string type;
  std::set<std::string> labels;  // "le" left out
  bool operator==(const MetricShape& other) const {
    return type == other.type && labels == other.labels;
  }
};

std::ostream& operator<<(std::ostream& os, const MetricShape& shape) {
  return os << shape.type << " {" << absl::StrJoin(shape.labels, ",") << "}";
}

// The families of an exposition: their # TYPE line and the label names of
// their samples (a histogram's _bucket, _sum and _count included).
std::map<std::string, MetricShape> ExportedMetrics(const std::string& body) {
  std::map<std::string, MetricShape> metrics;
  const std::regex type_line(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\w+)$)");
  const std::regex label(R"(([a-zA-Z_][a-zA-Z0-9_]*)=")");
  for (absl::string_view piece : absl::StrSplit(body, '\n')) {
    const std::string line(piece);
    std::smatch match;
    if (std::regex_match(line, match, type_line)) {
      metrics[match[1]].type = match[2];
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::string name = line.substr(0, line.find_first_of("{ "));
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (!metrics.count(name) && absl::EndsWith(name, suffix)) {
        name = name.substr(0, name.size() - strlen(suffix));
      }
    }
    EXPECT_TRUE(metrics.count(name)) << "a sample before its # TYPE: " << line;
    const size_t open = line.find('{');
    if (open == std::string::npos) continue;
    const std::string labels = line.substr(open, line.rfind('}') - open);
    for (auto it = std::sregex_iterator(labels.begin(), labels.end(), label);
         it != std::sregex_iterator(); ++it) {
      if ((*it)[1] != "le") metrics[name].labels.insert((*it)[1]);
    }
  }
  return metrics;
}

// The rows of docs/operations.md's metric table:
// | `name` | type | `label`, `label`: values | meaning |
std::map<std::string, MetricShape> DocumentedMetrics(
    const std::string& markdown) {
  std::map<std::string, MetricShape> metrics;
  const std::regex row(
      R"(^\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \| (counter|gauge|histogram) \|([^|]*)\|)");
  const std::regex label("`([a-zA-Z_][a-zA-Z0-9_]*)`");
  for (absl::string_view piece : absl::StrSplit(markdown, '\n')) {
    const std::string line(piece);
    std::smatch match;
    if (!std::regex_search(line, match, row)) continue;
    MetricShape& shape = metrics[match[1]];
    shape.type = match[2];
    const std::string labels = match[3];
    for (auto it = std::sregex_iterator(labels.begin(), labels.end(), label);
         it != std::sregex_iterator(); ++it) {
      shape.labels.insert((*it)[1]);
    }
  }
  return metrics;
}

// docs/operations.md is the operator's reference: every metric the daemon
// exports is in its table, with its type and labels, and the table lists
// nothing the daemon does not export.
TEST_F(MetricsTest, EveryExportedMetricIsDocumented) {
  auto client = Connect("documented");  // for the per-client series
  ASSERT_OK(client->Alloc({16}).status());
  httplib::Result response = http_->Get("/metrics");
  ASSERT_TRUE(response);
  const std::map<std::string, MetricShape> exported =
      ExportedMetrics(response->body);
  std::ifstream doc(testing::RunfilePath("docs/operations.md"));
  ASSERT_TRUE(doc) << "docs/operations.md is not in the runfiles";
  std::stringstream markdown;
  markdown << doc.rdbuf();
  const std::map<std::string, MetricShape> documented =
      DocumentedMetrics(markdown.str());
  ASSERT_GT(exported.size(), 30u);
  for (const auto& [name, shape] : exported) {
    auto it = documented.find(name);
    if (it == documented.end()) {
      ADD_FAILURE() << name << " (" << shape
                    << ") is exported but not in docs/operations.md's "
                       "metric table";
      continue;
    }
    EXPECT_EQ(it->second, shape) << name << ": documented vs exported";
  }
  for (const auto& [name, shape] : documented) {
    EXPECT_TRUE(exported.count(name))
        << name << " is in docs/operations.md but the daemon does not export "
        << "it";
  }
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

// ---- deploy/grafana/pagealloc.json

using google::protobuf::Struct;
using google::protobuf::Value;

const Value& Field(const Struct& object, const std::string& name) {
  auto it = object.fields().find(name);
  return it == object.fields().end() ? Value::default_instance() : it->second;
}

absl::StatusOr<testing::Dashboard> LoadShippedDashboard() {
  return testing::LoadDashboard(
      testing::RunfilePath("deploy/grafana/pagealloc.json"));
}

// Concrete values for the dashboard's variables, as Grafana would give them.
const std::map<std::string, std::string>& VariableValues() {
  static const auto* values = new std::map<std::string, std::string>{
      {"__rate_interval", "1m"}, {"__interval", "15s"},
      {"__range", "1h"},         {"datasource", "prometheus"},
      {"job", "pagealloc"},      {"instance", "gpu-host-1:9464"},
  };
  return *values;
}

TEST(GrafanaDashboardTest, IsAPrometheusDashboardWithItsVariables) {
  ASSERT_OK_AND_ASSIGN(const testing::Dashboard dashboard,
                       LoadShippedDashboard());
  const Struct& json = dashboard.json;
  EXPECT_EQ(Field(json, "schemaVersion").number_value(), 38);
  EXPECT_EQ(Field(json, "uid").string_value(), "pagealloc");
  EXPECT_EQ(Field(json, "title").string_value(), "pagealloc");
  EXPECT_EQ(dashboard.variables,
            (std::vector<std::string>{"datasource", "job", "instance"}));
  const Struct& datasource =
      Field(Field(json, "templating").struct_value(), "list")
          .list_value()
          .values(0)
          .struct_value();
  EXPECT_EQ(Field(datasource, "type").string_value(), "datasource");
  EXPECT_EQ(Field(datasource, "query").string_value(), "prometheus");

  // Every panel and target reads the chosen data source; ids are unique;
  // panels lie on the 24-column grid without overlapping.
  auto uses_variable = [](const Value& source) {
    return Field(source.struct_value(), "type").string_value() ==
               "prometheus" &&
           Field(source.struct_value(), "uid").string_value() ==
               "${datasource}";
  };
  std::set<int> ids;
  struct Box {
    double x, y, w, h;
  };
  std::vector<std::pair<std::string, Box>> boxes;
  for (const Value& value : Field(json, "panels").list_value().values()) {
    const Struct& panel = value.struct_value();
    const std::string title = Field(panel, "title").string_value();
    EXPECT_TRUE(ids.insert(Field(panel, "id").number_value()).second)
        << "duplicate id: " << title;
    const Struct& pos = Field(panel, "gridPos").struct_value();
    const Box box = {
        Field(pos, "x").number_value(), Field(pos, "y").number_value(),
        Field(pos, "w").number_value(), Field(pos, "h").number_value()};
    EXPECT_LE(box.x + box.w, 24) << title;
    for (const auto& [other, b] : boxes) {
      const bool apart = box.x >= b.x + b.w || b.x >= box.x + box.w ||
                         box.y >= b.y + b.h || b.y >= box.y + box.h;
      EXPECT_TRUE(apart) << title << " overlaps " << other;
    }
    boxes.push_back({title, box});
    if (Field(panel, "type").string_value() == "row") continue;
    EXPECT_FALSE(Field(panel, "description").string_value().empty()) << title;
    EXPECT_TRUE(uses_variable(Field(panel, "datasource"))) << title;
    const auto& targets = Field(panel, "targets").list_value().values();
    EXPECT_FALSE(targets.empty()) << title;
    for (const Value& target : targets) {
      EXPECT_TRUE(uses_variable(Field(target.struct_value(), "datasource")))
          << title;
    }
  }
  // Each query selects the chosen job and daemons.
  for (const testing::DashboardQuery& query : dashboard.queries) {
    if (query.panel_title.empty()) continue;  // a variable
    EXPECT_THAT(query.expr, HasSubstr(R"(job="$job",instance=~"$instance")"))
        << query.where;
  }
}

// Prometheus' own parser (promtool check rules) accepts every panel's and
// variable's query once Grafana's variables are replaced.
TEST(GrafanaDashboardTest, PromtoolParsesEveryQuery) {
  ASSERT_OK_AND_ASSIGN(const testing::Dashboard dashboard,
                       LoadShippedDashboard());
  std::vector<std::string> exprs;
  std::string index;  // which query each rule is, for failure messages
  for (const testing::DashboardQuery& query : dashboard.queries) {
    ASSERT_OK_AND_ASSIGN(std::string expr, testing::SubstituteVariables(
                                               query.expr, VariableValues()));
    absl::StrAppendFormat(&index, "\n  dashboard:query_%d: %s", exprs.size(),
                          query.where);
    exprs.push_back(expr);
  }
  ASSERT_GT(exprs.size(), 30u);
  const std::string rules = ::testing::TempDir() + "/dashboard_rules.yml";
  std::ofstream(rules) << testing::RecordingRuleFile(exprs);
  auto [status, output] =
      RunWithInput("/usr/bin/promtool check rules " + rules, "");
  EXPECT_EQ(status, 0) << output << "The rules are:" << index;
  EXPECT_THAT(output, HasSubstr(absl::StrFormat("SUCCESS: %d rules found",
                                                exprs.size())));
}

// The checks above can fail: a query Prometheus cannot parse, or a variable
// left in, is refused.
TEST(GrafanaDashboardTest, PromtoolRefusesABrokenQuery) {
  const std::string rules = ::testing::TempDir() + "/broken_rules.yml";
  std::ofstream(rules) << testing::RecordingRuleFile(
      {"sum by (instance) (rate(pagealloc_launches_total[1m])",
       "rate(pagealloc_launches_total[$__rate_interval])"});
  auto [status, output] =
      RunWithInput("/usr/bin/promtool check rules " + rules, "");
  EXPECT_NE(status, 0) << output;
  EXPECT_THAT(
      testing::SubstituteVariables("up{job=\"$cluster\"}", VariableValues()),
      testing::StatusIs(absl::StatusCode::kInvalidArgument,
                        HasSubstr("$cluster")));
  EXPECT_THAT(testing::SubstituteVariables(
                  R"(up{job="${job}",instance=~"$instance"}[$__range])",
                  VariableValues()),
              testing::IsOkAndHolds(
                  R"(up{job="pagealloc",instance=~"gpu-host-1:9464"}[1h])"));
}

// The dashboard plots every metric the daemon exports, and names none that
// it does not.
TEST_F(MetricsTest, TheDashboardUsesEveryExportedMetric) {
  auto client = Connect("dashboard");  // for the per-client series
  httplib::Result response = http_->Get("/metrics");
  ASSERT_TRUE(response);
  const std::map<std::string, MetricShape> exported =
      ExportedMetrics(response->body);
  ASSERT_OK_AND_ASSIGN(const testing::Dashboard dashboard,
                       LoadShippedDashboard());
  std::set<std::string> used;
  const std::regex metric(R"(\b((pagealloc|process)_[a-z_]+)\b)");
  for (const testing::DashboardQuery& query : dashboard.queries) {
    for (auto it =
             std::sregex_iterator(query.expr.begin(), query.expr.end(), metric);
         it != std::sregex_iterator(); ++it) {
      std::string name = (*it)[1];
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        if (!exported.count(name) && absl::EndsWith(name, suffix)) {
          name = name.substr(0, name.size() - strlen(suffix));
        }
      }
      EXPECT_TRUE(exported.count(name)) << query.where << " uses " << (*it)[1]
                                        << ", which the daemon does not export";
      used.insert(name);
    }
  }
  for (const auto& [name, shape] : exported) {
    EXPECT_TRUE(used.count(name)) << name << " is on no dashboard panel";
  }
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
