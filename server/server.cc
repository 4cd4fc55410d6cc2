#include "server/server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <pwd.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/socket_location.h"
#include "common/status_macros.h"
#include "fast_channel/layout.h"
#include "fd_store/fd_store.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_posix.h"
#include "grpcpp/support/server_interceptor.h"
#include "kept_state/session_record.h"
#include "memory/memory_socket.h"
#include "memory/unique_fd.h"
#include "server/descriptors.h"
#include "server/heap_return.h"
#include "unix_socket/listen.h"

#ifdef PAGEALLOC_HAVE_CUDA
#include "server/cuda_backend.h"
#endif

namespace pagealloc {

// Counts the unary RPCs that have arrived and are not yet complete (their
// answer sent). Streams are not counted: a KeepAlive stream is open for as
// long as its session lives and carries no work to finish. This class is
// thread-safe.
class InFlightRpcs {
 public:
  void Add() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++count_;
  }
  void Done() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    --count_;
  }
  // Waits until no unary RPC is in flight; false after `timeout`.
  bool WaitForNone(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        absl::Condition(
            +[](int64_t* count) { return *count == 0; }, &count_),
        timeout);
  }

 private:
  absl::Mutex mu_;
  int64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

namespace {

// The longest a TCP connection may take to finish its TLS handshake and
// send its HTTP/2 settings (capped by --max_connection_idle_ms).
constexpr absl::Duration kTcpHandshakeTimeout = absl::Seconds(20);

// Holds its RPC in the InFlightRpcs count from creation (the RPC's arrival)
// to destruction (gRPC destroys it with the finished call).
class InFlightInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit InFlightInterceptor(std::shared_ptr<InFlightRpcs> rpcs)
      : rpcs_(std::move(rpcs)) {
    rpcs_->Add();
  }
  ~InFlightInterceptor() override { rpcs_->Done(); }
  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  const std::shared_ptr<InFlightRpcs> rpcs_;
};

class InFlightInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit InFlightInterceptorFactory(std::shared_ptr<InFlightRpcs> rpcs)
      : rpcs_(std::move(rpcs)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    if (info->type() != grpc::experimental::ServerRpcInfo::Type::UNARY) {
      return nullptr;  // streams: KeepAlive, health Watch, reflection
    }
    return new InFlightInterceptor(rpcs_);
  }

 private:
  const std::shared_ptr<InFlightRpcs> rpcs_;
};

// "unix:///run/x.sock" or "unix:/run/x.sock" -> "/run/x.sock"; "" for TCP.
std::string UnixSocketPath(const std::string& address) {
  if (absl::StartsWith(address, "unix://")) return address.substr(7);
  if (absl::StartsWith(address, "unix:")) return address.substr(5);
  return "";
}

// Listens on the Unix socket `path` of `type` with --socket_mode and
// --socket_group (ListenOnUnixSocket); a directory this user cannot use is
// refused with the flag's advice.
absl::StatusOr<UniqueFd> ListenOnSocketFlag(const std::string& path, int type,
                                            const ServerOptions& options) {
  UnixListenOptions listen;
  listen.type = type;
  listen.mode = options.socket_mode;
  listen.group = options.socket_group;
  listen.socket_advice = "--listen=unix:///tmp/pagealloc.sock";
  return ListenOnUnixSocket(path, listen);
}

// "ipv4:127.0.0.1:80" -> "127.0.0.1"; "[::1]:80" -> "::1"; "" for no host.
std::string TcpHost(const std::string& address) {
  absl::string_view host(address);
  absl::ConsumePrefix(&host, "ipv4:") || absl::ConsumePrefix(&host, "ipv6:");
  const size_t colon = host.rfind(':');
  if (colon != absl::string_view::npos) host = host.substr(0, colon);
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  return std::string(host);
}

// Why a bind to `address` (a Unix socket or host:port) fails, in errno's
// words with a hint: "Address already in use (another process listens
// there)". "" when a bind now succeeds (the probe's socket is closed and
// removed again) or the address is not one we can probe.
std::string WhyCannotBind(const std::string& address) {
  const std::string path = UnixSocketPath(address);
  int error = 0;
  if (!path.empty()) {
    sockaddr_un addr{};
    if (path.size() >= sizeof(addr.sun_path)) return "";
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return "";
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      error = errno;
    } else {
      unlink(path.c_str());
    }
    close(fd);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) return "";
    std::string host = address.substr(0, colon);
    const std::string port = address.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* found = nullptr;
    const int resolved = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                                     port.c_str(), &hints, &found);
    if (resolved != 0) return gai_strerror(resolved);
    const int fd =
        socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
      const int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (bind(fd, found->ai_addr, found->ai_addrlen) != 0) error = errno;
      close(fd);
    }
    freeaddrinfo(found);
  }
  if (error == 0) return "";
  std::string why = std::strerror(error);
  if (error == EADDRINUSE) {
    why += " (another process listens there)";
  } else if (error == EACCES && path.empty()) {
    why += " (ports below 1024 need root)";
  } else if (error == EADDRNOTAVAIL) {
    why += " (no interface of this host has that address)";
  }
  return why;
}

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: cannot read %s", flag, path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Credentials for TCP addresses: TLS when configured, else insecure.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(
    const ServerOptions::Tls& tls) {
  if (tls.cert_file.empty() && tls.key_file.empty()) {
    if (!tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca_file needs --tls_cert_file and --tls_key_file");
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both --tls_cert_file and --tls_key_file");
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, ReadFile(tls.cert_file, "--tls_cert_file"));
  ASSIGN_OR_RETURN(pair.private_key, ReadFile(tls.key_file, "--tls_key_file"));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!tls.client_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs,
                     ReadFile(tls.client_ca_file, "--tls_client_ca_file"));
    ssl.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// The first Unix socket among `listen`, which the memory socket and the
// handover socket sit beside; "" without one.
std::string FirstUnixSocketPath(const std::vector<std::string>& listen) {
  for (const std::string& address : listen) {
    const std::string path = UnixSocketPath(address);
    if (!path.empty()) return path;
  }
  return "";
}

std::string MemorySocketPathFor(const std::vector<std::string>& listen) {
  const std::string first = FirstUnixSocketPath(listen);
  return first.empty() ? "" : memory_socket::MemorySocketPath(first);
}

std::string HandoverSocketPathFor(const std::vector<std::string>& listen) {
  const std::string first = FirstUnixSocketPath(listen);
  return first.empty() ? "" : HandoverSocketPath(first);
}

}  // namespace

