// Server: the pagealloc daemon, assembled. Owns the backend, the pool, the
// sessions, the batcher and the gRPC server (PageAllocator, Health,
// reflection) on Unix sockets and/or TCP.
//
//   ASSIGN_OR_RETURN(auto server, Server::Create(options));
//   RETURN_IF_ERROR(server->Start());
//   ... server->Shutdown() from a signal watcher ...
//   server->Wait();
//
// This class is thread-safe.

#ifndef PAGEALLOC_SERVER_SERVER_H_
#define PAGEALLOC_SERVER_SERVER_H_

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "allocator/page_pool.h"
#include "common/handoff_thread.h"
#include "fd_keeper/fd_keeper.h"
#include "grpcpp/grpcpp.h"
#include "handover/handover.h"
#include "kept_state/kept_state.h"
#include "kv_events/grpc_stream.h"
#include "kv_events/publisher.h"
#include "memory/kv_layout.h"
#include "server/backend.h"
#include "server/batcher.h"
#include "server/call_core.h"
#include "server/connection_acceptor.h"
#include "server/fast_channel_server.h"
#include "server/grpc_service.h"
#include "server/memory_budget.h"
#include "server/memory_socket_server.h"
#include "server/metrics.h"
#include "server/metrics_http_server.h"
#include "server/scheduling_policy.h"
#include "server/session.h"

