// Descriptors that outlive the daemon: systemd's file-descriptor store.
//
// Under systemd (FileDescriptorStoreMax= > 0 in the unit) the daemon hands
// the service manager a duplicate of each descriptor whose memory must
// survive a restart (the KV slab, the state journal: docs/design.md, "A
// restart keeps the pool"); the manager keeps them while the service is
// running, restarting or has a job queued, and passes them back to the
// next start of the service as it passes socket-activation descriptors
// ($LISTEN_FDS from fd 3, named by $LISTEN_FDNAMES). The protocol is
// libsystemd's own (sd_pid_notify_with_fds with "FDSTORE=1", and
// sd_listen_fds_with_names); any supervisor that speaks it can hold them.
//
// These functions are thread-compatible: they read and change the
// process's environment.

#ifndef PAGEALLOC_FD_STORE_FD_STORE_H_
#define PAGEALLOC_FD_STORE_FD_STORE_H_

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "memory/unique_fd.h"

namespace pagealloc {

// The descriptors the service manager passed to this process at start, by
// name ($LISTEN_FDNAMES; "unknown" for a descriptor without one, as
// sd_listen_fds_with_names names it). Each is marked close-on-exec, and the
// $LISTEN_* variables are unset, so that a child inherits none of them.
// Empty when none were passed (not started by a service manager, or a
// first start). INVALID_ARGUMENT when the variables are malformed or two
// descriptors carry the same name.
absl::StatusOr<absl::flat_hash_map<std::string, UniqueFd>> TakePassedFds();

// True when a service manager listens for this process's notifications
// ($NOTIFY_SOCKET is set).
bool ServiceManagerListening();

// Stores a duplicate of `fd` under `name` in the service manager's store
// (FDSTORE=1, FDNAME=name). A name is 1 to 255 printable ASCII characters
// without ':' (systemd's rule). FAILED_PRECONDITION when no service
// manager listens; the notification's error otherwise. A manager whose
// unit allows no store (FileDescriptorStoreMax=0) drops the descriptor
// without telling: docs/operations.md says how to check the unit.
absl::Status StoreFd(absl::string_view name, int fd);

// Drops every descriptor stored under `name` (FDSTOREREMOVE=1).
absl::Status RemoveStoredFds(absl::string_view name);

// Tells the service manager the daemon is ready (READY=1) with a status
// line; OK and nothing sent when no manager listens.
absl::Status NotifyReady(absl::string_view status);

}  // namespace pagealloc

#endif  // PAGEALLOC_FD_STORE_FD_STORE_H_
