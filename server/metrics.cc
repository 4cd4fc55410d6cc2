#include "server/metrics.h"

#include <map>
#include <set>
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

void AddReserveFamilies(const FastChannelServer* fast_channels,
                        const std::vector<std::shared_ptr<Session>>& sessions,
                        std::vector<MetricFamily>& families) {
  // Session page reserves (client/page_reserve.h): what each client
  // reports of its reserve is a hint, shown as such (summed by client
  // name, as pagealloc_session_pages); the asks and their latency are the
  // daemon's own.
  std::map<uint64_t, std::string> names;
  std::set<std::string> labels;
  for (const std::shared_ptr<Session>& session : sessions) {
    std::string name = session->client_name();
    if (!labels.count(name) &&
        static_cast<int>(labels.size()) >= MetricsExporter::kMaxClientLabels) {
      name = "other";
    }
    labels.insert(name);
    names[session->id()] = name;
  }
  struct Figures {
    double pages = 0, refills = 0, returns = 0;
  };
  std::map<std::string, Figures> by_client;
  int64_t reclaim_asks = 0;
  int64_t reclaim_returns = 0;
  if (fast_channels != nullptr) {
    for (const FastChannelServer::SessionReserve& reserve :
         fast_channels->SessionReserves()) {
      auto it = names.find(reserve.session_id);
      if (it == names.end()) continue;  // ended meanwhile
      Figures& figures = by_client[it->second];
      figures.pages += reserve.pages;
      figures.refills += reserve.refills;
      figures.returns += reserve.returns;
    }
    reclaim_asks = fast_channels->reclaim_asks();
    reclaim_returns = fast_channels->reclaim_returns();
  }
  MetricFamily pages =
      Family("pagealloc_session_reserve_pages",
             "Pages in the sessions' reserves, by client name, as the "
             "clients report them (a hint).",
             MetricType::Gauge);
  MetricFamily refills =
      Family("pagealloc_session_reserve_refills",
             "Refills of the live sessions' reserves, by client name, as the "
             "clients report them.",
             MetricType::Gauge);
  MetricFamily returns =
      Family("pagealloc_session_reserve_returns",
             "Returns from the live sessions' reserves, by client name, as "
             "the clients report them.",
             MetricType::Gauge);
  for (const auto& [name, figures] : by_client) {
    AddGauge(pages, figures.pages, {{"client", name}});
    AddGauge(refills, figures.refills, {{"client", name}});
    AddGauge(returns, figures.returns, {{"client", name}});
  }
  families.push_back(std::move(pages));
  families.push_back(std::move(refills));
  families.push_back(std::move(returns));
  families.push_back(Counter(
      "pagealloc_reserve_reclaim_asks_total",
      "Asks sent to sessions for their unused reserve (another session's "
      "allocation found the pool short).",
      reclaim_asks));
  families.push_back(Counter(
      "pagealloc_reserve_reclaim_returns_total",
      "Asks answered by a return call of the asked session.", reclaim_returns));
  if (fast_channels != nullptr) {
    families.push_back(Histogram(
        "pagealloc_reserve_reclaim_seconds",
        "Time from an ask for a session's reserve to its return call.",
        fast_channels->reclaim_latency()));
  }
}

}  // namespace

