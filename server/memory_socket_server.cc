#include "server/memory_socket_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "memory/fd_passing.h"
#include "memory/memory_socket.h"

namespace pagealloc {
namespace {

namespace ms = memory_socket;

// epoll data: the wake-up eventfd, the listener, then connections by serial.
constexpr uint64_t kWakeTag = 0;
constexpr uint64_t kListenerTag = 1;
constexpr uint64_t kFirstConnection = 2;

// How long the listener rests when the daemon is out of descriptors, so
// that a full descriptor table does not spin the thread on accept.
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);

absl::Span<const char> BytesOf(const ms::DaemonMessage& message) {
  return absl::MakeConstSpan(reinterpret_cast<const char*>(&message),
                             sizeof(message));
}

// Best effort: the peer may be gone already.
void SendStatus(int fd, ms::MessageKind kind, const absl::Status& status) {
  (void)SendWithFds(fd, BytesOf(ms::MakeStatusMessage(kind, status)), {});
}

pid_t PeerPid(int fd) {
  ucred credentials{};
  socklen_t size = sizeof(credentials);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) {
    return 0;
  }
  return credentials.pid;
}

}  // namespace

struct MemorySocketServer::Connection {
  UniqueFd fd;
  uint64_t session_id = 0;  // 0 until its Hello was accepted
  absl::Time accepted;
  pid_t pid = 0;
};

MemorySocketServer::MemorySocketServer(CallCore* core,
                                       FastChannelServer* fast_channels)
    : core_(core), fast_channels_(fast_channels) {
  core_->AddSessionObserver(this);
}

MemorySocketServer::~MemorySocketServer() { Stop(); }

