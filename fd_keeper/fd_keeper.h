// The descriptor keeper: a small process that holds a daemon's kept
// descriptors (the KV slab, the state journal) where no service manager
// does, so that the pool outlives the daemon's crash and not only its
// planned restart (docs/design.md, "A restart keeps the pool").
//
// Under systemd the descriptors live in the service manager's fd store
// (//fd_store). Elsewhere the daemon spawns a keeper, its own executable
// run with kFdKeeperArg, at start. The keeper holds duplicates of the
// descriptors and answers successors on the daemon's handover socket
// (//handover, the same protocol and path), whether the daemon still runs
// or has died:
//
//   - A daemon that runs is asked to stop when a successor says GO, and
//     DONE follows once it has stopped (or died): a planned restart or an
//     upgrade, as the daemon's own handover listener did it.
//   - A daemon that died (SIGKILL, a crash, an OOM kill) left the journal
//     as the crash model allows (//state_journal): DONE follows GO at
//     once, and the successor recovers the pool as after any crash.
//
// The keeper ends when a successor has taken the descriptors (the
// successor spawns its own), when the daemon retires it (its kept state
// broke: a successor must start fresh, never from a state that lacks a
// change), or when no successor came within its linger after the daemon
// went: the descriptors close, and the memory they kept is freed.
//
// Daemon and keeper talk over a SOCK_SEQPACKET socketpair (descriptor 3 in
// the keeper):
//
//   keeper -> daemon   "READY" once it listens, or "FAILED <why>" and it
//                      exits (the socket is another live daemon's)
//                      (a daemon that died before READY is one that died:
//                      the keeper keeps its pool)
//   keeper -> daemon   "STOP": a successor said GO; stop, keeping the
//                      sessions (every call answered, every change kept)
//   daemon -> keeper   "STOPPED" once it has
//   daemon -> keeper   "RETIRE": drop the descriptors and exit
//   the daemon's end closing: it exited or died
//
// Nothing a successor sends reaches the daemon but a STOP after a GO; a
// successor is checked as the handover checks it (this user or root, the
// protocol's version, bounded messages and waits).

#ifndef PAGEALLOC_FD_KEEPER_FD_KEEPER_H_
#define PAGEALLOC_FD_KEEPER_FD_KEEPER_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "handover/handover.h"
#include "memory/unique_fd.h"

namespace pagealloc {

// argv[1] of a keeper: the daemon's main runs RunFdKeeper when it sees it.
inline constexpr char kFdKeeperArg[] = "--internal_fd_keeper";

// The daemon's side: the keeper it spawned. This class is thread-safe.
class FdKeeper {
 public:
  struct Options {
    // The keeper's executable, whose main runs RunFdKeeper when argv[1] is
    // kFdKeeperArg (the daemon's own: /proc/self/exe).
    std::string binary;
    // The handover socket it listens on (HandoverSocketPath).
    std::string socket_path;
    // What it keeps and offers, by name (duplicated into it; the daemon
    // keeps its own).
    std::vector<OfferedFd> fds;
    // How long it waits for a successor once the daemon is gone.
    absl::Duration linger = absl::Minutes(1);
    // Stops the daemon, keeping its sessions, when a successor takes the
    // pool over; returns once it has. On the keeper link's thread.
    std::function<void()> stop;
  };

  // Spawns the keeper and waits until it listens. FAILED_PRECONDITION when
  // a live process listens on the socket already (another daemon, or the
  // keeper of one that died: take it over with --take_over); INTERNAL when
  // the keeper cannot be started or does not answer within `start_timeout`.
  static absl::StatusOr<std::unique_ptr<FdKeeper>> Spawn(
      Options options, absl::Duration start_timeout = absl::Seconds(30));

  // Closes the link: the keeper lingers for a successor (as after the
  // daemon's death). Waits for a stop in progress.
  ~FdKeeper();

  // Tells the keeper to drop the descriptors and exit; a successor then
  // finds nothing to take over. Idempotent; never blocks on the keeper.
  void Retire() ABSL_LOCKS_EXCLUDED(mu_);

  pid_t pid() const { return pid_; }
  // Whether a successor has taken the pool over (the daemon was stopped).
  bool handed_over() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the keeper's end closed while this daemon runs (it died or was
  // killed): nothing answers successors now, and the daemon's end loses
  // the pool.
  bool lost() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  FdKeeper(Options options, UniqueFd link, pid_t pid);
  // The link's thread: answers STOP, notes the keeper's end.
  void Run();

  const Options options_;
  const pid_t pid_;
  mutable absl::Mutex mu_;
  UniqueFd link_ ABSL_GUARDED_BY(mu_);
  bool retired_ ABSL_GUARDED_BY(mu_) = false;
  bool handed_over_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// The keeper process's main, for argv as FdKeeper::Spawn passes it (the
// link on descriptor 3, the kept descriptors from 4). Returns its exit
// code: 0 when it handed the descriptors over, was retired or lingered
// out; 1 when it could not listen.
int RunFdKeeper(int argc, char** argv);

}  // namespace pagealloc

#endif  // PAGEALLOC_FD_KEEPER_FD_KEEPER_H_
