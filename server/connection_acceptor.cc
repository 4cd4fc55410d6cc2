#include "server/connection_acceptor.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace pagealloc {
namespace {

// Accepts per listener per wake-up, so that Stop and the other listeners
// are not kept waiting by a flood on one.
constexpr int kMaxAcceptsPerWake = 256;
// Refusals over the cap are logged at most this often.
constexpr absl::Duration kCapLogInterval = absl::Seconds(10);

int64_t OpenFilesLimit() {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0 ||
      files.rlim_cur == RLIM_INFINITY ||
      files.rlim_cur > static_cast<rlim_t>(std::numeric_limits<int>::max())) {
    return std::numeric_limits<int>::max();
  }
  return static_cast<int64_t>(files.rlim_cur);
}

UniqueFd OpenDevNull() {
  return UniqueFd(open("/dev/null", O_RDONLY | O_CLOEXEC));
}

// Open descriptors of this process (the directory's own included), or -1
// when /proc cannot be read (no descriptor left for it, or no /proc).
int64_t OpenDescriptors() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int64_t count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

}  // namespace

int ConnectionAcceptor::ReservedDescriptors(int64_t open_files_limit) {
  return static_cast<int>(std::clamp<int64_t>(open_files_limit / 16, 32, 1024));
}

ConnectionAcceptor::ConnectionAcceptor(Options options,
                                       std::function<void(int fd)> serve)
    : options_(options), serve_(std::move(serve)) {}

ConnectionAcceptor::~ConnectionAcceptor() { Stop(); }

void ConnectionAcceptor::AddListener(UniqueFd listener, std::string name) {
  // The loop accepts until EAGAIN: a blocking listener would hold it there.
  const int flags = fcntl(listener.get(), F_GETFL);
  if (flags >= 0) fcntl(listener.get(), F_SETFL, flags | O_NONBLOCK);
  absl::MutexLock lock(&mu_);
  listeners_.push_back({std::move(listener), std::move(name)});
}

absl::Status ConnectionAcceptor::Start() {
  absl::MutexLock lock(&mu_);
  wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_.valid()) {
    return absl::InternalError(absl::StrFormat(
        "cannot make the acceptor's eventfd: %s", std::strerror(errno)));
  }
  spare_ = OpenDevNull();
  started_ = true;
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void ConnectionAcceptor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    if (!started_) {
      listeners_.clear();
      return;
    }
  }
  const uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  listeners_.clear();
}

absl::Status ConnectionAcceptor::health() const {
  absl::MutexLock lock(&mu_);
  if (!in_trouble_) return absl::OkStatus();
  return absl::UnavailableError(absl::StrFormat(
      "not accepting gRPC connections (for %d ms): %s",
      absl::ToInt64Milliseconds(absl::Now() - trouble_since_), trouble_));
}

int ConnectionAcceptor::connections() {
  absl::MutexLock lock(&mu_);
  Sweep();
  return static_cast<int>(tracked_.size());
}

void ConnectionAcceptor::Sweep() {
  tracked_.erase(std::remove_if(tracked_.begin(), tracked_.end(),
                                [](const Tracked& tracked) {
                                  struct stat st;
                                  return fstat(tracked.fd, &st) != 0 ||
                                         !S_ISSOCK(st.st_mode) ||
                                         st.st_ino != tracked.inode;
                                }),
                 tracked_.end());
}

void ConnectionAcceptor::Run() {
  std::vector<pollfd> polled(listeners_.size() + 1);
  polled[0] = {wake_.get(), POLLIN, 0};
  for (size_t i = 0; i < listeners_.size(); ++i) {
    polled[i + 1] = {listeners_[i].fd.get(), POLLIN, 0};
  }
  const int retry_ms = static_cast<int>(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.retry_interval)));
  while (true) {
    bool trouble;
    {
      absl::MutexLock lock(&mu_);
      trouble = in_trouble_;
    }
    // In trouble a listener with connections waiting stays readable: poll
    // only the wake-up fd and come back after the retry interval rather
    // than spin.
    for (size_t i = 1; i < polled.size(); ++i) {
      polled[i].events = trouble ? 0 : POLLIN;
      polled[i].revents = 0;
    }
    polled[0].revents = 0;
    const int ready =
        poll(polled.data(), polled.size(), trouble ? retry_ms : -1);
    if (ready < 0 && errno != EINTR) {
      Logger("server")->error("acceptor: poll failed: {}",
                              std::strerror(errno));
      absl::SleepFor(options_.retry_interval);
      continue;
    }
    if (polled[0].revents != 0) return;  // Stop
    if (trouble) CheckRecovered();
    for (size_t i = 0; i < listeners_.size(); ++i) {
      if (trouble || (polled[i + 1].revents & POLLIN) != 0) {
        AcceptAll(listeners_[i]);
      }
    }
  }
}

