#include "server/metrics_http_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "memory/unique_fd.h"
#include "server/epoll_listener.h"

namespace pagealloc {
namespace {

// How often at most the log says what it closed.
constexpr absl::Duration kLogInterval = absl::Seconds(10);

// The client's address without its port: what the per-address bound counts.
std::string AddressOf(const sockaddr_storage& peer) {
  char host[NI_MAXHOST] = "?";
  getnameinfo(reinterpret_cast<const sockaddr*>(&peer), sizeof(peer), host,
              sizeof(host), nullptr, 0, NI_NUMERICHOST);
  return host;
}

std::string Response(int status, absl::string_view reason,
                     absl::string_view content_type, absl::string_view body,
                     bool head_only, absl::string_view extra_headers = "") {
  std::string out = absl::StrFormat(
      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s"
      "Connection: close\r\n\r\n",
      status, reason, content_type, body.size(), extra_headers);
  if (!head_only) absl::StrAppend(&out, body);
  return out;
}

std::string PlainResponse(int status, absl::string_view reason,
                          absl::string_view body, bool head_only = false,
                          absl::string_view extra_headers = "") {
  return Response(status, reason, "text/plain", body, head_only, extra_headers);
}

}  // namespace

class MetricsHttpServer::Impl {
 public:
  Impl(std::function<std::string()> render,
       std::function<absl::Status()> health, Options options)
      : render_(std::move(render)),
        health_(std::move(health)),
        options_(options),
        log_(Logger("server")) {}

  // Binds and listens; returns the bound port.
  absl::StatusOr<int> Bind(const std::string& host, int port);
  void Start() {
    event_thread_ = std::thread([this] { Serve(); });
    render_thread_ = std::thread([this] { RenderScrapes(); });
  }
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  int64_t timed_out() const { return timed_out_.load(); }
  int64_t shed() const { return shed_.load(); }

 private:
  enum class Phase { kHead, kBody, kRendering, kWriting };
  struct Connection {
    UniqueFd fd;
    std::string address;
    Phase phase = Phase::kHead;
    absl::Time deadline;
    std::string in;
    size_t body_left = 0;
    bool head_only = false;  // a HEAD request
    std::string out;
    size_t written = 0;
  };

  // The event thread: accepts, reads requests, answers, closes.
  void Serve();
  void AcceptAll();
  void Admit(UniqueFd fd, std::string address);
  // Makes room for a newcomer among the connections still sending their
  // request (those from `address` when it is not null): reads the oldest,
  // which answers it when its request is in, else closes it; repeats until
  // there is room. False when no such connection is left.
  bool ShedOldest(const std::string* address);
  void Read(uint64_t serial);
  // A request's head is complete in `in` (up to `head_end`).
  void Dispatch(uint64_t serial, size_t head_end);
  // Answers the request whose head and body are in.
  void Answer(uint64_t serial, absl::string_view method,
              absl::string_view path);
  void StartWriting(uint64_t serial, std::string out);
  void Write(uint64_t serial);
  void Close(uint64_t serial);
  // Closes connections past their deadline.
  void Tick(absl::Time now);
  // The earliest deadline of a connection.
  absl::Time NextDeadline() const;
  // Takes the renderings the render thread finished into their
  // connections.
  void TakeRendered() ABSL_LOCKS_EXCLUDED(mu_);
  void LogClosed(absl::Time now);
  int Reading(const std::string& address) const;

  // The render thread: renders once for every scrape queued meanwhile.
  void RenderScrapes() ABSL_LOCKS_EXCLUDED(mu_);
  bool ReadyToRender() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !to_render_.empty();
  }

  const std::function<std::string()> render_;
  const std::function<absl::Status()> health_;
  const Options options_;
  std::shared_ptr<spdlog::logger> log_;
  UniqueFd listener_;
  EpollListener events_;  // Stop and the render thread wake it
  std::thread event_thread_;
  std::thread render_thread_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<uint64_t> to_render_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::vector<uint64_t>, std::string>> rendered_
      ABSL_GUARDED_BY(mu_);

  // The event thread's alone.
  std::map<uint64_t, Connection> connections_;  // by serial, oldest first
  absl::flat_hash_map<std::string, int> reading_of_address_;
  uint64_t next_serial_ = EpollListener::kFirstTag;
  int64_t unlogged_timed_out_ = 0;
  int64_t unlogged_shed_ = 0;
  absl::Time last_log_ = absl::InfinitePast();

  std::atomic<int64_t> timed_out_{0};
  std::atomic<int64_t> shed_{0};
};

