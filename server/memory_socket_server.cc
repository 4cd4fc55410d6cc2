#include "server/memory_socket_server.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "memory/fd_passing.h"
#include "memory/memory_socket.h"

namespace pagealloc {
namespace {

namespace ms = memory_socket;

absl::Span<const char> BytesOf(const ms::DaemonMessage& message) {
  return absl::MakeConstSpan(reinterpret_cast<const char*>(&message),
                             sizeof(message));
}

// Best effort: the peer may be gone already.
void SendStatus(int fd, ms::MessageKind kind, const absl::Status& status) {
  (void)SendWithFds(fd, BytesOf(ms::MakeStatusMessage(kind, status)), {});
}

ucred PeerCredentials(int fd) {
  ucred credentials{};
  socklen_t size = sizeof(credentials);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) {
    return ucred{};
  }
  return credentials;
}

// Whether a message (or the peer's close) is waiting on `fd`.
bool Readable(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
}

// How often at most the shed log line is written.
constexpr absl::Duration kShedLogInterval = absl::Seconds(1);

}  // namespace

absl::string_view MemorySocketServer::ShedName(Shed reason) {
  switch (reason) {
    case Shed::kPeerBound:
      return "peer_bound";
    case Shed::kTotalBound:
      return "total_bound";
    case Shed::kHelloTimeout:
      return "hello_timeout";
  }
  return "unknown";
}

MemorySocketServer::MemorySocketServer(CallCore* core,
                                       FastChannelServer* fast_channels,
                                       Options options)
    : core_(core),
      fast_channels_(fast_channels),
      options_(options),
      log_(Logger("session")),
      next_serial_(EpollListener::kFirstTag) {
  core_->AddSessionObserver(this);
}

MemorySocketServer::~MemorySocketServer() { Stop(); }

absl::Status MemorySocketServer::Start(UniqueFd listener, std::string path) {
  absl::MutexLock lock(&mu_);
  if (started_ || stopping_) {
    return absl::FailedPreconditionError("the memory socket was started");
  }
  listener_ = std::move(listener);
  path_ = std::move(path);
  if (absl::Status prepared = events_.Init(listener_.get()); !prepared.ok()) {
    unlink(path_.c_str());
    return absl::Status(prepared.code(),
                        absl::StrCat("memory socket: ", prepared.message()));
  }
  started_ = true;
  thread_ = std::thread([this] { Serve(); });
  return absl::OkStatus();
}

void MemorySocketServer::Stop(SessionsAtStop sessions) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    sessions_at_stop_ = sessions;
    if (!started_) return;
  }
  events_.Wake();
  thread_.join();
  listener_.reset();
  unlink(path_.c_str());
}

void MemorySocketServer::SessionClosed(uint64_t session_id,
                                       absl::string_view reason) {
  absl::MutexLock lock(&mu_);
  if (!started_ || stopping_) return;
  ended_.emplace_back(session_id, std::string(reason));
  events_.Wake();
}

void MemorySocketServer::SessionResumed(uint64_t session_id,
                                        uint64_t old_generation,
                                        bool was_connected) {
  if (!was_connected) return;
  absl::MutexLock lock(&mu_);
  if (!started_ || stopping_) return;
  taken_over_.emplace_back(session_id, old_generation);
  events_.Wake();
}

void MemorySocketServer::SeverConnections() {
  auto done = std::make_shared<absl::Notification>();
  {
    absl::MutexLock lock(&mu_);
    if (!started_ || stopping_) return;
    sever_.push_back(done);
    events_.Wake();
  }
  done->WaitForNotification();
}

void MemorySocketServer::Serve() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  while (true) {
    const int n = events_.Wait(events, kMaxEvents, NextDeadline());
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == EpollListener::kWakeTag) continue;
      if (tag == EpollListener::kListenerTag) {
        AcceptAll();
      } else if (auto it = connections_.find(tag); it != connections_.end()) {
        if (it->second.session_id == 0) {
          ReadHello(tag);
        } else {
          Watch(tag);
        }
      }
    }
    EndSessions();
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      stopping = stopping_;
    }
    if (stopping) break;
    Tick(absl::Now());
  }
  LogShedding(absl::Now(), /*force=*/true);
  SessionsAtStop sessions;
  {
    absl::MutexLock lock(&mu_);
    sessions = sessions_at_stop_;
  }
  // Shutting down: every session's client learns it now, from a word
  // (the sessions end) or from its connection's close alone (they are
  // kept for the successor: the client resumes, as after a crash).
  if (sessions == SessionsAtStop::kEnd) {
    for (auto& [serial, connection] : connections_) {
      if (connection.session_id == 0) continue;
      SendStatus(connection.fd.get(), ms::MessageKind::kEnded,
                 absl::UnavailableError(absl::StrFormat(
                     "the daemon is shutting down: session %d, its pages and "
                     "slots are gone",
                     connection.session_id)));
    }
  }
  connected_.store(0, std::memory_order_relaxed);
  // A SeverConnections that came after the last look waits no longer: the
  // connections close with the server.
  absl::MutexLock lock(&mu_);
  for (const auto& done : sever_) done->Notify();
  sever_.clear();
}