absl::StatusOr<std::string> DefaultListenAddress(
    int gpu, const std::string& system_dir, const std::string& runtime_dir) {
  // Clients look in the same directories, in the same order
  // (FindDaemonTarget): the first that takes our socket is the one they find.
  const std::vector<std::string> dirs =
      SocketDirectories(system_dir, runtime_dir);
  std::vector<std::string> refusals;
  for (const std::string& dir : dirs) {
    const absl::Status usable =
        CheckSocketDirectory(dir, dir == system_dir ? 0755 : 0700);
    if (!usable.ok()) {
      refusals.push_back(std::string(usable.message()));
      continue;
    }
    const std::string address = absl::StrCat("unix://", SocketPathIn(dir, gpu));
    if (!refusals.empty()) {
      Logger("server")->warn(
          "{}; listening in this user's runtime directory instead: {} "
          "(clients look there too; or --target={})",
          refusals.front(), address, address);
    }
    return address;
  }
  if (runtime_dir.empty()) refusals.push_back("$XDG_RUNTIME_DIR is not set");
  const struct passwd* user = getpwuid(geteuid());
  return absl::PermissionDeniedError(absl::StrFormat(
      "no directory for the socket: %s. Run as root (or as the "
      "pagealloc user of deploy/systemd), let this user create sockets in "
      "%s (sudo install -d -o %s %s), or name a socket of your own: "
      "--listen=unix:///tmp/pagealloc-gpu%d.sock",
      absl::StrJoin(refusals, "; and "), system_dir,
      user != nullptr ? user->pw_name : "$USER", system_dir, gpu));
}

int RemoveLeftoverSegments(int gpu) {
  const std::string prefix = absl::StrFormat("pagealloc-gpu%d.", gpu);
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (const dirent* entry = readdir(dir)) {
    // "pagealloc-gpu<gpu>.<pid>.<rest>": the creator's pid follows.
    absl::string_view name(entry->d_name);
    if (!absl::ConsumePrefix(&name, prefix)) continue;
    const size_t dot = name.find('.');
    int pid = 0;
    if (dot == absl::string_view::npos ||
        !absl::SimpleAtoi(name.substr(0, dot), &pid) || pid <= 0 ||
        pid == getpid()) {
      continue;
    }
    // A pid that runs (or that we may not signal) may be a daemon of an
    // earlier version still serving: its files stay.
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (unlinkat(dirfd(dir), entry->d_name, 0) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

bool IsLoopbackAddress(const std::string& address) {
  const std::string host = TcpHost(address);
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(
    const ServerOptions& options) {
  const std::string& name = options.backend;
  if (name == "cpu") return MakeCpuBackend();
  if (name != "cuda" && name != "auto") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--backend=%s is not one of auto, cuda, cpu", name));
  }
#ifdef PAGEALLOC_HAVE_CUDA
  CudaBackendOptions cuda_options;
  cuda_options.gpu = options.gpu;
  cuda_options.max_batch_requests = options.batcher.max_batch_requests;
  cuda_options.max_batch_tokens = options.batcher.max_batch_tokens;
  absl::StatusOr<std::unique_ptr<Backend>> cuda = MakeCudaBackend(cuda_options);
  if (cuda.ok() || name == "cuda") return cuda;
  Logger("server")->warn(
      "no usable GPU ({}); falling back to the CPU backend, whose slots live "
      "in host shared memory",
      std::string(cuda.status().message()));
#else
  if (name == "cuda") {
    return absl::FailedPreconditionError(
        "this pagealloc-server was built without CUDA (no toolkit at build "
        "time); use --backend=cpu");
  }
  Logger("server")->warn(
      "built without CUDA; using the CPU backend, whose slots live in host "
      "shared memory");
#endif
  return MakeCpuBackend();
}

absl::StatusOr<KvSlabGeometry> SizeKvSlab(const ServerOptions& options,
                                          Backend& backend) {
  const KvLayout& layout = *options.kv.layout;
  const int64_t page_size = options.pool.page_size;
  ASSIGN_OR_RETURN(const int64_t alignment, backend.KvAlignment());
  ASSIGN_OR_RETURN(const int64_t available, backend.KvAvailableBytes());
  const char* where = backend.kind() == BackendKind::kCuda
                          ? "free on the GPU"
                          : AvailableHostMemory().source();
  std::optional<int64_t> budget;
  if (options.kv.budget.has_value()) {
    budget = options.kv.budget->Resolve(available);
    if (*budget > available) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--kv_memory asks for %s (%d bytes); only %s (%d bytes) is %s",
          FormatBytes(*budget), *budget, FormatBytes(available), available,
          where));
    }
  }
  if (options.pool.num_pages == 0) {
    if (!budget.has_value()) {
      return absl::InvalidArgumentError(
          "--kv_layout needs --kv_memory (or --num_pages) to size the slab");
    }
    return FitKvSlab(layout, page_size, *budget, alignment);
  }
  ASSIGN_OR_RETURN(
      KvSlabGeometry slab,
      PlaceKvSlab(layout, page_size, options.pool.num_pages, alignment));
  const int64_t limit = budget.value_or(available);
  if (slab.total_bytes > limit) {
    absl::StatusOr<KvSlabGeometry> fits =
        FitKvSlab(layout, page_size, limit, alignment);
    return absl::InvalidArgumentError(absl::StrFormat(
        "--num_pages=%d with --kv_layout needs a KV slab of %s (%d bytes, %s "
        "a page); %s %s (%d bytes)%s",
        options.pool.num_pages, FormatBytes(slab.total_bytes), slab.total_bytes,
        FormatBytes(slab.bytes_per_page),
        budget.has_value() ? "--kv_memory is" : "only", FormatBytes(limit),
        limit,
        fits.ok() ? absl::StrFormat(", which holds %d pages", fits->num_pages)
                  : std::string(budget.has_value() ? "" : " is available")));
  }
  return slab;
}

SchedulingPolicy::Settings SchedulingSettingsOf(const ServerOptions& options) {
  SchedulingPolicy::Settings settings;
  settings.batcher = options.batcher;
  settings.fast_channel = options.fast_channel;
  settings.fast_channel_spin = options.fast_channel_spin;
  settings.fast_channel_pollers = options.fast_channel_pollers;
  settings.grpc_answer_threads = options.grpc_answer_threads;
  return settings;
}

void SetSchedulingSettings(const SchedulingPolicy::Settings& settings,
                           ServerOptions* options) {
  options->batcher = settings.batcher;
  options->fast_channel = settings.fast_channel;
  options->fast_channel_spin = settings.fast_channel_spin;
  options->fast_channel_pollers = settings.fast_channel_pollers;
  options->grpc_answer_threads = settings.grpc_answer_threads;
}

// Reports every shared page of `state` as stored, each after the page its
// key chains to (when the index holds it), for the routers that follow the
// KV events: a restarted daemon's publisher starts with AllBlocksCleared.
void ReportKeptBlocks(const PoolState& state, KvEventSink& sink) {
  absl::flat_hash_map<PrefixKey, std::vector<const PrefixEntryState*>> children;
  absl::flat_hash_set<PrefixKey> keys;
  for (const PrefixEntryState& entry : state.prefix_entries) {
    keys.insert(entry.key);
  }
  std::vector<const PrefixEntryState*> ready;
  for (const PrefixEntryState& entry : state.prefix_entries) {
    if (entry.has_parent && keys.contains(entry.parent)) {
      children[entry.parent].push_back(&entry);
    } else {
      ready.push_back(&entry);
    }
  }
  while (!ready.empty()) {
    const PrefixEntryState* entry = ready.back();
    ready.pop_back();
    StoredBlocks blocks;
    blocks.keys.push_back(PrefixKeyBytes(entry->key));
    if (entry->has_parent) blocks.parent_key = PrefixKeyBytes(entry->parent);
    sink.BlocksStored(blocks);
    auto it = children.find(entry->key);
    if (it == children.end()) continue;
    ready.insert(ready.end(), it->second.begin(), it->second.end());
  }
}

