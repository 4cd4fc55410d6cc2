#include "fd_keeper/fd_keeper.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/logging.h"

extern char** environ;

namespace pagealloc {
namespace {

// Descriptor numbers in the keeper: the link, then the kept descriptors.
constexpr int kLinkFd = 3;
constexpr int kFirstKeptFd = 4;
// The most descriptors a keeper takes (the daemon keeps two).
constexpr int kMaxKeptFds = 16;
// The longest message on the link.
constexpr size_t kMaxLinkMessage = 1024;

absl::Status SendLink(int fd, absl::string_view message) {
  if (send(fd, message.data(), message.size(), MSG_NOSIGNAL | MSG_DONTWAIT) <
      0) {
    return absl::InternalError(
        absl::StrCat("descriptor keeper link: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// One message; "" when the other end closed; an error otherwise.
absl::StatusOr<std::string> ReceiveLink(int fd) {
  std::string message(kMaxLinkMessage, '\0');
  for (;;) {
    const ssize_t n = recv(fd, message.data(), message.size(), 0);
    if (n >= 0) {
      message.resize(n);
      return message;
    }
    if (errno == EINTR) continue;
    return absl::InternalError(
        absl::StrCat("descriptor keeper link: ", std::strerror(errno)));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<FdKeeper>> FdKeeper::Spawn(
    Options options, absl::Duration start_timeout) {
  if (options.fds.empty() ||
      options.fds.size() > static_cast<size_t>(kMaxKeptFds)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a descriptor keeper keeps 1 to %d descriptors, not %d",
                        kMaxKeptFds, options.fds.size()));
  }
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    return absl::InternalError(
        absl::StrCat("socketpair (descriptor keeper): ", std::strerror(errno)));
  }
  UniqueFd link(pair[0]);
  UniqueFd keeper_end(pair[1]);
  // Each descriptor goes to its number in the keeper through a duplicate
  // numbered above them all, so that no dup2 overwrites a source another
  // one still needs.
  std::vector<UniqueFd> sources;
  sources.emplace_back(fcntl(keeper_end.get(), F_DUPFD_CLOEXEC, 64));
  for (const OfferedFd& fd : options.fds) {
    sources.emplace_back(fcntl(fd.fd, F_DUPFD_CLOEXEC, 64));
  }
  for (const UniqueFd& source : sources) {
    if (!source.valid()) {
      return absl::InternalError(
          absl::StrCat("fcntl (descriptor keeper): ", std::strerror(errno)));
    }
  }
  std::vector<std::string> args = {
      options.binary, kFdKeeperArg, options.socket_path,
      absl::StrCat(absl::ToInt64Milliseconds(options.linger))};
  for (const OfferedFd& fd : options.fds) args.push_back(fd.name);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (size_t i = 0; i < sources.size(); ++i) {
    posix_spawn_file_actions_adddup2(&actions, sources[i].get(),
                                     kLinkFd + static_cast<int>(i));
  }
  // The daemon blocks the signals it waits for (SIGTERM, SIGINT): the
  // keeper starts with none blocked and default dispositions, so that an
  // operator's `kill` ends it.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int signal : {SIGTERM, SIGINT, SIGHUP, SIGPIPE}) {
    sigaddset(&defaults, signal);
  }
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setflags(&attributes,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, options.binary.c_str(), &actions,
                                  &attributes, argv.data(), environ);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    return absl::InternalError(
        absl::StrFormat("cannot start the descriptor keeper (%s): %s",
                        options.binary, std::strerror(spawned)));
  }
  keeper_end.reset();
  sources.clear();

  auto give_up = [&](absl::Status why) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return why;
  };
  pollfd ready = {link.get(), POLLIN, 0};
  const int polled = poll(
      &ready, 1, static_cast<int>(absl::ToInt64Milliseconds(start_timeout)));
  if (polled != 1) {
    return give_up(absl::InternalError(absl::StrFormat(
        "the descriptor keeper (pid %d) did not answer within %s", pid,
        absl::FormatDuration(start_timeout))));
  }
  absl::StatusOr<std::string> answer = ReceiveLink(link.get());
  if (!answer.ok()) return give_up(answer.status());
  absl::string_view why = *answer;
  if (absl::ConsumePrefix(&why, "FAILED ")) {
    waitpid(pid, nullptr, 0);
    return absl::FailedPreconditionError(std::string(why));
  }
  if (*answer != "READY") {
    return give_up(absl::InternalError(
        absl::StrFormat("the descriptor keeper (pid %d) answered '%s'", pid,
                        answer->empty() ? "nothing: it exited" : *answer)));
  }
  std::unique_ptr<FdKeeper> keeper(
      new FdKeeper(std::move(options), std::move(link), pid));
  keeper->thread_ = std::thread([k = keeper.get()] { k->Run(); });
  return keeper;
}

FdKeeper::FdKeeper(Options options, UniqueFd link, pid_t pid)
    : options_(std::move(options)), pid_(pid), link_(std::move(link)) {}

FdKeeper::~FdKeeper() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    // Wakes the link's thread; the keeper sees its end close, as at the
    // daemon's death, and lingers for a successor.
    shutdown(link_.get(), SHUT_RDWR);
  }
  if (thread_.joinable()) thread_.join();
}

void FdKeeper::Retire() {
  absl::MutexLock lock(&mu_);
  if (retired_ || closing_) return;
  retired_ = true;
  if (absl::Status sent = SendLink(link_.get(), "RETIRE"); !sent.ok()) {
    Logger("keeper")->error("retiring the descriptor keeper (pid {}): {}", pid_,
                            std::string(sent.message()));
  }
}

bool FdKeeper::handed_over() const {
  absl::MutexLock lock(&mu_);
  return handed_over_;
}