absl::Time MemorySocketServer::NextDeadline() const {
  absl::Time until = absl::InfiniteFuture();
  if (!pending_.empty()) {
    // The oldest waiting connection is the first to miss its deadline.
    until = connections_.at(pending_.begin()->first).accepted +
            options_.hello_timeout;
  }
  for (int64_t count : unlogged_shed_) {
    if (count > 0) until = std::min(until, last_shed_log_ + kShedLogInterval);
  }
  return until;
}

void MemorySocketServer::AcceptAll() {
  bool out_of_descriptors = false;
  for (UniqueFd fd;
       (fd = events_.Accept(nullptr, &out_of_descriptors)).valid();) {
    Admit(std::move(fd));
  }
  if (out_of_descriptors) {
    log_->warn("memory socket: accept failed ({}); pausing {} ms",
               std::strerror(errno),
               absl::ToInt64Milliseconds(EpollListener::kAcceptPause));
  }
}

void MemorySocketServer::Admit(UniqueFd fd) {
  const ucred peer = PeerCredentials(fd.get());
  // Room first, oldest out: a flood of silent connections costs the flooder
  // its own oldest connections, and the honest client's fresh one gets in.
  if (auto it = pending_of_peer_.find(peer.pid);
      it != pending_of_peer_.end() &&
      it->second >= options_.max_pending_per_peer) {
    ShedOldest(peer.pid, Shed::kPeerBound);
  }
  if (static_cast<int>(pending_.size()) >= options_.max_pending) {
    ShedOldest(std::nullopt, Shed::kTotalBound);
  }
  const uint64_t serial = next_serial_++;
  if (!events_.Add(fd.get(), serial, EPOLLIN | EPOLLRDHUP)) return;
  Connection& connection = connections_[serial];
  connection.fd = std::move(fd);
  connection.accepted = absl::Now();
  connection.pid = peer.pid;
  connection.uid = peer.uid;
  pending_.emplace(serial, peer.pid);
  ++pending_of_peer_[peer.pid];
  pending_count_.store(pending_.size(), std::memory_order_relaxed);
}

void MemorySocketServer::ShedOldest(std::optional<pid_t> pid, Shed reason) {
  // Each pass either serves a waiting Hello or sheds one connection, and
  // both take the connection off pending_: the loop ends.
  while (true) {
    auto it = pending_.begin();
    if (pid.has_value()) {
      while (it != pending_.end() && it->second != *pid) ++it;
    }
    if (it == pending_.end()) return;
    const uint64_t serial = it->first;
    if (Readable(connections_.at(serial).fd.get())) {
      // Its Hello (or its close) came in with the flood: serve it.
      ReadHello(serial);
      if (pending_.count(serial) > 0) return ShedConnection(serial, reason);
      const auto peer = pid.has_value() ? pending_of_peer_.find(*pid)
                                        : pending_of_peer_.end();
      const bool room =
          pid.has_value()
              ? peer == pending_of_peer_.end() ||
                    peer->second < options_.max_pending_per_peer
              : static_cast<int>(pending_.size()) < options_.max_pending;
      if (room) return;
      continue;
    }
    return ShedConnection(serial, reason);
  }
}