namespace pagealloc {

struct ServerOptions {
  // "auto" (CUDA when a GPU is present, else CPU), "cuda" or "cpu".
  std::string backend = "auto";
  int gpu = 0;
  PoolOptions pool;
  // gRPC addresses: "unix:///run/pagealloc/gpu0.sock", "127.0.0.1:50051".
  std::vector<std::string> listen;
  // Mode and group of Unix socket files (group "" keeps the default).
  int socket_mode = 0660;
  std::string socket_group;
  // The batcher, the fast channel's pollers and the gRPC answer threads
  // are scheduled by a SchedulingPolicy made of these fields (batcher,
  // fast_channel, fast_channel_spin, fast_channel_pollers,
  // grpc_answer_threads; SchedulingSettingsOf), which checks them and
  // resolves their contradictions. The defaults are the policy's for the
  // CPUs this process may run on.
  Batcher::Options batcher =
      SchedulingPolicy::DefaultsForMachine(std::thread::hardware_concurrency())
          .batcher;
  SessionRegistry::Options sessions;
  // TLS for TCP addresses (Unix sockets rely on file permissions). With a
  // certificate and key set, TCP listens with TLS only; with a client CA too,
  // clients must present a certificate it signed.
  struct Tls {
    std::string cert_file;       // PEM server certificate (chain)
    std::string key_file;        // PEM private key
    std::string client_ca_file;  // PEM CA for client certificates, optional
  } tls;
  // Largest gRPC message accepted, in bytes.
  int max_message_bytes = 64 << 20;
  // Run PagePool::CheckInvariants after every change (slow; tests).
  bool debug_checks = false;
  // Let ClearPool be forced while sessions hold pages (CallCore::Options).
  bool allow_forced_clear = false;
  // HTTP /metrics and /healthz: host and port (0: any free port; -1: off;
  // pagealloc-server's flag defaults to 9464). Loopback by default: the
  // port answers anyone who reaches it, so a deployment that scrapes from
  // elsewhere names the address (the pod IP, 0.0.0.0) itself.
  std::string metrics_host = "127.0.0.1";
  int metrics_port = -1;
  // The KV memory the daemon owns (docs/design.md, section 11). Without a
  // layout the daemon hands out slot indices only.
  struct Kv {
    std::optional<KvLayout> layout;
    // The slab's budget; without one the slab is sized for pool.num_pages
    // (which must then be set). With one and pool.num_pages == 0, the pool
    // takes the most pages the budget holds; with pool.num_pages set too,
    // those pages must fit the budget.
    std::optional<KvMemoryBudget> budget;
    // Zero a page in every buffer before it goes to a session other than
    // its last owner.
    bool scrub = false;
  } kv;
  // When not empty, Register must carry it (RegisterRequest.
  // register_secret; --register_secret_file).
  std::string register_secret;
  // Offer fast channels (fast_channel/layout.h) to sessions that ask, and
  // how long the poller spins after a call before it sleeps.
  bool fast_channel = true;
  absl::Duration fast_channel_spin = absl::Microseconds(200);
  int fast_channel_pollers = 1;
  // How long an ended session's channel header page is kept for a client
  // that still maps it (server/retired_channel_headers.h).
  absl::Duration fast_channel_ended_header_life = absl::Seconds(10);
  // Threads that send the gRPC answers of launches that carried several
  // calls, taken in turn, where the batcher thread spins (0: the batcher
  // thread sends them itself).
  int grpc_answer_threads = 1;
  // Connections (docs/operations.md, "Connections"). The daemon accepts on
  // its Unix sockets itself (server/connection_acceptor.h) and holds at
  // most this many connections there; more are closed as they arrive.
  int max_connections = 4096;
  // gRPC keepalive from the daemon's side: a connection with a call open
  // (a session's KeepAlive stream) and silent for keepalive_time is
  // pinged, and closed when the ping is not answered within
  // keepalive_timeout (a hung or vanished peer).
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  // A connection with no call open for this long is closed (GOAWAY; a gRPC
  // client reconnects on its next call). A session's KeepAlive stream is a
  // call open for the session's life, so sessions are never idle.
  absl::Duration max_connection_idle = absl::Minutes(5);
  // Budgets of the memory sessions make the daemon allocate
  // (server/memory_budget.h), in bytes; -1: derived from what the daemon
  // can have (DefaultSessionBudget). Host memory holds the CPU backend's
  // rings and every fast channel; GPU memory the CUDA backend's rings.
  // Each session's ring is capped by its budget too.
  int64_t session_memory = -1;
  int64_t session_gpu_memory = -1;
  // The memory socket's bounds on connections that have not sent their
  // Hello (MemorySocketServer::Options; docs/design.md, section 9).
  MemorySocketServer::Options memory_socket;
  // Plain TCP (no TLS) on an address other than loopback: Start refuses it
  // unless this is set, and then logs a warning.
  bool allow_insecure_tcp = false;
  // A fast channel's abuse (FastChannelServer::Options): strikes that
  // throttle its session and that drop it (0: never), and how long a
  // throttle lasts after the last strike.
  int64_t fast_channel_throttle_strikes = 100;
  int64_t fast_channel_drop_strikes = 1000;
  absl::Duration fast_channel_throttle_time = absl::Seconds(1);
  // KV events for routers (docs/design.md, "KV events"): published when
  // kv_events.endpoint is set, and served by SubscribeKvEvents then.
  KvEventPublisherOptions kv_events;
  // Keep the pool across the daemon's own restarts (docs/design.md, "A
  // restart keeps the pool"): its state journal and KV slab in the service
  // manager's fd store (under a service manager: $NOTIFY_SOCKET), or held
  // by the daemon and handed to a successor over its handover socket
  // (otherwise), recovered at the next start.
  struct KeepState {
    bool enabled = false;
    // Without a service manager: take the pool over from the daemon that
    // runs on the same socket (it stops once this one has checked it can
    // read its state); FAILED_PRECONDITION when none runs.
    bool take_over = false;
    // The journal's log of records between snapshots (a snapshot is
    // written when half of it is used).
    int64_t log_bytes = 64 << 20;
    // Drop a kept state this build refuses (another format, another
    // pool's flags) instead of refusing to start.
    bool discard = false;
    // Without a service manager: the executable of the descriptor keeper
    // (//fd_keeper; the daemon's own, /proc/self/exe), which holds the
    // kept descriptors in a process of its own, so that the pool outlives
    // this daemon's crash too, and answers successors on the handover
    // socket. Empty: the daemon holds them and answers successors itself
    // (a planned restart keeps the pool, a crash does not).
    std::string keeper_binary;
    // How long the keeper waits for a successor after the daemon is gone.
    absl::Duration keeper_linger = absl::Minutes(5);
    // At a stop that keeps the sessions: how long to wait for frees
    // pending on their release fence, whose words only this process
    // maps. Their clients' streams still write the words; pages whose
    // fence passes are freed (and kept so) before the daemon exits, and
    // the rest stay their sessions', marked as awaiting release in the
    // kept state, until each session resumes.
    absl::Duration release_wait = absl::Seconds(1);
  } keep_state;
};

// Applies the daemon's gRPC server settings from `options` to `builder`:
// message size limits, no HTTP/2 BDP probing, keepalive, idle and
// handshake timeouts. Server::Start builds its server with them, and the
// benchmark's gRPC echo floor (bench/grpc_echo.h) builds its own with them
// too, so that both carry calls alike.
void ApplyGrpcServerSettings(const ServerOptions& options,
                             grpc::ServerBuilder* builder);

// The scheduling settings of `options` (see ServerOptions.batcher), and
// their way back into ServerOptions.
SchedulingPolicy::Settings SchedulingSettingsOf(const ServerOptions& options);
void SetSchedulingSettings(const SchedulingPolicy::Settings& settings,
                           ServerOptions* options);

class InFlightRpcs;  // server.cc: the unary RPCs not yet answered

class Server {
 public:
  // Builds the backend, the KV slab (options.kv), pool, sessions and
  // batcher. Fails with FAILED_PRECONDITION when --backend=cuda finds no
  // usable GPU, INVALID_ARGUMENT naming the numbers when the KV budget is
  // larger than the memory available, leaves no page, or cannot hold
  // pool.num_pages; RESOURCE_EXHAUSTED when the slab cannot be had.
  static absl::StatusOr<std::unique_ptr<Server>> Create(
      const ServerOptions& options);
  ~Server();

