// pagealloc-server: owns one GPU's pool of KV-cache pages and serves
// pagealloc.v1.PageAllocator to the scheduler processes on the same host.
//
//   pagealloc-server --gpu 0
//
// Flags are parsed and checked here and nowhere else; see --help. A usage
// error (a flag's value out of its range, a pool too large for this host)
// exits 2 before anything starts, a failure at run time exits 1.

#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <new>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/command_line.h"
#include "common/logging.h"
#include "common/socket_location.h"
#include "common/status_macros.h"
#include "fd_keeper/fd_keeper.h"
#include "kv_events/publisher.h"
#include "memory/kv_layout.h"
#include "server/descriptors.h"
#include "server/memory_budget.h"
#include "server/scheduling_policy.h"
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
ABSL_FLAG(int64_t, page_size, 16, "Tokens per page.");
ABSL_FLAG(std::string, kv_layout, "",
          "The KV memory the daemon owns and exports to every session: "
          "mha:layers=32,kv_heads=8,head_dim=128,dtype=bf16 (a K and a V "
          "buffer per layer), mla:layers=61,kv_lora_rank=512,rope_dim=64,"
          "dtype=bf16, or custom:[layers=N,]NAME=DTYPE:D0xD1,... Empty: slot "
          "indices only (docs/operations.md, \"KV memory\").");
ABSL_FLAG(std::string, kv_memory, "",
          "The KV slab's budget with --kv_layout: a size (80GiB, 512MiB) or "
          "a fraction of the free GPU memory (of the available host memory "
          "on the CPU backend), e.g. 0.9. The pool gets the most pages it "
          "holds (unless --num_pages is given, which must then fit).");
ABSL_FLAG(bool, kv_scrub, false,
          "Zero a page's slots in every KV buffer before handing it to a "
          "session other than its last owner (needs --kv_layout).");
ABSL_FLAG(std::string, register_secret_file, "",
          "A file holding a secret that Register must carry "
          "(RegisterRequest.register_secret): sessions that map one KV slab "
          "share one trust domain. Trailing newlines are ignored.");
ABSL_FLAG(std::string, free_policy, "lifo",
          "lifo: freed pages are reused first; sorted: freed pages are parked "
          "and merged, sorted, when an allocation does not fit (SGLang's "
          "need_sort).");
ABSL_FLAG(std::string, semantics, "pagealloc",
          "pagealloc: the daemon's own contract; sglang: SGLang's allocators "
          "where they differ (slot frees put pages back ascending; with "
          "page size 1 at the back of the free list; the sorted policy "
          "merges on SGLang's over-estimate). docs/design.md, \"SGLang "
          "compatibility\".");
ABSL_FLAG(bool, allow_forced_clear, false,
          "Let ClearPool with force clear the pool while sessions hold pages "
          "(their slots become void). Off: a forced clear is refused.");
ABSL_FLAG(bool, keep_state, false,
          "Keep the pool across restarts of the daemon: its KV slab and a "
          "journal of every page's state go to the service manager's "
          "file-descriptor store (a systemd unit with "
          "FileDescriptorStoreMax=), and the next start takes the pool over "
          "with its sessions, pages and KV (docs/operations.md, \"Upgrades "
          "and restarts\"). Without a service manager ($NOTIFY_SOCKET "
          "unset) a descriptor keeper process holds them (--fd_keeper) and "
          "hands them to a successor started with --take_over, after a "
          "planned stop or a crash of the daemon.");
ABSL_FLAG(bool, take_over, false,
          "With --keep_state and no service manager: take the pool, its "
          "sessions and KV over from the daemon running on the same socket, "
          "which stops once this one has checked that it can read its state "
          "(a refusal leaves it serving), or from the descriptor keeper of "
          "one that died. Refused when nothing answers: a first start goes "
          "without it.");
ABSL_FLAG(bool, fd_keeper, true,
          "With --keep_state and no service manager: spawn a descriptor "
          "keeper, a small process of this executable that holds the KV "
          "slab and the state journal and hands them to a successor started "
          "with --take_over, so that a crash of the daemon keeps the pool "
          "too. Off: the daemon holds them itself, and only a planned "
          "restart keeps the pool.");
ABSL_FLAG(int64_t, fd_keeper_linger_ms, 300000,
          "With --fd_keeper: how long the keeper waits for a successor after "
          "the daemon is gone (stopped or crashed) before it lets the pool "
          "go, freeing its KV memory.");
ABSL_FLAG(int64_t, state_log_bytes, 64 << 20,
          "With --keep_state: bytes of the journal's log of changes between "
          "two snapshots of the pool (a snapshot is written when half is "
          "used).");
ABSL_FLAG(bool, discard_state, false,
          "With --keep_state: drop a kept state this build will not take "
          "over (another journal format or pool semantics version, or a "
          "pool of other flags) and start a fresh pool, instead of refusing "
          "to start. Every session of the last run and its KV is lost.");
ABSL_FLAG(int64_t, stop_release_wait_ms, 1000,
          "With --keep_state: at a stop that keeps the sessions (SIGTERM, "
          "a handover), how long to wait for frees pending on their release "
          "fence, so that their pages are freed before the daemon exits. "
          "Pages still pending then stay their sessions' across the restart "
          "and are freed when each session resumes.");
ABSL_FLAG(int64_t, prefix_max_pinned_pages, 1024,
          "Most shared prefix pages one session may pin (Publish with pin: "
          "never evicted while pinned). 0: pins are refused.");
ABSL_FLAG(std::vector<std::string>, listen, {},
          "Comma-separated gRPC addresses: unix:///path.sock and/or "
          "host:port. Default unix:///run/pagealloc/gpu<gpu>.sock, or "
          "$XDG_RUNTIME_DIR/pagealloc/gpu<gpu>.sock when this user may not "
          "create sockets in /run/pagealloc.");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM server certificate: TCP addresses then use TLS.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA bundle: TCP clients must present a certificate it signed.");
ABSL_FLAG(std::string, socket_mode, "0660",
          "Octal file mode of Unix socket files (and of the shared memory of "
          "fast channels).");
ABSL_FLAG(std::string, socket_group, "",
          "Group that owns Unix socket files (default: the daemon's).");