void MemorySocketServer::ReadHello(uint64_t serial) {
  Connection& connection = connections_.at(serial);
  ms::Hello hello;
  std::vector<UniqueFd> none;
  absl::StatusOr<size_t> received = ReceiveWithFds(
      connection.fd.get(),
      absl::MakeSpan(reinterpret_cast<char*>(&hello), sizeof(hello)), 0, &none);
  if (!received.ok()) {
    if (received.status().code() == absl::StatusCode::kUnavailable) return;
    return Refuse(serial, received.status());
  }
  if (*received == 0) return Forget(serial);  // gone before its Hello
  absl::StatusOr<ms::Hello> parsed = ms::ParseHello(
      absl::MakeConstSpan(reinterpret_cast<const char*>(&hello), *received));
  if (!parsed.ok()) return Refuse(serial, parsed.status());
  absl::StatusOr<std::shared_ptr<Session>> session =
      core_->Authenticate(parsed->session_id, ms::TokenOf(*parsed));
  if (!session.ok()) return Refuse(serial, session.status());
  const uint64_t id = (*session)->id();
  // One connection a link: refused while the session is connected, or
  // detached without a Resume since (its memory went to a connection that
  // closed).
  absl::StatusOr<uint64_t> generation = (*session)->Connect();
  if (!generation.ok()) return Refuse(serial, generation.status());
  if (auto old = serial_of_.find(id); old != serial_of_.end()) {
    // The connection of a link a Resume took over, not told yet.
    EndTakenOver(old->second);
  }
  if (!HandOver(connection, **session)) {
    (*session)->AbortConnect(*generation);
    return Forget(serial);
  }
  pending_.erase(serial);
  if (--pending_of_peer_[connection.pid] == 0) {
    pending_of_peer_.erase(connection.pid);
  }
  pending_count_.store(pending_.size(), std::memory_order_relaxed);
  connection.session_id = id;
  connection.generation = *generation;
  connection.session = *session;
  serial_of_[id] = serial;
  connected_.fetch_add(1, std::memory_order_relaxed);
}

