// The hooks that join the daemon's transports without either including the
// other. The gRPC service opens sessions (Register) and reports on them
// (GetStats); a transport that serves a session beside gRPC (the fast
// channel) hears of a session that asked for it through SessionChannels,
// which the server wires into the gRPC service, and of every session's end
// as a SessionObserver of the call core. Plain types only: no protobuf, no
// gRPC.

#ifndef PAGEALLOC_SERVER_SESSION_HOOKS_H_
#define PAGEALLOC_SERVER_SESSION_HOOKS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pagealloc {

// What a transport that stops tells its sessions' clients.
enum class SessionsAtStop {
  // The sessions end with the daemon: each client is told so.
  kEnd,
  // The sessions outlive the daemon (its state is kept for a successor,
  // --keep_state): nothing says they ended, and each client, seeing its
  // daemon go as after a crash, resumes with the successor.
  kKeep,
};

// Told when a session ends, so that a transport can drop what it holds
// for it (the fast channel's memory, the memory socket's connection).
class SessionObserver {
 public:
  virtual ~SessionObserver() = default;
  // Called once per session, from whichever thread ended it; `reason` is
  // what the log says ("closed by client", "lost its lease", ...).
  virtual void SessionClosed(uint64_t session_id, absl::string_view reason) = 0;
  // Called when a Resume gave session `session_id` a new link (a fresh
  // ring; the fast channel, if any, is the transport's to replace), from
  // the thread that resumed it. `old_generation` is the link it replaced
  // (Session::link_generation), which was connected when
  // `was_connected` (a take-over: that connection is to be closed, its
  // client told).
  virtual void SessionResumed(uint64_t session_id, uint64_t old_generation,
                              bool was_connected) {}
  // Called after an allocation call of `session_id` had `requests`
  // requests refused with RESOURCE_EXHAUSTED (the pool short, or the
  // session's quota), before its answer goes out; from the thread that
  // answers it. Sessions' page reserves are asked back from here.
  virtual void PoolShort(uint64_t session_id, int64_t requests) {}
};

// What a session's channel beside gRPC carries at most, as Register
// describes it to the client.
struct ChannelCapacity {
  int32_t max_requests = 0;   // requests in one call
  int32_t message_bytes = 0;  // bytes of one refusal message
};

// A transport that a session may ask for at Register, beside gRPC. Its
// channels end with their sessions (SessionObserver::SessionClosed, called
// by the core before it frees the session's pages).
class SessionChannels : public SessionObserver {
 public:
  // Opens a channel for session `session_id`, just opened, that asked for
  // one; returns what it carries. RESOURCE_EXHAUSTED when its memory cannot
  // be had, INTERNAL for other system errors: the session then works
  // without one (over gRPC).
  virtual absl::StatusOr<ChannelCapacity> SessionOpened(
      uint64_t session_id, const std::string& session_token) = 0;
  // Whether session `session_id` has a channel now (for GetStats).
  virtual bool HasChannel(uint64_t session_id) = 0;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_SESSION_HOOKS_H_