// What a kept pool state means: the flags that shape it. A restart with
// other values refuses the kept state (KeptStateOptions.fingerprint). The
// pool's size is not among them when a budget sizes it: a kept pool keeps
// its pages.
std::string PoolFingerprint(const ServerOptions& options, Backend& backend) {
  const DeviceDescription device = backend.DescribeDevice();
  const PoolOptions& pool = options.pool;
  return absl::StrCat(
      "backend=", device.kind == BackendKind::kCuda ? "cuda" : "cpu",
      "\ndevice=", device.device_uuid, "\npage_size=", pool.page_size,
      "\nnum_pages=",
      pool.num_pages > 0 ? absl::StrCat(pool.num_pages) : "sized by budget",
      "\nfree_policy=", FreePolicyName(pool.free_policy),
      "\nsemantics=", SemanticsName(pool.semantics), "\nkv_layout=",
      options.kv.layout.has_value() ? options.kv.layout->text : "none",
      "\nkv_scrub=", options.kv.scrub ? "on" : "off",
      "\nmax_pinned_pages_per_owner=", pool.max_pinned_pages_per_owner);
}

namespace {

// The kept state's descriptors: from the service manager's store when one
// listens; otherwise from the daemon running on the same socket, when told
// to take over (which stops that daemon once its state is known to be
// one this build reads; none running is an error).
absl::StatusOr<std::unique_ptr<KeptState>> OpenKeptState(
    const ServerOptions& options, KeptStateOptions kept_options) {
  using PassedFds = absl::flat_hash_map<std::string, UniqueFd>;
  if (ServiceManagerListening()) {
    if (options.keep_state.take_over) {
      return absl::InvalidArgumentError(
          "--take_over is for daemons without a service manager; under one, "
          "restart the unit (systemctl restart) and its store hands the "
          "pool over");
    }
    ASSIGN_OR_RETURN(PassedFds passed, TakePassedFds());
    return KeptState::Open(kept_options, std::move(passed));
  }
  kept_options.keeper = DescriptorKeeper::kDaemon;
  const std::string path = HandoverSocketPathFor(options.listen);
  if (path.empty()) {
    return absl::InvalidArgumentError(
        "--keep_state without a service manager hands the pool to a "
        "successor over a Unix socket beside the daemon's: listen on one "
        "(--listen=unix://...)");
  }
  auto log = Logger("state");
  if (!options.keep_state.take_over) {
    // A live handover socket is a running daemon's, or the descriptor
    // keeper's of one that died: its pool is there to take over, and a
    // fresh pool must not take its place (nor its keeper's socket).
    if (HandoverSocketLive(path)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "a daemon, or the descriptor keeper of one that died, holds a "
          "kept pool on %s: start with --take_over to take it over (add "
          "--discard_state to start a fresh pool instead), or stop that "
          "process",
          path));
    }
    if (options.keep_state.keeper_binary.empty()) {
      log->warn(
          "no service manager keeps descriptors ($NOTIFY_SOCKET is not set) "
          "and no descriptor keeper (--fd_keeper=false): this daemon holds "
          "its pool's state itself and hands it to a successor started with "
          "--take_over (socket {}); a crash loses it",
          path);
    }
    return KeptState::Open(kept_options, PassedFds());
  }
  constexpr absl::Duration kHandoverTimeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<PendingHandover>> pending =
      PendingHandover::Request(path, kHandoverTimeout);
  if (absl::IsNotFound(pending.status())) {
    // Never a fresh pool in its place: a second successor, or one started
    // while the first binds the sockets, must not serve an empty pool on
    // them.
    return absl::FailedPreconditionError(
        absl::StrCat("--take_over: ", pending.status().message(),
                     "; for a first start, start without --take_over"));
  }
  if (!pending.ok()) {
    return absl::Status(
        pending.status().code(),
        absl::StrCat("--take_over: ", pending.status().message()));
  }
  PassedFds& offered = (*pending)->fds();
  auto state = offered.find(kStateFdName);
  const absl::Status readable =
      state == offered.end()
          ? absl::FailedPreconditionError(
                "the running daemon offered no state journal")
          : KeptState::CheckTakeOver(kept_options, state->second.get());
  if (!readable.ok()) {
    (*pending)->Refuse(readable.message());
    return absl::FailedPreconditionError(
        absl::StrCat("--take_over: refused, and the running daemon serves on: ",
                     readable.message(),
                     ". Start the build or the flags that kept it, or add "
                     "--discard_state (every session and its KV is lost)"));
  }
  log->info(
      "--take_over: the running daemon's state is one this build "
      "reads; asking it to stop");
  RETURN_IF_ERROR((*pending)->Accept(kHandoverTimeout));
  return KeptState::Open(kept_options, std::move(offered));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(
    const ServerOptions& options) {
  std::unique_ptr<Server> server(new Server(options));
  if (!options.kv_events.endpoint.empty()) {
    // Before the pool, whose prefix cache reports to it: its first batch,
    // AllBlocksCleared, tells routers this pool starts with none cached.
    ASSIGN_OR_RETURN(server->kv_events_,
                     KvEventPublisher::Create(options.kv_events));
    server->kv_events_->Start();
    Logger("server")->info(
        "publishing KV events on {}{}{}", server->kv_events_->pub_endpoint(),
        server->kv_events_->replay_endpoint().empty() ? "" : ", replay on ",
        server->kv_events_->replay_endpoint());
  } else if (!options.kv_events.replay_endpoint.empty()) {
    return absl::InvalidArgumentError(
        "--kv_events_replay_endpoint needs --kv_events_endpoint");
  }
  ASSIGN_OR_RETURN(SchedulingPolicy policy,
                   SchedulingPolicy::Create(SchedulingSettingsOf(options)));
  for (const std::string& note : policy.notes()) {
    Logger("server")->info("scheduling: {}", note);
  }
  server->policy_ = std::move(policy);
  ASSIGN_OR_RETURN(server->backend_, MakeBackend(options));
  PoolOptions pool_options = options.pool;
  const std::string fingerprint = PoolFingerprint(options, *server->backend_);
  if (options.keep_state.enabled) {
    KeptStateOptions kept_options;
    kept_options.fingerprint = fingerprint;
    kept_options.log_capacity_bytes = options.keep_state.log_bytes;
    kept_options.discard = options.keep_state.discard;
    kept_options.max_owners = options.sessions.max_sessions;
    ASSIGN_OR_RETURN(server->kept_, OpenKeptState(options, kept_options));
  }
  KeptState* const kept = server->kept_.get();
  auto recovering = [kept] {
    return kept != nullptr && kept->outcome() == KeptStateOutcome::kRecovered;
  };
  // A kept pool keeps its size: the pages a budget holds may differ now
  // (the GPU's free memory), but the kept slab and pages are what they
  // were.
  if (recovering()) pool_options.num_pages = kept->recovered_state().num_pages;
  uint64_t slab_id = 0;
  if (options.kv.layout.has_value()) {
    ServerOptions sizing = options;
    sizing.pool.num_pages = pool_options.num_pages;
    if (recovering()) sizing.kv.budget.reset();
    ASSIGN_OR_RETURN(KvSlabGeometry slab,
                     SizeKvSlab(sizing, *server->backend_));
    bool adopted = false;
    if (recovering()) {
      UniqueFd kept_slab = kept->TakeSlabFd();
      const absl::Status adopt =
          kept_slab.valid()
              ? server->backend_->AdoptKvSlab(
                    *options.kv.layout, slab, options.kv.scrub,
                    std::move(kept_slab), kept->identity().slab_id)
              : absl::DataLossError(
                    "the service manager kept the state but no KV slab");
      if (adopt.ok()) {
        adopted = true;
      } else {
        kept->Discard(adopt);
        pool_options.num_pages = options.pool.num_pages;
        sizing.pool.num_pages = options.pool.num_pages;
        sizing.kv.budget = options.kv.budget;
        ASSIGN_OR_RETURN(slab, SizeKvSlab(sizing, *server->backend_));
      }
    }
    if (!adopted) {
      RETURN_IF_ERROR(server->backend_->CreateKvSlab(*options.kv.layout, slab,
                                                     options.kv.scrub));
    }
    slab_id = server->backend_->kv_slab()->slab_id;
    pool_options.num_pages = slab.num_pages;
    pool_options.scrub = options.kv.scrub;
    Logger("server")->info(
        "KV slab: {} ({} buffers, {} a page, {} pages of {} slots){}{}",
        FormatBytes(slab.total_bytes), options.kv.layout->buffers.size(),
        FormatBytes(slab.bytes_per_page), slab.num_pages, slab.page_size,
        options.kv.scrub ? ", scrubbed between owners" : "",
        adopted ? ", kept from the last run with its KV" : "");
  } else if (options.kv.scrub) {
    return absl::InvalidArgumentError("--kv_scrub needs --kv_layout");
  }
  server->slab_id_ = slab_id;
  // The prefix cache reports what it stores and removes to the KV-event
  // publisher (null without --kv_events_endpoint).
  pool_options.kv_event_sink = server->kv_events_.get();
  pool_options.change_log = kept;
  server->options_.pool = pool_options;
  if (recovering()) {
    // The kept snapshot, then the records after it. Anything that fails
    // here fails closed: a fresh pool (and slab) rather than a guess.
    absl::StatusOr<std::unique_ptr<PagePool>> restored =
        PagePool::CreateFromState(pool_options, server->backend_->executor(),
                                  kept->recovered_state());
    absl::Status replayed =
        restored.ok() ? kept->Replay(**restored) : restored.status();
    if (replayed.ok()) {
      server->pool_ = *std::move(restored);
      if (server->kv_events_ != nullptr) {
        // The publisher's first batch said AllBlocksCleared; the kept
        // pool's shared pages are stored again, parents first.
        ReportKeptBlocks(server->pool_->ExportState(), *server->kv_events_);
      }
    } else {
      kept->Discard(replayed);
      return absl::DataLossError(absl::StrCat(
          "the kept state failed to apply (", replayed.message(),
          "); it is dropped from the service manager's store: start again "
          "for a fresh pool"));
    }
  } else {
    ASSIGN_OR_RETURN(
        server->pool_,
        PagePool::Create(pool_options, server->backend_->executor()));
  }
  // A ring smaller than the pool would refuse, for its size, a call the
  // pool could serve: by default a ring holds the whole pool (8 bytes a
  // token, against the token's KV bytes), within the sessions' memory
  // budget (MakeBudgets); docs/design.md section 5.
  const bool pool_sized_ring =
      options.sessions.default_ring_capacity_slots == 0;
  server->options_.sessions =
      options.sessions.ForPool(pool_options.num_pages * pool_options.page_size);
  RETURN_IF_ERROR(server->MakeBudgets(pool_sized_ring));
  server->sessions_ = std::make_unique<SessionRegistry>(
      server->options_.sessions, server->backend_.get(),
      server->gpu_budget_ != nullptr ? server->gpu_budget_.get()
                                     : server->host_budget_.get());
  const SchedulingPolicy& scheduling = *server->policy_;
  ASSIGN_OR_RETURN(
      server->batcher_,
      Batcher::Create(scheduling.BatcherOptions(options.debug_checks),
                      server->pool_.get(), server->backend_.get()));
  CallCore::Options core_options;
  core_options.max_call_requests = options.batcher.max_batch_requests;
  core_options.max_call_tokens = options.batcher.max_batch_tokens;
  core_options.allow_forced_clear = options.allow_forced_clear;
  core_options.register_secret = options.register_secret;
  core_options.state_kept = kept != nullptr;
  core_options.call_tags_kept = kept == nullptr || kept->KeepsCallTags();
  server->core_ = std::make_unique<CallCore>(
      core_options, server->pool_.get(), server->backend_.get(),
      server->sessions_.get(), server->batcher_.get());
  if (scheduling.settings().fast_channel) {
    FastChannelServer::Options fast;
    fast.max_requests = options.batcher.max_batch_requests;
    fast.spin = scheduling.settings().fast_channel_spin;
    fast.pollers = scheduling.settings().fast_channel_pollers;
    fast.throttle_strikes = options.fast_channel_throttle_strikes;
    fast.drop_strikes = options.fast_channel_drop_strikes;
    fast.throttle_time = options.fast_channel_throttle_time;
    fast.budget = server->host_budget_.get();
    fast.retired_header_life = options.fast_channel_ended_header_life;
    ASSIGN_OR_RETURN(server->fast_channels_,
                     FastChannelServer::Create(fast, server->core_.get()));
  }
  server->memory_socket_path_ = MemorySocketPathFor(options.listen);
  if (!server->memory_socket_path_.empty()) {
    server->memory_socket_ = std::make_unique<MemorySocketServer>(
        server->core_.get(), server->fast_channels_.get(),
        options.memory_socket);
  }
  // The policy starts answer threads only where the batcher thread spins.
  if (scheduling.grpc_answer_threads() > 0) {
    server->grpc_answer_senders_ = std::make_unique<HandoffThreads>(
        scheduling.grpc_answer_threads(), scheduling.grpc_answer_spin());
  }
  server->grpc_service_ = std::make_unique<GrpcService>(
      server->core_.get(), server->fast_channels_.get(),
      server->memory_socket_path_, server->grpc_answer_senders_.get());
  server->metrics_ = std::make_unique<MetricsExporter>(
      server->pool_.get(), server->sessions_.get(), server->core_.get(),
      server->batcher_.get(), server->backend_.get(),
      server->fast_channels_.get(), server->memory_socket_.get(),
      server->grpc_answer_senders_.get(),
      std::vector<const MemoryBudget*>{server->host_budget_.get(),
                                       server->gpu_budget_.get()},
      server->kv_events_.get(), server->kept_.get());
  server->kv_events_service_ =
      std::make_unique<KvEventsService>(server->kv_events_.get());
  if (kept != nullptr) {
    // The sessions the kept pool's owners were, each with a fresh lease
    // to resume in (their clients reconnect); then the state as it now
    // stands becomes the journal's base, and both descriptors go to the
    // service manager's store.
    RETURN_IF_ERROR(server->RestoreSessions());
    const KvSlab* slab = server->backend_->kv_slab();
    DaemonIdentity identity;
    identity.slab_id = slab_id;
    RETURN_IF_ERROR(kept->StartKeeping(
        *server->pool_, slab != nullptr ? slab->fd : -1, identity));
    const KeptStateStats stats = kept->stats();
    Logger("state")->info(
        "keeping the pool's state {} (start {} of this pool{}{})",
        kept->keeper() == DescriptorKeeper::kServiceManager
            ? "in the service manager's store"
            : "in this daemon, for a successor to take over",
        stats.identity.starts,
        stats.outcome == KeptStateOutcome::kRecovered
            ? absl::StrFormat(": recovered with %d records replayed, %d "
                              "sessions to resume, in %.1f ms",
                              stats.replayed_records, server->sessions_->size(),
                              stats.recovery_seconds * 1e3)
            : std::string(),
        stats.reason.empty()
            ? ""
            : "; the last run's state was not used: " + stats.reason);
  }
  return server;
}