absl::StatusOr<int> MetricsHttpServer::Impl::Bind(const std::string& host,
                                                  int port) {
  const auto fail = [&](absl::string_view what, int error) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot listen for metrics on %s:%d: %s%s (another process, perhaps "
        "another pagealloc-server, holds the port; choose another with "
        "--metrics_port, or -1 to turn metrics off)",
        host, port, what, error != 0 ? std::strerror(error) : ""));
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (const int error =
          getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
      error != 0) {
    return fail(absl::StrCat("resolving the host: ", gai_strerror(error)), 0);
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owned(found,
                                                           &freeaddrinfo);
  listener_.reset(socket(found->ai_family,
                         found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                         found->ai_protocol));
  if (!listener_.valid()) return fail("socket: ", errno);
  // SO_REUSEADDR: a restarted daemon can bind while old connections linger
  // in TIME_WAIT. Never SO_REUSEPORT: a second daemon on the same port
  // would start silently and scrapes would alternate between two pools.
  const int yes = 1;
  setsockopt(listener_.get(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  if (bind(listener_.get(), found->ai_addr, found->ai_addrlen) != 0) {
    return fail("", errno);
  }
  if (listen(listener_.get(), 1024) != 0) return fail("listen: ", errno);
  sockaddr_storage bound{};
  socklen_t size = sizeof(bound);
  getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&bound), &size);
  const int bound_port =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);

  if (absl::Status ready = events_.Init(listener_.get()); !ready.ok()) {
    return fail(absl::StrCat(ready.message()), 0);
  }
  return bound_port;
}

void MetricsHttpServer::Impl::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  events_.Wake();
  if (event_thread_.joinable()) event_thread_.join();
  if (render_thread_.joinable()) render_thread_.join();
  connections_.clear();
  listener_.reset();
}

void MetricsHttpServer::Impl::Serve() {
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
        if (it->second.phase == Phase::kWriting) {
          Write(tag);
        } else if (it->second.phase != Phase::kRendering) {
          Read(tag);
        } else if (events[i].events & (EPOLLHUP | EPOLLERR)) {
          Close(tag);  // gone while its scrape renders
        }
      }
    }
    TakeRendered();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
    }
    Tick(absl::Now());
  }
  LogClosed(absl::InfiniteFuture());
}

absl::Time MetricsHttpServer::Impl::NextDeadline() const {
  absl::Time until = absl::InfiniteFuture();
  for (const auto& [serial, connection] : connections_) {
    if (connection.phase != Phase::kRendering) {
      until = std::min(until, connection.deadline);
    }
  }
  return until;
}

void MetricsHttpServer::Impl::AcceptAll() {
  // Out of descriptors, the listener rests; the gRPC side's acceptor
  // reports it in /healthz.
  sockaddr_storage peer{};
  for (UniqueFd fd; (fd = events_.Accept(&peer)).valid();) {
    Admit(std::move(fd), AddressOf(peer));
  }
}

int MetricsHttpServer::Impl::Reading(const std::string& address) const {
  auto it = reading_of_address_.find(address);
  return it == reading_of_address_.end() ? 0 : it->second;
}

void MetricsHttpServer::Impl::Admit(UniqueFd fd, std::string address) {
  // Room first, oldest out: a probe's fresh connection always gets in.
  if (Reading(address) >= options_.max_connections_per_address &&
      !ShedOldest(&address)) {
    return;  // every one of its connections is being answered: not this one
  }
  if (static_cast<int>(connections_.size()) >= options_.max_connections &&
      !ShedOldest(nullptr)) {
    return;
  }
  const uint64_t serial = next_serial_++;
  if (!events_.Add(fd.get(), serial, EPOLLIN | EPOLLRDHUP)) return;
  Connection& connection = connections_[serial];
  connection.fd = std::move(fd);
  connection.deadline = absl::Now() + options_.header_timeout;
  ++reading_of_address_[address];
  connection.address = std::move(address);
}

bool MetricsHttpServer::Impl::ShedOldest(const std::string* address) {
  // Each pass either answers a candidate whose request had arrived or
  // sheds one: it ends. Reading first matters: a burst of connections can
  // be accepted before the serving of a probe whose request is already in.
  uint64_t after = 0;
  while (true) {
    auto it = connections_.upper_bound(after);
    while (it != connections_.end() &&
           ((it->second.phase != Phase::kHead &&
             it->second.phase != Phase::kBody) ||
            (address != nullptr && it->second.address != *address))) {
      ++it;
    }
    if (it == connections_.end()) return false;
    const uint64_t serial = it->first;
    Read(serial);
    it = connections_.find(serial);
    if (it != connections_.end() && (it->second.phase == Phase::kHead ||
                                     it->second.phase == Phase::kBody)) {
      shed_.fetch_add(1, std::memory_order_relaxed);
      ++unlogged_shed_;
      Close(serial);
      return true;
    }
    // Answered (or gone): room, if it was in the scope's count.
    if (address != nullptr
            ? Reading(*address) < options_.max_connections_per_address
            : static_cast<int>(connections_.size()) <
                  options_.max_connections) {
      return true;
    }
    after = serial;
  }
}

