// The memory socket: how a session gets the memory the daemon made for it,
// and how each side learns at once that the other has died.
//
// Why. The daemon shares memory with each client: the session's fast
// channel (fast_channel/layout.h), the channel's doorbell (an eventfd), the
// session's output ring (a memfd on the CPU backend, a CUDA virtual-memory
// allocation exported as a POSIX fd on the CUDA backend) and, on the CUDA
// backend, the pool's completion counter (another such allocation). Handed
// over as file
// descriptors (SCM_RIGHTS, memory/fd_passing.h) to the session that proved
// its token, instead of named in /dev/shm, no other process can open them,
// nothing is left behind when either process dies, and a container needs
// no shared /dev/shm.
//
// Where. The daemon listens on a Unix socket of type SOCK_SEQPACKET beside
// its gRPC socket: "<gRPC socket path>.fd" (MemorySocketPath), with the same
// file mode and group. RegisterResponse.memory_socket names it.
//
// Protocol. One connection per session, open for the session's life.
//   client: connects; sends a Hello (session id and token).
//   daemon: authenticates it. Refused (unknown or expired session, wrong
//           token, a session that already has its connection, a malformed
//           Hello): a DaemonMessage of kind kRefused with the status and no
//           descriptor, then it closes the connection. Accepted: a
//           DaemonMessage of kind kHandoff describing each descriptor it
//           carries, in order.
//   then:   neither side sends anything more, and either side closing ends
//           the session: the daemon reclaims the pages of a session whose
//           client closed it (a process that dies has its sockets closed by
//           the kernel), and a client whose daemon closed it knows that the
//           daemon is gone. When the daemon ends a session itself (closed,
//           lease lost, shutting down) it first sends a DaemonMessage of
//           kind kEnded saying why. The daemon ends the session of a client
//           that sends anything after its Hello.
//
// This header is the wire format and the client's end; the daemon's end is
// server/memory_socket_server.h. Each side checks everything it reads.

#ifndef PAGEALLOC_MEMORY_MEMORY_SOCKET_H_
#define PAGEALLOC_MEMORY_MEMORY_SOCKET_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "memory/unique_fd.h"