void ConnectionAcceptor::AcceptAll(const Listener& listener) {
  std::shared_ptr<spdlog::logger> log = Logger("server");
  for (int n = 0; n < kMaxAcceptsPerWake; ++n) {
    UniqueFd fd(accept4(listener.fd.get(), nullptr, nullptr,
                        SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      const int error = errno;
      switch (error) {
        case EINTR:
        case ECONNABORTED:
        case EPROTO:
          continue;
        case EAGAIN:
          return;
        case EMFILE:
        case ENFILE:
        case ENOBUFS:
        case ENOMEM:
          refused_no_descriptors_.fetch_add(1, std::memory_order_relaxed);
          EnterTrouble(listener.name,
                       absl::StrFormat(
                           "accept failed: %s (open-files limit "
                           "%d); retrying every %d ms",
                           std::strerror(error), OpenFilesLimit(),
                           absl::ToInt64Milliseconds(options_.retry_interval)));
          DropOne(listener);
          return;
        default:
          EnterTrouble(listener.name,
                       absl::StrFormat(
                           "accept failed: %s; retrying every %d ms",
                           std::strerror(error),
                           absl::ToInt64Milliseconds(options_.retry_interval)));
          return;
      }
    }
    // accept4 returns the lowest free descriptor: one in the reserved top
    // of the limit means every descriptor below it is taken.
    const int64_t limit = OpenFilesLimit();
    const int reserved = ReservedDescriptors(limit);
    if (fd.get() >= limit - reserved) {
      refused_no_descriptors_.fetch_add(1, std::memory_order_relaxed);
      EnterTrouble(
          listener.name,
          absl::StrFormat(
              "descriptors nearly exhausted (a new connection got descriptor "
              "%d; the open-files limit is %d, of which the last %d are kept "
              "for the daemon itself); refusing new connections until "
              "descriptors are free. Raise the limit (LimitNOFILE) or lower "
              "--max_connections",
              fd.get(), limit, reserved));
      continue;  // `fd` closes; the next waiting connection likewise
    }
    struct stat st;
    if (fstat(fd.get(), &st) != 0) continue;
    {
      absl::MutexLock lock(&mu_);
      if (in_trouble_) {
        log->info("accepting gRPC connections on {} again after {} ms",
                  listener.name,
                  absl::ToInt64Milliseconds(absl::Now() - trouble_since_));
        in_trouble_ = false;
      }
      if (static_cast<int>(tracked_.size()) >= options_.max_connections) {
        Sweep();
      }
      if (static_cast<int>(tracked_.size()) >= options_.max_connections) {
        const int64_t refused =
            refused_over_cap_.fetch_add(1, std::memory_order_relaxed) + 1;
        const absl::Time now = absl::Now();
        if (now - last_cap_log_ >= kCapLogInterval) {
          last_cap_log_ = now;
          log->warn(
              "{}: {} connections open, the most --max_connections allows; "
              "closing new ones at once ({} so far)",
              listener.name, tracked_.size(), refused);
        }
        continue;  // `fd` closes
      }
      // A descriptor number reused since gRPC closed it names another
      // socket now: drop the stale pair.
      const int number = fd.get();
      tracked_.erase(std::remove_if(tracked_.begin(), tracked_.end(),
                                    [number](const Tracked& tracked) {
                                      return tracked.fd == number;
                                    }),
                     tracked_.end());
      tracked_.push_back({number, st.st_ino});
    }
    serve_(fd.release());
  }
}

void ConnectionAcceptor::DropOne(const Listener& listener) {
  // The spare's slot takes the waiting connection, which is closed at once:
  // its client sees the connection end instead of waiting in the backlog.
  spare_.reset();
  UniqueFd dropped(accept4(listener.fd.get(), nullptr, nullptr,
                           SOCK_NONBLOCK | SOCK_CLOEXEC));
  dropped.reset();
  spare_ = OpenDevNull();
}

void ConnectionAcceptor::CheckRecovered() {
  if (!spare_.valid()) spare_ = OpenDevNull();
  if (!spare_.valid()) return;
  const int64_t limit = OpenFilesLimit();
  const int reserved = ReservedDescriptors(limit);
  {
    UniqueFd probe = OpenDevNull();
    if (!probe.valid() || probe.get() >= limit - reserved) return;
  }
  const int64_t open = OpenDescriptors();
  if (open < 0 || open >= limit - reserved) return;
  absl::MutexLock lock(&mu_);
  if (!in_trouble_) return;
  Logger("server")->info(
      "descriptors free again ({} of {} open); accepting gRPC connections "
      "again after {} ms",
      open, limit, absl::ToInt64Milliseconds(absl::Now() - trouble_since_));
  in_trouble_ = false;
}

void ConnectionAcceptor::EnterTrouble(const std::string& listener,
                                      const std::string& why) {
  absl::MutexLock lock(&mu_);
  trouble_ = absl::StrFormat("%s: %s", listener, why);
  if (in_trouble_) return;
  in_trouble_ = true;
  trouble_since_ = absl::Now();
  Logger("server")->warn("{}", trouble_);
}

}  // namespace pagealloc