void MetricsHttpServer::Impl::Read(uint64_t serial) {
  Connection& connection = connections_.at(serial);
  char buffer[4096];
  while (true) {
    const ssize_t n = recv(connection.fd.get(), buffer, sizeof(buffer), 0);
    if (n == 0) return Close(serial);  // gone before its request was in
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      return Close(serial);
    }
    if (connection.phase == Phase::kBody) {
      // The body is read and dropped: no route takes one.
      const size_t taken = std::min(connection.body_left, size_t(n));
      connection.body_left -= taken;
      if (connection.body_left == 0) {
        // The request line was checked (three words) before the body.
        const std::string head = std::move(connection.in);
        const std::string line = head.substr(0, head.find("\r\n"));
        const std::vector<absl::string_view> request_line =
            absl::StrSplit(line, ' ');
        return Answer(serial, request_line[0], request_line[1]);
      }
      continue;
    }
    connection.in.append(buffer, n);
    if (const size_t end = connection.in.find("\r\n\r\n");
        end != std::string::npos && end + 4 <= options_.max_header_bytes) {
      return Dispatch(serial, end + 4);
    }
    if (connection.in.size() >= options_.max_header_bytes) {
      return StartWriting(
          serial, PlainResponse(431, "Request Header Fields Too Large",
                                absl::StrFormat("request head over %d bytes\n",
                                                options_.max_header_bytes)));
    }
  }
}

void MetricsHttpServer::Impl::Dispatch(uint64_t serial, size_t head_end) {
  Connection& connection = connections_.at(serial);
  const std::string head = connection.in.substr(0, head_end);
  const std::string rest = connection.in.substr(head_end);
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  const std::vector<absl::string_view> request_line =
      absl::StrSplit(lines[0], ' ');
  if (request_line.size() != 3 ||
      !absl::StartsWith(request_line[2], "HTTP/1.")) {
    return StartWriting(
        serial, PlainResponse(400, "Bad Request", "bad request line\n"));
  }
  uint64_t content_length = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view name = lines[i].substr(0, colon);
    const absl::string_view value =
        absl::StripAsciiWhitespace(lines[i].substr(colon + 1));
    if (absl::EqualsIgnoreCase(name, "Transfer-Encoding")) {
      return StartWriting(
          serial, PlainResponse(411, "Length Required",
                                "a body must come with Content-Length\n"));
    }
    if (absl::EqualsIgnoreCase(name, "Content-Length") &&
        !absl::SimpleAtoi(value, &content_length)) {
      return StartWriting(
          serial, PlainResponse(400, "Bad Request", "bad Content-Length\n"));
    }
  }
  if (content_length > options_.max_body_bytes) {
    return StartWriting(
        serial, PlainResponse(
                    413, "Payload Too Large",
                    absl::StrFormat("body of %d bytes, over %d\n",
                                    content_length, options_.max_body_bytes)));
  }
  if (content_length > rest.size()) {
    connection.phase = Phase::kBody;
    connection.body_left = content_length - rest.size();
    connection.deadline = absl::Now() + options_.body_timeout;
    connection.in = head;
    return;
  }
  Answer(serial, request_line[0], request_line[1]);
}

void MetricsHttpServer::Impl::Answer(uint64_t serial, absl::string_view method,
                                     absl::string_view path) {
  Connection& connection = connections_.at(serial);
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    return StartWriting(
        serial, PlainResponse(405, "Method Not Allowed", "GET or HEAD only\n",
                              false, "Allow: GET, HEAD\r\n"));
  }
  path = path.substr(0, path.find('?'));
  if (path == "/healthz") {
    // Here, on the event thread, ahead of any scrape.
    const absl::Status status = health_();
    return StartWriting(
        serial,
        status.ok()
            ? PlainResponse(200, "OK", "serving\n", head_only)
            : PlainResponse(503, "Service Unavailable",
                            absl::StrCat(status.message(), "\n"), head_only));
  }
  if (path != "/metrics") {
    return StartWriting(
        serial,
        PlainResponse(404, "Not Found", "/metrics or /healthz\n", head_only));
  }
  if (--reading_of_address_[connection.address] == 0) {
    reading_of_address_.erase(connection.address);
  }
  connection.phase = Phase::kRendering;
  connection.head_only = head_only;
  // Nothing to hear until the rendering is in.
  events_.Modify(connection.fd.get(), serial, 0);
  absl::MutexLock lock(&mu_);
  to_render_.push_back(serial);
}