absl::Status Server::RestoreSessions() {
  for (const PoolOwnerState& owner : pool_->ExportState().owners) {
    absl::StatusOr<KeptSession> kept = DecodeKeptSession(owner.metadata);
    absl::Status restored = kept.status();
    if (kept.ok()) {
      restored = sessions_->Restore(owner.id, *kept).status();
    }
    if (!restored.ok()) {
      // The pool is built and the slab adopted: the daemon cannot start
      // fresh from here, so it stops, and the kept state is dropped for
      // the next start (fail closed).
      kept_->Discard(restored);
      return absl::DataLossError(absl::StrFormat(
          "the kept session %d cannot be restored (%s); the kept state is "
          "dropped from the service manager's store: start again for a "
          "fresh pool",
          owner.id, restored.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Server::MakeBudgets(bool pool_sized_ring) {
  const KvSlab* slab = backend_->kv_slab();
  const int64_t slab_bytes = slab != nullptr ? slab->geometry.total_bytes : 0;
  const bool cuda = backend_->kind() == BackendKind::kCuda;
  auto log = Logger("server");
  // Host memory: the cgroup's limit holds the CPU backend's slab; the
  // host's MemAvailable, read now, has it taken already.
  int64_t host = options_.session_memory;
  if (host < 0) {
    const HostMemory room = AvailableHostMemory();
    host = DefaultSessionBudget(BudgetMemory::kHost,
                                std::max<int64_t>(0, room.bytes),
                                !cuda && room.cgroup_limit ? slab_bytes : 0);
    log->info("sessions' host memory budget: {} (from {}, {}{})",
              FormatBytes(host), FormatBytes(room.bytes), room.source(),
              !cuda && room.cgroup_limit ? ", less the KV slab" : "");
  }
  host_budget_ =
      std::make_unique<MemoryBudget>("host", "--session_memory", host);
  if (cuda) {
    // The GPU's free memory now, the slab made: what is left of it at
    // start.
    int64_t gpu = options_.session_gpu_memory;
    if (gpu < 0) {
      ASSIGN_OR_RETURN(const int64_t free_now, backend_->KvAvailableBytes());
      gpu = DefaultSessionBudget(BudgetMemory::kGpu, free_now, 0);
      log->info(
          "sessions' GPU memory budget: {} (an eighth of the {} free after "
          "the KV slab; the rest is left to other processes)",
          FormatBytes(gpu), FormatBytes(free_now));
    }
    gpu_budget_ =
        std::make_unique<MemoryBudget>("gpu", "--session_gpu_memory", gpu);
  }
  // One session must fit: its default ring in the ring budget, and its
  // fast channel in host memory beside a CPU ring.
  MemoryBudget& rings = cuda ? *gpu_budget_ : *host_budget_;
  SessionRegistry::Options& sessions = options_.sessions;
  if (pool_sized_ring) {
    // A pool-sized ring takes at most an eighth of the ring budget, so that
    // a big pool leaves room for several sessions; it never goes below the
    // smallest default ring (a budget that cannot hold that is refused
    // below).
    sessions.default_ring_capacity_slots = std::max(
        SessionRegistry::kMinDefaultRingCapacitySlots,
        std::min(sessions.default_ring_capacity_slots, rings.limit() / 64));
  }
  ASSIGN_OR_RETURN(const int64_t granularity, backend_->KvAlignment());
  const int64_t ring_bytes =
      (sessions.default_ring_capacity_slots * 8 + granularity - 1) /
      granularity * granularity;
  const int64_t channel_bytes =
      options_.fast_channel
          ? static_cast<int64_t>(fast_channel::ChannelLayout(
                                     options_.batcher.max_batch_requests,
                                     FastChannelServer::Options().message_bytes)
                                     .total_bytes)
          : 0;
  if (ring_bytes + (cuda ? 0 : channel_bytes) > rings.limit() ||
      channel_bytes > host_budget_->limit()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the sessions' memory budget cannot hold one session: its ring of "
        "%d slots (--ring_capacity_slots) takes %s and its fast channel %s, "
        "and the budget is %s of host memory (--session_memory)%s",
        sessions.default_ring_capacity_slots, FormatBytes(ring_bytes),
        FormatBytes(channel_bytes), FormatBytes(host_budget_->limit()),
        cuda ? absl::StrFormat(" and %s of GPU memory (--session_gpu_memory)",
                               FormatBytes(gpu_budget_->limit()))
             : std::string()));
  }
  sessions.max_ring_capacity_slots =
      std::min(sessions.max_ring_capacity_slots, rings.limit() / 8);
  return absl::OkStatus();
}

void ApplyGrpcServerSettings(const ServerOptions& options,
                             grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(options.max_message_bytes);
  builder->SetMaxSendMessageSize(options.max_message_bytes);
  // No HTTP/2 BDP probing: the daemon's peers are on the same host, where
  // it only adds a PING exchange (two wake-ups) per message.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // Dead and silent peers (ServerOptions): keepalive pings on connections
  // with a call open, with no limit on pings between data frames (gRPC's
  // default of 2 would stop probing a quiet stream after two), and idle
  // connections closed.
  const auto millis = [](absl::Duration d) {
    return static_cast<int>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(d), 1, std::numeric_limits<int>::max()));
  };
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                              millis(options.keepalive_time));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                              millis(options.keepalive_timeout));
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                              millis(options.max_connection_idle));
  // TCP connections (accepted by gRPC) must finish their TLS handshake and
  // send HTTP/2 settings within this; Unix-socket connections are bounded
  // by the idle timeout from their first byte.
  builder->AddChannelArgument(
      GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
      millis(std::min(options.max_connection_idle, kTcpHandshakeTimeout)));
}

