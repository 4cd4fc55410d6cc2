#include "server/metrics.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/version.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "server/process_stats.h"

namespace pagealloc {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

void AddGauge(MetricFamily& family, double value,
              std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric metric;
  metric.label = std::move(labels);
  metric.gauge.value = value;
  family.metric.push_back(std::move(metric));
}

void AddCounter(MetricFamily& family, double value,
                std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric metric;
  metric.label = std::move(labels);
  metric.counter.value = value;
  family.metric.push_back(std::move(metric));
}

MetricFamily Gauge(std::string name, std::string help, double value) {
  MetricFamily family =
      Family(std::move(name), std::move(help), MetricType::Gauge);
  AddGauge(family, value);
  return family;
}

MetricFamily Counter(std::string name, std::string help, double value) {
  MetricFamily family =
      Family(std::move(name), std::move(help), MetricType::Counter);
  AddCounter(family, value);
  return family;
}

void AddHistogram(MetricFamily& family, const AtomicHistogram& histogram,
                  std::vector<ClientMetric::Label> labels = {}) {
  const AtomicHistogram::Snapshot snapshot = histogram.Take();
  ClientMetric metric;
  metric.label = std::move(labels);
  metric.histogram.sample_count = snapshot.count;
  metric.histogram.sample_sum = snapshot.sum;
  for (size_t i = 0; i < snapshot.upper_bounds.size(); ++i) {
    metric.histogram.bucket.push_back(
        {snapshot.cumulative_counts[i], snapshot.upper_bounds[i]});
  }
  metric.histogram.bucket.push_back({snapshot.cumulative_counts.back(),
                                     std::numeric_limits<double>::infinity()});
  family.metric.push_back(std::move(metric));
}

MetricFamily Histogram(std::string name, std::string help,
                       const AtomicHistogram& histogram) {
  MetricFamily family =
      Family(std::move(name), std::move(help), MetricType::Histogram);
  AddHistogram(family, histogram);
  return family;
}

}  // namespace

MetricsExporter::MetricsExporter(PagePool* pool, SessionRegistry* sessions,
                                 CallCore* core, Batcher* batcher,
                                 Backend* backend,
                                 const FastChannelServer* fast_channels,
                                 const MemorySocketServer* memory_socket,
                                 const HandoffThreads* grpc_answer_senders)
    : pool_(pool),
      sessions_(sessions),
      core_(core),
      batcher_(batcher),
      backend_(backend),
      fast_channels_(fast_channels),
      memory_socket_(memory_socket),
      grpc_answer_senders_(grpc_answer_senders) {}