absl::Status MemorySocketServer::Prepare() {
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!epoll_.valid() || !wake_.valid()) {
    return absl::InternalError(absl::StrFormat(
        "memory socket: epoll or eventfd failed: %s", std::strerror(errno)));
  }
  auto add = [this](int fd, uint64_t tag) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = tag;
    return epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) == 0;
  };
  if (!add(wake_.get(), kWakeTag) || !add(listener_.get(), kListenerTag)) {
    return absl::InternalError(absl::StrFormat(
        "memory socket: epoll_ctl failed: %s", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status MemorySocketServer::Start(UniqueFd listener, std::string path) {
  absl::MutexLock lock(&mu_);
  if (started_ || stopping_) {
    return absl::FailedPreconditionError("the memory socket was started");
  }
  listener_ = std::move(listener);
  path_ = std::move(path);
  if (absl::Status prepared = Prepare(); !prepared.ok()) {
    unlink(path_.c_str());
    return prepared;
  }
  started_ = true;
  thread_ = std::thread([this] { Serve(); });
  return absl::OkStatus();
}

void MemorySocketServer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    if (!started_) return;
  }
  const uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
  thread_.join();
  listener_.reset();
  unlink(path_.c_str());
}

void MemorySocketServer::SessionClosed(uint64_t session_id,
                                       absl::string_view reason) {
  absl::MutexLock lock(&mu_);
  if (!started_ || stopping_) return;
  ended_.emplace_back(session_id, std::string(reason));
  const uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
}

void MemorySocketServer::Serve() {
  std::shared_ptr<spdlog::logger> log = Logger("session");
  absl::flat_hash_map<uint64_t, Connection> connections;  // by serial
  absl::flat_hash_map<uint64_t, uint64_t> serial_of;      // by session id
  uint64_t next_serial = kFirstConnection;
  int pending_hellos = 0;
  absl::Time listener_paused_until = absl::InfinitePast();

  auto forget = [&](uint64_t serial) {
    auto it = connections.find(serial);
    if (it == connections.end()) return;
    if (it->second.session_id != 0) {
      serial_of.erase(it->second.session_id);
      connected_.fetch_sub(1, std::memory_order_relaxed);
    } else {
      --pending_hellos;
    }
    // Closing the descriptor takes it out of the epoll set.
    connections.erase(it);
  };
  auto refuse = [&](uint64_t serial, const absl::Status& status) {
    refusals_.fetch_add(1, std::memory_order_relaxed);
    log->warn("memory socket: refused pid {}: {}", connections[serial].pid,
              status.ToString());
    SendStatus(connections[serial].fd.get(), ms::MessageKind::kRefused, status);
    forget(serial);
  };

  auto accept_all = [&] {
    while (true) {
      UniqueFd fd(accept4(listener_.get(), nullptr, nullptr,
                          SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd.valid()) {
        if (errno == EINTR) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
            errno == ENOMEM) {
          log->warn("memory socket: accept failed ({}); pausing {} ms",
                    std::strerror(errno),
                    absl::ToInt64Milliseconds(kAcceptPause));
          epoll_event event{};
          event.data.u64 = kListenerTag;
          epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &event);
          listener_paused_until = absl::Now() + kAcceptPause;
        }
        return;
      }
      if (pending_hellos >= kMaxPendingHellos) continue;  // closed at once
      const uint64_t serial = next_serial++;
      epoll_event event{};
      event.events = EPOLLIN | EPOLLRDHUP;
      event.data.u64 = serial;
      if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd.get(), &event) != 0) {
        continue;
      }
      Connection& connection = connections[serial];
      connection.pid = PeerPid(fd.get());
      connection.fd = std::move(fd);
      connection.accepted = absl::Now();
      ++pending_hellos;
    }
  };

  // A connection's first message: authenticate, then hand the memory over.
  auto read_hello = [&](uint64_t serial) {
    Connection& connection = connections[serial];
    ms::Hello hello;
    std::vector<UniqueFd> none;
    absl::StatusOr<size_t> received = ReceiveWithFds(
        connection.fd.get(),
        absl::MakeSpan(reinterpret_cast<char*>(&hello), sizeof(hello)), 0,
        &none);
    if (!received.ok()) {
      if (received.status().code() == absl::StatusCode::kUnavailable) return;
      return refuse(serial, received.status());
    }
    if (*received == 0) return forget(serial);  // gone before its Hello
    absl::StatusOr<ms::Hello> parsed = ms::ParseHello(
        absl::MakeConstSpan(reinterpret_cast<const char*>(&hello), *received));
    if (!parsed.ok()) return refuse(serial, parsed.status());
    absl::StatusOr<std::shared_ptr<Session>> session =
        core_->Authenticate(parsed->session_id, ms::TokenOf(*parsed));
    if (!session.ok()) return refuse(serial, session.status());
    const uint64_t id = (*session)->id();
    if (serial_of.contains(id)) {
      return refuse(
          serial,
          absl::FailedPreconditionError(absl::StrFormat(
              "session %d already has its memory socket connection", id)));
    }
    std::vector<ms::MemoryEntry> entries;
    std::vector<int> fds;
    FastChannelServer::ChannelFds channel;
    if (fast_channels_ != nullptr) {
      absl::StatusOr<FastChannelServer::ChannelFds> exported =
          fast_channels_->ExportFds(id);
      if (exported.ok()) {
        channel = *std::move(exported);
        entries.push_back({static_cast<uint32_t>(ms::MemoryKind::kChannel), 0,
                           channel.bytes});
        fds.push_back(channel.memory.get());
        entries.push_back(
            {static_cast<uint32_t>(ms::MemoryKind::kDoorbell), 0, 0});
        fds.push_back(channel.doorbell.get());
      } else if (exported.status().code() != absl::StatusCode::kNotFound) {
        return refuse(serial, exported.status());
      }
    }
    const RingDescription ring = (*session)->ring_memory().Describe();
    if (ring.fd >= 0) {
      const ms::MemoryKind kind =
          ring.memory == RingDescription::Memory::kCudaVmm
              ? ms::MemoryKind::kCudaRing
              : ms::MemoryKind::kRing;
      entries.push_back({static_cast<uint32_t>(kind), 0, ring.bytes});
      fds.push_back(ring.fd);
    }
    if (ring.completion_fd >= 0) {
      entries.push_back(
          {static_cast<uint32_t>(ms::MemoryKind::kCompletionCounter), 0,
           ring.completion_bytes});
      fds.push_back(ring.completion_fd);
    }
    // The pool's KV slab: the same memory for every session.
    if (const KvSlab* slab = core_->DescribePool().kv_slab; slab != nullptr) {
      entries.push_back({static_cast<uint32_t>(ms::MemoryKind::kKvSlab), 0,
                         static_cast<uint64_t>(slab->geometry.total_bytes)});
      fds.push_back(slab->fd);
    }
    const absl::Status sent = SendWithFds(
        connection.fd.get(), BytesOf(ms::MakeHandoff(entries)), fds);
    if (!sent.ok()) {
      log->warn(
          "memory socket: session {}: handing its memory to pid {} "
          "failed: {}",
          id, connection.pid, sent.ToString());
      return forget(serial);
    }
    --pending_hellos;
    connection.session_id = id;
    serial_of[id] = serial;
    connected_.fetch_add(1, std::memory_order_relaxed);
    log->info("session {}: memory ({} descriptors) handed to pid {}", id,
              fds.size(), connection.pid);
    // The client holds its memory now and a session has one connection:
    // the daemon keeps its mappings but not their descriptors (two fewer a
    // session; server/descriptors.h).
    (*session)->ring_memory().CloseDescriptor();
    if (fast_channels_ != nullptr) fast_channels_->CloseMemoryDescriptor(id);
  };

  // A connected session's connection woke: the client went away (EOF), or
  // broke the protocol (anything it sends after its Hello).
  auto watch = [&](uint64_t serial) {
    Connection& connection = connections[serial];
    char byte;
    std::vector<UniqueFd> none;
    absl::StatusOr<size_t> received =
        ReceiveWithFds(connection.fd.get(), absl::MakeSpan(&byte, 1), 0, &none);
    if (!received.ok() &&
        received.status().code() == absl::StatusCode::kUnavailable) {
      return;  // nothing after all
    }
    const uint64_t id = connection.session_id;
    const bool went_away = received.ok() && *received == 0;
    forget(serial);
    core_->ReclaimSession(id, went_away ? "client went away"
                                        : "broke the memory socket's protocol");
  };

  auto end_sessions = [&] {
    std::vector<std::pair<uint64_t, std::string>> ended;
    {
      absl::MutexLock lock(&mu_);
      ended.swap(ended_);
    }
    for (const auto& [id, reason] : ended) {
      auto it = serial_of.find(id);
      if (it == serial_of.end()) continue;
      SendStatus(connections[it->second].fd.get(), ms::MessageKind::kEnded,
                 absl::NotFoundError(absl::StrFormat(
                     "session %d ended (%s): its pages and slots are gone; "
                     "register again",
                     id, reason)));
      forget(it->second);
    }
  };

  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  while (true) {
    int timeout_ms = -1;
    if (pending_hellos > 0) timeout_ms = 250;
    if (listener_paused_until != absl::InfinitePast()) {
      timeout_ms = std::min<int>(timeout_ms < 0 ? 1 << 30 : timeout_ms,
                                 absl::ToInt64Milliseconds(kAcceptPause));
    }
    const int n = epoll_wait(epoll_.get(), events, kMaxEvents, timeout_ms);
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) {
        uint64_t count;
        (void)!read(wake_.get(), &count, sizeof(count));
      } else if (tag == kListenerTag) {
        accept_all();
      } else if (auto it = connections.find(tag); it != connections.end()) {
        if (it->second.session_id == 0) {
          read_hello(tag);
        } else {
          watch(tag);
        }
      }
    }
    end_sessions();
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      stopping = stopping_;
    }
    if (stopping) break;
    const absl::Time now = absl::Now();
    if (listener_paused_until != absl::InfinitePast() &&
        now >= listener_paused_until) {
      epoll_event event{};
      event.events = EPOLLIN;
      event.data.u64 = kListenerTag;
      epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &event);
      listener_paused_until = absl::InfinitePast();
    }
    if (pending_hellos > 0) {
      std::vector<uint64_t> late;
      for (const auto& [serial, connection] : connections) {
        if (connection.session_id == 0 &&
            now - connection.accepted > kHelloTimeout) {
          late.push_back(serial);
        }
      }
      for (uint64_t serial : late) forget(serial);
    }
  }
  // Shutting down: every session's client learns it now.
  for (auto& [serial, connection] : connections) {
    if (connection.session_id == 0) continue;
    SendStatus(connection.fd.get(), ms::MessageKind::kEnded,
               absl::UnavailableError(absl::StrFormat(
                   "the daemon is shutting down: session %d, its pages and "
                   "slots are gone",
                   connection.session_id)));
  }
  connected_.store(0, std::memory_order_relaxed);
}

}  // namespace pagealloc