ABSL_FLAG(bool, fast_channel, true,
          "Offer sessions a fast channel: allocation calls, Free, Checkpoint "
          "and Rollback through shared memory instead of gRPC, for clients "
          "on this host (see docs/design.md).");
ABSL_FLAG(int, fast_channel_spin_us, 200,
          "The longest the fast channel's poller spins after a call before "
          "it sleeps (a call to a sleeping poller pays one thread wake-up). "
          "The poller spins about twice the recent gaps between calls when "
          "they are shorter than this, and not at all when they are longer.");
ABSL_FLAG(int, fast_channel_pollers, 1,
          "Threads serving fast channels (each spins while its channels are "
          "busy).");
ABSL_FLAG(int, max_connections, pagealloc::ServerOptions().max_connections,
          "Most gRPC connections held at once on the Unix sockets; more are "
          "closed as they arrive.");
ABSL_FLAG(
    int64_t, max_connection_idle_ms,
    absl::ToInt64Milliseconds(pagealloc::ServerOptions().max_connection_idle),
    "A gRPC connection with no call open for this long is closed (a "
    "session's KeepAlive stream is a call open for its life).");
ABSL_FLAG(int64_t, keepalive_time_ms,
          absl::ToInt64Milliseconds(pagealloc::ServerOptions().keepalive_time),
          "A gRPC connection with a call open and nothing received for this "
          "long is pinged.");
ABSL_FLAG(
    int64_t, keepalive_timeout_ms,
    absl::ToInt64Milliseconds(pagealloc::ServerOptions().keepalive_timeout),
    "A ping not answered within this closes the connection (a hung or "
    "vanished peer).");
ABSL_FLAG(int64_t, memory_socket_hello_timeout_ms,
          absl::ToInt64Milliseconds(
              pagealloc::MemorySocketServer::Options().hello_timeout),
          "A memory socket connection that has not sent its Hello within "
          "this is closed.");
ABSL_FLAG(int, memory_socket_max_pending,
          pagealloc::MemorySocketServer::Options().max_pending,
          "Memory socket connections waiting for their Hello, in all; a new "
          "one over it closes the oldest.");
ABSL_FLAG(int, memory_socket_max_pending_per_peer,
          pagealloc::MemorySocketServer::Options().max_pending_per_peer,
          "The same per peer process; a new one over it closes that "
          "process's oldest.");
ABSL_FLAG(bool, allow_insecure_tcp, false,
          "Allow --listen on a TCP address other than loopback without TLS "
          "(refused otherwise).");
ABSL_FLAG(int64_t, fast_channel_throttle_strikes, 100,
          "Strikes that throttle a session's fast channel: doorbell rings no "
          "call explains, or calls posted before their answers. A throttled "
          "session's doorbell wakes nobody and its calls are taken at most "
          "every 10 ms. 0: never throttle.");
ABSL_FLAG(int64_t, fast_channel_drop_strikes, 1000,
          "Strikes that drop a session: it ends, its pages are reclaimed and "
          "its client is told why. 0: never drop.");
ABSL_FLAG(int64_t, fast_channel_throttle_ms, 1000,
          "A throttled session is heard again, its strikes forgiven, after "
          "this long without a strike.");
ABSL_FLAG(int, metrics_port, 9464,
          "HTTP port for /metrics (Prometheus) and /healthz; 0 picks a free "
          "port, -1 turns metrics off.");
ABSL_FLAG(std::string, metrics_host, pagealloc::ServerOptions().metrics_host,
          "Address the metrics port binds (loopback by default; 0.0.0.0 or "
          "the pod IP to be scraped from elsewhere).");
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
          "Like --fast_channel_spin_us, the spin adapts to the gaps between "
          "launches, this being its cap, and a lone client's call is run by "
          "the thread that submits it. "
          "-1: 200 on a machine with at least 8 CPUs, else 0.");
ABSL_FLAG(int, grpc_answer_threads,
          pagealloc::ServerOptions().grpc_answer_threads,
          "With a spinning batcher thread (--batcher_spin_us): threads that "
          "send the gRPC answers of a launch that carried several calls, "
          "taken in turn, so that they leave together and the batcher thread "
          "goes on to the next launch (each spins like the batcher thread "
          "while answers flow). 0: the batcher thread sends them itself.");
ABSL_FLAG(bool, print_scheduling_policy, false,
          "Print which thread drives launches, spins and sends answers under "
          "the other flags (docs/design.md, section 6), and exit.");
ABSL_FLAG(int64_t, lease_ms, 10000,
          "A session that sends nothing for this long (KeepAlive included) "
          "loses its pages.");
ABSL_FLAG(int64_t, ring_capacity_slots, 0,
          "Default output ring size per session (8 bytes a slot, in GPU "
          "memory on the CUDA backend). 0: the pool's slots (num_pages * "
          "page_size, at least 1048576), so that any call the pool can "
          "serve fits, within an eighth of the sessions' ring budget.");
ABSL_FLAG(int64_t, max_sessions, 256,
          "Most sessions at once; at most what the open-files limit holds "
          "(4 descriptors a session; docs/operations.md, \"Descriptors\").");
ABSL_FLAG(std::string, session_memory, "",
          "Budget of host memory for sessions' rings (CPU backend) and fast "
          "channels: a size (512MiB, 4GiB). Empty: three quarters of what "
          "the memory cgroup's limit (else the host's available memory) "
          "leaves after the KV slab (docs/operations.md, \"Memory "
          "budget\").");
ABSL_FLAG(std::string, session_gpu_memory, "",
          "Budget of GPU memory for sessions' rings (CUDA backend): a size. "
          "Empty: an eighth of the GPU memory free after the KV slab.");
ABSL_FLAG(int64_t, max_session_quota_pages, 0,
          "Cap on any session's page quota (0: no cap).");
ABSL_FLAG(int, max_message_bytes, 64 << 20, "Largest gRPC message accepted.");
ABSL_FLAG(std::string, log_level, "info",
          "trace, debug, info, warn, error, critical or off (any case).");
ABSL_FLAG(bool, debug_checks, false,
          "Check every pool invariant after each batch (slow).");
ABSL_FLAG(std::string, kv_events_endpoint, "",
          "Publish KV events for routers on a ZeroMQ PUB socket bound here, "
          "in vLLM's shape: tcp://HOST:PORT or ipc://PATH (empty: no KV "
          "events). docs/integration.md, \"KV events\".");