namespace pagealloc {
namespace memory_socket {

inline constexpr uint32_t kMagic = 0x4d534150;  // "PASM" in memory order
// Bumped whenever a field's meaning or offset changes; both ends check it.
inline constexpr uint32_t kVersion = 2;
inline constexpr size_t kMaxTokenBytes = 64;
// Room for every kind of memory a session may be handed at once, and for
// kinds to come (output rings and a completion counter as CUDA VMM fds).
inline constexpr int kMaxEntries = 8;
inline constexpr size_t kMaxMessageBytes = 256;

// The client's one message.
struct Hello {
  uint32_t magic;
  uint32_t version;
  uint64_t session_id;
  uint32_t token_bytes;  // <= kMaxTokenBytes
  uint32_t reserved;     // 0
  char token[kMaxTokenBytes];
};

// What a descriptor of a handoff is.
enum class MemoryKind : uint32_t {
  kChannel = 1,   // the fast channel (memfd, read-write)
  kDoorbell = 2,  // the fast channel's doorbell (eventfd; bytes = 0)
  kRing = 3,      // the CPU backend's output ring (memfd, read-only use)
  // The CUDA backend's output ring: a cuMemCreate allocation of `bytes`
  // (the device's granularity) exported as a POSIX fd, for
  // cuMemImportFromShareableHandle.
  kCudaRing = 10,
  // The CUDA backend's completion counter: a uint64 at offset 0 of a
  // cuMemCreate allocation of `bytes`, exported likewise; the daemon's
  // stream writes it after each asynchronous launch, and a client's stream
  // waits on it (AllocResponse.completion_value).
  kCompletionCounter = 11,
  // The pool's KV slab (PoolInfo.kv_slab), the same memory for every
  // session: a memfd on the CPU backend, a CUDA VMM allocation's POSIX fd
  // (cuMemImportFromShareableHandle) on the CUDA backend. Read-write.
  kKvSlab = 4,
};

struct MemoryEntry {
  uint32_t kind;  // MemoryKind
  uint32_t reserved;
  uint64_t bytes;  // the memory's size
};

enum class MessageKind : uint32_t {
  kHandoff = 1,  // the session's memory: one descriptor per entry
  kRefused = 2,  // the Hello was refused: code and message say why
  kEnded = 3,    // the daemon ended the session: code and message say why
};

// The daemon's messages.
struct DaemonMessage {
  uint32_t magic;
  uint32_t version;
  uint32_t kind;  // MessageKind
  int32_t code;   // an absl::StatusCode; 0 for a handoff
  uint32_t num_entries;
  uint32_t message_bytes;
  MemoryEntry entries[kMaxEntries];
  char message[kMaxMessageBytes];
};

// Shared by separately built processes: pin the layout.
static_assert(offsetof(Hello, session_id) == 8);
static_assert(offsetof(Hello, token_bytes) == 16);
static_assert(offsetof(Hello, token) == 24);
static_assert(sizeof(Hello) == 88);
static_assert(sizeof(MemoryEntry) == 16);
static_assert(offsetof(DaemonMessage, num_entries) == 16);
static_assert(offsetof(DaemonMessage, entries) == 24);
static_assert(offsetof(DaemonMessage, message) == 152);
static_assert(sizeof(DaemonMessage) == 408);

// "<grpc_socket_path>.fd".
std::string MemorySocketPath(absl::string_view grpc_socket_path);

// ---- The wire format, for both ends.

// A Hello for `session_id`; INVALID_ARGUMENT when the token is too long.
absl::StatusOr<Hello> MakeHello(uint64_t session_id, absl::string_view token);
// Checks a received Hello (untrusted): its size, magic, version and token
// length. INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<Hello> ParseHello(absl::Span<const char> bytes);
// The token a parsed Hello carries.
inline absl::string_view TokenOf(const Hello& hello) {
  return absl::string_view(hello.token, hello.token_bytes);
}

// A handoff of `entries` (at most kMaxEntries).
DaemonMessage MakeHandoff(absl::Span<const MemoryEntry> entries);
// A refusal or an end, carrying `status` (not OK; its message truncated to
// kMaxMessageBytes).
DaemonMessage MakeStatusMessage(MessageKind kind, const absl::Status& status);
// Checks a message received with `fds_received` descriptors: its size,
// magic, version and kind; a handoff's entries must be known kinds, one per
// descriptor; other kinds carry none and a status that is not OK. INTERNAL
// naming what is wrong.
absl::StatusOr<DaemonMessage> ParseDaemonMessage(absl::Span<const char> bytes,
                                                 size_t fds_received);
// The status a refusal or an end carries.
absl::Status StatusOf(const DaemonMessage& message);

// ---- The client's end.

// A session's memory as the client received it. Descriptors the daemon did
// not send stay invalid (no fast channel; a CPU ring on the CUDA backend and
// the reverse; no completion counter on the CPU backend; no KV slab when the
// daemon owns no KV memory).
struct SessionMemory {
  // The connection: keep it open for the session's life (closing it ends
  // the session); it becomes readable when the daemon ends the session or
  // dies (ReadSessionEnd).
  UniqueFd connection;
  UniqueFd channel;
  uint64_t channel_bytes = 0;
  UniqueFd doorbell;
  UniqueFd ring;
  uint64_t ring_bytes = 0;
  UniqueFd cuda_ring;
  uint64_t cuda_ring_bytes = 0;
  UniqueFd completion_counter;
  uint64_t completion_counter_bytes = 0;
  UniqueFd kv_slab;
  uint64_t kv_slab_bytes = 0;
};

// Connects to the memory socket at `path`, authenticates as the session and
// receives its memory, within `timeout`. Returns UNAVAILABLE when nothing
// serves at `path` (a client on another host or in another container),
// the daemon's own status when it refuses (e.g. UNAUTHENTICATED),
// DEADLINE_EXCEEDED when it does not answer in time, INTERNAL when its
// answer is malformed.
absl::StatusOr<SessionMemory> ReceiveSessionMemory(const std::string& path,
                                                   uint64_t session_id,
                                                   absl::string_view token,
                                                   absl::Duration timeout);

// Reads, once `connection` is readable, why the session ended: the status
// of the daemon's kEnded message, or, when the connection closed without
// one, UNAVAILABLE saying the daemon went away (and `*went_away`, when
// given, true; false after a kEnded message).
absl::Status ReadSessionEnd(int connection, bool* went_away = nullptr);

}  // namespace memory_socket
}  // namespace pagealloc

#endif  // PAGEALLOC_MEMORY_MEMORY_SOCKET_H_
