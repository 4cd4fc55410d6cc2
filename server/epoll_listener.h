// EpollListener: what the daemon's own accept loops on the memory socket
// and the metrics port share. One epoll set holding a wake-up eventfd (any
// thread rings it) and a listening socket, whose accepts rest for a moment
// when the process is out of descriptors (so that a full descriptor table
// does not spin the loop); connections join the set under tags from
// kFirstTag up.
//
// This class is thread-compatible, except Wake, which is thread-safe.

#ifndef PAGEALLOC_SERVER_EPOLL_LISTENER_H_
#define PAGEALLOC_SERVER_EPOLL_LISTENER_H_

#include <sys/epoll.h>
#include <sys/socket.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "memory/unique_fd.h"

namespace pagealloc {

class EpollListener {
 public:
  static constexpr uint64_t kWakeTag = 0;
  static constexpr uint64_t kListenerTag = 1;
  static constexpr uint64_t kFirstTag = 2;
  // How long accepts rest when descriptors run out.
  static constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);

  // Makes the epoll set and the eventfd and adds them with `listener` (a
  // non-blocking listening socket this does not own). INTERNAL naming what
  // failed.
  absl::Status Init(int listener);

  // Wakes Wait. Thread-safe.
  void Wake();

  // Waits for events until `until` at the latest (the listener's pause
  // included); a wake-up is consumed here and reported as kWakeTag.
  // Returns the number of events.
  int Wait(epoll_event* events, int max_events, absl::Time until);

  // Accepts one connection (non-blocking, close-on-exec), with its peer's
  // address in `peer` when not null; invalid when none is waiting. When
  // the process is out of descriptors it stops listening for kAcceptPause
  // and `*out_of_descriptors` is set.
  UniqueFd Accept(sockaddr_storage* peer, bool* out_of_descriptors = nullptr);

  // Adds or changes a connection's events; false when epoll_ctl fails.
  bool Add(int fd, uint64_t tag, uint32_t events);
  void Modify(int fd, uint64_t tag, uint32_t events);

 private:
  UniqueFd epoll_;
  UniqueFd wake_;
  int listener_ = -1;
  absl::Time paused_until_ = absl::InfinitePast();
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_EPOLL_LISTENER_H_