ABSL_FLAG(std::string, kv_events_replay_endpoint, "",
          "Answer vLLM's replay requests for missed KV-event batches on a "
          "ZeroMQ ROUTER socket bound here (empty: none).");
ABSL_FLAG(std::string, kv_events_topic, "",
          "The topic frame of every KV-event message.");
ABSL_FLAG(int64_t, kv_events_replay_batches,
          pagealloc::KvEventPublisherOptions().replay_batches,
          "KV-event batches kept for replay and for late SubscribeKvEvents "
          "streams.");
ABSL_FLAG(int64_t, kv_events_queue_events,
          pagealloc::KvEventPublisherOptions().queue_events,
          "KV events waiting to be sent before more are dropped (and the "
          "sequence numbers show the gap).");
ABSL_FLAG(int64_t, kv_events_batch_events,
          pagealloc::KvEventPublisherOptions().max_batch_events,
          "Most KV events in one batch.");
ABSL_FLAG(int64_t, kv_events_batch_delay_us, 1000,
          "Longest a KV event waits for others to join its batch.");
ABSL_FLAG(std::string, kv_events_encoding, "map",
          "Each KV event on the ZeroMQ wire: map (tagged under \"type\", "
          "vLLM's current encoding) or array (the positional tagged array "
          "of earlier vLLM).");
ABSL_FLAG(std::string, kv_events_block_hash, "int",
          "Block hashes on the ZeroMQ wire: int (the key's last 8 bytes, "
          "big-endian, vLLM's default) or bytes (the whole key).");
ABSL_FLAG(int, kv_events_data_parallel_rank, 0,
          "The data_parallel_rank every KV-event batch carries.");

namespace pagealloc {
namespace {

const CommandLineSpec kCommandLine = {
    "pagealloc-server",
    "pagealloc-server: serves one GPU's pool of KV-cache pages to the "
    "scheduler processes of its host.\n"
    "  pagealloc-server --gpu=0 [--page_size=16 --num_pages=65536]\n"
    "docs/operations.md is the operator's reference.",
    "server/main.cc",
    {
        {"pool",
         {{"gpu", "device ordinal"},
          {"backend"},
          {"num_pages", "pages"},
          {"pool_tokens", "tokens"},
          {"page_size", "tokens"},
          {"free_policy"},
          {"semantics"},
          {"allow_forced_clear"},
          {"prefix_max_pinned_pages", "pages"}}},
        {"KV memory",
         {{"kv_layout", "layout"},
          {"kv_memory", "bytes or fraction"},
          {"kv_scrub"}}},
        {"memory and sessions",
         {{"ring_capacity_slots", "slots of 8 bytes"},
          {"max_sessions", "sessions"},
          {"session_memory", "bytes"},
          {"session_gpu_memory", "bytes"},
          {"max_session_quota_pages", "pages"},
          {"lease_ms", "milliseconds"}}},
        {"transport",
         {{"listen", "addresses"},
          {"fast_channel"},
          {"fast_channel_spin_us", "microseconds"},
          {"fast_channel_pollers", "threads"},
          {"fast_channel_throttle_strikes", "strikes"},
          {"fast_channel_drop_strikes", "strikes"},
          {"fast_channel_throttle_ms", "milliseconds"},
          {"max_message_bytes", "bytes"}}},
        {"connections",
         {{"max_connections", "connections"},
          {"max_connection_idle_ms", "milliseconds"},
          {"keepalive_time_ms", "milliseconds"},
          {"keepalive_timeout_ms", "milliseconds"},
          {"memory_socket_hello_timeout_ms", "milliseconds"},
          {"memory_socket_max_pending", "connections"},
          {"memory_socket_max_pending_per_peer", "connections"}}},
        {"security",
         {{"socket_mode", "octal mode"},
          {"socket_group", "group name"},
          {"register_secret_file", "path"},
          {"tls_cert_file", "path"},
          {"tls_key_file", "path"},
          {"tls_client_ca_file", "path"},
          {"allow_insecure_tcp"}}},
        {"batching",
         {{"max_batch_requests", "requests"},
          {"max_batch_tokens", "slots"},
          {"batch_window_us", "microseconds"},
          {"batch_min_calls", "calls"},
          {"batcher_spin_us", "microseconds"},
          {"grpc_answer_threads", "threads"},
          {"print_scheduling_policy"}}},
        {"restarts",
         {{"keep_state"},
          {"take_over"},
          {"fd_keeper"},
          {"fd_keeper_linger_ms", "milliseconds"},
          {"state_log_bytes", "bytes"},
          {"discard_state"},
          {"stop_release_wait_ms", "milliseconds"}}},
        {"logging", {{"log_level"}, {"debug_checks"}}},
        {"metrics",
         {{"metrics_port", "TCP port"}, {"metrics_host", "address"}}},
        {"KV events",
         {{"kv_events_endpoint", "ZeroMQ endpoint"},
          {"kv_events_replay_endpoint", "ZeroMQ endpoint"},
          {"kv_events_topic", "bytes"},
          {"kv_events_replay_batches", "batches"},
          {"kv_events_queue_events", "events"},
          {"kv_events_batch_events", "events"},
          {"kv_events_batch_delay_us", "microseconds"},
          {"kv_events_encoding"},
          {"kv_events_block_hash"},
          {"kv_events_data_parallel_rank", "rank"}}},
    },
    {}};

// Host memory the pool's bookkeeping takes per page while it is built: the
// free ring, the owner table, the free list copy the executor mirrors, the
// initial list and the checkpoint log's index (8 bytes each).
constexpr int64_t kHostBytesPerPage = 40;
// Slots are int64; PagePool keeps num_pages * page_size within this.
constexpr int64_t kMaxSlots = int64_t{1} << 40;

std::string Bytes(double bytes) {
  if (bytes >= (int64_t{1} << 40)) {
    return absl::StrFormat("%.1f TiB", bytes / (int64_t{1} << 40));
  }
  if (bytes >= (int64_t{1} << 30)) {
    return absl::StrFormat("%.1f GiB", bytes / (int64_t{1} << 30));
  }
  return absl::StrFormat("%.1f MiB", bytes / (1 << 20));
}

// "--lease_ms=0 is out of range (accepted: 100..86400000 milliseconds)".
absl::Status OutOfRange(absl::string_view flag, absl::string_view value,
                        absl::string_view accepted) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "--%s=%s is out of range (accepted: %s)", flag, value, accepted));
}

