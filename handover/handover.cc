#include "handover/handover.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "memory/fd_passing.h"
#include "unix_socket/listen.h"

namespace pagealloc {
namespace {

// The longest message either side sends: a refusal's reason is cut to fit.
constexpr size_t kMaxMessageBytes = 4096;
// How long the daemon waits for a successor's next message: its check of
// the state reads the journal once.
constexpr absl::Duration kPeerTimeout = absl::Seconds(30);

absl::Status SystemError(absl::string_view what, int error) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(error)));
}

absl::StatusOr<sockaddr_un> AddressOf(const std::string& path) {
  sockaddr_un address{};
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("handover socket path '%s': 1 to %d bytes", path,
                        sizeof(address.sun_path) - 1));
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  return address;
}

void SetTimeout(int fd, absl::Duration timeout) {
  timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

absl::Status Send(int fd, absl::string_view message,
                  absl::Span<const int> fds = {}) {
  if (message.size() > kMaxMessageBytes)
    message = message.substr(0, kMaxMessageBytes);
  return SendWithFds(fd, absl::MakeConstSpan(message.data(), message.size()),
                     fds);
}

// One message; "" when the peer closed the connection. Descriptors are
// kept only where `fds` is given.
absl::StatusOr<std::string> Receive(int fd,
                                    std::vector<UniqueFd>* fds = nullptr) {
  std::string buffer(kMaxMessageBytes, '\0');
  std::vector<UniqueFd> ignored;
  ASSIGN_OR_RETURN(
      const size_t n,
      ReceiveWithFds(fd, absl::MakeSpan(buffer.data(), buffer.size()),
                     fds != nullptr ? kMaxPassedFds : 0,
                     fds != nullptr ? fds : &ignored));
  buffer.resize(n);
  return buffer;
}

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

std::string HandoverSocketPath(absl::string_view socket_path) {
  return absl::StrCat(socket_path, ".handover");
}

absl::StatusOr<std::unique_ptr<HandoverListener>> HandoverListener::Start(
    std::string path, Callbacks callbacks) {
  // Only this user (or root) may take the pool over; the peer's uid is
  // checked again at accept. A blocking accept: Stop wakes it.
  UnixListenOptions options;
  options.type = SOCK_SEQPACKET;
  options.nonblocking = false;
  options.mode = 0600;
  absl::StatusOr<UniqueFd> listener = ListenOnUnixSocket(path, options);
  if (!listener.ok()) {
    return absl::Status(
        listener.status().code(),
        absl::StrCat("handover socket: ", listener.status().message()));
  }
  std::unique_ptr<HandoverListener> handover(new HandoverListener(
      std::move(path), *std::move(listener), std::move(callbacks)));
  handover->thread_ = std::thread([h = handover.get()] { h->Run(); });
  return handover;
}

HandoverListener::HandoverListener(std::string path, UniqueFd listener,
                                   Callbacks callbacks)
    : path_(std::move(path)),
      callbacks_(std::move(callbacks)),
      listener_(std::move(listener)) {}

HandoverListener::~HandoverListener() {
  Stop();
  if (thread_.joinable()) thread_.join();
}

void HandoverListener::Stop() {
  absl::MutexLock lock(&mu_);
  if (stopped_) return;
  stopped_ = true;
  // Wakes the accept; the descriptor is closed by the thread's end (or
  // the destructor), never under a blocked accept.
  shutdown(listener_.get(), SHUT_RDWR);
  unlink(path_.c_str());
}

int HandoverListener::handed_over() const {
  absl::MutexLock lock(&mu_);
  return handed_over_;
}

int HandoverListener::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

void HandoverListener::Run() {
  int listener;
  {
    absl::MutexLock lock(&mu_);
    listener = listener_.get();
  }
  for (;;) {
    UniqueFd peer(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
    }
    if (!peer.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      Logger("handover")
          ->error("accept on {}: {}", path_, std::strerror(errno));
      return;
    }
    Serve(peer.get());
  }
}

void HandoverListener::Serve(int peer) {
  auto log = Logger("handover");
  const auto refuse = [&](const std::string& why) {
    log->warn("a successor did not take the pool over: {}", why);
    absl::MutexLock lock(&mu_);
    ++refused_;
  };
  ucred cred{};
  socklen_t cred_bytes = sizeof(cred);
  if (getsockopt(peer, SOL_SOCKET, SO_PEERCRED, &cred, &cred_bytes) != 0 ||
      (cred.uid != geteuid() && cred.uid != 0)) {
    Send(peer, absl::StrFormat("REFUSE a successor runs as this daemon's "
                               "user (uid %d) or as root",
                               geteuid()))
        .IgnoreError();
    return refuse(absl::StrFormat("pid %d runs as uid %d", cred.pid, cred.uid));
  }
  SetTimeout(peer, kPeerTimeout);
  absl::StatusOr<std::string> take = Receive(peer);
  if (!take.ok()) return refuse(std::string(take.status().message()));
  int version = 0;
  absl::string_view rest = *take;
  if (!absl::ConsumePrefix(&rest, "TAKE ") ||
      !absl::SimpleAtoi(rest, &version) || version != kHandoverVersion) {
    Send(peer, absl::StrFormat("REFUSE this daemon hands over by protocol "
                               "version %d; asked: '%s'",
                               kHandoverVersion, absl::CHexEscape(*take)))
        .IgnoreError();
    return refuse(absl::StrFormat("pid %d asked '%s'", cred.pid,
                                  absl::CHexEscape(*take)));
  }
  absl::StatusOr<std::vector<OfferedFd>> offer = callbacks_.offer();
  if (!offer.ok()) {
    Send(peer, absl::StrCat("REFUSE ", offer.status().message())).IgnoreError();
    return refuse(absl::StrCat(
        "pid ", cred.pid, ": nothing to offer: ", offer.status().message()));
  }
  std::vector<std::string> names;
  std::vector<int> fds;
  for (const OfferedFd& fd : *offer) {
    names.push_back(fd.name);
    fds.push_back(fd.fd);
  }
  if (absl::Status sent =
          Send(peer, absl::StrCat("OFFER ", absl::StrJoin(names, " ")), fds);
      !sent.ok()) {
    return refuse(std::string(sent.message()));
  }
  absl::StatusOr<std::string> answer = Receive(peer);
  if (!answer.ok()) return refuse(std::string(answer.status().message()));
  if (*answer != "GO") {
    absl::string_view why = *answer;
    if (!absl::ConsumePrefix(&why, "REFUSE ")) {
      why = answer->empty() ? "it closed the connection" : "a malformed answer";
    }
    return refuse(absl::StrFormat("pid %d: %s", cred.pid, why));
  }
  log->info("handing the pool over to pid {}: stopping", cred.pid);
  callbacks_.stop();
  {
    absl::MutexLock lock(&mu_);
    ++handed_over_;
  }
  if (absl::Status done = Send(peer, "DONE"); !done.ok()) {
    log->warn("the successor (pid {}) left before DONE: {}", cred.pid,
              std::string(done.message()));
  }
}

bool HandoverSocketLive(const std::string& path) {
  absl::StatusOr<sockaddr_un> address = AddressOf(path);
  if (!address.ok()) return false;
  UniqueFd socket_fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  return socket_fd.valid() &&
         connect(socket_fd.get(), reinterpret_cast<const sockaddr*>(&*address),
                 sizeof(*address)) == 0;
}

absl::StatusOr<std::unique_ptr<PendingHandover>> PendingHandover::Request(
    const std::string& path, absl::Duration timeout) {
  ASSIGN_OR_RETURN(const sockaddr_un address, AddressOf(path));
  UniqueFd socket_fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!socket_fd.valid()) return SystemError("socket (handover)", errno);
  if (connect(socket_fd.get(), reinterpret_cast<const sockaddr*>(&address),
              sizeof(address)) != 0) {
    if (errno == ENOENT || errno == ECONNREFUSED) {
      return absl::NotFoundError(
          absl::StrFormat("no daemon answers handovers on %s", path));
    }
    return SystemError(absl::StrCat("connect ", path), errno);
  }
  SetTimeout(socket_fd.get(), timeout);
  RETURN_IF_ERROR(
      Send(socket_fd.get(), absl::StrCat("TAKE ", kHandoverVersion)));
  std::vector<UniqueFd> fds;
  ASSIGN_OR_RETURN(std::string offer, Receive(socket_fd.get(), &fds));
  absl::string_view rest = offer;
  if (absl::ConsumePrefix(&rest, "REFUSE ")) {
    return absl::FailedPreconditionError(
        absl::StrCat("the running daemon refuses the handover: ", rest));
  }
  if (offer.empty()) {
    return absl::UnavailableError(
        "the running daemon closed the handover without an answer");
  }
  if (!absl::ConsumePrefix(&rest, "OFFER ")) {
    return absl::InternalError(absl::StrFormat(
        "the running daemon's handover answer is malformed: '%s'",
        absl::CHexEscape(offer)));
  }
  std::vector<std::string> names = absl::StrSplit(rest, ' ', absl::SkipEmpty());
  if (names.size() != fds.size()) {
    return absl::InternalError(absl::StrFormat(
        "the running daemon offered %d names and %d descriptors", names.size(),
        fds.size()));
  }
  std::unique_ptr<PendingHandover> pending(
      new PendingHandover(std::move(socket_fd)));
  for (size_t i = 0; i < names.size(); ++i) {
    if (!ValidName(names[i]) || pending->fds_.contains(names[i])) {
      return absl::InternalError(absl::StrFormat(
          "the running daemon offered a descriptor named '%s' (twice, or "
          "not a name)",
          absl::CHexEscape(names[i])));
    }
    pending->fds_.emplace(names[i], std::move(fds[i]));
  }
  return pending;
}

absl::Status PendingHandover::Accept(absl::Duration timeout) {
  SetTimeout(socket_.get(), timeout);
  RETURN_IF_ERROR(Send(socket_.get(), "GO"));
  absl::StatusOr<std::string> done = Receive(socket_.get());
  if (!done.ok()) {
    if (absl::IsUnavailable(done.status())) {
      return absl::DeadlineExceededError(
          absl::StrFormat("the running daemon did not stop within %s",
                          absl::FormatDuration(timeout)));
    }
    return done.status();
  }
  if (done->empty()) {
    Logger("handover")
        ->warn(
            "the running daemon closed the handover before DONE: it died; "
            "taking its state over as after a crash");
    return absl::OkStatus();
  }
  if (*done != "DONE") {
    return absl::InternalError(
        absl::StrFormat("the running daemon's handover answer is '%s'",
                        absl::CHexEscape(*done)));
  }
  return absl::OkStatus();
}

void PendingHandover::Refuse(absl::string_view why) {
  Send(socket_.get(), absl::StrCat("REFUSE ", why)).IgnoreError();
  socket_.reset();
}

}  // namespace pagealloc