Server::~Server() {
  Shutdown();
  Wait();
}

absl::Status Server::Start() {
  absl::MutexLock lock(&mu_);
  if (started_) return absl::FailedPreconditionError("already started");
  std::shared_ptr<spdlog::logger> log = Logger("server");
  if (const int removed = RemoveLeftoverSegments(options_.gpu); removed > 0) {
    log->info(
        "removed {} leftover shared-memory segments of dead daemons "
        "(/dev/shm/pagealloc-gpu{}.<pid>.*)",
        removed, options_.gpu);
  }
  RETURN_IF_ERROR(CheckTcpAddresses());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  ApplyGrpcServerSettings(options_, &builder);
  builder.RegisterService(grpc_service_.get());
  builder.RegisterService(kv_events_service_.get());
  // Shutdown waits for the unary RPCs in flight, and only for those.
  in_flight_rpcs_ = std::make_shared<InFlightRpcs>();
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      std::make_unique<InFlightInterceptorFactory>(in_flight_rpcs_));
  // Malformed requests are INVALID_ARGUMENT, whatever the method.
  interceptors.push_back(
      GrpcService::MalformedRequestInterceptors(core_.get()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::vector<std::unique_ptr<int>> ports;
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> tcp_credentials,
                   TcpCredentials(options_.tls));
  // Unix sockets: the daemon listens and accepts (ConnectionAcceptor);
  // TCP: gRPC does (it owns the TLS handshake).
  ConnectionAcceptor::Options accepting;
  accepting.max_connections = options_.max_connections;
  acceptor_ = std::make_unique<ConnectionAcceptor>(accepting, [this](int fd) {
    grpc::AddInsecureChannelFromFd(grpc_server_.get(), fd);
  });
  // A failure from here on must not leave a socket file behind.
  const auto close_sockets = [this] {
    acceptor_->Stop();
    for (const std::string& path : socket_paths_) unlink(path.c_str());
  };
  const auto unlink_sockets = [&close_sockets](const absl::Status& status) {
    close_sockets();
    return status;
  };
  for (const std::string& address : options_.listen) {
    const std::string path = UnixSocketPath(address);
    ports.push_back(std::make_unique<int>(0));
    if (path.empty()) {
      builder.AddListeningPort(address, tcp_credentials, ports.back().get());
      continue;
    }
    absl::StatusOr<UniqueFd> listener =
        ListenOnSocketFlag(path, SOCK_STREAM, options_);
    if (!listener.ok()) return unlink_sockets(listener.status());
    socket_paths_.push_back(path);
    acceptor_->AddListener(*std::move(listener), path);
  }
  // Before gRPC: a client that registers finds its memory socket serving.
  if (absl::Status memory = StartMemorySocket(); !memory.ok()) {
    return unlink_sockets(memory);
  }
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr) {
    close_sockets();
    // gRPC logs its reason in a line of its own; say it here, per address.
    std::vector<std::string> reasons;
    for (const std::string& address : options_.listen) {
      const std::string why = WhyCannotBind(address);
      if (!why.empty()) reasons.push_back(address + ": " + why);
    }
    return absl::UnavailableError(absl::StrFormat(
        "could not listen on %s%s", absl::StrJoin(options_.listen, ", "),
        reasons.empty()
            ? " (gRPC's log line above says why)"
            : absl::StrCat(" (", absl::StrJoin(reasons, "; "), ")")));
  }
  // A failure from here on must not leave the gRPC server running or the
  // socket files behind.
  const auto abandon = [this, &close_sockets](const absl::Status& status) {
    close_sockets();
    grpc_server_->Shutdown(absl::ToChronoTime(absl::Now()));
    return status;
  };
  if (absl::Status accepting = acceptor_->Start(); !accepting.ok()) {
    return abandon(accepting);
  }
  for (size_t i = 0; i < options_.listen.size(); ++i) {
    const std::string& address = options_.listen[i];
    if (!UnixSocketPath(address).empty()) {
      bound_.push_back(address);
    } else {
      const size_t colon = address.rfind(':');
      bound_.push_back(
          absl::StrFormat("%s:%d", address.substr(0, colon), *ports[i]));
    }
  }
  grpc_server_->GetHealthCheckService()->SetServingStatus(true);
  if (options_.metrics_port >= 0) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
        MetricsHttpServer::Start(
            options_.metrics_host, options_.metrics_port,
            [this] { return metrics_->Render(); }, [this] { return Health(); });
    if (!http.ok()) {
      const std::string why = WhyCannotBind(absl::StrFormat(
          "%s:%d", options_.metrics_host, options_.metrics_port));
      return abandon(absl::UnavailableError(absl::StrFormat(
          "cannot serve metrics on %s:%d%s%s: give each daemon of a host its "
          "own --metrics_port (9464 + the GPU index), 0 for any free port, "
          "or -1 for no metrics",
          options_.metrics_host, options_.metrics_port, why.empty() ? "" : ": ",
          why)));
    }
    metrics_http_ = *std::move(http);
    log->info("metrics on http://{}:{}/metrics", options_.metrics_host,
              metrics_http_->port());
  }
  if (kept_ != nullptr && kept_->keeper() == DescriptorKeeper::kDaemon) {
    // Last: a successor may stop this daemon as soon as it listens. The
    // stop returns once this daemon has stopped (a stop already under way
    // included): only then may the successor go on.
    auto stop = [this] {
      Shutdown();
      Wait();
    };
    absl::Status listening = options_.keep_state.keeper_binary.empty()
                                 ? ListenForSuccessors(stop)
                                 : SpawnKeeper(stop);
    if (!listening.ok() && !absl::IsFailedPrecondition(listening)) {
      // The keeper did not start. This daemon may hold the only copies of
      // a pool it took over: it serves on and answers successors itself
      // (a crash then loses the pool: pagealloc_state_outlives_crash 0).
      log->error("{}; this daemon answers successors itself",
                 listening.ToString());
      listening = ListenForSuccessors(stop);
    }
    if (!listening.ok()) return abandon(listening);
  }
  reaper_ = std::thread([this] { ReapLeases(); });
  release_poller_ = std::thread([this] { core_->RunReleasePoller(); });
  started_ = true;
  log->info(
      "serving on {}{}: backend {}, {} pages of {} tokens ({} policy, {} "
      "semantics), lease "
      "{} ms, batcher {}",
      absl::StrJoin(bound_, ", "),
      options_.tls.cert_file.empty()
          ? ""
          : (options_.tls.client_ca_file.empty()
                 ? " (TCP with TLS)"
                 : " (TCP with TLS, client certificates required)"),
      backend_->Summary(), options_.pool.num_pages, options_.pool.page_size,
      std::string(FreePolicyName(options_.pool.free_policy)),
      std::string(SemanticsName(options_.pool.semantics)),
      absl::ToInt64Milliseconds(options_.sessions.lease), policy_->Summary());
  log->info("scheduling (docs/design.md, section 6):\n{}", policy_->Describe());
  // Under a service manager (a Type=notify unit): serving now.
  if (absl::Status ready = NotifyReady(
          absl::StrCat("serving ", options_.pool.num_pages, " pages",
                       kept_ != nullptr ? ", state kept across restarts" : ""));
      !ready.ok()) {
    log->warn("could not tell the service manager we are ready: {}",
              std::string(ready.message()));
  }
  if (const DeviceDescription device = backend_->DescribeDevice();
      device.kind == BackendKind::kCuda && !device.cuda_mps) {
    // Measured on an H200: GPU-ordered AllocDecode(256) 266 us p50 without
    // MPS against 51 us with it (docs/performance.md).
    log->warn(
        "GPU {} is not shared through CUDA MPS: clients' streams and the "
        "daemon's time-slice the GPU, and GPU-ordered calls run several "
        "times slower; run the daemon and its clients under MPS "
        "(docs/operations.md, \"CUDA MPS\")",
        device.gpu);
  }
  return absl::OkStatus();
}