// "--backend=gpu is not one of auto, cuda, cpu".
absl::Status NotOneOf(absl::string_view flag, absl::string_view value,
                      absl::string_view choices) {
  return absl::InvalidArgumentError(
      absl::StrFormat("--%s=%s is not one of %s", flag, value, choices));
}

absl::Status CheckRange(absl::string_view flag, int64_t value, int64_t min,
                        int64_t max, absl::string_view unit = "") {
  if (value >= min && value <= max) return absl::OkStatus();
  return OutOfRange(
      flag, absl::StrCat(value),
      absl::StrCat(min, "..", max, unit.empty() ? "" : " ", unit));
}

// The most pages a pool of `page_size` may have: 2^40 slots, page 0 reserved.
int64_t MaxPages(int64_t page_size) { return kMaxSlots / page_size - 1; }

// --session_memory and --session_gpu_memory: a size each, or empty for
// the budget derived from what the daemon can have (-1).
absl::Status SessionMemoryFromFlags(ServerOptions* options) {
  const std::tuple<const char*, std::string, int64_t*> flags[] = {
      {"session_memory", absl::GetFlag(FLAGS_session_memory),
       &options->session_memory},
      {"session_gpu_memory", absl::GetFlag(FLAGS_session_gpu_memory),
       &options->session_gpu_memory}};
  for (const auto& [name, text, bytes] : flags) {
    if (text.empty()) continue;
    absl::StatusOr<KvMemoryBudget> size = ParseKvMemory(text);
    if (!size.ok() || size->bytes <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--%s=%s is not a size (accepted: 512MiB, 4GiB, 1000000000)", name,
          text));
    }
    *bytes = size->bytes;
  }
  return absl::OkStatus();
}

// The flags of one group into `options`; INVALID_ARGUMENT naming the flag,
// its value and what is accepted for the first one that is out of range.
// Each group reads only flags and what the groups before it set.

// --backend, --gpu.
absl::Status DeviceFlags(ServerOptions* options) {
  options->backend = absl::GetFlag(FLAGS_backend);
  if (options->backend != "auto" && options->backend != "cuda" &&
      options->backend != "cpu") {
    return NotOneOf("backend", options->backend, "auto, cuda, cpu");
  }
  options->gpu = absl::GetFlag(FLAGS_gpu);
  RETURN_IF_ERROR(CheckRange("gpu", options->gpu, 0,
                             std::numeric_limits<int>::max(),
                             "(a CUDA device ordinal)"));
  return absl::OkStatus();
}

// --page_size, --num_pages, --pool_tokens.
absl::Status PoolGeometryFlags(ServerOptions* options) {
  options->pool.page_size = absl::GetFlag(FLAGS_page_size);
  RETURN_IF_ERROR(
      CheckRange("page_size", options->pool.page_size, 1, 1 << 20, "tokens"));
  const int64_t max_pages = MaxPages(options->pool.page_size);
  options->pool.num_pages = absl::GetFlag(FLAGS_num_pages);
  if (options->pool.num_pages != 0) {
    RETURN_IF_ERROR(CheckRange(
        "num_pages", options->pool.num_pages, 0, max_pages,
        absl::StrFormat("pages: 0 takes --pool_tokens; at most 2^40 slots "
                        "with --page_size=%d",
                        options->pool.page_size)));
  } else if (const int64_t tokens = absl::GetFlag(FLAGS_pool_tokens);
             tokens != 0) {
    RETURN_IF_ERROR(CheckRange(
        "pool_tokens", tokens, options->pool.page_size, kMaxSlots - 1,
        absl::StrFormat("tokens: at least one page of --page_size=%d",
                        options->pool.page_size)));
    options->pool.num_pages = tokens / options->pool.page_size;
  } else {
    options->pool.num_pages = 65536;
  }
  options->pool.max_pinned_pages_per_owner =
      absl::GetFlag(FLAGS_prefix_max_pinned_pages);
  RETURN_IF_ERROR(CheckRange("prefix_max_pinned_pages",
                             options->pool.max_pinned_pages_per_owner, 0,
                             kMaxSlots, "pages"));
  return absl::OkStatus();
}

// The KV memory (--kv_layout, --kv_memory, --kv_scrub): with a layout and a
// budget, the slab sizes the pool (Server::Create, once the backend knows
// its free memory).
absl::Status KvFlags(ServerOptions* options) {
  const std::string kv_layout = absl::GetFlag(FLAGS_kv_layout);
  const std::string kv_memory = absl::GetFlag(FLAGS_kv_memory);
  options->kv.scrub = absl::GetFlag(FLAGS_kv_scrub);
  if (!kv_layout.empty()) {
    ASSIGN_OR_RETURN(options->kv.layout, ParseKvLayout(kv_layout));
    if (!kv_memory.empty()) {
      ASSIGN_OR_RETURN(options->kv.budget, ParseKvMemory(kv_memory));
      if (absl::GetFlag(FLAGS_num_pages) == 0 &&
          absl::GetFlag(FLAGS_pool_tokens) == 0) {
        options->pool.num_pages = 0;  // from the budget
      }
    } else if (absl::GetFlag(FLAGS_num_pages) == 0 &&
               absl::GetFlag(FLAGS_pool_tokens) == 0) {
      return absl::InvalidArgumentError(
          "--kv_layout needs --kv_memory (or --num_pages / --pool_tokens) to "
          "size the KV slab");
    }
  } else if (!kv_memory.empty() || options->kv.scrub) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s needs --kv_layout",
                        kv_memory.empty() ? "--kv_scrub" : "--kv_memory"));
  }
  return absl::OkStatus();
}

// The pool's bookkeeping against this host's memory.
absl::Status CheckHostMemory(ServerOptions* options) {
  // Unknown (no /proc): not checked.
  const HostMemory host = AvailableHostMemory();
  const int64_t available = host.bytes;
  const double needed =
      static_cast<double>(options->pool.num_pages) * kHostBytesPerPage;
  if (available >= 0 && needed > available) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a pool of %d pages (--num_pages or --pool_tokens) needs %s of host "
        "memory for its bookkeeping (%d bytes a page); this host has %s "
        "(%s). Size the pool to the engine's KV buffers "
        "(docs/operations.md, \"Sizing the pool\")",
        options->pool.num_pages, Bytes(needed), kHostBytesPerPage,
        Bytes(available), host.source()));
  }
  return absl::OkStatus();
}