bool MemorySocketServer::HandOver(Connection& connection, Session& session) {
  const uint64_t id = session.id();
  std::vector<ms::MemoryEntry> entries;
  std::vector<int> fds;
  FastChannelServer::ChannelFds channel;
  if (fast_channels_ != nullptr) {
    absl::StatusOr<FastChannelServer::ChannelFds> exported =
        fast_channels_->ExportFds(id);
    if (exported.ok()) {
      channel = *std::move(exported);
      entries.push_back(
          {static_cast<uint32_t>(ms::MemoryKind::kChannel), 0, channel.bytes});
      fds.push_back(channel.memory.get());
      entries.push_back(
          {static_cast<uint32_t>(ms::MemoryKind::kDoorbell), 0, 0});
      fds.push_back(channel.doorbell.get());
    } else if (exported.status().code() != absl::StatusCode::kNotFound) {
      refusals_.fetch_add(1, std::memory_order_relaxed);
      log_->warn("memory socket: refused pid {}: {}", connection.pid,
                 exported.status().ToString());
      SendStatus(connection.fd.get(), ms::MessageKind::kRefused,
                 exported.status());
      return false;
    }
  }
  const std::shared_ptr<RingMemory> ring_memory = session.ring();
  const RingDescription ring = ring_memory->Describe();
  if (ring.fd >= 0) {
    const ms::MemoryKind kind = ring.memory == RingDescription::Memory::kCudaVmm
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
  const absl::Status sent =
      SendWithFds(connection.fd.get(), BytesOf(ms::MakeHandoff(entries)), fds);
  if (!sent.ok()) {
    log_->warn(
        "memory socket: session {}: handing its memory to pid {} failed: {}",
        id, connection.pid, sent.ToString());
    return false;
  }
  log_->info("session {}: memory ({} descriptors) handed to pid {}", id,
             fds.size(), connection.pid);
  // The client holds its memory now and a session has one connection:
  // the daemon keeps its mappings but not their descriptors (two fewer a
  // session; server/descriptors.h).
  ring_memory->CloseDescriptor();
  if (fast_channels_ != nullptr) fast_channels_->CloseMemoryDescriptor(id);
  return true;
}

void MemorySocketServer::Watch(uint64_t serial) {
  Connection& connection = connections_.at(serial);
  char byte;
  std::vector<UniqueFd> none;
  absl::StatusOr<size_t> received =
      ReceiveWithFds(connection.fd.get(), absl::MakeSpan(&byte, 1), 0, &none);
  if (!received.ok() &&
      received.status().code() == absl::StatusCode::kUnavailable) {
    return;  // nothing after all
  }
  const uint64_t id = connection.session_id;
  const uint64_t generation = connection.generation;
  const bool went_away = received.ok() && *received == 0;
  Forget(serial);
  core_->DisconnectSession(
      id, generation, /*keep_if_resumable=*/went_away,
      went_away ? "client went away" : "broke the memory socket's protocol");
}

void MemorySocketServer::EndTakenOver(uint64_t serial) {
  Connection& connection = connections_.at(serial);
  SendStatus(connection.fd.get(), ms::MessageKind::kEnded,
             absl::AbortedError(absl::StrFormat(
                 "session %d was taken over by another process (Resume with "
                 "take_over): this process no longer holds it",
                 connection.session_id)));
  log_->info("session {}: its connection from pid {} was taken over",
             connection.session_id, connection.pid);
  Forget(serial);
}

void MemorySocketServer::EndSessions() {
  std::vector<std::pair<uint64_t, std::string>> ended;
  std::vector<std::pair<uint64_t, uint64_t>> taken_over;
  std::vector<std::shared_ptr<absl::Notification>> sever;
  {
    absl::MutexLock lock(&mu_);
    ended.swap(ended_);
    taken_over.swap(taken_over_);
    sever.swap(sever_);
  }
  for (const auto& [id, generation] : taken_over) {
    auto it = serial_of_.find(id);
    if (it == serial_of_.end()) continue;
    if (connections_.at(it->second).generation == generation) {
      EndTakenOver(it->second);
    }
  }
  if (!sever.empty()) {
    std::vector<uint64_t> serials;
    for (const auto& [id, serial] : serial_of_) serials.push_back(serial);
    for (uint64_t serial : serials) {
      Connection& connection = connections_.at(serial);
      if (std::shared_ptr<Session> session = connection.session.lock()) {
        session->Detach(connection.generation);
      }
      Forget(serial);
    }
    log_->warn("memory socket: severed {} connections (sessions kept)",
               serials.size());
    for (const auto& done : sever) done->Notify();
  }
  for (const auto& [id, reason] : ended) {
    auto it = serial_of_.find(id);
    if (it == serial_of_.end()) continue;
    SendStatus(connections_.at(it->second).fd.get(), ms::MessageKind::kEnded,
               absl::NotFoundError(absl::StrFormat(
                   "session %d ended (%s): its pages and slots are gone; "
                   "register again",
                   id, reason)));
    Forget(it->second);
  }
}

void MemorySocketServer::Tick(absl::Time now) {
  // pending_ is in accept order: the late ones are at its front.
  while (!pending_.empty()) {
    const uint64_t serial = pending_.begin()->first;
    if (now - connections_.at(serial).accepted <= options_.hello_timeout) {
      break;
    }
    ShedConnection(serial, Shed::kHelloTimeout);
  }
  LogShedding(now, /*force=*/false);
}

void MemorySocketServer::Refuse(uint64_t serial, const absl::Status& status) {
  refusals_.fetch_add(1, std::memory_order_relaxed);
  Connection& connection = connections_.at(serial);
  log_->warn("memory socket: refused pid {}: {}", connection.pid,
             status.ToString());
  SendStatus(connection.fd.get(), ms::MessageKind::kRefused, status);
  Forget(serial);
}

void MemorySocketServer::ShedConnection(uint64_t serial, Shed reason) {
  const Connection& connection = connections_.at(serial);
  shed_[static_cast<int>(reason)].fetch_add(1, std::memory_order_relaxed);
  ++unlogged_shed_[static_cast<int>(reason)];
  last_shed_pid_ = connection.pid;
  last_shed_uid_ = connection.uid;
  // Closed without a word: it has not said who it is, and the protocol's
  // answers are for sessions.
  Forget(serial);
}

void MemorySocketServer::Forget(uint64_t serial) {
  auto it = connections_.find(serial);
  if (it == connections_.end()) return;
  if (it->second.session_id != 0) {
    serial_of_.erase(it->second.session_id);
    connected_.fetch_sub(1, std::memory_order_relaxed);
  } else if (pending_.erase(serial) > 0) {
    if (--pending_of_peer_[it->second.pid] == 0) {
      pending_of_peer_.erase(it->second.pid);
    }
    pending_count_.store(pending_.size(), std::memory_order_relaxed);
  }
  // Closing the descriptor takes it out of the epoll set.
  connections_.erase(it);
}

void MemorySocketServer::LogShedding(absl::Time now, bool force) {
  int64_t total = 0;
  for (int64_t count : unlogged_shed_) total += count;
  if (total == 0) return;
  if (!force && now - last_shed_log_ < kShedLogInterval) return;
  log_->warn(
      "memory socket: closed {} connections that sent no Hello ({} over "
      "--memory_socket_max_pending_per_peer={}, {} over "
      "--memory_socket_max_pending={}, {} past "
      "--memory_socket_hello_timeout_ms={}); the last from pid {} uid {}; "
      "{} wait now",
      total, unlogged_shed_[static_cast<int>(Shed::kPeerBound)],
      options_.max_pending_per_peer,
      unlogged_shed_[static_cast<int>(Shed::kTotalBound)], options_.max_pending,
      unlogged_shed_[static_cast<int>(Shed::kHelloTimeout)],
      absl::ToInt64Milliseconds(options_.hello_timeout), last_shed_pid_,
      last_shed_uid_, pending_.size());
  unlogged_shed_.fill(0);
  last_shed_log_ = now;
}

}  // namespace pagealloc
