// MemorySocketServer: the daemon's end of the memory socket
// (memory/memory_socket.h). One thread serves every connection: it accepts
// them, authenticates each client's Hello through the call core, hands the
// session its memory as file descriptors (its fast channel's memory and
// doorbell, its ring, the CUDA backend's completion counter, the pool's KV
// slab), and then watches the connection for the session's life. When the
// client's end closes (its process died: the kernel closes the sockets of a
// dead process) the session is reclaimed at once, its pages freed, without
// waiting for its lease; the lease remains for clients that hang rather
// than die. A session that ends otherwise
// (closed, lease lost, daemon shutting down) is told why, then its
// connection is closed, which is how its client learns at once.
//
// Bounds: a connection has kHelloTimeout to send its Hello, at most
// kMaxPendingHellos wait for theirs, and a session has one connection.
//
// This class is thread-safe.

#ifndef PAGEALLOC_SERVER_MEMORY_SOCKET_SERVER_H_
#define PAGEALLOC_SERVER_MEMORY_SOCKET_SERVER_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "memory/unique_fd.h"
#include "server/call_core.h"
#include "server/fast_channel_server.h"

namespace pagealloc {

class MemorySocketServer final : public SessionObserver {
 public:
  static constexpr absl::Duration kHelloTimeout = absl::Seconds(5);
  static constexpr int kMaxPendingHellos = 256;

  // `core` and `fast_channels` (null when the daemon offers no fast
  // channels) must outlive this. Registers as an observer of the core's
  // session ends: construct it before serving.
  MemorySocketServer(CallCore* core, FastChannelServer* fast_channels);
  // Stops (Stop).
  ~MemorySocketServer() override;
  MemorySocketServer(const MemorySocketServer&) = delete;
  MemorySocketServer& operator=(const MemorySocketServer&) = delete;

  // Serves `listener`: a bound, listening Unix socket of type
  // SOCK_SEQPACKET at `path` (which Stop removes). REQUIRES: called at most
  // once. INTERNAL when the serving thread's epoll set cannot be made.
  absl::Status Start(UniqueFd listener, std::string path)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Tells every connected client that the daemon is shutting down
  // (UNAVAILABLE), closes every connection and the listener, and removes
  // the socket file. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // SessionObserver: the session's client is told why, and its connection
  // closed (asynchronously, by the serving thread).
  void SessionClosed(uint64_t session_id, absl::string_view reason) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // Sessions connected now (handed their memory, connection open).
  int64_t connected_sessions() const {
    return connected_.load(std::memory_order_relaxed);
  }
  // Hellos refused since start.
  int64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }

 private:
  struct Connection;

  // The serving thread.
  void Serve();
  // Sets up the epoll set for Serve.
  absl::Status Prepare() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CallCore* const core_;
  FastChannelServer* const fast_channels_;
  // Set by Start before the serving thread starts, then only read (and
  // the listener closed by Stop after the thread is joined).
  UniqueFd epoll_;
  UniqueFd wake_;  // eventfd: SessionClosed and Stop ring it
  UniqueFd listener_;
  std::string path_;
  std::thread thread_;

  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Sessions ended since the serving thread last looked, and why.
  std::vector<std::pair<uint64_t, std::string>> ended_ ABSL_GUARDED_BY(mu_);

  std::atomic<int64_t> connected_{0};
  std::atomic<int64_t> refusals_{0};
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_MEMORY_SOCKET_SERVER_H_