// --free_policy, --semantics, --allow_forced_clear.
absl::Status PoolPolicyFlags(ServerOptions* options) {
  absl::StatusOr<FreePolicy> policy =
      ParseFreePolicy(absl::GetFlag(FLAGS_free_policy));
  if (!policy.ok()) {
    return NotOneOf("free_policy", absl::GetFlag(FLAGS_free_policy),
                    "lifo, sorted");
  }
  options->pool.free_policy = *policy;
  absl::StatusOr<Semantics> semantics =
      ParseSemantics(absl::GetFlag(FLAGS_semantics));
  if (!semantics.ok()) {
    return NotOneOf("semantics", absl::GetFlag(FLAGS_semantics),
                    "pagealloc, sglang");
  }
  options->pool.semantics = *semantics;
  options->allow_forced_clear = absl::GetFlag(FLAGS_allow_forced_clear);
  options->keep_state.enabled = absl::GetFlag(FLAGS_keep_state);
  options->keep_state.log_bytes = absl::GetFlag(FLAGS_state_log_bytes);
  options->keep_state.discard = absl::GetFlag(FLAGS_discard_state);
  options->keep_state.take_over = absl::GetFlag(FLAGS_take_over);
  if (options->keep_state.log_bytes < (1 << 16) ||
      options->keep_state.log_bytes > (int64_t{1} << 32) ||
      options->keep_state.log_bytes % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--state_log_bytes=%d: a multiple of 8 from 65536 to 4294967296",
        options->keep_state.log_bytes));
  }
  const int64_t release_wait_ms = absl::GetFlag(FLAGS_stop_release_wait_ms);
  RETURN_IF_ERROR(CheckRange("stop_release_wait_ms", release_wait_ms, 0, 60000,
                             "milliseconds"));
  options->keep_state.release_wait = absl::Milliseconds(release_wait_ms);
  if (absl::GetFlag(FLAGS_fd_keeper)) {
    // This executable, whatever became of its file since it started.
    options->keep_state.keeper_binary = "/proc/self/exe";
  }
  const int64_t linger_ms = absl::GetFlag(FLAGS_fd_keeper_linger_ms);
  RETURN_IF_ERROR(CheckRange("fd_keeper_linger_ms", linger_ms, 0, 86400000,
                             "milliseconds"));
  options->keep_state.keeper_linger = absl::Milliseconds(linger_ms);
  if (options->keep_state.take_over && !options->keep_state.enabled) {
    return absl::InvalidArgumentError("--take_over needs --keep_state");
  }
  if (options->keep_state.discard && !options->keep_state.enabled) {
    return absl::InvalidArgumentError("--discard_state needs --keep_state");
  }
  return absl::OkStatus();
}

// --listen.
absl::Status ListenFlags(ServerOptions* options) {
  options->listen = absl::GetFlag(FLAGS_listen);
  for (const std::string& address : options->listen) {
    const std::string hint = UnixSchemeHint(address);
    if (!hint.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--listen=%s is not a gRPC address: %s", address, hint));
    }
    if (absl::StartsWith(address, "unix:")) continue;
    const size_t colon = address.rfind(':');
    int port = 0;
    if (colon == std::string::npos ||
        !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--listen=%s is not a gRPC address (accepted: unix:///path.sock, "
          "or host:port with a port in 0..65535)",
          address));
    }
  }
  return absl::OkStatus();
}

// --fast_channel and its pollers, spin and throttles.
absl::Status FastChannelFlags(ServerOptions* options) {
  // The pollers' count and spin go to the scheduling policy
  // (BatchingFlags).
  RETURN_IF_ERROR(CheckRange("fast_channel_pollers",
                             absl::GetFlag(FLAGS_fast_channel_pollers), 1, 64,
                             "threads"));
  RETURN_IF_ERROR(CheckRange("fast_channel_spin_us",
                             absl::GetFlag(FLAGS_fast_channel_spin_us), 0,
                             1000000, "microseconds"));
  options->fast_channel_throttle_strikes =
      absl::GetFlag(FLAGS_fast_channel_throttle_strikes);
  RETURN_IF_ERROR(CheckRange("fast_channel_throttle_strikes",
                             options->fast_channel_throttle_strikes, 0,
                             int64_t{1} << 40, "strikes"));
  options->fast_channel_drop_strikes =
      absl::GetFlag(FLAGS_fast_channel_drop_strikes);
  RETURN_IF_ERROR(CheckRange("fast_channel_drop_strikes",
                             options->fast_channel_drop_strikes, 0,
                             int64_t{1} << 40, "strikes"));
  const int64_t throttle_ms = absl::GetFlag(FLAGS_fast_channel_throttle_ms);
  RETURN_IF_ERROR(CheckRange("fast_channel_throttle_ms", throttle_ms, 1,
                             86400000, "milliseconds"));
  options->fast_channel_throttle_time = absl::Milliseconds(throttle_ms);
  return absl::OkStatus();
}

// --max_message_bytes, --max_connections, idle and keepalive times.
absl::Status ConnectionFlags(ServerOptions* options) {
  options->max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  RETURN_IF_ERROR(CheckRange("max_message_bytes", options->max_message_bytes,
                             4096, std::numeric_limits<int>::max(), "bytes"));

  // Connections.
  options->max_connections = absl::GetFlag(FLAGS_max_connections);
  RETURN_IF_ERROR(CheckRange("max_connections", options->max_connections, 1,
                             1 << 20, "connections"));
  for (const auto& [flag, value, field] :
       {std::tuple<const char*, int64_t, absl::Duration*>{
            "max_connection_idle_ms",
            absl::GetFlag(FLAGS_max_connection_idle_ms),
            &options->max_connection_idle},
        {"keepalive_time_ms", absl::GetFlag(FLAGS_keepalive_time_ms),
         &options->keepalive_time},
        {"keepalive_timeout_ms", absl::GetFlag(FLAGS_keepalive_timeout_ms),
         &options->keepalive_timeout},
        {"memory_socket_hello_timeout_ms",
         absl::GetFlag(FLAGS_memory_socket_hello_timeout_ms),
         &options->memory_socket.hello_timeout}}) {
    RETURN_IF_ERROR(CheckRange(
        flag, value, 100, std::numeric_limits<int>::max(), "milliseconds"));
    *field = absl::Milliseconds(value);
  }
  options->memory_socket.max_pending =
      absl::GetFlag(FLAGS_memory_socket_max_pending);
  options->memory_socket.max_pending_per_peer =
      absl::GetFlag(FLAGS_memory_socket_max_pending_per_peer);
  RETURN_IF_ERROR(CheckRange("memory_socket_max_pending",
                             options->memory_socket.max_pending, 1, 1 << 16,
                             "connections"));
  RETURN_IF_ERROR(
      CheckRange("memory_socket_max_pending_per_peer",
                 options->memory_socket.max_pending_per_peer, 1,
                 options->memory_socket.max_pending,
                 "connections, at most --memory_socket_max_pending"));
  return absl::OkStatus();
}

