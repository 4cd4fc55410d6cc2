// Descriptors: what the daemon's file descriptors allow. Every session
// holds a few (DescriptorsPerSession), and the open-files limit
// (RLIMIT_NOFILE) caps them all: the daemon checks --max_sessions against
// it at start, refuses a Register that would leave it short (instead of
// failing inside the kernel with EMFILE), and /healthz says so while it
// is short. docs/operations.md, "Descriptors".

#ifndef PAGEALLOC_SERVER_DESCRIPTORS_H_
#define PAGEALLOC_SERVER_DESCRIPTORS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pagealloc {

// The most descriptors one session holds at a time: its gRPC connection,
// its doorbell (an eventfd), and its ring's and fast channel's memory
// (memfds) until the memory socket hands them over, whereupon the daemon
// closes both and the memory socket connection takes their place.
inline constexpr int64_t kDescriptorsPerSession = 4;
// Descriptors a Register leaves free (beyond the session's own), for
// /healthz, the memory socket's accepts and /proc reads.
inline constexpr int64_t kDescriptorsKept = 16;
// Descriptors the daemon holds whatever its sessions: listeners, epoll
// sets, eventfds, the KV slab, logs, gRPC's own.
inline constexpr int64_t kDaemonDescriptors = 64;

struct DescriptorCount {
  int64_t open = 0;   // listed in /proc/self/fd (the listing's own left out)
  int64_t limit = 0;  // the soft RLIMIT_NOFILE
};

// Counts this process's open descriptors. When none is left to list them
// with, `open` is the limit. UNAVAILABLE when /proc cannot be read.
absl::StatusOr<DescriptorCount> CountDescriptors();

// OK when `more` descriptors can be opened and kDescriptorsKept still be
// left free; RESOURCE_EXHAUSTED "descriptors exhausted: N open of limit M"
// (with what was asked) otherwise. OK when /proc cannot be read (the
// kernel's own EMFILE then answers).
absl::Status CheckDescriptorsFree(int64_t more);

// The most sessions an open-files limit of `limit` serves: what is left
// after the daemon's own descriptors and those its connection acceptor
// keeps free (ConnectionAcceptor::ReservedDescriptors), per session.
int64_t SessionsWithin(int64_t limit);

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_DESCRIPTORS_H_
