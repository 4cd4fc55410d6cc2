#include "server/epoll_listener.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace pagealloc {

absl::Status EpollListener::Init(int listener) {
  listener_ = listener;
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!epoll_.valid() || !wake_.valid()) {
    return absl::InternalError(
        absl::StrFormat("epoll or eventfd failed: %s", std::strerror(errno)));
  }
  if (!Add(wake_.get(), kWakeTag, EPOLLIN) ||
      !Add(listener_, kListenerTag, EPOLLIN)) {
    return absl::InternalError(
        absl::StrFormat("epoll_ctl failed: %s", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void EpollListener::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
}

int EpollListener::Wait(epoll_event* events, int max_events, absl::Time until) {
  absl::Time now = absl::Now();
  if (paused_until_ != absl::InfinitePast()) {
    if (now >= paused_until_) {
      Modify(listener_, kListenerTag, EPOLLIN);
      paused_until_ = absl::InfinitePast();
    } else {
      until = std::min(until, paused_until_);
    }
  }
  int timeout_ms = -1;
  if (until != absl::InfiniteFuture()) {
    // Rounded up, so that the wake-up finds the deadline passed.
    timeout_ms = static_cast<int>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(until - now) + 1, 0, 1 << 30));
  }
  const int n = epoll_wait(epoll_.get(), events, max_events, timeout_ms);
  for (int i = 0; i < n; ++i) {
    if (events[i].data.u64 == kWakeTag) {
      uint64_t count;
      (void)!read(wake_.get(), &count, sizeof(count));
    }
  }
  return std::max(n, 0);
}

UniqueFd EpollListener::Accept(sockaddr_storage* peer,
                               bool* out_of_descriptors) {
  while (true) {
    socklen_t size = sizeof(sockaddr_storage);
    UniqueFd fd(accept4(listener_, reinterpret_cast<sockaddr*>(peer),
                        peer != nullptr ? &size : nullptr,
                        SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.valid()) return fd;
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
        errno == ENOMEM) {
      Modify(listener_, kListenerTag, 0);
      paused_until_ = absl::Now() + kAcceptPause;
      if (out_of_descriptors != nullptr) *out_of_descriptors = true;
    }
    return UniqueFd();
  }
}

bool EpollListener::Add(int fd, uint64_t tag, uint32_t events) {
  epoll_event event{};
  event.events = events;
  event.data.u64 = tag;
  return epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) == 0;
}

void EpollListener::Modify(int fd, uint64_t tag, uint32_t events) {
  epoll_event event{};
  event.events = events;
  event.data.u64 = tag;
  epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &event);
}

}  // namespace pagealloc