// --socket_mode, --socket_group.
absl::Status SocketFlags(ServerOptions* options) {
  const std::string mode_text = absl::GetFlag(FLAGS_socket_mode);
  int mode = 0;
  for (char c : mode_text) {
    if (c < '0' || c > '7') {
      mode = -1;
      break;
    }
    mode = std::min(mode * 8 + (c - '0'), 010000);
  }
  if (mode_text.empty() || mode < 0 || mode > 0777) {
    return OutOfRange("socket_mode", mode_text,
                      "an octal file mode, 0000..0777");
  }
  options->socket_mode = mode;
  options->socket_group = absl::GetFlag(FLAGS_socket_group);
  if (!options->socket_group.empty() &&
      getgrnam(options->socket_group.c_str()) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--socket_group=%s: no such group on this host",
                        options->socket_group));
  }
  return absl::OkStatus();
}

// --register_secret_file.
absl::Status RegisterSecretFlag(ServerOptions* options) {
  if (const std::string path = absl::GetFlag(FLAGS_register_secret_file);
      !path.empty()) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--register_secret_file=%s: cannot read it: %s", path,
                          std::strerror(errno)));
    }
    std::string secret((std::istreambuf_iterator<char>(in)),
                       std::istreambuf_iterator<char>());
    while (!secret.empty() &&
           (secret.back() == '\n' || secret.back() == '\r')) {
      secret.pop_back();
    }
    if (secret.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--register_secret_file=%s is empty: a Register secret must not be",
          path));
    }
    options->register_secret = std::move(secret);
  }
  return absl::OkStatus();
}

