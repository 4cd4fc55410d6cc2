// Passing file descriptors between processes (SCM_RIGHTS on a Unix socket):
// how the daemon hands a session the memory it made for it
// (memory/memory_socket.h). Debian 12 packages no C or C++ library for
// this, so these two functions over sendmsg / recvmsg are the whole of it.

#ifndef PAGEALLOC_MEMORY_FD_PASSING_H_
#define PAGEALLOC_MEMORY_FD_PASSING_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "memory/unique_fd.h"

namespace pagealloc {

// The most descriptors one message carries.
inline constexpr int kMaxPassedFds = 16;

// Sends `bytes` as one message on `socket`, a connected Unix socket of type
// SOCK_SEQPACKET (which keeps message boundaries and delivers a message and
// its descriptors together), with `fds` attached: the receiver gets
// descriptors of its own to the same open files. Never raises SIGPIPE.
// Returns UNAVAILABLE when the peer is gone or the socket's buffer is full
// (non-blocking socket), INVALID_ARGUMENT for more than kMaxPassedFds
// descriptors, INTERNAL for other errors.
absl::Status SendWithFds(int socket, absl::Span<const char> bytes,
                         absl::Span<const int> fds);

// Receives one message into `buffer`, and up to `max_fds` descriptors
// attached to it (close-on-exec), appended to `fds`. Returns the message's
// length; 0 means the peer closed the connection (or reset it). Returns
// UNAVAILABLE when no message is waiting (non-blocking socket), and
// INVALID_ARGUMENT, keeping no descriptor, when the message was longer than
// `buffer` or carried more than `max_fds` descriptors (with `max_fds` 0:
// any); INTERNAL for other errors.
absl::StatusOr<size_t> ReceiveWithFds(int socket, absl::Span<char> buffer,
                                      int max_fds, std::vector<UniqueFd>* fds);

}  // namespace pagealloc

#endif  // PAGEALLOC_MEMORY_FD_PASSING_H_