  // Binds the listen addresses and starts serving. Refuses to start over a
  // Unix socket another process is serving on; replaces a stale one.
  // FAILED_PRECONDITION for a plain TCP address that is not loopback,
  // unless options.allow_insecure_tcp (or TLS is configured).
  absl::Status Start() ABSL_LOCKS_EXCLUDED(mu_);

  // What /healthz reports: OK while serving; UNAVAILABLE "draining" once
  // Shutdown began, or naming the Unix socket and the reason while the
  // daemon cannot accept connections there (descriptors exhausted).
  absl::Status Health() const;

  // Drains: new calls get UNAVAILABLE, queued work finishes and is
  // answered, then the gRPC server stops at once (KeepAlive streams and idle
  // connections are cut rather than waited for) and socket files are
  // removed. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until Shutdown has finished.
  void Wait();

  // A channel to this server without a socket (tests).
  std::shared_ptr<grpc::Channel> InProcessChannel();

  PagePool& pool() { return *pool_; }
  Backend& backend() { return *backend_; }
  CallCore& core() { return *core_; }
  // Null when ServerOptions.fast_channel is off.
  FastChannelServer* fast_channels() { return fast_channels_.get(); }
  // The memory socket (memory/memory_socket.h), beside the first Unix
  // socket of `listen`; null when there is none.
  MemorySocketServer* memory_socket() { return memory_socket_.get(); }
  // Its path ("" when there is none).
  const std::string& memory_socket_path() const { return memory_socket_path_; }
  const ServerOptions& options() const { return options_; }
  // Which thread does what (made by Create from options()).
  const SchedulingPolicy& scheduling_policy() const { return *policy_; }
  // Addresses actually bound ("127.0.0.1:0" resolves to a real port).
  std::vector<std::string> bound_addresses() const ABSL_LOCKS_EXCLUDED(mu_);
  // The metrics port actually bound, or -1 when metrics are off.
  int metrics_port() const ABSL_LOCKS_EXCLUDED(mu_);
  const MetricsExporter& metrics() const { return *metrics_; }
  // Where the pool's prefix cache reports what it stores and removes: the
  // KV-event publisher, or null when options.kv_events.endpoint is empty.
  // It lives as long as the server.
  KvEventSink* kv_event_sink() const { return kv_events_.get(); }
  KvEventPublisher* kv_event_publisher() { return kv_events_.get(); }

 private:
  explicit Server(const ServerOptions& options) : options_(options) {}
  void ReapLeases();
  // Binds the memory socket beside the first Unix socket (same mode and
  // group) and starts serving it; nothing when there is no Unix socket.
  absl::Status StartMemorySocket();
  // Checks the TCP addresses of options_.listen against
  // allow_insecure_tcp and TLS.
  absl::Status CheckTcpAddresses() const;

  // Sets up host_budget_ and gpu_budget_ (Create, after the KV slab), and
  // caps options_.sessions' ring sizes by them; with `pool_sized_ring`
  // (--ring_capacity_slots=0) the default ring shrinks to an eighth of the
  // ring budget where the pool is larger. INVALID_ARGUMENT naming
  // the numbers when a budget cannot hold one session's default ring and
  // channel.
  absl::Status MakeBudgets(bool pool_sized_ring);