absl::Status Server::StartMemorySocket() {
  std::shared_ptr<spdlog::logger> log = Logger("server");
  if (memory_socket_ == nullptr) {
    log->warn(
        "no Unix socket to --listen on: no memory socket, so sessions get no "
        "fast channel and no CPU-backend ring (only return_inline calls)");
    return absl::OkStatus();
  }
  const std::string& path = memory_socket_path_;
  absl::StatusOr<UniqueFd> listener =
      ListenOnSocketFlag(path, SOCK_SEQPACKET, options_);
  if (!listener.ok()) {
    return absl::Status(
        listener.status().code(),
        absl::StrCat("memory socket: ", listener.status().message()));
  }
  RETURN_IF_ERROR(memory_socket_->Start(*std::move(listener), path));
  log->info("memory socket on {}", path);
  return absl::OkStatus();
}

absl::Status Server::CheckTcpAddresses() const {
  if (!options_.tls.cert_file.empty()) return absl::OkStatus();
  for (const std::string& address : options_.listen) {
    if (!UnixSocketPath(address).empty() || IsLoopbackAddress(address)) {
      continue;
    }
    if (!options_.allow_insecure_tcp) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "refusing to listen on %s without TLS: anyone who can reach that "
          "address could take and free this GPU's pages. Give "
          "--tls_cert_file and --tls_key_file (and --tls_client_ca_file to "
          "require client certificates), listen on a Unix socket or on "
          "127.0.0.1, or pass --allow_insecure_tcp if the network is "
          "trusted",
          address));
    }
    Logger("server")->warn(
        "listening on {} without TLS (--allow_insecure_tcp): anyone who can "
        "reach it can take and free this GPU's pages",
        address);
  }
  return absl::OkStatus();
}

