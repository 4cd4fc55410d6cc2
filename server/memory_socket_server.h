// MemorySocketServer: the daemon's end of the memory socket
// (memory/memory_socket.h). One thread serves every connection: it accepts
// them, authenticates each client's Hello through the call core, hands the
// session its memory as file descriptors (its fast channel's memory and
// doorbell, its ring, the CUDA backend's completion counter, the pool's KV
// slab), and then watches the connection for the session's life. When the
// client's end closes (its process died: the kernel closes the sockets of a
// dead process) the session is reclaimed at once, its pages freed, without
// waiting for its lease; the lease remains for clients that hang rather
// than die. A resumable session is kept instead (detached) until its lease
// runs out or a Resume gives it a new link, whose Hello this server then
// takes; a connection of a link a Resume replaced (take_over) is told why
// and closed, and its close ends nothing. A session that ends otherwise
// (closed, lease lost, daemon shutting down) is told why, then its
// connection is closed, which is how its client learns at once.
//
// Bounds (Options): a connection that has not sent its Hello yet is
// unauthenticated, and costs the daemon a descriptor and nothing more. It
// has hello_timeout to send it; at most max_pending_per_peer of them wait
// per peer process (SO_PEERCRED's pid) and max_pending in all. A new
// connection over either bound sheds the oldest waiting connection in its
// scope (the peer's own, or everyone's) rather than being refused, so that
// an honest client, which sends its Hello as soon as it connects, gets
// through a flood of silent connections: a connection whose Hello is
// already waiting is served, not shed. Every shed is counted by reason
// (shed_total) and logged, at most once a second with the counts. A
// session has one connection.
//
// This class is thread-safe.

#ifndef PAGEALLOC_SERVER_MEMORY_SOCKET_SERVER_H_
#define PAGEALLOC_SERVER_MEMORY_SOCKET_SERVER_H_

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "memory/unique_fd.h"
#include "server/call_core.h"
#include "server/epoll_listener.h"
#include "server/fast_channel_server.h"

namespace pagealloc {

// MemorySocketServer's bounds on connections that have not sent their Hello
// (outside the class, so that its defaults can serve as a default argument).
struct MemorySocketOptions {
  // How long a connection may take to send its Hello (an honest client
  // sends it right after connecting).
  absl::Duration hello_timeout = absl::Seconds(2);
  // Connections waiting for their Hello, in all and per peer process.
  int max_pending = 256;
  int max_pending_per_peer = 16;
};

class MemorySocketServer final : public SessionObserver {
 public:
  using Options = MemorySocketOptions;

  // Why a connection that sent no Hello was closed.
  enum class Shed : int { kPeerBound = 0, kTotalBound, kHelloTimeout };
  static constexpr int kNumShedReasons = 3;
  // "peer_bound", "total_bound", "hello_timeout": the metric's label.
  static absl::string_view ShedName(Shed reason);

  // `core` and `fast_channels` (null when the daemon offers no fast
  // channels) must outlive this. Registers as an observer of the core's
  // session ends: construct it before serving. REQUIRES: the bounds are
  // at least 1 and hello_timeout is positive (the flags check them).
  MemorySocketServer(CallCore* core, FastChannelServer* fast_channels,
                     Options options = Options());
  // Stops (Stop).
  ~MemorySocketServer() override;
  MemorySocketServer(const MemorySocketServer&) = delete;
  MemorySocketServer& operator=(const MemorySocketServer&) = delete;

  // Serves `listener`: a bound, listening Unix socket of type
  // SOCK_SEQPACKET at `path` (which Stop removes). REQUIRES: called at most
  // once. INTERNAL when the serving thread's epoll set cannot be made.
  absl::Status Start(UniqueFd listener, std::string path)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Closes every connection, then the listener, and removes the socket
  // file. With kEnd each session's client is first told that the daemon
  // is shutting down (UNAVAILABLE); with kKeep each connection closes
  // without a word, as a crash closes it. Idempotent: only the first
  // call's `sessions` counts.
  void Stop(SessionsAtStop sessions = SessionsAtStop::kEnd)
      ABSL_LOCKS_EXCLUDED(mu_);

  // SessionObserver: the session's client is told why, and its connection
  // closed (asynchronously, by the serving thread).
  void SessionClosed(uint64_t session_id, absl::string_view reason) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // SessionObserver: a take-over's old connection is told (ABORTED, "taken
  // over") and closed, asynchronously, by the serving thread.
  void SessionResumed(uint64_t session_id, uint64_t old_generation,
                      bool was_connected) override ABSL_LOCKS_EXCLUDED(mu_);

  // Closes every session's connection without a word and keeps the
  // sessions, detached (resumable or not), as a daemon that restarts with
  // its state leaves them: each client sees its daemon go away and may
  // Resume. Returns once the serving thread has closed them (at once when
  // it is not running). A daemon that stops with its state kept calls it
  // as soon as it drains (Server::Shutdown); tests call it to exercise the
  // client's reconnect.
  void SeverConnections() ABSL_LOCKS_EXCLUDED(mu_);

