// A service manager for process-level tests: what pagealloc-server sees of
// systemd when it runs as a unit with FileDescriptorStoreMax= set. It
// listens on $NOTIFY_SOCKET, keeps the descriptors the daemon stores
// (FDSTORE=1 with FDNAME=, dropped by FDSTOREREMOVE=1), and passes them
// back at the next start as systemd does: descriptors 3, 4, ... with
// $LISTEN_FDS, $LISTEN_FDNAMES and $LISTEN_PID (the child's own pid, set
// by a shell that then execs the daemon). The protocol is systemd's
// (sd_notify(3), sd_listen_fds(3)); the daemon's side of it is
// libsystemd's.
//
// This class is thread-compatible.

#ifndef PAGEALLOC_TESTS_SERVICE_MANAGER_H_
#define PAGEALLOC_TESTS_SERVICE_MANAGER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "memory/unique_fd.h"
#include "tests/subprocess.h"

namespace pagealloc::testing {

class FdStoreManager {
 public:
  // A manager with an empty store, its socket in a private directory.
  static absl::StatusOr<std::unique_ptr<FdStoreManager>> Create();
  ~FdStoreManager();

  // Starts `argv` as the service: the stored descriptors passed in name
  // order, $NOTIFY_SOCKET naming this manager. Output goes to `log_path`.
  // Clears `ready()`.
  absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv,
                                   const std::string& log_path);

  // Reads every notification waiting (the daemon's, even after it died:
  // datagrams stay queued on the socket), storing and removing
  // descriptors as they say. Returns the count read.
  int Drain();
  // Drains until READY=1 arrives or `timeout` passes; returns whether it
  // did.
  bool WaitReady(absl::Duration timeout);
  bool ready() const { return ready_; }

  // Names of the stored descriptors, sorted; how many carry `name`.
  std::vector<std::string> stored_names() const;
  int stored(const std::string& name) const;
  // The first descriptor stored under `name` (-1 if none); owned here.
  int stored_fd(const std::string& name) const;
  // Drops every stored descriptor (systemctl stop on systemd before 254:
  // the store goes with the stopped unit).
  void Clear() { store_.clear(); }

 private:
  FdStoreManager(std::string dir, UniqueFd socket)
      : dir_(std::move(dir)), socket_(std::move(socket)) {}
  std::string socket_path() const { return dir_ + "/notify"; }

  const std::string dir_;
  const UniqueFd socket_;
  // name -> descriptors, in the order stored (systemd keeps several of a
  // name and passes each).
  std::map<std::string, std::vector<UniqueFd>> store_;
  bool ready_ = false;
};

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_SERVICE_MANAGER_H_