  // As given, but pool.num_pages as the KV slab sized it (Create).
  ServerOptions options_;
  // First: what reports to it (the pool) and follows it (the gRPC
  // streams) are destroyed before it.
  std::unique_ptr<KvEventPublisher> kv_events_;
  std::optional<SchedulingPolicy> policy_;
  std::unique_ptr<Backend> backend_;
  // Sessions' memory; before everything that charges them.
  std::unique_ptr<MemoryBudget> host_budget_;
  std::unique_ptr<MemoryBudget> gpu_budget_;  // CUDA backend only
  // The slab's identity (KvSlab.slab_id): drawn with the slab, kept with
  // it across restarts. 0 without a slab.
  uint64_t slab_id_ = 0;
  // Registers the sessions the kept pool's owners are (their records are
  // the owners' metadata), each with a fresh lease.
  absl::Status RestoreSessions();
  // Without a service manager: answers successors' handovers here, with
  // the descriptors this process holds (no keeper configured).
  absl::Status ListenForSuccessors(std::function<void()> stop);
  // Without a service manager: spawns the descriptor keeper, which holds
  // the kept descriptors and answers successors (//fd_keeper).
  absl::Status SpawnKeeper(std::function<void()> stop)
      ABSL_LOCKS_EXCLUDED(keeper_mu_);
  // Spawns a keeper of kept_'s descriptors that runs `stop` when a
  // successor takes over.
  absl::StatusOr<std::unique_ptr<FdKeeper>> StartKeeper(
      std::function<void()> stop) ABSL_LOCKS_EXCLUDED(keeper_mu_);
  // Tells the keeper to drop the descriptors, for good (the kept state
  // broke, or the sessions end).
  void RetireKeeper() ABSL_LOCKS_EXCLUDED(keeper_mu_);
  // Spawns a keeper in place of one that was lost (killed) while this
  // daemon runs, so that its stop or crash keeps the pool again.
  void RespawnLostKeeper() ABSL_LOCKS_EXCLUDED(keeper_mu_, mu_);
  // Declared before the pool, whose change log it is.
  std::unique_ptr<KeptState> kept_;
  // Answers a successor's handover (kept_ held by the daemon itself,
  // without a keeper); null otherwise.
  std::unique_ptr<HandoverListener> handover_;
  // Holds kept_'s descriptors in a process of its own and answers
  // successors (options_.keep_state.keeper_binary); null otherwise. A
  // keeper lost while the daemon runs (killed) is spawned anew by the
  // reaper's thread; one retired (the kept state broke, or the daemon
  // stops without keeping its sessions) is not.
  absl::Mutex keeper_mu_;
  std::unique_ptr<FdKeeper> keeper_ ABSL_GUARDED_BY(keeper_mu_);
  std::function<void()> keeper_stop_ ABSL_GUARDED_BY(keeper_mu_);
  bool keeper_retired_ ABSL_GUARDED_BY(keeper_mu_) = false;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<SessionRegistry> sessions_;
  // Send gRPC answers of shared launches (GrpcService); declared before
  // the batcher, which hands them work until it stops.
  std::unique_ptr<HandoffThreads> grpc_answer_senders_;
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<CallCore> core_;
  // After core_, which they call: destroyed first.
  std::unique_ptr<FastChannelServer> fast_channels_;
  // After fast_channels_, which it exports: destroyed first.
  std::string memory_socket_path_;
  std::unique_ptr<MemorySocketServer> memory_socket_;
  std::unique_ptr<GrpcService> grpc_service_;
  std::unique_ptr<KvEventsService> kv_events_service_;
  std::unique_ptr<MetricsExporter> metrics_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  // Shared with the gRPC server's interceptors, which may outlive Shutdown.
  std::shared_ptr<InFlightRpcs> in_flight_rpcs_;
  std::unique_ptr<grpc::Server> grpc_server_;
  // Accepts on the Unix sockets of `listen` and hands connections to
  // grpc_server_; stopped before it.
  std::unique_ptr<ConnectionAcceptor> acceptor_;
  std::vector<std::string> socket_paths_;
  std::thread reaper_;
  absl::Notification stop_reaper_;
  // Frees pages whose release fence passed (CallCore::RunReleasePoller).
  std::thread release_poller_;
  absl::Notification shut_down_;

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> bound_ ABSL_GUARDED_BY(mu_);
};

// The address pagealloc-server listens on without --listen: the first of
// SocketDirectories(system_dir, runtime_dir) (common/socket_location.h,
// where clients look for it, in the same order) that this process may
// create sockets in:
// unix://<system_dir>/gpu<gpu>.sock when this process may create sockets in
// `system_dir` (kSystemSocketDir; created when missing), else
// unix://<runtime_dir>/pagealloc/gpu<gpu>.sock (runtime_dir:
// $XDG_RUNTIME_DIR, "" when unset), with a warning in the log that says
// why and where. PERMISSION_DENIED when neither will do, naming each
// directory's error (errno's text) and the ways out.
absl::StatusOr<std::string> DefaultListenAddress(
    int gpu, const std::string& system_dir, const std::string& runtime_dir);

// Whether a TCP listen address ("host:port", optionally "ipv4:" or
// "ipv6:" first) names only this host's loopback interface: 127.0.0.0/8,
// [::1] or localhost. A wildcard or any other host is not.
bool IsLoopbackAddress(const std::string& address);

// Makes the backend options.backend names. "auto" falls back to CPU
// (logging a warning) when no GPU is usable.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(
    const ServerOptions& options);

// Sizes the KV slab of options.kv (REQUIRES: a layout) on `backend`: its
// geometry, given the backend's alignment and available memory. Errors as
// Server::Create's.
absl::StatusOr<KvSlabGeometry> SizeKvSlab(const ServerOptions& options,
                                          Backend& backend);

// Removes the shared-memory files (/dev/shm/pagealloc-gpu<gpu>.<pid>.*) that
// daemons of earlier versions named their rings, channels and doorbells
// with and left behind when they were killed: those whose creator pid no
// longer runs. Returns how many it removed.
int RemoveLeftoverSegments(int gpu);

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_SERVER_H_