  // Sessions connected now (handed their memory, connection open).
  int64_t connected_sessions() const {
    return connected_.load(std::memory_order_relaxed);
  }
  // Hellos refused since start.
  int64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }
  // Connections waiting for their Hello now.
  int64_t pending_hellos() const {
    return pending_count_.load(std::memory_order_relaxed);
  }
  // Connections closed without a Hello since start, for `reason`.
  int64_t shed_total(Shed reason) const {
    return shed_[static_cast<int>(reason)].load(std::memory_order_relaxed);
  }
  const Options& options() const { return options_; }

 private:
  struct Connection {
    UniqueFd fd;
    uint64_t session_id = 0;  // 0 until its Hello was accepted
    // The session's link this connection holds (Session::Connect), and
    // the session, for SeverConnections.
    uint64_t generation = 0;
    std::weak_ptr<Session> session;
    absl::Time accepted;
    pid_t pid = 0;
    uid_t uid = 0;
  };

  // The serving thread: waits, dispatches, repeats until Stop; then tells
  // every session that the daemon is shutting down. The functions below
  // run on it alone.
  void Serve();
  // When the serving thread must wake up at the latest: the oldest Hello
  // deadline, the next shed log line.
  absl::Time NextDeadline() const;
  // Accepts every connection the listener has; pauses the listener when
  // the daemon is out of descriptors.
  void AcceptAll();
  // Takes an accepted connection in, shedding within the bounds first.
  void Admit(UniqueFd fd);
  // Sheds the oldest connection waiting for its Hello, among the peer's
  // when `pid` is set; a candidate whose Hello has arrived is served
  // instead (which also takes it off the waiting list) and the next
  // oldest tried, until one is shed, there is room, or the scope is empty.
  void ShedOldest(std::optional<pid_t> pid, Shed reason);
  // A connection's first message: authenticate, then hand the memory over.
  void ReadHello(uint64_t serial);
  // Sends the session its memory's descriptors; false when that failed.
  bool HandOver(Connection& connection, Session& session);
  // A connected session's connection woke: the client went away (EOF) or
  // broke the protocol (anything sent after its Hello).
  void Watch(uint64_t serial);
  // Tells the sessions SessionClosed named why, and closes their
  // connections; tells and closes the connections SessionResumed took
  // sessions from; severs every connection when asked.
  void EndSessions() ABSL_LOCKS_EXCLUDED(mu_);
  // Tells a connection whose session a Resume took that it was taken over,
  // and closes it.
  void EndTakenOver(uint64_t serial);
  // Sheds connections past their Hello deadline; writes the shed log line
  // when due.
  void Tick(absl::Time now);
  void Refuse(uint64_t serial, const absl::Status& status);
  void ShedConnection(uint64_t serial, Shed reason);
  void Forget(uint64_t serial);
  void LogShedding(absl::Time now, bool force);

  CallCore* const core_;
  FastChannelServer* const fast_channels_;
  const Options options_;
  // Set by Start before the serving thread starts, then only read (and
  // the listener closed by Stop after the thread is joined).
  EpollListener events_;  // SessionClosed and Stop wake it
  UniqueFd listener_;
  std::string path_;
  std::thread thread_;

  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  SessionsAtStop sessions_at_stop_ ABSL_GUARDED_BY(mu_) = SessionsAtStop::kEnd;
  // Sessions ended since the serving thread last looked, and why; links
  // taken over (session id, the old link's generation); SeverConnections'
  // waiters.
  std::vector<std::pair<uint64_t, std::string>> ended_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, uint64_t>> taken_over_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<absl::Notification>> sever_ ABSL_GUARDED_BY(mu_);

  // The serving thread's state (see Serve).
  std::shared_ptr<spdlog::logger> log_;
  std::map<uint64_t, Connection> connections_;  // by serial, oldest first
  absl::flat_hash_map<uint64_t, uint64_t> serial_of_;  // by session id
  // Serials of the connections waiting for their Hello, oldest first, and
  // how many each peer process has.
  std::map<uint64_t, pid_t> pending_;
  absl::flat_hash_map<pid_t, int> pending_of_peer_;
  uint64_t next_serial_;
  // Sheds since the last log line, by reason, and the last peer shed.
  std::array<int64_t, kNumShedReasons> unlogged_shed_{};
  pid_t last_shed_pid_ = 0;
  uid_t last_shed_uid_ = 0;
  absl::Time last_shed_log_ = absl::InfinitePast();

  std::atomic<int64_t> connected_{0};
  std::atomic<int64_t> refusals_{0};
  std::atomic<int64_t> pending_count_{0};
  std::array<std::atomic<int64_t>, kNumShedReasons> shed_{};
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_MEMORY_SOCKET_SERVER_H_