namespace {

using Families = std::vector<MetricFamily>;

// The pool's pages and the KV slab's figures.
void AddPoolFamilies(const PoolStats& stats, const Backend& backend,
                     Families* out) {
  MetricFamily pages = Family("pagealloc_pool_pages",
                              "Pages of the pool by state (page 0 excluded).",
                              MetricType::Gauge);
  AddGauge(pages, stats.free_pages, {{"state", "free"}});
  AddGauge(pages, stats.parked_pages, {{"state", "parked"}});
  AddGauge(pages, stats.used_pages, {{"state", "used"}});
  out->push_back(std::move(pages));
  out->push_back(Gauge("pagealloc_pool_capacity_pages",
                       "Usable pages in the pool.", stats.total_pages));
  out->push_back(
      Gauge("pagealloc_pool_usage_ratio", "Used pages over usable pages.",
            stats.total_pages > 0
                ? static_cast<double>(stats.used_pages) / stats.total_pages
                : 0));
  out->push_back(
      Gauge("pagealloc_page_size_tokens", "Tokens per page.", stats.page_size));
  // The KV slab (0 when the daemon owns no KV memory).
  const KvSlab* slab = backend.kv_slab();
  out->push_back(Gauge(
      "pagealloc_kv_slab_bytes",
      "Bytes of the KV slab the daemon owns (0: it hands out indices only).",
      slab != nullptr ? slab->geometry.total_bytes : 0));
  out->push_back(Gauge("pagealloc_kv_slab_buffers", "KV buffers in the slab.",
                       slab != nullptr ? slab->layout.buffers.size() : 0));
  out->push_back(Gauge("pagealloc_kv_slab_page_bytes",
                       "Bytes one page takes across every KV buffer.",
                       slab != nullptr ? slab->geometry.bytes_per_page : 0));
  out->push_back(Gauge("pagealloc_kv_slab_pages",
                       "Usable pages the KV slab holds.",
                       slab != nullptr ? slab->geometry.num_pages : 0));
  out->push_back(
      Counter("pagealloc_kv_pages_scrubbed_total",
              "Pages zeroed in every KV buffer before going to a session "
              "other than their last owner (--kv_scrub).",
              stats.pages_scrubbed));
}

// The pool kept across restarts (--keep_state): how this start found the
// kept state, whether it is being kept, and the journal's figures.
void AddKeptStateFamilies(const KeptState* kept, Families* out) {
  const KeptStateStats stats =
      kept != nullptr ? kept->stats() : KeptStateStats();
  MetricFamily recovery = Family(
      "pagealloc_state_recovery",
      "1 for how this start found the pool's kept state (--keep_state): "
      "none kept, recovered, corrupt (failed a check: a fresh pool, every "
      "session gone), discarded (refused, dropped by --discard_state); all "
      "0 without --keep_state.",
      MetricType::Gauge);
  for (KeptStateOutcome outcome :
       {KeptStateOutcome::kNone, KeptStateOutcome::kRecovered,
        KeptStateOutcome::kCorrupt, KeptStateOutcome::kDiscarded}) {
    AddGauge(recovery, kept != nullptr && stats.outcome == outcome ? 1 : 0,
             {{"outcome", std::string(KeptStateOutcomeName(outcome))}});
  }
  out->push_back(std::move(recovery));
  out->push_back(Gauge("pagealloc_state_kept",
                       "1 while every change to the pool is journaled in the "
                       "kept state (the service manager's store, or this "
                       "daemon's own for a successor); 0 without "
                       "--keep_state or once a change could not be kept "
                       "(the log says why).",
                       stats.keeping ? 1 : 0));
  out->push_back(Gauge("pagealloc_state_outlives_crash",
                       "1 while the kept state's descriptors are held where "
                       "a crash of the daemon leaves them: the service "
                       "manager's store, or a live descriptor keeper "
                       "(--fd_keeper); 0 otherwise (a crash now loses the "
                       "pool).",
                       stats.outlives_crash ? 1 : 0));
  out->push_back(Gauge("pagealloc_state_starts",
                       "Starts of the daemon on this kept pool (1: the first).",
                       stats.identity.starts));
  out->push_back(Counter("pagealloc_state_records_total",
                         "Change records journaled since start.",
                         stats.records));
  out->push_back(Counter("pagealloc_state_record_bytes_total",
                         "Bytes of the change records journaled since start.",
                         stats.record_bytes));
  out->push_back(Counter("pagealloc_state_snapshots_total",
                         "Snapshots of the pool written since start.",
                         stats.snapshots));
  out->push_back(Gauge("pagealloc_state_log_bytes",
                       "Bytes of the journal's log in use since its last "
                       "snapshot.",
                       stats.log_bytes_used));
  out->push_back(Gauge("pagealloc_state_recovery_seconds",
                       "Time from taking the kept state to keeping it again "
                       "at this start.",
                       stats.recovery_seconds));
}

// The shared prefix pages: by state, lookups and hits in tokens, pages
// published, adopted and evicted by reason. Adopt latency is MatchPrefix's
// pagealloc_rpc_duration_seconds.
void AddPrefixFamilies(const PoolStats& stats, Families* out) {
  MetricFamily pages = Family(
      "pagealloc_prefix_pages",
      "Shared prefix pages by state: published (held by a session), cached "
      "(held by none, KV valid), pinned (never evicted; either state), "
      "evictable (cached, not pinned).",
      MetricType::Gauge);
  AddGauge(pages, stats.published_pages, {{"state", "published"}});
  AddGauge(pages, stats.cached_pages, {{"state", "cached"}});
  AddGauge(pages, stats.pinned_pages, {{"state", "pinned"}});
  AddGauge(pages, stats.evictable_pages, {{"state", "evictable"}});
  out->push_back(std::move(pages));
  out->push_back(Counter("pagealloc_prefix_lookup_tokens_total",
                         "Tokens of the key chains MatchPrefix looked up.",
                         stats.prefix_lookup_pages * stats.page_size));
  out->push_back(Counter(
      "pagealloc_prefix_hit_tokens_total",
      "Tokens of the prefixes MatchPrefix found (over lookup: the hit rate).",
      stats.prefix_hit_pages * stats.page_size));
  out->push_back(Counter("pagealloc_prefix_published_pages_total",
                         "Pages newly published under a key.",
                         stats.prefix_pages_published));
  out->push_back(Counter("pagealloc_prefix_adopted_pages_total",
                         "References taken on shared pages by adopts.",
                         stats.prefix_pages_adopted));
  MetricFamily evicted = Family(
      "pagealloc_prefix_evicted_pages_total",
      "Cached pages evicted, by reason: allocation (a launch the free list "
      "could not serve), reset (ResetPrefixCache).",
      MetricType::Counter);
  AddCounter(evicted, stats.prefix_evicted_for_allocation,
             {{"reason", "allocation"}});
  AddCounter(evicted, stats.prefix_evicted_by_reset, {{"reason", "reset"}});
  out->push_back(std::move(evicted));
}

// pagealloc_build_info: always 1, its labels describe the daemon.
void AddBuildInfo(const Backend& backend, FreePolicy free_policy,
                  Families* out) {
  const DeviceDescription device = backend.DescribeDevice();
  const bool cuda = device.kind == BackendKind::kCuda;
  MetricFamily build =
      Family("pagealloc_build_info", "Always 1; labels describe the daemon.",
             MetricType::Gauge);
  AddGauge(build, 1,
           {{"version", kPageallocVersion},
            {"backend", cuda ? "cuda" : "cpu"},
            {"gpu", cuda ? absl::StrFormat("%d", device.gpu) : ""},
            {"device_uuid", device.device_uuid},
            {"cuda_mps", cuda ? (device.cuda_mps ? "true" : "false") : ""},
            {"free_policy", std::string(FreePolicyName(free_policy))}});
  out->push_back(std::move(build));
}

void AddAllocationFamilies(const PoolStats& stats, int64_t launches,
                           Families* out) {
  out->push_back(Counter("pagealloc_slots_allocated_total",
                         "Token slots handed out.", stats.slots_allocated));
  out->push_back(Counter("pagealloc_pages_allocated_total",
                         "Pages taken from the free list.",
                         stats.pages_allocated));
  out->push_back(Counter("pagealloc_pages_freed_total",
                         "Pages returned by Free, Rollback and session ends.",
                         stats.pages_freed));
  out->push_back(Counter("pagealloc_out_of_pages_total",
                         "Requests refused because the pool was short.",
                         stats.out_of_pages_refusals));
  out->push_back(Counter("pagealloc_quota_refusals_total",
                         "Requests refused by their session's quota.",
                         stats.quota_refusals));
  out->push_back(Counter("pagealloc_free_list_sorts_total",
                         "Merges of parked pages (sorted policy).",
                         stats.free_list_sorts));
  out->push_back(Counter("pagealloc_launches_total",
                         "Executor launches (batches).", launches));
}

// Sessions' pages and quotas by client name (at most kMaxClientLabels
// names, the rest as "other"), and sessions' comings and goings.
void AddSessionFamilies(const PoolStats& stats,
                        const std::vector<std::shared_ptr<Session>>& sessions,
                        const SessionCounters& counters, Families* out) {
  std::map<std::string, std::pair<double, double>> by_client;  // pages, quota
  for (const std::shared_ptr<Session>& session : sessions) {
    std::string name = session->client_name();
    if (!by_client.count(name) && static_cast<int>(by_client.size()) >=
                                      MetricsExporter::kMaxClientLabels) {
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
  out->push_back(std::move(owned));
  out->push_back(std::move(quota));
  out->push_back(
      Gauge("pagealloc_sessions_active", "Live sessions.", sessions.size()));
  int64_t detached = 0;
  for (const std::shared_ptr<Session>& session : sessions) {
    detached += session->link() == SessionLink::kDetached;
  }
  out->push_back(Gauge("pagealloc_sessions_detached",
                       "Resumable sessions whose client's connection closed, "
                       "kept for a Resume until their lease runs out.",
                       detached));
  out->push_back(Counter("pagealloc_sessions_detached_total",
                         "Resumable sessions kept when their client's "
                         "connection closed.",
                         counters.sessions_detached));
  MetricFamily resumes = Family(
      "pagealloc_session_resumes_total",
      "Resume calls, by outcome: resumed, taken_over (from a connected "
      "client), or refused (not_found, unauthenticated, still_connected, "
      "refused).",
      MetricType::Counter);
  for (int o = 0; o < kNumResumeOutcomes; ++o) {
    AddCounter(resumes, counters.resumes[o].load(std::memory_order_relaxed),
               {{"outcome", ResumeOutcomeName(static_cast<ResumeOutcome>(o))}});
  }
  out->push_back(std::move(resumes));
  out->push_back(Counter("pagealloc_sessions_opened_total",
                         "Sessions registered.", counters.sessions_opened));
  out->push_back(Counter("pagealloc_sessions_closed_total",
                         "Sessions ended, cleanly or not.",
                         counters.sessions_closed));
  out->push_back(Counter("pagealloc_sessions_reclaimed_total",
                         "Sessions ended because their lease ran out.",
                         counters.sessions_reclaimed));
  out->push_back(Counter("pagealloc_pages_reclaimed_total",
                         "Pages freed because their session's lease ran out.",
                         counters.pages_reclaimed));
}

// The release fence: pages waiting for their session's fence, and how
// long fenced frees waited.
void AddReleaseFamilies(const CallCore& core, Families* out) {
  out->push_back(Gauge("pagealloc_release_pending_pages",
                       "Pages freed with a release fence that has not passed "
                       "yet (still owned by their sessions).",
                       core.release_pending_pages()));
  out->push_back(Counter("pagealloc_pages_released_total",
                         "Pages freed into the pool once their release fence "
                         "passed.",
                         core.pages_released()));
  out->push_back(Histogram("pagealloc_release_fence_wait_seconds",
                           "Time from a fenced free's arrival to its release "
                           "fence being seen to pass.",
                           core.release_wait()));
}

// Sessions' memory budgets, by memory ("host"; "gpu" on CUDA).
void AddBudgetFamilies(const std::vector<const MemoryBudget*>& budgets,
                       Families* out) {
  MetricFamily budget_bytes = Family(
      "pagealloc_session_memory_budget_bytes",
      "Budget of the memory sessions make the daemon allocate (rings, fast "
      "channels), by memory.",
      MetricType::Gauge);
  MetricFamily budget_used =
      Family("pagealloc_session_memory_used_bytes",
             "Memory charged to the sessions' budget now, by memory.",
             MetricType::Gauge);
  MetricFamily budget_refusals =
      Family("pagealloc_session_memory_refusals_total",
             "Rings and fast channels refused for want of budget, by memory.",
             MetricType::Counter);
  for (const MemoryBudget* budget : budgets) {
    const std::vector<ClientMetric::Label> memory = {
        {"memory", budget->name()}};
    AddGauge(budget_bytes, budget->limit(), memory);
    AddGauge(budget_used, budget->used(), memory);
    AddCounter(budget_refusals, budget->refusals(), memory);
  }
  out->push_back(std::move(budget_bytes));
  out->push_back(std::move(budget_used));
  out->push_back(std::move(budget_refusals));
}

// Fast-channel abuse, by reason; both reasons from the start (0 without a
// fast channel).
void AddAbuseFamilies(const FastChannelServer* fast_channels, Families* out) {
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
               fast_channels != nullptr ? fast_channels->throttled(abuse) : 0,
               reason);
    AddCounter(dropped,
               fast_channels != nullptr ? fast_channels->dropped(abuse) : 0,
               reason);
  }
  out->push_back(std::move(throttled));
  out->push_back(std::move(dropped));
}

// The memory socket's unauthenticated connections (memory_socket_server.h).
void AddMemorySocketFamilies(const MemorySocketServer* memory_socket,
                             Families* out) {
  out->push_back(
      Gauge("pagealloc_memory_socket_pending_hellos",
            "Memory socket connections waiting for their Hello now.",
            memory_socket != nullptr ? memory_socket->pending_hellos() : 0));
  MetricFamily shed =
      Family("pagealloc_memory_socket_shed_total",
             "Memory socket connections closed before their Hello, by reason: "
             "over the per-peer or the total bound, or past the deadline.",
             MetricType::Counter);
  for (int r = 0; r < MemorySocketServer::kNumShedReasons; ++r) {
    const auto reason = static_cast<MemorySocketServer::Shed>(r);
    AddCounter(shed,
               memory_socket != nullptr ? memory_socket->shed_total(reason) : 0,
               {{"reason", std::string(MemorySocketServer::ShedName(reason))}});
  }
  out->push_back(std::move(shed));
}

// Calls by method, transport and code, and their latency. A method's
// series exist from the start (OK at 0, an empty histogram) for each
// transport that carries it, so that rates and ratios have a base; other
// codes appear when they first occur. KeepAlive streams are counted like
// calls but timed in a histogram of their own (RpcMetrics::Record).
void AddRpcFamilies(const RpcMetrics& rpc, Families* out) {
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
  out->push_back(std::move(requests));
  out->push_back(std::move(latency));
  out->push_back(Histogram(
      "pagealloc_keepalive_stream_seconds",
      "How long each KeepAlive stream was open (about its session's life).",
      rpc.keepalive_stream()));
}

void AddBatchFamilies(const BatcherMetrics& batches, Families* out) {
  out->push_back(Histogram("pagealloc_batch_requests", "Requests per launch.",
                           batches.requests_per_batch));
  out->push_back(Histogram("pagealloc_batch_tokens",
                           "Slots written per launch.",
                           batches.tokens_per_batch));
  out->push_back(Histogram("pagealloc_queue_wait_seconds",
                           "Time a call waited for its launch.",
                           batches.queue_wait_seconds));
  out->push_back(Histogram(
      "pagealloc_execute_seconds",
      "Planning plus the executor's launch (and its wait in sync mode).",
      batches.execute_seconds));
  out->push_back(Histogram(
      "pagealloc_complete_seconds",
      "The part of execute spent completing a launch: waiting for the GPU "
      "(sync) or recording the completion event (async).",
      batches.complete_seconds));
}

// The threads that spin while calls flow, and whether they sleep now.
void AddThreadFamilies(const Batcher& batcher,
                       const FastChannelServer* fast_channels,
                       const HandoffThreads* answer_senders, Families* out) {
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
  AddGauge(asleep, batcher.thread_asleep() ? 1 : 0, {{"thread", "batcher"}});
  AddGauge(budget, absl::ToDoubleSeconds(batcher.spin_budget()),
           {{"thread", "batcher"}});
  if (fast_channels != nullptr) {
    for (int i = 0; i < fast_channels->pollers(); ++i) {
      const std::string name = absl::StrCat("poller", i);
      AddGauge(asleep, fast_channels->poller_asleep(i) ? 1 : 0,
               {{"thread", name}});
      AddGauge(budget,
               absl::ToDoubleSeconds(fast_channels->poller_spin_budget(i)),
               {{"thread", name}});
    }
  }
  if (answer_senders != nullptr) {
    for (int i = 0; i < answer_senders->size(); ++i) {
      const HandoffThread& sender = answer_senders->thread(i);
      const std::string name = absl::StrCat("grpc_answers", i);
      AddGauge(asleep, sender.asleep() ? 1 : 0, {{"thread", name}});
      AddGauge(budget, absl::ToDoubleSeconds(sender.spin_budget()),
               {{"thread", name}});
    }
  }
  out->push_back(std::move(asleep));
  out->push_back(std::move(budget));
}

// The process, under the names every Prometheus client library uses. Left
// out where /proc cannot be read.
void AddProcessFamilies(Families* out) {
  const absl::StatusOr<ProcessStats> process = ReadProcessStats();
  if (process.ok()) {
    out->push_back(Counter("process_cpu_seconds_total",
                           "Total user and system CPU time spent in "
                           "seconds.",
                           process->cpu_seconds));
    out->push_back(Gauge("process_resident_memory_bytes",
                         "Resident memory size in bytes.",
                         process->resident_memory_bytes));
    out->push_back(Gauge("process_virtual_memory_bytes",
                         "Virtual memory size in bytes.",
                         process->virtual_memory_bytes));
    out->push_back(Gauge("process_open_fds", "Number of open file descriptors.",
                         process->open_fds));
    out->push_back(Gauge("process_max_fds",
                         "Maximum number of open file descriptors.",
                         process->max_fds));
    out->push_back(Gauge("process_start_time_seconds",
                         "Start time of the process since unix epoch in "
                         "seconds.",
                         process->start_time_seconds));
  }
}

// The KV-event publisher's counters (zeros when the daemon publishes none).
void AddKvEventFamilies(const KvEventPublisher* kv_events, Families* out) {
  const KvEventPublisherStats stats =
      kv_events != nullptr ? kv_events->stats() : KvEventPublisherStats{};
  out->push_back(Counter("pagealloc_kv_events_published_total",
                         "KV events sent to routers, in batches",
                         stats.events_published));
  out->push_back(Counter("pagealloc_kv_event_batches_published_total",
                         "KV-event batches sent (each one sequence number)",
                         stats.batches_published));
  out->push_back(Counter("pagealloc_kv_events_dropped_total",
                         "KV events dropped on a full queue",
                         stats.events_dropped));
  out->push_back(
      Counter("pagealloc_kv_event_sequence_gaps_total",
              "KV-event sequence numbers skipped where events were dropped",
              stats.sequence_gaps));
  out->push_back(Counter("pagealloc_kv_event_replay_requests_total",
                         "KV-event replay requests on the ROUTER socket",
                         stats.replay_requests));
  out->push_back(Counter(
      "pagealloc_kv_event_replay_requests_rejected_total",
      "KV-event replay requests that were malformed (answered with the end "
      "marker alone)",
      stats.replay_requests_rejected));
  out->push_back(Gauge("pagealloc_kv_event_subscribers",
                       "SubscribeKvEvents streams open", stats.followers));
  out->push_back(Gauge("pagealloc_kv_events_queued",
                       "KV events waiting in the publisher's queue",
                       stats.queued_events));
}

}  // namespace