absl::Status Server::Health() const {
  if (core_->draining()) return absl::UnavailableError("draining");
  if (acceptor_ != nullptr) RETURN_IF_ERROR(acceptor_->health());
  // Short of descriptors for one more session: Register refuses, and so
  // does the daemon's health.
  const absl::Status descriptors = CheckDescriptorsFree(kDescriptorsPerSession);
  if (!descriptors.ok()) {
    return absl::UnavailableError(descriptors.message());
  }
  return absl::OkStatus();
}

void Server::ReapLeases() {
  const absl::Duration period = std::clamp(
      options_.sessions.lease / 4, absl::Milliseconds(5), absl::Seconds(1));
  // Every few seconds, freed heap memory past a threshold goes back to the
  // kernel (server/heap_return.h says why): resident memory follows load
  // down after a burst of sessions or streams.
  constexpr absl::Duration kHeapReturnPeriod = absl::Seconds(5);
  constexpr int64_t kHeapReturnThreshold = 16 << 20;
  absl::Time next_heap_return = absl::Now() + kHeapReturnPeriod;
  while (!stop_reaper_.WaitForNotificationWithTimeout(period)) {
    const absl::Time now = absl::Now();
    core_->ReclaimExpired(now);
    RespawnLostKeeper();
    if (now >= next_heap_return) {
      next_heap_return = now + kHeapReturnPeriod;
      const HeapReturn returned = ReturnFreeHeapMemory(kHeapReturnThreshold);
      if (returned.trimmed) {
        Logger("server")->debug("returned free heap memory ({} MiB free)",
                                returned.free_bytes >> 20);
      }
    }
  }
}

absl::Status Server::ListenForSuccessors(std::function<void()> stop) {
  HandoverListener::Callbacks handover;
  handover.offer = [this]() -> absl::StatusOr<std::vector<OfferedFd>> {
    ASSIGN_OR_RETURN(auto kept, kept_->KeptDescriptors());
    std::vector<OfferedFd> offer;
    for (auto& [name, fd] : kept) offer.push_back({name, fd});
    return offer;
  };
  handover.stop = std::move(stop);
  ASSIGN_OR_RETURN(
      handover_, HandoverListener::Start(HandoverSocketPathFor(options_.listen),
                                         handover));
  Logger("server")->info(
      "a successor started with --take_over takes the pool over on {}; a "
      "crash of this daemon loses it (no descriptor keeper)",
      handover_->path());
  return absl::OkStatus();
}