std::string MetricsExporter::Render() const {
  const PoolStats stats = pool_->Stats();
  std::vector<MetricFamily> families;

  // Pool.
  MetricFamily pages = Family("pagealloc_pool_pages",
                              "Pages of the pool by state (page 0 excluded).",
                              MetricType::Gauge);
  AddGauge(pages, stats.free_pages, {{"state", "free"}});
  AddGauge(pages, stats.parked_pages, {{"state", "parked"}});
  AddGauge(pages, stats.used_pages, {{"state", "used"}});
  families.push_back(std::move(pages));
  families.push_back(Gauge("pagealloc_pool_capacity_pages",
                           "Usable pages in the pool.", stats.total_pages));
  families.push_back(
      Gauge("pagealloc_pool_usage_ratio", "Used pages over usable pages.",
            stats.total_pages > 0
                ? static_cast<double>(stats.used_pages) / stats.total_pages
                : 0));
  families.push_back(
      Gauge("pagealloc_page_size_tokens", "Tokens per page.", stats.page_size));
  // The KV slab (0 when the daemon owns no KV memory).
  const KvSlab* slab = backend_->kv_slab();
  families.push_back(Gauge(
      "pagealloc_kv_slab_bytes",
      "Bytes of the KV slab the daemon owns (0: it hands out indices only).",
      slab != nullptr ? slab->geometry.total_bytes : 0));
  families.push_back(Gauge("pagealloc_kv_slab_buffers",
                           "KV buffers in the slab.",
                           slab != nullptr ? slab->layout.buffers.size() : 0));
  families.push_back(
      Gauge("pagealloc_kv_slab_page_bytes",
            "Bytes one page takes across every KV buffer.",
            slab != nullptr ? slab->geometry.bytes_per_page : 0));
  families.push_back(Gauge("pagealloc_kv_slab_pages",
                           "Usable pages the KV slab holds.",
                           slab != nullptr ? slab->geometry.num_pages : 0));
  families.push_back(
      Counter("pagealloc_kv_pages_scrubbed_total",
              "Pages zeroed in every KV buffer before going to a session "
              "other than their last owner (--kv_scrub).",
              stats.pages_scrubbed));
  const DeviceDescription device = backend_->DescribeDevice();
  const bool cuda = device.kind == BackendKind::kCuda;
  MetricFamily build =
      Family("pagealloc_build_info", "Always 1; labels describe the daemon.",
             MetricType::Gauge);
  AddGauge(
      build, 1,
      {{"version", kPageallocVersion},
       {"backend", cuda ? "cuda" : "cpu"},
       {"gpu", cuda ? absl::StrFormat("%d", device.gpu) : ""},
       {"device_uuid", device.device_uuid},
       {"cuda_mps", cuda ? (device.cuda_mps ? "true" : "false") : ""},
       {"free_policy", std::string(FreePolicyName(pool_->free_policy()))}});
  families.push_back(std::move(build));

  // Allocation counters.
  families.push_back(Counter("pagealloc_slots_allocated_total",
                             "Token slots handed out.", stats.slots_allocated));
  families.push_back(Counter("pagealloc_pages_allocated_total",
                             "Pages taken from the free list.",
                             stats.pages_allocated));
  families.push_back(Counter(
      "pagealloc_pages_freed_total",
      "Pages returned by Free, Rollback and session ends.", stats.pages_freed));
  families.push_back(Counter("pagealloc_out_of_pages_total",
                             "Requests refused because the pool was short.",
                             stats.out_of_pages_refusals));
  families.push_back(Counter("pagealloc_quota_refusals_total",
                             "Requests refused by their session's quota.",
                             stats.quota_refusals));
  families.push_back(Counter("pagealloc_free_list_sorts_total",
                             "Merges of parked pages (sorted policy).",
                             stats.free_list_sorts));
  families.push_back(Counter("pagealloc_launches_total",
                             "Executor launches (batches).",
                             batcher_->launches()));

  // Sessions.
  const std::vector<std::shared_ptr<Session>> sessions = sessions_->List();
  std::map<std::string, std::pair<double, double>> by_client;  // pages, quota
  for (const std::shared_ptr<Session>& session : sessions) {
    std::string name = session->client_name();
    if (!by_client.count(name) &&
        static_cast<int>(by_client.size()) >= kMaxClientLabels) {
      name = "other";
    }
    auto it = stats.owners.find(session->id());
    auto& [owned, quota] = by_client[name];
    owned += it != stats.owners.end() ? it->second.pages_owned : 0;
    quota += session->quota_pages();
  }
  MetricFamily owned =
      Family("pagealloc_session_pages", "Pages owned, by client name.",
             MetricType::Gauge);
  MetricFamily quota =
      Family("pagealloc_session_quota_pages",
             "Page quota (0: none), by client name.", MetricType::Gauge);
  for (const auto& [name, figures] : by_client) {
    AddGauge(owned, figures.first, {{"client", name}});
    AddGauge(quota, figures.second, {{"client", name}});
  }
  families.push_back(std::move(owned));
  families.push_back(std::move(quota));
  const SessionCounters& counters = core_->counters();
  families.push_back(
      Gauge("pagealloc_sessions_active", "Live sessions.", sessions.size()));
  families.push_back(Counter("pagealloc_sessions_opened_total",
                             "Sessions registered.", counters.sessions_opened));
  families.push_back(Counter("pagealloc_sessions_closed_total",
                             "Sessions ended, cleanly or not.",
                             counters.sessions_closed));
  families.push_back(Counter("pagealloc_sessions_reclaimed_total",
                             "Sessions ended because their lease ran out.",
                             counters.sessions_reclaimed));
  families.push_back(
      Counter("pagealloc_pages_reclaimed_total",
              "Pages freed because their session's lease ran out.",
              counters.pages_reclaimed));
  // Fast-channel abuse, by reason; both reasons from the start.
  MetricFamily throttled =
      Family("pagealloc_sessions_throttled_total",
             "Throttles of sessions abusing their fast channel, by reason.",
             MetricType::Counter);
  MetricFamily dropped =
      Family("pagealloc_sessions_dropped_total",
             "Sessions dropped for abusing their fast channel, by reason.",
             MetricType::Counter);
  for (int a = 0; a < FastChannelServer::kNumAbuses; ++a) {
    const auto abuse = static_cast<FastChannelServer::Abuse>(a);
    const std::vector<ClientMetric::Label> reason = {
        {"reason", FastChannelServer::AbuseName(abuse)}};
    AddCounter(throttled,
               fast_channels_ != nullptr ? fast_channels_->throttled(abuse) : 0,
               reason);
    AddCounter(dropped,
               fast_channels_ != nullptr ? fast_channels_->dropped(abuse) : 0,
               reason);
  }
  families.push_back(std::move(throttled));
  families.push_back(std::move(dropped));

  // The memory socket's unauthenticated connections (memory_socket_server.h).
  families.push_back(
      Gauge("pagealloc_memory_socket_pending_hellos",
            "Memory socket connections waiting for their Hello now.",
            memory_socket_ != nullptr ? memory_socket_->pending_hellos() : 0));
  MetricFamily shed =
      Family("pagealloc_memory_socket_shed_total",
             "Memory socket connections closed before their Hello, by reason: "
             "over the per-peer or the total bound, or past the deadline.",
             MetricType::Counter);
  for (int r = 0; r < MemorySocketServer::kNumShedReasons; ++r) {
    const auto reason = static_cast<MemorySocketServer::Shed>(r);
    AddCounter(
        shed,
        memory_socket_ != nullptr ? memory_socket_->shed_total(reason) : 0,
        {{"reason", std::string(MemorySocketServer::ShedName(reason))}});
  }
  families.push_back(std::move(shed));

  // Calls by method, transport and code, and their latency. A method's
  // series exist from the start (OK at 0, an empty histogram) for each
  // transport that carries it, so that rates and ratios have a base; other
  // codes appear when they first occur. KeepAlive streams are counted like
  // calls but timed in a histogram of their own (RpcMetrics::Record).
  const RpcMetrics& rpc = core_->rpc_metrics();
  MetricFamily requests =
      Family("pagealloc_requests_total",
             "Calls answered, by method, status code and transport "
             "(KeepAlive: streams ended).",
             MetricType::Counter);
  MetricFamily latency =
      Family("pagealloc_rpc_duration_seconds",
             "Time from a call's arrival to its answer, by method and "
             "transport (KeepAlive excluded).",
             MetricType::Histogram);
  for (int r = 0; r < kNumMethods; ++r) {
    const Method method = static_cast<Method>(r);
    for (const Transport transport :
         {Transport::kGrpc, Transport::kFastChannel}) {
      const bool carried = TransportCarries(transport, method);
      for (int c = 0; c < kNumStatusCodes; ++c) {
        const absl::StatusCode code = static_cast<absl::StatusCode>(c);
        const int64_t n = rpc.count(method, transport, code);
        if (n > 0 || (carried && code == absl::StatusCode::kOk)) {
          AddCounter(requests, n,
                     {{"rpc", MethodName(method)},
                      {"code", absl::StatusCodeToString(code)},
                      {"transport", TransportName(transport)}});
        }
      }
      if (method == Method::kKeepAlive) continue;
      const AtomicHistogram& histogram = rpc.latency(method, transport);
      if (carried || histogram.Take().count > 0) {
        AddHistogram(latency, histogram,
                     {{"rpc", MethodName(method)},
                      {"transport", TransportName(transport)}});
      }
    }
  }
  families.push_back(std::move(requests));
  families.push_back(std::move(latency));
  families.push_back(Histogram(
      "pagealloc_keepalive_stream_seconds",
      "How long each KeepAlive stream was open (about its session's life).",
      rpc.keepalive_stream()));

  // Batches.
  const BatcherMetrics& batches = batcher_->metrics();
  families.push_back(Histogram("pagealloc_batch_requests",
                               "Requests per launch.",
                               batches.requests_per_batch));
  families.push_back(Histogram("pagealloc_batch_tokens",
                               "Slots written per launch.",
                               batches.tokens_per_batch));
  families.push_back(Histogram("pagealloc_queue_wait_seconds",
                               "Time a call waited for its launch.",
                               batches.queue_wait_seconds));
  families.push_back(Histogram(
      "pagealloc_execute_seconds",
      "Planning plus the executor's launch (and its wait in sync mode).",
      batches.execute_seconds));
  families.push_back(Histogram(
      "pagealloc_complete_seconds",
      "The part of execute spent completing a launch: waiting for the GPU "
      "(sync) or recording the completion event (async).",
      batches.complete_seconds));

  // The threads that spin while calls flow, and whether they sleep now.
  MetricFamily asleep = Family(
      "pagealloc_thread_asleep",
      "1 while the thread sleeps waiting for work (neither spinning nor "
      "working), by thread: the batcher thread, each fast-channel poller, "
      "the threads that send gRPC answers of shared launches.",
      MetricType::Gauge);
  MetricFamily budget = Family(
      "pagealloc_spin_budget_seconds",
      "How long the thread spins now after its last piece of work before it "
      "sleeps (its adaptive spin; at most the spin flag), by thread.",
      MetricType::Gauge);
  AddGauge(asleep, batcher_->thread_asleep() ? 1 : 0, {{"thread", "batcher"}});
  AddGauge(budget, absl::ToDoubleSeconds(batcher_->spin_budget()),
           {{"thread", "batcher"}});
  if (fast_channels_ != nullptr) {
    for (int i = 0; i < fast_channels_->pollers(); ++i) {
      const std::string name = absl::StrCat("poller", i);
      AddGauge(asleep, fast_channels_->poller_asleep(i) ? 1 : 0,
               {{"thread", name}});
      AddGauge(budget,
               absl::ToDoubleSeconds(fast_channels_->poller_spin_budget(i)),
               {{"thread", name}});
    }
  }
  if (grpc_answer_senders_ != nullptr) {
    for (int i = 0; i < grpc_answer_senders_->size(); ++i) {
      const HandoffThread& sender = grpc_answer_senders_->thread(i);
      const std::string name = absl::StrCat("grpc_answers", i);
      AddGauge(asleep, sender.asleep() ? 1 : 0, {{"thread", name}});
      AddGauge(budget, absl::ToDoubleSeconds(sender.spin_budget()),
               {{"thread", name}});
    }
  }
  families.push_back(std::move(asleep));
  families.push_back(std::move(budget));

  // The process, under the names every Prometheus client library uses.
  // Left out where /proc cannot be read.
  const absl::StatusOr<ProcessStats> process = ReadProcessStats();
  if (process.ok()) {
    families.push_back(Counter("process_cpu_seconds_total",
                               "Total user and system CPU time spent in "
                               "seconds.",
                               process->cpu_seconds));
    families.push_back(Gauge("process_resident_memory_bytes",
                             "Resident memory size in bytes.",
                             process->resident_memory_bytes));
    families.push_back(Gauge("process_virtual_memory_bytes",
                             "Virtual memory size in bytes.",
                             process->virtual_memory_bytes));
    families.push_back(Gauge("process_open_fds",
                             "Number of open file descriptors.",
                             process->open_fds));
    families.push_back(Gauge("process_max_fds",
                             "Maximum number of open file descriptors.",
                             process->max_fds));
    families.push_back(Gauge("process_start_time_seconds",
                             "Start time of the process since unix epoch in "
                             "seconds.",
                             process->start_time_seconds));
  }

  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace pagealloc