bool FdKeeper::lost() const {
  absl::MutexLock lock(&mu_);
  return lost_;
}

void FdKeeper::Run() {
  auto log = Logger("keeper");
  int link;
  {
    absl::MutexLock lock(&mu_);
    link = link_.get();
  }
  for (;;) {
    absl::StatusOr<std::string> message = ReceiveLink(link);
    absl::MutexLock lock(&mu_);
    if (closing_) return;
    if (!message.ok() || message->empty()) {
      lost_ = !retired_ && !handed_over_;
      if (lost_) {
        log->error(
            "the descriptor keeper (pid {}) is gone: until another keeps "
            "the pool, no successor can take it over, and this daemon's end "
            "(a stop or a crash) loses it",
            pid_);
      }
      mu_.Unlock();
      waitpid(pid_, nullptr, 0);  // its end closed: it is exiting
      mu_.Lock();
      return;
    }
    if (*message != "STOP") {
      log->error("the descriptor keeper (pid {}) sent '{}'", pid_, *message);
      continue;
    }
    handed_over_ = true;
    mu_.Unlock();
    log->info("a successor takes the pool over: stopping");
    options_.stop();
    mu_.Lock();
    if (!closing_) SendLink(link, "STOPPED").IgnoreError();
  }
}

int RunFdKeeper(int argc, char** argv) {
  auto log = Logger("keeper");
  const auto fail = [&](const std::string& why) {
    log->error("descriptor keeper: {}", why);
    SendLink(kLinkFd, absl::StrCat("FAILED ", why)).IgnoreError();
    return 1;
  };
  int64_t linger_ms = 0;
  if (argc < 5 || absl::string_view(argv[1]) != kFdKeeperArg ||
      !absl::SimpleAtoi(argv[3], &linger_ms) || linger_ms < 0 ||
      argc - 4 > kMaxKeptFds) {
    return fail(
        "usage: <binary> --internal_fd_keeper <socket> <linger_ms> "
        "<name>...; run by the daemon only");
  }
  const std::string path = argv[2];
  std::vector<OfferedFd> fds;
  for (int i = 4; i < argc; ++i) {
    const int fd = kFirstKeptFd + (i - 4);
    if (fcntl(fd, F_GETFD) < 0) {
      return fail(
          absl::StrFormat("descriptor %d (%s) is not open", fd, argv[i]));
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    fds.push_back({argv[i], fd});
  }
  fcntl(kLinkFd, F_SETFD, FD_CLOEXEC);

  // The daemon's state as the link tells it. The handover's thread waits on
  // it between a successor's GO and its DONE.
  absl::Mutex mu;
  bool daemon_running = true;
  bool daemon_stopped = false;
  // Set once Start returned (a successor may connect before).
  HandoverListener* listening = nullptr;
  std::unique_ptr<HandoverListener> listener;
  HandoverListener::Callbacks callbacks;
  callbacks.offer = [&fds]() -> absl::StatusOr<std::vector<OfferedFd>> {
    return fds;
  };
  callbacks.stop = [&] {
    HandoverListener* self;
    {
      absl::MutexLock lock(&mu);
      if (daemon_running && !daemon_stopped) {
        SendLink(kLinkFd, "STOP").IgnoreError();
      }
      // Stopped, or gone: either way nothing changes the journal now.
      mu.Await(absl::Condition(
          +[](bool* done) { return *done; }, &daemon_stopped));
      mu.Await(absl::Condition(
          +[](HandoverListener** l) { return *l != nullptr; }, &listening));
      self = listening;
    }
    // The successor listens here next: the socket and its file go before
    // DONE (and never after: the file would be the successor's by then).
    self->Stop();
  };
  absl::StatusOr<std::unique_ptr<HandoverListener>> started =
      HandoverListener::Start(path, callbacks);
  if (!started.ok()) return fail(std::string(started.status().message()));
  listener = *std::move(started);
  {
    absl::MutexLock lock(&mu);
    listening = listener.get();
  }
  // A daemon that died before it heard this is found gone below, as one
  // that dies later: its journal was whole when it spawned the keeper, so
  // the pool is kept for a successor either way.
  SendLink(kLinkFd, "READY").IgnoreError();

  const absl::Duration linger = absl::Milliseconds(linger_ms);
  absl::Time linger_until = absl::InfiniteFuture();
  pollfd link = {kLinkFd, POLLIN, 0};
  for (;;) {
    if (listener->handed_over() > 0) {
      listener.reset();  // after its DONE
      return 0;
    }
    if (absl::Now() >= linger_until) {
      log->warn(
          "no successor took the pool over within {} of the daemon's end: "
          "its descriptors close, and the KV memory they kept is freed",
          absl::FormatDuration(linger));
      listener.reset();
      return 0;
    }
    if (poll(&link, 1, 100) != 1) continue;
    absl::StatusOr<std::string> message = ReceiveLink(kLinkFd);
    if (message.ok() && *message == "RETIRE") {
      log->info("descriptor keeper retired: the pool is no longer kept");
      listener.reset();
      return 0;
    }
    absl::MutexLock lock(&mu);
    if (message.ok() && *message == "STOPPED") {
      daemon_stopped = true;
    } else if (!message.ok() || message->empty()) {
      // The daemon exited or died: from now on a successor's GO needs no
      // stop.
      if (!daemon_stopped) {
        log->warn(
            "the daemon is gone: its pool is kept for a successor started "
            "with --take_over for {} (descriptor keeper pid {})",
            absl::FormatDuration(linger), getpid());
      }
      daemon_running = false;
      daemon_stopped = true;
      linger_until = absl::Now() + linger;
      link.fd = -1;  // poll ignores it from now on
    } else {
      log->error("descriptor keeper: the daemon sent '{}'", *message);
    }
  }
}

}  // namespace pagealloc
