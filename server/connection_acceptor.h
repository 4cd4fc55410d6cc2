// ConnectionAcceptor: the daemon's own accept loop for its gRPC Unix
// sockets. gRPC (1.51) stops accepting on a listener for good after one
// accept4 fails with EMFILE, and has no cap on connections; so the daemon
// listens and accepts itself and hands each connection to gRPC
// (grpc::AddInsecureChannelFromFd, through `serve`). That way it can:
//
//  - cap the connections it holds (Options.max_connections): one more is
//    accepted and closed at once, so its client fails fast instead of
//    hanging in the backlog;
//  - keep descriptors for itself: a connection whose descriptor lands in
//    the last `reserve` of the open-files limit is closed at once too, so
//    /healthz, the memory socket, sessions' memory and /proc reads still
//    find descriptors when clients hold the rest;
//  - survive exhaustion: when accept4 fails for lack of descriptors it
//    closes a spare descriptor it keeps open, accepts and closes the
//    waiting connection (so the backlog does not hold it), reopens the
//    spare, and tries again every Options.retry_interval instead of
//    spinning on a readable listener;
//  - say whether it can accept (health()): /healthz answers 503 with the
//    reason while it cannot, and 200 again once descriptors are free,
//    which it checks by itself every retry_interval.
//
// Connections are counted by (descriptor, inode) pairs: gRPC closes a
// descriptor it was given without telling us, so a pair whose descriptor no
// longer names the same socket is a connection that ended. The count is
// swept when it reaches the cap and when it is read.
//
// This class is thread-safe.

#ifndef PAGEALLOC_SERVER_CONNECTION_ACCEPTOR_H_
#define PAGEALLOC_SERVER_CONNECTION_ACCEPTOR_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "memory/unique_fd.h"

namespace pagealloc {

class ConnectionAcceptor {
 public:
  struct Options {
    // Most connections held at once; more are closed as they arrive.
    int max_connections = 4096;
    // How often it retries while it cannot accept (and checks whether it
    // can again).
    absl::Duration retry_interval = absl::Milliseconds(100);
  };

  // Descriptors kept free for the rest of the daemon: 1/16 of the
  // open-files limit, at least 32 and at most 1024.
  static int ReservedDescriptors(int64_t open_files_limit);

  // `serve` takes ownership of each accepted connection's descriptor
  // (non-blocking, close-on-exec); it runs on the acceptor's thread.
  ConnectionAcceptor(Options options, std::function<void(int fd)> serve);
  // Stops (Stop).
  ~ConnectionAcceptor();
  ConnectionAcceptor(const ConnectionAcceptor&) = delete;
  ConnectionAcceptor& operator=(const ConnectionAcceptor&) = delete;

  // Serves `listener` (a bound, listening stream socket; made
  // non-blocking), named `name` in logs and health
  // ("/run/pagealloc/gpu0.sock"). REQUIRES: before Start.
  void AddListener(UniqueFd listener, std::string name)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Starts the accepting thread. INTERNAL when its wake-up eventfd cannot
  // be made. REQUIRES: called at most once.
  absl::Status Start() ABSL_LOCKS_EXCLUDED(mu_);

  // Stops accepting and closes the listeners (connections already handed
  // to gRPC stay with it). Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // OK while it accepts; UNAVAILABLE naming the listener, how long, and
  // why (descriptors exhausted, or nearly so) while it cannot.
  absl::Status health() const ABSL_LOCKS_EXCLUDED(mu_);

  // Connections accepted and still open.
  int connections() ABSL_LOCKS_EXCLUDED(mu_);
  // Connections closed at once since start: over max_connections, and for
  // lack of descriptors.
  int64_t refused_over_cap() const {
    return refused_over_cap_.load(std::memory_order_relaxed);
  }
  int64_t refused_no_descriptors() const {
    return refused_no_descriptors_.load(std::memory_order_relaxed);
  }

 private:
  struct Listener {
    UniqueFd fd;
    std::string name;
  };
  struct Tracked {
    int fd;
    ino_t inode;
  };

  void Run();
  // Accepts what `listener` has waiting (at most kMaxAcceptsPerWake),
  // handing each to serve_ or closing it at once; enters trouble when it
  // runs out of descriptors.
  void AcceptAll(const Listener& listener);
  // Accepts one waiting connection with the spare descriptor's slot and
  // closes it.
  void DropOne(const Listener& listener);
  // Checks, while it cannot accept, whether descriptors are free again.
  void CheckRecovered();
  void EnterTrouble(const std::string& listener, const std::string& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Sweep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const std::function<void(int)> serve_;
  std::vector<Listener> listeners_;  // fixed once Start runs
  UniqueFd wake_;                    // eventfd: Stop wakes the thread
  UniqueFd spare_;                   // /dev/null, given up on exhaustion
  std::thread thread_;
  std::atomic<int64_t> refused_over_cap_{0};
  std::atomic<int64_t> refused_no_descriptors_{0};

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Tracked> tracked_ ABSL_GUARDED_BY(mu_);
  // Set while it cannot accept: since when, and why.
  bool in_trouble_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time trouble_since_ ABSL_GUARDED_BY(mu_);
  std::string trouble_ ABSL_GUARDED_BY(mu_);
  absl::Time last_cap_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_CONNECTION_ACCEPTOR_H_