absl::Status Server::SpawnKeeper(std::function<void()> stop) {
  ASSIGN_OR_RETURN(std::unique_ptr<FdKeeper> keeper, StartKeeper(stop));
  {
    absl::MutexLock lock(&keeper_mu_);
    keeper_stop_ = std::move(stop);
    keeper_ = std::move(keeper);
  }
  // A state that can no longer be kept must not reach a successor.
  kept_->SetBreakObserver([this] { RetireKeeper(); });
  kept_->SetCrashSurvivalProbe([this] {
    absl::MutexLock lock(&keeper_mu_);
    return keeper_ != nullptr && !keeper_retired_ && !keeper_->lost();
  });
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<FdKeeper>> Server::StartKeeper(
    std::function<void()> stop) {
  FdKeeper::Options keeper;
  keeper.binary = options_.keep_state.keeper_binary;
  keeper.socket_path = HandoverSocketPathFor(options_.listen);
  keeper.linger = options_.keep_state.keeper_linger;
  keeper.stop = std::move(stop);
  ASSIGN_OR_RETURN(auto kept, kept_->KeptDescriptors());
  for (auto& [name, fd] : kept) keeper.fds.push_back({name, fd});
  absl::StatusOr<std::unique_ptr<FdKeeper>> spawned =
      FdKeeper::Spawn(std::move(keeper));
  if (!spawned.ok()) {
    return absl::Status(
        spawned.status().code(),
        absl::StrCat("descriptor keeper: ", spawned.status().message(),
                     absl::IsFailedPrecondition(spawned.status())
                         ? " (a daemon or the keeper of one that died holds "
                           "this pool: start with --take_over to take it "
                           "over)"
                         : ""));
  }
  Logger("server")->info(
      "descriptor keeper pid {} holds the pool's descriptors: a successor "
      "started with --take_over takes the pool over on {}, after a planned "
      "stop or a crash of this daemon",
      (*spawned)->pid(), HandoverSocketPathFor(options_.listen));
  return spawned;
}

void Server::RetireKeeper() {
  absl::MutexLock lock(&keeper_mu_);
  keeper_retired_ = true;
  if (keeper_ != nullptr) keeper_->Retire();
}

void Server::RespawnLostKeeper() {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
  }
  // The spawn runs outside the lock, which the break observer takes under
  // the pool's lock and /metrics through the crash probe.
  std::unique_ptr<FdKeeper> gone;
  std::function<void()> stop;
  {
    absl::MutexLock lock(&keeper_mu_);
    if (keeper_ == nullptr || keeper_retired_ || !keeper_->lost()) return;
    gone = std::move(keeper_);
    stop = keeper_stop_;
  }
  const pid_t lost = gone->pid();
  gone.reset();  // its link's thread has ended
  absl::StatusOr<std::unique_ptr<FdKeeper>> spawned = StartKeeper(stop);
  if (!spawned.ok()) {
    Logger("server")->error(
        "the descriptor keeper (pid {}) was lost and none could replace it "
        "({}): this daemon's stop or crash loses its pool",
        lost, std::string(spawned.status().message()));
    return;
  }
  const pid_t replacement = (*spawned)->pid();
  {
    absl::MutexLock lock(&keeper_mu_);
    if (keeper_retired_) {
      (*spawned)->Retire();  // the state broke meanwhile
      return;
    }
    keeper_ = *std::move(spawned);
  }
  Logger("server")->warn(
      "the descriptor keeper (pid {}) was lost; pid {} keeps the pool now",
      lost, replacement);
}

void Server::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    if (!started_) {
      // Create may have failed part way: stop only what exists.
      if (batcher_ != nullptr) batcher_->Stop();
      if (grpc_answer_senders_ != nullptr) grpc_answer_senders_->Stop();
      shut_down_.Notify();
      return;
    }
  }
  // No successor may start a handover of a daemon that is stopping (one
  // in progress is what stops it).
  if (handover_ != nullptr) handover_->Stop();
  std::shared_ptr<spdlog::logger> log = Logger("server");
  // With the pool's state kept, a successor takes the sessions over: this
  // stop is a restart to them, as a crash is, never their end.
  const bool sessions_kept = kept_ != nullptr && kept_->stats().keeping;
  if (!sessions_kept) {
    RetireKeeper();
  } else {
    absl::MutexLock lock(&keeper_mu_);
    if (keeper_ != nullptr && !keeper_->handed_over()) {
      log->info(
          "the descriptor keeper (pid {}) keeps the pool for a successor "
          "started with --take_over for {} after this daemon exits (kill "
          "it to free the pool's memory at once)",
          keeper_->pid(),
          absl::FormatDuration(options_.keep_state.keeper_linger));
    }
  }
  log->info("draining: refusing new calls, finishing queued work{}",
            sessions_kept ? "; the sessions are kept for the successor" : "");
  core_->StartDraining();
  grpc_server_->GetHealthCheckService()->SetServingStatus(false);
  if (sessions_kept && memory_socket_ != nullptr) {
    // Each client learns now, from its connection's close, that its daemon
    // is going, and reconnects (its Resume is refused until the successor
    // serves). So every call of its that fails from here on, cut by the
    // drain or by gRPC's Shutdown below, fails as one a restart took
    // (UNAVAILABLE, outcome unknown), not as a cancelled call; and no
    // Resume can attach a session to this daemon, which is draining.
    memory_socket_->SeverConnections();
  }
  if (sessions_kept) {
    // A free pending on its release fence waits on a word only this
    // process maps: the kept state has its pages as the session's,
    // awaiting release until the session resumes. Their clients' streams
    // still write the words (mapped here until the daemon exits), so a
    // short wait lets the successor find those pages free.
    const int64_t pending =
        core_->WaitForReleases(options_.keep_state.release_wait);
    if (pending > 0) {
      log->warn(
          "{} freed pages still wait for their release fence after {}: they "
          "stay their sessions' across the restart, and are freed when each "
          "session resumes",
          pending, absl::FormatDuration(options_.keep_state.release_wait));
    }
  }
  // Finishes the queued work: every call taken so far is answered.
  batcher_->Stop();
  if (grpc_answer_senders_ != nullptr) grpc_answer_senders_->Stop();
  // Then lets gRPC send those answers, and answer UNAVAILABLE to what
  // arrived meanwhile. What is left after that holds no work: KeepAlive
  // streams and idle connections, which gRPC's Shutdown would wait for
  // until its deadline (a client keeps its connection after closing its
  // session). So the deadline is now: gRPC cuts them at once. The bound
  // only guards against a handler that never returns.
  if (!in_flight_rpcs_->WaitForNone(absl::Seconds(5))) {
    log->warn("unary calls still in flight after 5 s; cancelling them");
  }
  // No connection may join the server once it shuts down.
  acceptor_->Stop();
  grpc_server_->Shutdown(absl::ToChronoTime(absl::Now()));
  // Calls posted until now were answered (UNAVAILABLE while draining).
  const SessionsAtStop sessions =
      sessions_kept ? SessionsAtStop::kKeep : SessionsAtStop::kEnd;
  if (fast_channels_ != nullptr) fast_channels_->Stop(sessions);
  if (memory_socket_ != nullptr) memory_socket_->Stop(sessions);
  if (sessions_kept) {
    // The clients keep what a crash would leave them: the slots in their
    // rings (their channels: FastChannelServer::Stop).
    for (const std::shared_ptr<Session>& session : sessions_->List()) {
      if (std::shared_ptr<RingMemory> ring = session->ring()) {
        ring->LeaveToClient();
      }
    }
  }
  stop_reaper_.Notify();
  if (reaper_.joinable()) reaper_.join();
  core_->StopReleasePoller();
  if (release_poller_.joinable()) release_poller_.join();
  for (const std::string& path : socket_paths_) unlink(path.c_str());
  if (metrics_http_ != nullptr) metrics_http_->Stop();
  log->info("stopped");
  shut_down_.Notify();
}

void Server::Wait() { shut_down_.WaitForNotification(); }

std::shared_ptr<grpc::Channel> Server::InProcessChannel() {
  return grpc_server_->InProcessChannel(grpc::ChannelArguments());
}

int Server::metrics_port() const {
  absl::MutexLock lock(&mu_);
  return metrics_http_ != nullptr ? metrics_http_->port() : -1;
}

std::vector<std::string> Server::bound_addresses() const {
  absl::MutexLock lock(&mu_);
  return bound_;
}

}  // namespace pagealloc
