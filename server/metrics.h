// The daemon's metrics: rendered in the Prometheus text exposition format
// 0.0.4 at scrape time, and served with /healthz over HTTP.
//
// Gauges come from snapshots taken at scrape time (the pool's stats, the
// session list); counters and histograms are atomics the hot path bumps
// without locks (RpcMetrics, BatcherMetrics, SessionCounters), and the
// process's figures are read from /proc at scrape time (ProcessStats).
// server/metrics_http_server.h serves them. Names
// start with pagealloc_, except the standard process_* ones; counters end
// in _total, times are in seconds. docs/operations.md lists every metric
// (a test checks that it does).

#ifndef PAGEALLOC_SERVER_METRICS_H_
#define PAGEALLOC_SERVER_METRICS_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/page_pool.h"
#include "common/handoff_thread.h"
#include "kept_state/kept_state.h"
#include "kv_events/publisher.h"
#include "server/backend.h"
#include "server/batcher.h"
#include "server/call_core.h"
#include "server/fast_channel_server.h"
#include "server/memory_budget.h"
#include "server/memory_socket_server.h"
#include "server/session.h"

namespace pagealloc {

// Renders every metric. This class is thread-safe; it only reads.
class MetricsExporter {
 public:
  // Sessions are labelled by client name; past this many distinct names the
  // rest share the label value "other", so a misbehaving fleet cannot blow
  // up the series count.
  static constexpr int kMaxClientLabels = 64;

  // Every pointer must outlive the exporter; `fast_channels` is null when
  // the daemon offers none, `memory_socket` when it has none, `kv_events`
  // when it publishes no KV events (their counters are exported as 0).
  MetricsExporter(PagePool* pool, SessionRegistry* sessions, CallCore* core,
                  Batcher* batcher, Backend* backend,
                  const FastChannelServer* fast_channels = nullptr,
                  const MemorySocketServer* memory_socket = nullptr,
                  const HandoffThreads* grpc_answer_senders = nullptr,
                  std::vector<const MemoryBudget*> budgets = {},
                  const KvEventPublisher* kv_events = nullptr,
                  const KeptState* kept = nullptr);

  // The exposition, text format 0.0.4.
  std::string Render() const;

 private:
  PagePool* const pool_;
  SessionRegistry* const sessions_;
  CallCore* const core_;
  Batcher* const batcher_;
  Backend* const backend_;
  const FastChannelServer* const fast_channels_;
  const MemorySocketServer* const memory_socket_;
  const HandoffThreads* const grpc_answer_senders_;
  // Sessions' memory budgets (nulls left out).
  std::vector<const MemoryBudget*> budgets_;
  const KvEventPublisher* const kv_events_;
  const KeptState* const kept_;  // null without --keep_state
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_METRICS_H_