// --tls_*, --allow_insecure_tcp.
absl::Status TlsFlags(ServerOptions* options) {
  options->tls.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options->tls.key_file = absl::GetFlag(FLAGS_tls_key_file);
  options->tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  options->allow_insecure_tcp = absl::GetFlag(FLAGS_allow_insecure_tcp);
  if (options->tls.cert_file.empty() != options->tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both --tls_cert_file and --tls_key_file");
  }
  if (!options->tls.client_ca_file.empty() && options->tls.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca_file needs --tls_cert_file and --tls_key_file");
  }
  for (const auto& [flag, path] :
       {std::pair<const char*, std::string>{"tls_cert_file",
                                            options->tls.cert_file},
        {"tls_key_file", options->tls.key_file},
        {"tls_client_ca_file", options->tls.client_ca_file}}) {
    if (!path.empty() && access(path.c_str(), R_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--%s=%s: cannot read it: %s", flag, path, std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

// The scheduling flags (the batcher's, the gRPC answer threads', the fast
// channel's pollers): checked for range here, turned into settings by the
// scheduling policy, which resolves the -1 defaults.
absl::Status BatchingFlags(ServerOptions* options) {
  SchedulingPolicy::Flags flags;
  flags.max_batch_requests = absl::GetFlag(FLAGS_max_batch_requests);
  RETURN_IF_ERROR(CheckRange("max_batch_requests", flags.max_batch_requests, 1,
                             1 << 20, "requests"));
  flags.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  RETURN_IF_ERROR(CheckRange("max_batch_tokens", flags.max_batch_tokens, 1,
                             int64_t{1} << 30, "slots"));
  flags.batch_min_calls = absl::GetFlag(FLAGS_batch_min_calls);
  RETURN_IF_ERROR(
      CheckRange("batch_min_calls", flags.batch_min_calls, 0, 4096, "calls"));
  flags.batcher_spin_us = absl::GetFlag(FLAGS_batcher_spin_us);
  RETURN_IF_ERROR(CheckRange("batcher_spin_us", flags.batcher_spin_us, -1,
                             1000000, "microseconds; -1: by CPU count"));
  flags.grpc_answer_threads = absl::GetFlag(FLAGS_grpc_answer_threads);
  RETURN_IF_ERROR(CheckRange("grpc_answer_threads", flags.grpc_answer_threads,
                             0, 64, "threads"));
  flags.batch_window_us = absl::GetFlag(FLAGS_batch_window_us);
  RETURN_IF_ERROR(CheckRange("batch_window_us", flags.batch_window_us, -1,
                             1000000, "microseconds; -1: by batcher mode"));
  flags.fast_channel = absl::GetFlag(FLAGS_fast_channel);
  flags.fast_channel_spin_us = absl::GetFlag(FLAGS_fast_channel_spin_us);
  flags.fast_channel_pollers = absl::GetFlag(FLAGS_fast_channel_pollers);
  SetSchedulingSettings(SchedulingPolicy::SettingsFromFlags(
                            flags, std::thread::hardware_concurrency()),
                        options);
  return absl::OkStatus();
}

// Sessions and their memory.
absl::Status SessionFlags(ServerOptions* options) {
  const int64_t lease_ms = absl::GetFlag(FLAGS_lease_ms);
  RETURN_IF_ERROR(
      CheckRange("lease_ms", lease_ms, 100, 86400000, "milliseconds"));
  options->sessions.lease = absl::Milliseconds(lease_ms);
  options->sessions.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  RETURN_IF_ERROR(CheckRange("max_sessions", options->sessions.max_sessions, 1,
                             65536, "sessions"));
  options->sessions.default_ring_capacity_slots =
      absl::GetFlag(FLAGS_ring_capacity_slots);
  RETURN_IF_ERROR(CheckRange("ring_capacity_slots",
                             options->sessions.default_ring_capacity_slots, 0,
                             int64_t{1} << 30, "slots; 0: the pool's slots"));
  options->sessions.max_ring_capacity_slots = std::max<int64_t>(
      options->sessions.default_ring_capacity_slots, int64_t{1} << 26);
  RETURN_IF_ERROR(SessionMemoryFromFlags(options));
  options->sessions.max_quota_pages =
      absl::GetFlag(FLAGS_max_session_quota_pages);
  // A pool sized by its KV budget (num_pages 0 here) is checked against
  // the largest pool instead.
  RETURN_IF_ERROR(CheckRange(
      "max_session_quota_pages", options->sessions.max_quota_pages, 0,
      options->pool.num_pages > 0 ? options->pool.num_pages
                                  : MaxPages(options->pool.page_size),
      "pages; 0: no cap beyond the pool"));
  return absl::OkStatus();
}

// --debug_checks, --metrics_port, --metrics_host.
absl::Status MetricsFlags(ServerOptions* options) {
  options->debug_checks = absl::GetFlag(FLAGS_debug_checks);
  options->metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (options->metrics_port < -1 || options->metrics_port > 65535) {
    return OutOfRange("metrics_port", absl::StrCat(options->metrics_port),
                      "1..65535, 0 for any free port, -1 for none");
  }
  options->metrics_host = absl::GetFlag(FLAGS_metrics_host);
  if (options->metrics_host.empty() && options->metrics_port >= 0) {
    return absl::InvalidArgumentError(
        "--metrics_host is empty (accepted: an address of this host, e.g. "
        "0.0.0.0 or 127.0.0.1)");
  }
  return absl::OkStatus();
}

// --kv_events_*.
absl::Status KvEventFlags(ServerOptions* options) {
  KvEventPublisherOptions& kv = options->kv_events;
  kv.endpoint = absl::GetFlag(FLAGS_kv_events_endpoint);
  kv.replay_endpoint = absl::GetFlag(FLAGS_kv_events_replay_endpoint);
  if (kv.endpoint.empty() && !kv.replay_endpoint.empty()) {
    return absl::InvalidArgumentError(
        "--kv_events_replay_endpoint needs --kv_events_endpoint");
  }
  kv.topic = absl::GetFlag(FLAGS_kv_events_topic);
  kv.replay_batches = absl::GetFlag(FLAGS_kv_events_replay_batches);
  RETURN_IF_ERROR(CheckRange("kv_events_replay_batches", kv.replay_batches, 0,
                             10000000, "batches"));
  kv.queue_events = absl::GetFlag(FLAGS_kv_events_queue_events);
  RETURN_IF_ERROR(CheckRange("kv_events_queue_events", kv.queue_events, 1,
                             100000000, "events"));
  kv.max_batch_events = absl::GetFlag(FLAGS_kv_events_batch_events);
  RETURN_IF_ERROR(CheckRange("kv_events_batch_events", kv.max_batch_events, 1,
                             1000000, "events"));
  const int64_t delay_us = absl::GetFlag(FLAGS_kv_events_batch_delay_us);
  RETURN_IF_ERROR(CheckRange("kv_events_batch_delay_us", delay_us, 0, 1000000,
                             "microseconds"));
  kv.max_batch_delay = absl::Microseconds(delay_us);
  const std::string encoding = absl::GetFlag(FLAGS_kv_events_encoding);
  if (encoding == "map") {
    kv.wire.encoding = KvEventEncoding::kTaggedMap;
  } else if (encoding == "array") {
    kv.wire.encoding = KvEventEncoding::kTaggedArray;
  } else {
    return NotOneOf("kv_events_encoding", encoding, "map, array");
  }
  const std::string block_hash = absl::GetFlag(FLAGS_kv_events_block_hash);
  if (block_hash == "int") {
    kv.wire.block_hash = BlockHashFormat::kUint64;
  } else if (block_hash == "bytes") {
    kv.wire.block_hash = BlockHashFormat::kBytes;
  } else {
    return NotOneOf("kv_events_block_hash", block_hash, "int, bytes");
  }
  kv.wire.data_parallel_rank =
      absl::GetFlag(FLAGS_kv_events_data_parallel_rank);
  RETURN_IF_ERROR(CheckRange("kv_events_data_parallel_rank",
                             kv.wire.data_parallel_rank, 0, 65535, "rank"));
  return absl::OkStatus();
}

// The flags as ServerOptions; INVALID_ARGUMENT naming the flag, its value
// and what is accepted for the first one that is out of range.
absl::StatusOr<ServerOptions> OptionsFromFlags() {
  ServerOptions options;
  for (absl::Status (*group)(ServerOptions*) :
       {DeviceFlags, PoolGeometryFlags, KvFlags, CheckHostMemory,
        PoolPolicyFlags, ListenFlags, FastChannelFlags, ConnectionFlags,
        SocketFlags, RegisterSecretFlag, TlsFlags, BatchingFlags, SessionFlags,
        MetricsFlags, KvEventFlags}) {
    RETURN_IF_ERROR(group(&options));
  }
  return options;
}

// Checks --max_sessions against the open-files limit (raised to its hard
// limit already): a value given on the command line that does not fit
// stops the daemon (INVALID_ARGUMENT naming both numbers); the default
// value (given or not) is lowered to what fits, with a warning.
absl::Status FitSessionsToDescriptors(ServerOptions* options) {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0 ||
      files.rlim_cur == RLIM_INFINITY) {
    return absl::OkStatus();
  }
  const int64_t limit = static_cast<int64_t>(files.rlim_cur);
  const int64_t fits = SessionsWithin(limit);
  int64_t& sessions = options->sessions.max_sessions;
  if (sessions <= fits) return absl::OkStatus();
  const std::string why = absl::StrFormat(
      "the open-files limit (RLIMIT_NOFILE) is %d, which holds %d sessions "
      "at %d descriptors a session beside the daemon's own",
      limit, fits, kDescriptorsPerSession);
  if (sessions !=
          std::stoll(
              absl::FindCommandLineFlag("max_sessions")->DefaultValue()) ||
      fits < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--max_sessions=%d does not fit: %s; raise the limit (LimitNOFILE=, "
        "ulimit -n) or lower --max_sessions",
        sessions, why));
  }
  Logger("server")->warn("--max_sessions lowered from {} to {}: {}", sessions,
                         fits, why);
  sessions = fits;
  return absl::OkStatus();
}

// spdlog's level for --log_level, in any case; INVALID_ARGUMENT for a name
// spdlog does not know (whose from_str would turn all logging off).
absl::StatusOr<spdlog::level::level_enum> LogLevel(const std::string& name) {
  static constexpr std::pair<const char*, spdlog::level::level_enum> kLevels[] =
      {{"trace", spdlog::level::trace},       {"debug", spdlog::level::debug},
       {"info", spdlog::level::info},         {"warn", spdlog::level::warn},
       {"warning", spdlog::level::warn},      {"error", spdlog::level::err},
       {"critical", spdlog::level::critical}, {"off", spdlog::level::off}};
  const std::string lower = absl::AsciiStrToLower(name);
  for (const auto& [level_name, level] : kLevels) {
    if (lower == level_name) return level;
  }
  return NotOneOf("log_level", name,
                  "trace, debug, info, warn, error, critical, off (any case)");
}

int Main() {
  absl::StatusOr<spdlog::level::level_enum> level =
      LogLevel(absl::GetFlag(FLAGS_log_level));
  if (!level.ok()) ExitUsage(kCommandLine.program, level.status().message());
  absl::StatusOr<ServerOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    ExitUsage(kCommandLine.program, options.status().message());
  }
  if (absl::GetFlag(FLAGS_print_scheduling_policy)) {
    absl::StatusOr<SchedulingPolicy> policy =
        SchedulingPolicy::Create(SchedulingSettingsOf(*options));
    if (!policy.ok())
      ExitUsage(kCommandLine.program, policy.status().message());
    for (const std::string& note : policy->notes()) {
      std::printf("note: %s\n", note.c_str());
    }
    std::printf("%s\n", policy->Describe().c_str());
    return 0;
  }
  std::shared_ptr<spdlog::logger> log = Logger("server");
  spdlog::set_level(*level);
  // Errors that end the daemon show at every level but "off".
  const auto fail = [&](const absl::Status& status) {
    log->critical("cannot start: {}", status.ToString());
    if (*level > spdlog::level::critical) {
      std::fprintf(stderr, "pagealloc-server: cannot start: %s\n",
                   status.ToString().c_str());
    }
    return kExitFailure;
  };
  if (options->listen.empty()) {
    const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
    absl::StatusOr<std::string> address =
        DefaultListenAddress(options->gpu, kSystemSocketDir,
                             runtime_dir != nullptr ? runtime_dir : "");
    if (!address.ok()) return fail(address.status());
    options->listen.push_back(*address);
  }
  // Every session holds a few descriptors (its connection, and memory the
  // daemon shares with it): run out of them and gRPC stops accepting. Take
  // the hard limit the operator allows (the unit raises it: LimitNOFILE).
  if (rlimit files; getrlimit(RLIMIT_NOFILE, &files) == 0 &&
                    files.rlim_cur < files.rlim_max) {
    const rlim_t soft = files.rlim_cur;
    files.rlim_cur = files.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &files) == 0) {
      log->info("open files limit raised from {} to {}", soft, files.rlim_max);
    }
  }
  if (absl::Status fits = FitSessionsToDescriptors(&*options); !fits.ok()) {
    ExitUsage(kCommandLine.program, fits.message());
  }
  // Signals go to one watcher thread, never to a gRPC or batcher thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<Server>> server;
  try {
    server = Server::Create(*options);
  } catch (const std::bad_alloc&) {
    // The host check in OptionsFromFlags leaves room; this is the rest.
    server = absl::ResourceExhaustedError(
        absl::StrFormat("out of host memory building a pool of %d pages",
                        options->pool.num_pages));
  }
  if (!server.ok()) {
    // The KV slab's sizing refusals (a budget larger than the memory
    // there is, one that leaves no page, --num_pages that does not fit)
    // are usage errors, found once the backend knows its memory.
    if (absl::IsInvalidArgument(server.status())) {
      ExitUsage(kCommandLine.program, server.status().message());
    }
    if (absl::IsResourceExhausted(server.status())) {
      // The pool's device memory: its free list, then a ring per session.
      return fail(absl::ResourceExhaustedError(absl::StrFormat(
          "%s (the pool of %d pages needs %s for its free list, and each "
          "session a ring of %s; docs/operations.md, \"Sizing the pool\")",
          server.status().message(), options->pool.num_pages,
          Bytes(8.0 * options->pool.num_pages),
          Bytes(8.0 *
                options->sessions
                    .ForPool(options->pool.num_pages * options->pool.page_size)
                    .default_ring_capacity_slots))));
    }
    return fail(server.status());
  }
  absl::Status started = (*server)->Start();
  if (!started.ok()) return fail(started);
  std::atomic<bool> stopped{false};
  std::thread watcher([&signals, &server, &stopped, log] {
    int signal = 0;
    sigwait(&signals, &signal);
    if (stopped.load()) return;  // woken below
    log->info("received {}; shutting down", strsignal(signal));
    (*server)->Shutdown();
  });
  (*server)->Wait();
  if (watcher.joinable()) {
    // Wake the watcher if shutdown came from elsewhere (a successor's
    // handover).
    stopped = true;
    pthread_kill(watcher.native_handle(), SIGTERM);
    watcher.join();
  }
  return 0;
}

}  // namespace
}  // namespace pagealloc

int main(int argc, char** argv) {
  // The descriptor keeper this daemon (or its predecessor) spawned: not a
  // daemon, and no flags of one.
  if (argc > 1 && std::string(argv[1]) == pagealloc::kFdKeeperArg) {
    return pagealloc::RunFdKeeper(argc, argv);
  }
  std::vector<char*> args =
      pagealloc::ParseCommandLine(argc, argv, pagealloc::kCommandLine);
  if (args.size() > 1) {
    pagealloc::ExitUsage(
        pagealloc::kCommandLine.program,
        absl::StrFormat("unexpected argument \"%s\" (flags are --name=value)",
                        args[1]));
  }
  // Debian builds Abseil without NDEBUG, which leaves Mutex deadlock
  // detection on: every Lock then updates a lock graph under one global
  // lock, which showed in profiles of the allocation path. Lock order is
  // checked at build time instead (--config=clang, -Wthread-safety).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return pagealloc::Main();
}
