// pagealloc-server: owns one GPU's pool of KV-cache pages and serves
// pagealloc.v1.PageAllocator to the scheduler processes on the same host.
//
//   pagealloc-server --gpu 0
//
// Flags are parsed here and nowhere else; see --help.

#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "server/server.h"

ABSL_FLAG(int, gpu, 0, "CUDA device ordinal whose KV pool this daemon owns.");
ABSL_FLAG(std::string, backend, "auto",
          "auto (CUDA when a GPU is present, else CPU with a warning), cuda "
          "or cpu.");
ABSL_FLAG(int64_t, num_pages, 0,
          "Usable pages in the pool (ids 1..num_pages; page 0 is reserved). "
          "0: from --pool_tokens, else 65536.");
ABSL_FLAG(int64_t, pool_tokens, 0,
          "Pool size in tokens (rounded down to whole pages); used when "
          "--num_pages is 0.");
ABSL_FLAG(int64_t, page_size, 16, "Tokens per page (>= 1).");
ABSL_FLAG(std::string, free_policy, "lifo",
          "lifo: freed pages are reused first; sorted: freed pages are parked "
          "and merged, sorted, when an allocation does not fit (SGLang's "
          "need_sort).");
ABSL_FLAG(std::vector<std::string>, listen, {},
          "Comma-separated gRPC addresses: unix:///path.sock and/or "
          "host:port. Default unix:///run/pagealloc/gpu<gpu>.sock.");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM server certificate: TCP addresses then use TLS.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA bundle: TCP clients must present a certificate it signed.");
ABSL_FLAG(std::string, socket_mode, "0660",
          "Octal file mode of Unix socket files.");
ABSL_FLAG(std::string, socket_group, "",
          "Group that owns Unix socket files (default: the daemon's).");
ABSL_FLAG(bool, fast_channel, true,
          "Offer sessions a fast channel: allocation calls, Free, Checkpoint "
          "and Rollback through shared memory instead of gRPC, for clients "
          "on this host (see docs/design.md).");
ABSL_FLAG(int, fast_channel_spin_us, 200,
          "How long the fast channel's poller spins after a call before it "
          "sleeps (a call to a sleeping poller pays one thread wake-up).");
ABSL_FLAG(int, fast_channel_pollers, 1,
          "Threads serving fast channels (each spins while its channels are "
          "busy).");
ABSL_FLAG(int, metrics_port, 9464,
          "HTTP port for /metrics (Prometheus) and /healthz; 0 picks a free "
          "port, -1 turns metrics off.");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0",
          "Address the metrics port binds.");
ABSL_FLAG(int64_t, max_batch_requests, 8192,
          "Most requests in one kernel launch, and in one call.");
ABSL_FLAG(int64_t, max_batch_tokens, 1 << 21,
          "Most slots written by one launch, and by one call.");
ABSL_FLAG(int64_t, batch_window_us, -1,
          "How long the batcher holds queued calls for more to join the "
          "launch (0: launch as soon as work is queued; calls that arrive "
          "meanwhile join the next launch). -1: 100 when the batcher thread "
          "spins (--batcher_spin_us), else 0.");
ABSL_FLAG(int, batch_min_calls, 4,
          "With --batch_window_us: stop waiting once this many calls are "
          "queued, capped at half the sessions that called in the last 2 ms "
          "(one or two clients never wait). 0: wait the whole window.");
ABSL_FLAG(int64_t, batcher_spin_us, -1,
          "0: the thread that submits work to an idle batcher runs the launch "
          "itself (lowest latency for a lone call). > 0: a dedicated batcher "
          "thread drives every launch and polls for work this long after each "
          "one, so fast-channel calls are taken while a launch runs (more "
          "throughput with several clients; a core busy while they call). "
          "-1: 200 on a machine with at least 8 CPUs, else 0.");
ABSL_FLAG(int64_t, lease_ms, 10000,
          "A session that sends nothing for this long (KeepAlive included) "
          "loses its pages.");
ABSL_FLAG(int64_t, ring_capacity_slots, 1 << 20,
          "Default output ring size per session, in slots.");
ABSL_FLAG(int64_t, max_sessions, 256, "Most sessions at once.");
ABSL_FLAG(int64_t, max_session_quota_pages, 0,
          "Cap on any session's page quota (0: no cap).");
ABSL_FLAG(int, max_message_bytes, 64 << 20, "Largest gRPC message accepted.");
ABSL_FLAG(std::string, log_level, "info",
          "trace, debug, info, warn, error, critical or off.");
ABSL_FLAG(bool, debug_checks, false,
          "Check every pool invariant after each batch (slow).");