MetricsExporter::MetricsExporter(PagePool* pool, SessionRegistry* sessions,
                                 CallCore* core, Batcher* batcher,
                                 Backend* backend,
                                 const FastChannelServer* fast_channels,
                                 const MemorySocketServer* memory_socket,
                                 const HandoffThreads* grpc_answer_senders,
                                 std::vector<const MemoryBudget*> budgets,
                                 const KvEventPublisher* kv_events,
                                 const KeptState* kept)
    : pool_(pool),
      sessions_(sessions),
      core_(core),
      batcher_(batcher),
      backend_(backend),
      fast_channels_(fast_channels),
      memory_socket_(memory_socket),
      grpc_answer_senders_(grpc_answer_senders),
      kv_events_(kv_events),
      kept_(kept) {
  for (const MemoryBudget* budget : budgets) {
    if (budget != nullptr) budgets_.push_back(budget);
  }
}

std::string MetricsExporter::Render() const {
  const PoolStats stats = pool_->Stats();
  Families families;
  AddPoolFamilies(stats, *backend_, &families);
  AddPrefixFamilies(stats, &families);
  AddKeptStateFamilies(kept_, &families);
  AddBuildInfo(*backend_, pool_->free_policy(), &families);
  AddAllocationFamilies(stats, batcher_->launches(), &families);
  const std::vector<std::shared_ptr<Session>> sessions = sessions_->List();
  AddSessionFamilies(stats, sessions, core_->counters(), &families);
  AddReserveFamilies(fast_channels_, sessions, families);
  AddReleaseFamilies(*core_, &families);
  AddBudgetFamilies(budgets_, &families);
  AddAbuseFamilies(fast_channels_, &families);
  AddMemorySocketFamilies(memory_socket_, &families);
  AddRpcFamilies(core_->rpc_metrics(), &families);
  AddBatchFamilies(batcher_->metrics(), &families);
  AddThreadFamilies(*batcher_, fast_channels_, grpc_answer_senders_, &families);
  AddKvEventFamilies(kv_events_, &families);
  AddProcessFamilies(&families);
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace pagealloc
