// Listening Unix sockets of the daemon: its gRPC sockets (--listen), the
// memory socket beside the first of them, and the handover socket. One
// place decides how a socket path is made bindable, so that each socket
// refuses to start over a live one and replaces a dead daemon's the same
// way.

#ifndef PAGEALLOC_UNIX_SOCKET_LISTEN_H_
#define PAGEALLOC_UNIX_SOCKET_LISTEN_H_

#include <sys/socket.h>
#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "memory/unique_fd.h"

namespace pagealloc {

// Checks that this process may create sockets in `dir`, creating it (not
// its parents) with `mode` when missing. The error names the directory and
// errno's text; errno picks its code (a missing parent is NOT_FOUND, a
// denied one PERMISSION_DENIED).
absl::Status CheckSocketDirectory(const std::string& dir, mode_t mode);

struct UnixListenOptions {
  // SOCK_STREAM or SOCK_SEQPACKET.
  int type = SOCK_STREAM;
  // The listening descriptor's O_NONBLOCK (an epoll acceptor's), or a
  // blocking accept.
  bool nonblocking = true;
  // The socket file's mode, set before it listens: no client ever finds
  // the socket with another.
  mode_t mode = 0660;
  // Its group by name; "" keeps the process's.
  std::string group;
  // The directory's mode when it has to be created.
  mode_t directory_mode = 0755;
  // How to choose another socket, in the refusal of a directory this user
  // cannot use (a flag to name, say); "" for none.
  std::string socket_advice;
};

// Binds and listens on `path`. First makes the path bindable: creates its
// directory (CheckSocketDirectory), refuses a path too long for a Unix
// socket (INVALID_ARGUMENT), a file that is not a socket, and a socket
// that a process still accepts on (FAILED_PRECONDITION; probed with a
// connection of `options.type`), and removes a stale socket file (a dead
// process's), saying so in the log. The socket file is removed again when
// a later step fails.
absl::StatusOr<UniqueFd> ListenOnUnixSocket(const std::string& path,
                                            const UnixListenOptions& options);

}  // namespace pagealloc

#endif  // PAGEALLOC_UNIX_SOCKET_LISTEN_H_