namespace pagealloc {
namespace {

// --batcher_spin_us=-1 (the default) spins this long on machines with at
// least this many CPUs (measured on the H200 host: docs/performance.md).
constexpr int64_t kDefaultBatcherSpinUs = 200;
constexpr unsigned kMinCpusForSpinningBatcher = 8;
// --batch_window_us=-1 with a spinning batcher thread; with the default
// --batch_min_calls it holds a launch only while fewer than 4 calls (or half
// the active sessions) are queued.
constexpr int64_t kDefaultBatchWindowUs = 100;

absl::StatusOr<ServerOptions> OptionsFromFlags() {
  ServerOptions options;
  options.backend = absl::GetFlag(FLAGS_backend);
  options.gpu = absl::GetFlag(FLAGS_gpu);
  options.pool.page_size = absl::GetFlag(FLAGS_page_size);
  if (options.pool.page_size < 1) {
    return absl::InvalidArgumentError("--page_size must be >= 1");
  }
  options.pool.num_pages = absl::GetFlag(FLAGS_num_pages);
  if (options.pool.num_pages == 0) {
    const int64_t tokens = absl::GetFlag(FLAGS_pool_tokens);
    options.pool.num_pages =
        tokens > 0 ? tokens / options.pool.page_size : 65536;
  }
  absl::StatusOr<FreePolicy> policy =
      ParseFreePolicy(absl::GetFlag(FLAGS_free_policy));
  if (!policy.ok()) return policy.status();
  options.pool.free_policy = *policy;
  options.listen = absl::GetFlag(FLAGS_listen);
  if (options.listen.empty()) {
    options.listen.push_back(
        absl::StrFormat("unix:///run/pagealloc/gpu%d.sock", options.gpu));
  }
  int mode = 0;
  for (char c : absl::GetFlag(FLAGS_socket_mode)) {
    if (c < '0' || c > '7') {
      return absl::InvalidArgumentError("--socket_mode must be octal");
    }
    mode = mode * 8 + (c - '0');
  }
  options.socket_mode = mode;
  options.socket_group = absl::GetFlag(FLAGS_socket_group);
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  options.batcher.max_batch_requests = absl::GetFlag(FLAGS_max_batch_requests);
  options.batcher.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.batcher.min_batch_calls = absl::GetFlag(FLAGS_batch_min_calls);
  int64_t batcher_spin_us = absl::GetFlag(FLAGS_batcher_spin_us);
  if (batcher_spin_us < 0) {
    // A spinning driver pays off with several clients, but on a small
    // machine it takes a core the clients and the poller need.
    batcher_spin_us =
        std::thread::hardware_concurrency() >= kMinCpusForSpinningBatcher
            ? kDefaultBatcherSpinUs
            : 0;
  }
  options.batcher.spin = absl::Microseconds(batcher_spin_us);
  int64_t batch_window_us = absl::GetFlag(FLAGS_batch_window_us);
  if (batch_window_us < 0) {
    // Only a spinning batcher thread gathers cheaply (a sleeping one would
    // take every launch over from the submitters, one wake-up each).
    batch_window_us = batcher_spin_us > 0 ? kDefaultBatchWindowUs : 0;
  }
  options.batcher.batch_window = absl::Microseconds(batch_window_us);
  options.sessions.lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  options.sessions.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.sessions.default_ring_capacity_slots =
      absl::GetFlag(FLAGS_ring_capacity_slots);
  options.sessions.max_ring_capacity_slots = std::max<int64_t>(
      options.sessions.default_ring_capacity_slots, int64_t{1} << 26);
  options.sessions.max_quota_pages =
      absl::GetFlag(FLAGS_max_session_quota_pages);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.debug_checks = absl::GetFlag(FLAGS_debug_checks);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.fast_channel = absl::GetFlag(FLAGS_fast_channel);
  options.fast_channel_pollers =
      std::max(1, absl::GetFlag(FLAGS_fast_channel_pollers));
  options.fast_channel_spin = absl::Microseconds(
      std::max(0, absl::GetFlag(FLAGS_fast_channel_spin_us)));
  options.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  return options;
}

int Main() {
  std::shared_ptr<spdlog::logger> log = Logger("server");
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  absl::StatusOr<ServerOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    log->critical("{}", std::string(options.status().message()));
    return 2;
  }
  // Signals go to one watcher thread, never to a gRPC or batcher thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(*options);
  if (!server.ok()) {
    log->critical("cannot start: {}", server.status().ToString());
    return 1;
  }
  absl::Status started = (*server)->Start();
  if (!started.ok()) {
    log->critical("cannot start: {}", started.ToString());
    return 1;
  }
  std::thread watcher([&signals, &server, log] {
    int signal = 0;
    sigwait(&signals, &signal);
    log->info("received {}; shutting down", strsignal(signal));
    (*server)->Shutdown();
  });
  (*server)->Wait();
  if (watcher.joinable()) {
    // Wake the watcher if shutdown came from elsewhere.
    pthread_kill(watcher.native_handle(), SIGTERM);
    watcher.join();
  }
  return 0;
}

}  // namespace
}  // namespace pagealloc

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Serves one GPU's pool of KV-cache pages to scheduler processes.\n"
      "  pagealloc-server --gpu 0 [--page_size 16 --num_pages 65536]");
  absl::ParseCommandLine(argc, argv);
  // Debian builds Abseil without NDEBUG, which leaves Mutex deadlock
  // detection on: every Lock then updates a lock graph under one global
  // lock, which showed in profiles of the allocation path. Lock order is
  // checked at build time instead (--config=clang, -Wthread-safety).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return pagealloc::Main();
}
