// End to end with a real Prometheus: Debian's prometheus server scrapes a
// running daemon on loopback, its HTTP API returns the pool and request
// figures the test produced, and every query of the Grafana dashboard
// (deploy/grafana/pagealloc.json) returns data from a daemon under load.

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/admin.h"
#include "client/client.h"
#include "client/page_reserve.h"
#include "fast_channel/codec.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "memory/kv_layout.h"
#include "memory/memory_socket.h"
#include "memory/unique_fd.h"
#include "proto/pagealloc.grpc.pb.h"
#include "server/server.h"
#include "tests/daemon_process.h"
#include "tests/grafana_dashboard.h"
#include "tests/in_process_server.h"
#include "tests/kv_event_replay.h"
#include "tests/status_matchers.h"
#include "tests/subprocess.h"
#include "tests/wait_for.h"

namespace pagealloc {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

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

// Debian's Prometheus, scraping the daemon's metrics port every second,
// with a configuration and a database of its own (under the test's name).
struct Prometheus {
  testing::Subprocess process;
  std::unique_ptr<httplib::Client> api;
  std::string log_path;
};

absl::StatusOr<Prometheus> StartPrometheus(int metrics_port) {
  const std::string dir = absl::StrFormat(
      "%s/prometheus-%s", ::testing::TempDir(),
      ::testing::UnitTest::GetInstance()->current_test_info()->name());
  if (mkdir(dir.c_str(), 0755) != 0) {
    return absl::InternalError("cannot create " + dir);
  }
  const std::string config = dir + "/prometheus.yml";
  std::ofstream(config) << absl::StrFormat(
      "global:\n"
      "  scrape_interval: 1s\n"
      "scrape_configs:\n"
      "  - job_name: pagealloc\n"
      "    static_configs:\n"
      "      - targets: ['127.0.0.1:%d']\n",
      metrics_port);
  const int web_port = FreePort();
  Prometheus prometheus;
  prometheus.log_path = dir + "/prometheus.log";
  absl::StatusOr<testing::Subprocess> process = testing::Subprocess::Start(
      {"/usr/bin/prometheus", "--config.file=" + config,
       "--storage.tsdb.path=" + dir + "/tsdb",
       absl::StrFormat("--web.listen-address=127.0.0.1:%d", web_port),
       "--log.level=warn"},
      prometheus.log_path);
  if (!process.ok()) return process.status();
  prometheus.process = *std::move(process);
  prometheus.api = std::make_unique<httplib::Client>("127.0.0.1", web_port);
  return prometheus;
}

// One sample of an instant query's answer.
struct Sample {
  std::map<std::string, std::string> labels;
  double value = 0;
};

const Value& Field(const Struct& object, const std::string& name) {
  auto it = object.fields().find(name);
  return it == object.fields().end() ? Value::default_instance() : it->second;
}

// Runs an instant query through Prometheus' HTTP API. A vector answer
// gives its samples, a scalar one a single sample without labels. Returns
// UNAVAILABLE when Prometheus does not answer (yet) and INVALID_ARGUMENT
// with Prometheus' error when it refuses the query.
absl::StatusOr<std::vector<Sample>> Query(httplib::Client& api,
                                          const std::string& query) {
  httplib::Result response = api.Get(
      "/api/v1/query", httplib::Params{{"query", query}}, httplib::Headers{});
  if (!response) return absl::UnavailableError("no answer from prometheus");
  Struct body;
  if (!google::protobuf::util::JsonStringToMessage(response->body, &body)
           .ok()) {
    return absl::UnavailableError("not JSON: " + response->body);
  }
  if (Field(body, "status").string_value() != "success") {
    return absl::InvalidArgumentError(response->body);
  }
  const Struct& data = Field(body, "data").struct_value();
  auto value_of = [](const Value& pair) {
    // [<time>, "<value>"]; "NaN", "+Inf" and "-Inf" parse too.
    double value = 0;
    const auto& values = pair.list_value().values();
    if (values.size() != 2 ||
        !absl::SimpleAtod(values[1].string_value(), &value)) {
      value = std::nan("");
    }
    return value;
  };
  std::vector<Sample> samples;
  if (Field(data, "resultType").string_value() == "scalar") {
    samples.push_back({{}, value_of(Field(data, "result"))});
    return samples;
  }
  for (const Value& result : Field(data, "result").list_value().values()) {
    Sample sample;
    for (const auto& [name, label] :
         Field(result.struct_value(), "metric").struct_value().fields()) {
      sample.labels[name] = label.string_value();
    }
    sample.value = value_of(Field(result.struct_value(), "value"));
    samples.push_back(std::move(sample));
  }
  return samples;
}

// The value of a query's first sample, or "" when it has none yet.
std::string QueryValue(httplib::Client& api, const std::string& query) {
  absl::StatusOr<std::vector<Sample>> samples = Query(api, query);
  if (!samples.ok() || samples->empty()) return "";
  return absl::StrFormat("%g", samples->front().value);
}

// Prometheus' view of its scrape targets (health, last error), for failure
// messages.
std::string Targets(httplib::Client& api) {
  httplib::Result response = api.Get("/api/v1/targets");
  return response ? response->body : "(no answer)";
}

std::string Describe(const std::vector<Sample>& samples) {
  std::vector<std::string> lines;
  for (const Sample& sample : samples) {
    std::vector<std::string> labels;
    for (const auto& [name, value] : sample.labels) {
      labels.push_back(absl::StrFormat("%s=\"%s\"", name, value));
    }
    lines.push_back(
        absl::StrFormat("{%s} %g", absl::StrJoin(labels, ","), sample.value));
  }
  return absl::StrJoin(lines, "; ");
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
  ASSERT_TRUE(client->uses_fast_channel());
  ASSERT_OK(client->Alloc({16 * 5}).status());
  ASSERT_OK(client->AllocExtend({0, 0}, {17, 3}, {-1, -1}).status());  // 3
  ASSERT_OK(client->AllocDecode({1}, {-1}).status());                  // 1

  ASSERT_OK_AND_ASSIGN(Prometheus prometheus,
                       StartPrometheus(server->server().metrics_port()));
  httplib::Client& api = *prometheus.api;

  // Wait (bounded) for a scrape that saw the allocations.
  std::string used, requests, sessions, up;
  bool exited = false;
  testing::WaitFor(
      [&] {
        exited = !prometheus.process.running();
        if (exited) return true;
        used = QueryValue(api, R"(pagealloc_pool_pages{state="used"})");
        requests =
            QueryValue(api, R"(pagealloc_requests_total{rpc="AllocExtend",)"
                            R"(code="OK",transport="fast_channel"})");
        sessions = QueryValue(
            api, R"(pagealloc_session_pages{client="e2e-scheduler"})");
        up = QueryValue(api, R"(up{job="pagealloc"})");
        return used == "9" && !requests.empty() && !sessions.empty();
      },
      absl::Seconds(60), absl::Milliseconds(250));
  ASSERT_FALSE(exited) << "prometheus exited: "
                       << testing::ReadLog(prometheus.log_path);
  EXPECT_EQ(up, "1");
  EXPECT_EQ(used, "9");  // 5 + 2 + 1 + 1 pages
  EXPECT_EQ(requests, "1");
  EXPECT_EQ(sessions, "9");
  EXPECT_EQ(QueryValue(api, "pagealloc_pool_capacity_pages"), "200");
  EXPECT_EQ(QueryValue(api, "pagealloc_slots_allocated_total"), "101");
  EXPECT_EQ(QueryValue(api, "pagealloc_sessions_active"), "1");
}

// Every query of the dashboard, against a real Prometheus scraping a
// daemon that served load through both transports, refused a ring past
// its memory budget and requests for lack of pages and by quota, failed a
// call, sorted its free list, ended KeepAlive streams, throttled and
// dropped a session that spammed its doorbell, kept a resumable session
// detached and resumed it, reclaimed a session whose lease ran out, and
// shed a silent memory socket connection (another still waits): each
// returns at least one finite, non-zero value.
// A service manager's notification socket for the daemon in this process
// ($NOTIFY_SOCKET), so that it keeps its state (--keep_state): what it
// stores stays queued on the socket.
class NotifySocket {
 public:
  NotifySocket() {
    char dir[] = "/tmp/pagealloc-e2e-notify-XXXXXX";
    dir_ = mkdtemp(dir);
    const std::string path = dir_ + "/notify";
    fd_ = UniqueFd(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    bound_ = bind(fd_.get(), reinterpret_cast<sockaddr*>(&address),
                  sizeof(address)) == 0;
    setenv("NOTIFY_SOCKET", path.c_str(), 1);
  }
  ~NotifySocket() {
    unsetenv("NOTIFY_SOCKET");
    unlink((dir_ + "/notify").c_str());
    rmdir(dir_.c_str());
  }
  bool bound() const { return bound_; }

 private:
  std::string dir_;
  UniqueFd fd_;
  bool bound_ = false;
};

TEST(PrometheusEndToEndTest, EveryDashboardQueryReturnsData) {
  ServerOptions options;
  options.backend = "cpu";
  // The pool's state kept across restarts, with a small log, so that the
  // journal's panels have records and snapshots to show.
  NotifySocket notify;
  ASSERT_TRUE(notify.bound());
  options.keep_state.enabled = true;
  options.keep_state.log_bytes = 8192;
  // The sorted policy, so that freed pages park and a later allocation
  // merges them back (a free-list sort).
  options.pool = {200, 16, FreePolicy::kSorted};
  options.pool.max_pinned_pages_per_owner = 4;  // for the prefix panels
  options.metrics_port = 0;
  // Clients renew every third of it; the abandoned session below loses it.
  options.sessions.lease = absl::Seconds(5);
  // A KV slab, scrubbed between owners, for the KV memory panels: the pages
  // the fast session takes and frees below go to the others, zeroed.
  options.kv.layout =
      *ParseKvLayout("mha:layers=2,kv_heads=2,head_dim=8,dtype=bf16");
  options.kv.scrub = true;
  // One strike throttles a session abusing its fast channel, two drop it
  // (honest clients never earn one).
  options.fast_channel_throttle_strikes = 1;
  options.fast_channel_drop_strikes = 2;
  // Room for the sessions below, not for a ring of 80 MiB beside them.
  options.session_memory = 96 << 20;
  // One silent memory socket connection per process waits for its Hello
  // (for an hour: to the end of the test); a second sheds the first.
  options.memory_socket.hello_timeout = absl::Hours(1);
  options.memory_socket.max_pending_per_peer = 1;
  // KV events on ipc:// sockets, with a queue of 2 events and batches that
  // wait an hour unless flushed: events stay queued and more are dropped.
  char kv_events_dir[] = "/tmp/pagealloc-e2e-kv-XXXXXX";
  ASSERT_NE(mkdtemp(kv_events_dir), nullptr);
  options.kv_events.endpoint = absl::StrCat("ipc://", kv_events_dir, "/pub");
  options.kv_events.replay_endpoint =
      absl::StrCat("ipc://", kv_events_dir, "/replay");
  options.kv_events.queue_events = 2;
  options.kv_events.max_batch_events = 1000;
  options.kv_events.max_batch_delay = absl::Hours(1);
  ASSERT_OK_AND_ASSIGN(auto server, testing::InProcessServer::Start(options));
  ASSERT_OK_AND_ASSIGN(Prometheus prometheus,
                       StartPrometheus(server->server().metrics_port()));
  httplib::Client& api = *prometheus.api;
  const std::string instance =
      absl::StrFormat("127.0.0.1:%d", server->server().metrics_port());
  const std::string selector = absl::StrFormat(R"({instance="%s"})", instance);

  // Rates need a sample from before the load: wait for the first scrape.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        return !prometheus.process.running() ||
               QueryValue(api, "pagealloc_pool_capacity_pages" + selector) ==
                   "200";
      },
      absl::Seconds(60), absl::Milliseconds(250)));
  ASSERT_TRUE(prometheus.process.running())
      << "prometheus exited: " << testing::ReadLog(prometheus.log_path);

  ClientOptions fast_options;
  fast_options.client_name = "e2e-fast";
  ASSERT_OK_AND_ASSIGN(auto fast, server->Connect(fast_options));
  ClientOptions grpc_options;
  grpc_options.client_name = "e2e-grpc";
  grpc_options.fast_channel = false;
  ASSERT_OK_AND_ASSIGN(auto grpc, server->Connect(grpc_options));
  ClientOptions quota_options;
  quota_options.client_name = "e2e-quota";
  quota_options.quota_pages = 4;
  ASSERT_OK_AND_ASSIGN(auto quota, server->Connect(quota_options));
  ASSERT_TRUE(fast->uses_fast_channel());
  ASSERT_FALSE(grpc->uses_fast_channel());

  // The KV-event panels: a batch published (AllBlocksCleared and a store),
  // two events left queued and one dropped on the full queue, a replay
  // request and a malformed one, and a SubscribeKvEvents stream left open.
  KvEventPublisher* kv_events = server->server().kv_event_publisher();
  ASSERT_NE(kv_events, nullptr);
  StoredBlocks blocks;
  blocks.keys = {"e2e-key"};
  blocks.block_size = 16;
  kv_events->BlocksStored(blocks);
  kv_events->Flush();
  for (int i = 0; i < 3; ++i) kv_events->BlocksStored(blocks);
  ASSERT_EQ(kv_events->stats().events_dropped, 1);
  for (const std::string& start : {std::string(8, '\0'), std::string("bad")}) {
    ASSERT_OK(
        testing::RequestKvEventReplay(options.kv_events.replay_endpoint, start)
            .status());
  }
  auto kv_stub = v1::KvEvents::NewStub(grpc::CreateChannel(
      server->target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext kv_context;
  v1::SubscribeKvEventsRequest kv_request;
  auto kv_reader = kv_stub->SubscribeKvEvents(&kv_context, kv_request);
  v1::KvEventBatch kv_batch;
  ASSERT_TRUE(kv_reader->Read(&kv_batch));

  // A free-list sort: take every free page, free them all (they park), then
  // allocate one page, which finds the free list empty and merges.
  {
    const int64_t free_pages = server->pool().Stats().free_pages;
    ASSERT_OK_AND_ASSIGN(Allocation all, fast->Alloc({16 * free_pages}));
    ASSERT_OK(all.status());
    std::vector<int64_t> slots(all[0].count);
    ASSERT_OK(fast->CopyToHost(all[0].slots, all[0].count, slots.data()));
    ASSERT_OK_AND_ASSIGN(const int64_t freed, fast->FreeSlots(slots));
    EXPECT_EQ(freed, free_pages);
    fast->Release(all);
    ASSERT_OK_AND_ASSIGN(Allocation one, fast->Alloc({16}));
    ASSERT_OK(one.status());
    fast->Release(one);
    ASSERT_GT(server->pool().Stats().free_list_sorts, 0);
  }

  // Calls of every allocating kind through both transports.
  for (Client* client : {fast.get(), grpc.get()}) {
    for (int round = 0; round < 5; ++round) {
      ASSERT_OK(client->Checkpoint());
      ASSERT_OK_AND_ASSIGN(Allocation extend,
                           client->AllocExtend({0, 0}, {40, 8}, {-1, -1}));
      ASSERT_OK(extend.status());
      // Each sequence's next token follows its last slot.
      int64_t last[2];
      ASSERT_OK(client->CopyToHost(extend[0].slots + 39, 1, &last[0]));
      ASSERT_OK(client->CopyToHost(extend[1].slots + 7, 1, &last[1]));
      ASSERT_OK_AND_ASSIGN(Allocation decode,
                           client->AllocDecode({41, 9}, {last[0], last[1]}));
      ASSERT_OK(decode.status());
      ASSERT_OK_AND_ASSIGN(const int64_t returned, client->Rollback());
      EXPECT_GT(returned, 0);
      client->Release(decode);
      ASSERT_OK_AND_ASSIGN(Allocation alloc, client->Alloc({32, 16}));
      ASSERT_OK(alloc.status());
      client->Release(alloc);
    }
  }
  // Shared prefix pages: published (one pinned), adopted by a sibling, some
  // freed to the cache, two evicted by a reset, one left cached.
  {
    ASSERT_OK_AND_ASSIGN(Allocation six, grpc->Alloc({6 * 16}));
    ASSERT_OK(six.status());
    std::vector<int64_t> pages(6);
    for (int64_t k = 0; k < 6; ++k) {
      ASSERT_OK(grpc->CopyToHost(six[0].slots + 16 * k, 1, &pages[k]));
      pages[k] /= 16;
    }
    grpc->Release(six);
    std::vector<std::string> keys;
    for (int k = 0; k < 6; ++k)
      keys.push_back(std::string(31, 'k') + static_cast<char>('0' + k));
    ASSERT_OK(grpc->Publish({pages[0]}, {keys[0]}, "", /*pin=*/true).status());
    ASSERT_OK(grpc->Publish(absl::MakeConstSpan(pages).subspan(1),
                            absl::MakeConstSpan(keys).subspan(1), keys[0])
                  .status());
    ASSERT_OK_AND_ASSIGN(std::vector<int64_t> adopted,
                         fast->MatchPrefix(keys, /*adopt=*/true));
    ASSERT_EQ(adopted, pages);
    ASSERT_OK(grpc->FreePages(absl::MakeConstSpan(pages).subspan(1)).status());
    ASSERT_OK(fast->FreePages({pages[4], pages[5]}).status());
    AdminOptions admin;
    admin.channel = server->channel();
    ASSERT_THAT(ResetDaemonPrefixCache(admin), testing::IsOkAndHolds(2));
    ASSERT_OK(fast->FreePages({pages[3]}).status());
  }
  // A page reserve (client/page_reserve.h): refills, a return above its
  // high mark, and below, its answer to the daemon's ask when the fast
  // session's refused call finds the pool short.
  ClientOptions reserve_options;
  reserve_options.client_name = "e2e-reserve";
  ASSERT_OK_AND_ASSIGN(auto reserved, server->Connect(reserve_options));
  PageReserveOptions page_reserve_options;
  page_reserve_options.initial_batch = 4;
  page_reserve_options.max_pages = 32;
  page_reserve_options.idle_ticks = 1 << 30;  // steady but for the steps
  ASSERT_OK_AND_ASSIGN(
      auto reserve, PageReserve::Create(reserved.get(), page_reserve_options));
  {
    std::vector<int64_t> pages;
    ASSERT_OK(reserve->Take(12, &pages));  // the batch grows to 12
    ASSERT_TRUE(testing::WaitFor([&] { return reserve->stats().pages == 24; },
                                 absl::Seconds(30)));
    ASSERT_OK(reserve->Put(pages));  // 36 > 32: the thread returns 12
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          const PageReserveStats stats = reserve->stats();
          return stats.returns == 1 && stats.pages == 24;
        },
        absl::Seconds(30)));
  }
  // Refusals: a ring past the sessions' memory budget, one request larger
  // than the free pool, one over a quota.
  {
    ClientOptions big_ring;
    big_ring.client_name = "e2e-big-ring";
    big_ring.ring_capacity_slots = int64_t{10} << 20;  // 80 MiB
    EXPECT_THAT(server->Connect(big_ring).status(),
                testing::StatusIs(
                    absl::StatusCode::kResourceExhausted,
                    ::testing::HasSubstr("session memory budget exhausted")));
  }
  {
    // Parked pages (the reserve's return parked some) count: an
    // allocation merges them; so do cached prefix pages: it evicts them.
    const PoolStats before = server->pool().Stats();
    const int64_t free_pages =
        before.free_pages + before.parked_pages + before.evictable_pages;
    ASSERT_OK_AND_ASSIGN(Allocation refused,
                         fast->Alloc({16 * (free_pages + 1)}));
    EXPECT_THAT(
        refused.status(),
        testing::StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
    ASSERT_OK_AND_ASSIGN(Allocation over, quota->Alloc({16 * 5}));
    EXPECT_FALSE(over.status().ok());
    ASSERT_OK_AND_ASSIGN(Allocation within, quota->Alloc({16 * 2}));
    ASSERT_OK(within.status());
    const PoolStats stats = server->pool().Stats();
    ASSERT_GT(stats.out_of_pages_refusals, 0);
    ASSERT_GT(stats.quota_refusals, 0);
    // The shortage asked the reserve back; it returned half of it.
    ASSERT_TRUE(testing::WaitFor([&] { return reserve->stats().reclaims >= 1; },
                                 absl::Seconds(30)));
    ASSERT_GT(server->server().fast_channels()->reclaim_returns(), 0);
  }
  // Failed calls: freeing a page the session does not own. A code's series
  // appears with its first occurrence, which rate() cannot see (it has no
  // earlier sample): fail once, let Prometheus scrape the new series, fail
  // again.
  const int64_t not_owned = server->pool().geometry().num_pages;
  EXPECT_FALSE(grpc->FreePages({not_owned}).ok());
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        return !prometheus.process.running() ||
               QueryValue(api, absl::StrFormat(
                                   R"(pagealloc_requests_total{rpc="Free",)"
                                   R"(code="FAILED_PRECONDITION",)"
                                   R"(instance="%s"})",
                                   instance)) == "1";
      },
      absl::Seconds(60), absl::Milliseconds(250)))
      << "its targets: " << Targets(api);
  EXPECT_FALSE(grpc->FreePages({not_owned}).ok());

  // The release fence: a page freed behind a fence that passes (released
  // after a wait) and one behind a fence that never does (pending while
  // Prometheus looks; reclaimed with its session at the end).
  {
    CallOptions inline_options;
    inline_options.return_inline = true;
    ASSERT_OK_AND_ASSIGN(Allocation two, fast->Alloc({32}, inline_options));
    ASSERT_OK(two.status());
    const int64_t first = two[0].slots[0] / 16, second = two[0].slots[16] / 16;
    ASSERT_OK(fast->FreePagesAfter({first}, 1).status());
    ASSERT_OK(fast->FreePagesAfter({second}, 1000).status());
    fast->reserve_channel()->release_word()->store(1);  // as a stream would
    ASSERT_TRUE(testing::WaitFor(
        [&] { return server->server().core().pages_released() == 1; },
        absl::Seconds(60), absl::Milliseconds(1)));
  }

  // A KeepAlive stream ends: a session closes.
  {
    ClientOptions short_options;
    short_options.client_name = "e2e-short";
    ASSERT_OK_AND_ASSIGN(auto short_lived, server->Connect(short_options));
    ASSERT_OK(short_lived->Close());
  }
  // A session that rings its fast channel's doorbell without calls until
  // it is throttled, then dropped.
  {
    std::unique_ptr<v1::PageAllocator::Stub> stub = server->NewStub();
    grpc::ClientContext register_context;
    v1::RegisterRequest register_request;
    register_request.set_client_name("e2e-spammer");
    register_request.set_fast_channel(true);
    v1::RegisterResponse registered;
    ASSERT_TRUE(
        stub->Register(&register_context, register_request, &registered).ok());
    ASSERT_OK_AND_ASSIGN(
        memory_socket::SessionMemory memory,
        memory_socket::ReceiveSessionMemory(
            registered.memory_socket(), registered.session_id(),
            registered.session_token(), absl::Seconds(30)));
    const FastChannelServer& channels = *server->server().fast_channels();
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          const uint64_t one = 1;
          for (int i = 0; i < 100; ++i) {
            (void)!write(memory.doorbell.get(), &one, sizeof(one));
          }
          return channels.dropped(FastChannelServer::Abuse::kDoorbell) > 0;
        },
        absl::Seconds(60), absl::Milliseconds(1)));
    ASSERT_EQ(channels.throttled(FastChannelServer::Abuse::kDoorbell), 1);
  }
  // A resumable session let go by its client (detached), seen so by
  // Prometheus, then taken back: the detached and resume series. Any call
  // renews its lease while Prometheus has not looked yet.
  {
    ClientOptions resumable_options;
    resumable_options.client_name = "e2e-resumable";
    resumable_options.resumable = true;
    ASSERT_OK_AND_ASSIGN(auto resumable, server->Connect(resumable_options));
    const uint64_t id = resumable->session_id();
    const std::string token = resumable->session_token();
    ASSERT_OK(resumable->Detach());
    resumable.reset();
    std::unique_ptr<v1::PageAllocator::Stub> stub = server->NewStub();
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          grpc::ClientContext context;
          v1::ReleaseRingRequest renew;
          renew.mutable_session()->set_session_id(id);
          renew.mutable_session()->set_session_token(token);
          v1::ReleaseRingResponse renewed;
          EXPECT_TRUE(stub->ReleaseRing(&context, renew, &renewed).ok());
          return !prometheus.process.running() ||
                 QueryValue(api, "pagealloc_sessions_detached" + selector) ==
                     "1";
        },
        absl::Seconds(60), absl::Milliseconds(250)))
        << "its targets: " << Targets(api);
    ClientOptions resume_options;
    resume_options.channel = server->channel();
    ASSERT_OK_AND_ASSIGN(auto resumed,
                         Client::Resume(resume_options, id, token));
    ASSERT_OK(resumed->Close());
  }
  // A session that never renews its lease, holding pages: registered and
  // served through a bare stub, then abandoned.
  std::vector<UniqueFd> silent_hellos;
  {
    std::unique_ptr<v1::PageAllocator::Stub> stub = server->NewStub();
    grpc::ClientContext register_context;
    v1::RegisterRequest register_request;
    register_request.set_client_name("e2e-abandoned");
    v1::RegisterResponse registered;
    ASSERT_TRUE(
        stub->Register(&register_context, register_request, &registered).ok());
    // Two connections to the memory socket that never say Hello.
    for (int i = 0; i < 2; ++i) {
      UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
      sockaddr_un address{};
      address.sun_family = AF_UNIX;
      const std::string& path = registered.memory_socket();
      ASSERT_LT(path.size(), sizeof(address.sun_path));
      std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
      ASSERT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&address),
                        sizeof(address)),
                0)
          << path << ": " << std::strerror(errno);
      silent_hellos.push_back(std::move(fd));
    }
    grpc::ClientContext alloc_context;
    v1::AllocRequest alloc;
    alloc.mutable_session()->set_session_id(registered.session_id());
    alloc.mutable_session()->set_session_token(registered.session_token());
    alloc.add_num_tokens(16 * 3);
    alloc.mutable_options()->set_return_inline(true);
    v1::AllocResponse allocated;
    ASSERT_TRUE(stub->Alloc(&alloc_context, alloc, &allocated).ok());
    ASSERT_EQ(allocated.results(0).code(), 0);
  }
  const CallCore& core = server->server().core();
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        return core.counters().sessions_reclaimed > 0 &&
               core.counters().pages_reclaimed > 0 &&
               server->server().memory_socket()->shed_total(
                   MemorySocketServer::Shed::kPeerBound) > 0 &&
               server->server().memory_socket()->pending_hellos() > 0 &&
               core.rpc_metrics().keepalive_stream().Take().count > 0;
      },
      absl::Seconds(60)))
      << "no session was reclaimed, no KeepAlive stream ended, or no "
         "memory socket connection was shed or waits";
  // Everything above happened before the reclaim: once Prometheus has the
  // reclaimed pages, it has the rest.
  const std::string reclaimed = absl::StrFormat(
      "%g", static_cast<double>(core.counters().pages_reclaimed));
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        return !prometheus.process.running() ||
               QueryValue(api, "pagealloc_pages_reclaimed_total" + selector) ==
                   reclaimed;
      },
      absl::Seconds(60), absl::Milliseconds(250)))
      << "Prometheus has pagealloc_pages_reclaimed_total "
      << QueryValue(api, "pagealloc_pages_reclaimed_total" + selector)
      << ", not " << reclaimed << "; its targets: " << Targets(api);
  ASSERT_TRUE(prometheus.process.running())
      << "prometheus exited: " << testing::ReadLog(prometheus.log_path);

  ASSERT_OK_AND_ASSIGN(const testing::Dashboard dashboard,
                       testing::LoadDashboard(testing::RunfilePath(
                           "deploy/grafana/pagealloc.json")));
  // Rate windows span the whole test, so every increase above is in them.
  const std::map<std::string, std::string> values = {
      {"__rate_interval", "5m"}, {"__interval", "15s"},
      {"__range", "5m"},         {"datasource", "prometheus"},
      {"job", "pagealloc"},      {"instance", instance},
  };
  int checked = 0;
  for (const testing::DashboardQuery& query : dashboard.queries) {
    ASSERT_OK_AND_ASSIGN(const std::string expr,
                         testing::SubstituteVariables(query.expr, values));
    absl::StatusOr<std::vector<Sample>> samples = Query(api, expr);
    ASSERT_OK(samples.status()) << query.where << ": " << expr;
    bool data = false;
    for (const Sample& sample : *samples) {
      data = data || (std::isfinite(sample.value) && sample.value != 0);
    }
    EXPECT_TRUE(data) << query.where
                      << " has no finite, non-zero value: " << expr << " -> ["
                      << Describe(*samples) << "]";
    ++checked;

    // The latency panels show both transports.
    if (expr.find("pagealloc_rpc_duration_seconds_bucket") !=
        std::string::npos) {
      std::set<std::string> transports;
      for (const Sample& sample : *samples) {
        if (std::isfinite(sample.value) && sample.value > 0) {
          auto transport = sample.labels.find("transport");
          transports.insert(
              transport == sample.labels.end() ? "(none)" : transport->second);
        }
      }
      EXPECT_EQ(transports, (std::set<std::string>{"fast_channel", "grpc"}))
          << query.where << ": " << Describe(*samples);
    }
  }
  EXPECT_EQ(checked, dashboard.queries.size());
  EXPECT_GT(checked, 30);

  kv_context.TryCancel();
  while (kv_reader->Read(&kv_batch)) {
  }
  kv_reader->Finish();
  std::remove(absl::StrCat(kv_events_dir, "/pub").c_str());
  std::remove(absl::StrCat(kv_events_dir, "/replay").c_str());
  rmdir(kv_events_dir);
}

}  // namespace
}  // namespace pagealloc