void MetricsHttpServer::Impl::StartWriting(uint64_t serial, std::string out) {
  Connection& connection = connections_.at(serial);
  if (connection.phase == Phase::kHead || connection.phase == Phase::kBody) {
    if (--reading_of_address_[connection.address] == 0) {
      reading_of_address_.erase(connection.address);
    }
  }
  connection.phase = Phase::kWriting;
  connection.out = std::move(out);
  connection.written = 0;
  connection.deadline = absl::Now() + options_.write_timeout;
  events_.Modify(connection.fd.get(), serial, EPOLLOUT);
  Write(serial);
}

void MetricsHttpServer::Impl::Write(uint64_t serial) {
  Connection& connection = connections_.at(serial);
  while (connection.written < connection.out.size()) {
    const ssize_t n =
        send(connection.fd.get(), connection.out.data() + connection.written,
             connection.out.size() - connection.written,
             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      return Close(serial);
    }
    connection.written += n;
  }
  Close(serial);
}

void MetricsHttpServer::Impl::Close(uint64_t serial) {
  auto it = connections_.find(serial);
  if (it == connections_.end()) return;
  if (it->second.phase == Phase::kHead || it->second.phase == Phase::kBody) {
    if (--reading_of_address_[it->second.address] == 0) {
      reading_of_address_.erase(it->second.address);
    }
  }
  // Closing the descriptor takes it out of the epoll set.
  connections_.erase(it);
}

void MetricsHttpServer::Impl::Tick(absl::Time now) {
  std::vector<uint64_t> late;
  for (const auto& [serial, connection] : connections_) {
    if (connection.phase != Phase::kRendering && now > connection.deadline) {
      late.push_back(serial);
    }
  }
  for (uint64_t serial : late) Close(serial);
  timed_out_.fetch_add(late.size(), std::memory_order_relaxed);
  unlogged_timed_out_ += late.size();
  LogClosed(now);
}

void MetricsHttpServer::Impl::TakeRendered() {
  std::vector<std::pair<std::vector<uint64_t>, std::string>> rendered;
  {
    absl::MutexLock lock(&mu_);
    rendered.swap(rendered_);
  }
  for (const auto& [serials, body] : rendered) {
    for (uint64_t serial : serials) {
      auto it = connections_.find(serial);
      if (it == connections_.end()) continue;
      StartWriting(serial, Response(200, "OK",
                                    "text/plain; version=0.0.4; charset=utf-8",
                                    body, it->second.head_only));
    }
  }
}

void MetricsHttpServer::Impl::RenderScrapes() {
  while (true) {
    std::vector<uint64_t> serials;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Impl::ReadyToRender));
      if (stopping_) return;
      serials.swap(to_render_);
    }
    std::string body = render_();
    {
      absl::MutexLock lock(&mu_);
      rendered_.emplace_back(std::move(serials), std::move(body));
    }
    events_.Wake();
  }
}

void MetricsHttpServer::Impl::LogClosed(absl::Time now) {
  if (unlogged_timed_out_ == 0 && unlogged_shed_ == 0) return;
  if (now != absl::InfiniteFuture() && now - last_log_ < kLogInterval) return;
  log_->warn(
      "metrics port: closed {} connections past their deadline (request "
      "head {} ms, body {} ms, answer {} ms) and {} for newer ones (over {} "
      "per client address or {} in all)",
      unlogged_timed_out_, absl::ToInt64Milliseconds(options_.header_timeout),
      absl::ToInt64Milliseconds(options_.body_timeout),
      absl::ToInt64Milliseconds(options_.write_timeout), unlogged_shed_,
      options_.max_connections_per_address, options_.max_connections);
  unlogged_timed_out_ = 0;
  unlogged_shed_ = 0;
  last_log_ = now;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, std::function<std::string()> render,
    std::function<absl::Status()> health, Options options) {
  auto impl =
      std::make_unique<Impl>(std::move(render), std::move(health), options);
  absl::StatusOr<int> bound = impl->Bind(host, port);
  if (!bound.ok()) return bound.status();
  impl->Start();
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(std::move(impl), *bound));
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl, int port)
    : impl_(std::move(impl)), port_(port) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() { impl_->Stop(); }

int64_t MetricsHttpServer::timed_out() const { return impl_->timed_out(); }
int64_t MetricsHttpServer::shed() const { return impl_->shed(); }

}  // namespace pagealloc
