// Handing the kept pool to a successor where no service manager keeps its
// descriptors (docs/design.md, "A restart keeps the pool").
//
// Under systemd the KV slab and the state journal outlive the daemon in
// the service manager's file-descriptor store (//fd_store). Elsewhere (a
// shell, a container, a supervisor that keeps no descriptors) the daemon
// holds them itself, and a successor started with --take_over takes them
// over a Unix socket beside the daemon's own (SOCK_SEQPACKET, mode 0600, a
// peer of another user refused), in four messages:
//
//   successor -> daemon   "TAKE <kHandoverVersion>"
//   daemon -> successor   "OFFER <name> <name> ...", the named descriptors
//                         attached (SCM_RIGHTS); or "REFUSE <why>" when
//                         its state is not kept (and then nothing follows)
//   successor -> daemon   "GO" once it has checked that it can take that
//                         state over, or "REFUSE <why>": the daemon then
//                         serves on, untouched
//   daemon -> successor   "DONE" once it has stopped: its calls drained,
//                         every change in the journal, its sockets closed;
//                         then it exits
//
// So a successor that cannot read the state (another format, other flags)
// refuses before the running daemon stops, and nothing is lost. A
// successor whose daemon dies between GO and DONE goes on as after a
// crash: the journal holds every operation that was answered.
//
// The daemon's descriptor keeper (//fd_keeper), a process of its own,
// answers successors on this socket with this protocol in the daemon's
// place, so that the descriptors outlive a crash of the daemon too; a
// daemon without one (--fd_keeper=false) answers them itself, and its
// crash loses the kept state (the clients' own mappings keep the KV memory,
// but the next daemon cannot reach it).

#ifndef PAGEALLOC_HANDOVER_HANDOVER_H_
#define PAGEALLOC_HANDOVER_HANDOVER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "memory/unique_fd.h"

namespace pagealloc {

// The handover protocol's version; a daemon answers a TAKE of another
// version with REFUSE.
inline constexpr int kHandoverVersion = 1;

// The handover socket of a daemon whose first Unix socket is `socket_path`.
std::string HandoverSocketPath(absl::string_view socket_path);

// A named descriptor a daemon offers (not owned: it stays the daemon's).
struct OfferedFd {
  std::string name;
  int fd = -1;
};

// The running daemon's side: a thread that answers successors, one at a
// time. This class is thread-safe.
class HandoverListener {
 public:
  struct Callbacks {
    // The descriptors to offer, by name (1 to 64 printable characters, no
    // spaces); an error refuses the successor with its message (the
    // state is no longer kept).
    std::function<absl::StatusOr<std::vector<OfferedFd>>()> offer;
    // Stops the daemon; returns once no change can reach the pool and its
    // sockets are closed. Called on the listener's thread.
    std::function<void()> stop;
  };

  // Listens on `path` (a stale socket file is replaced; a live one is
  // FAILED_PRECONDITION) with mode 0600.
  static absl::StatusOr<std::unique_ptr<HandoverListener>> Start(
      std::string path, Callbacks callbacks);
  // Stops, and waits for a handover in progress.
  ~HandoverListener();

  // Closes the listening socket and removes its file; a handover in
  // progress goes on. Never waits, so `stop` may call it.
  void Stop();

  const std::string& path() const { return path_; }
  // Successors that took the daemon over (0 or 1) or were refused.
  int handed_over() const;
  int refused() const;

 private:
  HandoverListener(std::string path, UniqueFd listener, Callbacks callbacks);
  void Run();
  // One successor, on connection `peer`.
  void Serve(int peer);

  const std::string path_;
  const Callbacks callbacks_;
  mutable absl::Mutex mu_;
  UniqueFd listener_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  int handed_over_ ABSL_GUARDED_BY(mu_) = 0;
  int refused_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

// Whether a process listens on the handover socket `path` (a daemon, or a
// descriptor keeper): a connection to it succeeds. The listener sees a
// successor that leaves at once.
bool HandoverSocketLive(const std::string& path);

// The successor's side. This class is thread-compatible.
class PendingHandover {
 public:
  // Connects to the daemon at `path` and asks for its descriptors.
  // NOT_FOUND when no daemon listens there (nothing to take over);
  // FAILED_PRECONDITION when the daemon refuses (its state is not kept);
  // UNAVAILABLE when it does not answer within `timeout`.
  static absl::StatusOr<std::unique_ptr<PendingHandover>> Request(
      const std::string& path, absl::Duration timeout);

  // The offered descriptors, by name; the caller may take them.
  absl::flat_hash_map<std::string, UniqueFd>& fds() { return fds_; }

  // Tells the daemon to stop, and waits until it has (DONE), or until its
  // connection closes (it died: the journal holds what it answered), for
  // at most `timeout` (then DEADLINE_EXCEEDED: the daemon may still run).
  absl::Status Accept(absl::Duration timeout);

  // Tells the daemon to serve on: this process will not take it over.
  void Refuse(absl::string_view why);

 private:
  explicit PendingHandover(UniqueFd socket) : socket_(std::move(socket)) {}

  UniqueFd socket_;
  absl::flat_hash_map<std::string, UniqueFd> fds_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_HANDOVER_HANDOVER_H_
