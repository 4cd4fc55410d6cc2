// Sessions: one per registered client (scheduler process). A session owns
// pages in the pool (as the pool owner with the same id), an output ring,
// and a lease that every call and KeepAlive message renews.

#ifndef PAGEALLOC_SERVER_SESSION_H_
#define PAGEALLOC_SERVER_SESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kept_state/session_record.h"
#include "server/backend.h"
#include "server/memory_budget.h"
#include "server/ring_space.h"

namespace pagealloc {

// A session's link to its client's process: the memory socket connection
// that holds its memory (docs/design.md section 9).
enum class SessionLink {
  // Its memory waits to be handed over: after Register and after each
  // Resume, until the memory socket accepts the client's Hello.
  kAwaitingHello,
  // Its memory socket connection is open.
  kConnected,
  // The connection closed and the session is resumable: it keeps its pages
  // until its lease runs out, or until a Resume takes it.
  kDetached,
};

// A session: id, secret token, quota, output ring, lease, and its link to
// the client's process. The ring is replaced at each Resume (ReplaceRing):
// a call holds the ring it reserved space in (ReserveRing's `ring`), which
// lives, with its charge to the ring budget, until the last such call is
// done. Each link (Register, then each Resume) has a generation, so that a
// connection of an earlier link, which a Resume took the session from,
// never ends it.
//
// This class is thread-safe.
class Session {
 public:
  // `ring_charge` is the ring's memory charged to the sessions' budget; it
  // is given back once the ring is gone. A `resumable` session is kept when
  // its client's connection closes (Disconnected).
  Session(uint64_t id, std::string token, std::string client_name,
          int64_t quota_pages, std::unique_ptr<RingMemory> ring,
          MemoryBudget::Charge ring_charge = {}, bool resumable = false);

  // A session restored from the daemon's kept state (docs/design.md, "A
  // restart keeps the pool"): only its token's digest is known until a
  // client proves the token (MatchesToken); it starts detached, waiting for
  // a Resume.
  struct Restored {
    TokenDigest token_digest{};
  };
  Session(uint64_t id, Restored restored, std::string client_name,
          int64_t quota_pages, std::unique_ptr<RingMemory> ring,
          MemoryBudget::Charge ring_charge, bool resumable);

  uint64_t id() const { return id_; }
  // The session's token; empty for a restored session until a client
  // proved it.
  std::string token() const ABSL_LOCKS_EXCLUDED(mu_);
  // SHA-256 of the token: what the daemon keeps of it across restarts.
  const TokenDigest& token_digest() const { return token_digest_; }
  // Whether `token` is the session's (its digest compared in constant
  // time). A restored session learns its token from the first match.
  bool MatchesToken(absl::string_view token) ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& client_name() const { return client_name_; }
  int64_t quota_pages() const { return quota_pages_; }
  bool resumable() const { return resumable_; }

  // The session's current ring (kept alive by the pointer, with its charge).
  std::shared_ptr<RingMemory> ring() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t ring_capacity_slots() const ABSL_LOCKS_EXCLUDED(mu_);

  // Reserves ring space for a call's slots in the current ring (see
  // RingSpace::Reserve); `ring`, when given, receives that ring, which the
  // call holds until its slots are written.
  absl::StatusOr<int64_t> ReserveRing(
      int64_t n, std::shared_ptr<RingMemory>* ring = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Undoes ReserveRing (RingSpace::Unreserve). With `ring`, the ring the
  // space was reserved in: nothing happens when it is no longer current.
  void UnreserveRing(int64_t position, int64_t n,
                     const RingMemory* ring = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReleaseRing(int64_t up_to) ABSL_LOCKS_EXCLUDED(mu_);
  int64_t ring_reserved() const ABSL_LOCKS_EXCLUDED(mu_);

  // Renews the lease until now + lease.
  void Renew(absl::Time now, absl::Duration lease) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Time lease_deadline() const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- The link (the memory socket's connection).

  SessionLink link() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t link_generation() const ABSL_LOCKS_EXCLUDED(mu_);
  // The memory socket accepted a Hello: kAwaitingHello -> kConnected.
  // Returns the link's generation (the connection's, for Disconnected).
  // FAILED_PRECONDITION when the session is connected already, or detached
  // (its memory went to an earlier connection: Resume first).
  absl::StatusOr<uint64_t> Connect() ABSL_LOCKS_EXCLUDED(mu_);
  // The connection of `generation` could not be handed the memory:
  // back to kAwaitingHello (nothing when the link changed meanwhile).
  void AbortConnect(uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);
  // What the close of a connection means for the session.
  enum class Disconnect {
    kStale,     // a connection of an earlier link: nothing
    kDetached,  // resumable: kept (kDetached) until its lease runs out
    kEnded,     // not resumable: the caller ends the session
  };
  // The connection of `generation` closed.
  Disconnect Disconnected(uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);
  // Detaches the link of `generation` whatever the session's resumable
  // flag (MemorySocketServer::SeverConnections); false when the link
  // changed meanwhile.
  bool Detach(uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);
  // What a Resume replaced.
  struct Relinked {
    SessionLink was = SessionLink::kAwaitingHello;
    uint64_t old_generation = 0;
  };
  // Resume: makes `ring` (fresh, of `ring_charge`) the session's ring,
  // starts a new link (kAwaitingHello, the next generation) and returns
  // what it replaced. The old ring lives on for the calls that hold it.
  // FAILED_PRECONDITION ("session 7 is still connected") while connected,
  // unless `take_over`; nothing changes then.
  absl::StatusOr<Relinked> ReplaceRing(std::unique_ptr<RingMemory> ring,
                                       MemoryBudget::Charge ring_charge,
                                       bool take_over) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const uint64_t id_;
  const TokenDigest token_digest_;
  const std::string client_name_;
  const int64_t quota_pages_;
  const bool resumable_;

  mutable absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  // The memory and its charge, released together when the last holder
  // (the session, or a call that reserved space in it) lets go.
  std::shared_ptr<RingMemory> ring_ ABSL_GUARDED_BY(mu_);
  RingSpace ring_space_ ABSL_GUARDED_BY(mu_);
  absl::Time lease_deadline_ ABSL_GUARDED_BY(mu_);
  SessionLink link_ ABSL_GUARDED_BY(mu_) = SessionLink::kAwaitingHello;
  uint64_t link_generation_ ABSL_GUARDED_BY(mu_) = 1;
};

// OK when `name` is valid UTF-8 without control characters (U+0000 to
// U+001F, U+007F): it goes into log lines and metric labels. Otherwise
// INVALID_ARGUMENT naming the byte.
absl::Status CheckClientName(absl::string_view name);

// The live sessions. This class is thread-safe.
class SessionRegistry {
 public:
  static constexpr int64_t kMinDefaultRingCapacitySlots = int64_t{1} << 20;

  struct Options {
    absl::Duration lease = absl::Seconds(10);
    int64_t max_sessions = 1024;
    // A session's ring when it asks for none; 0: sized from the pool
    // (ForPool).
    int64_t default_ring_capacity_slots = 1 << 20;
    int64_t max_ring_capacity_slots = 1 << 26;
    int64_t max_quota_pages = 0;  // 0: no cap

    // Returns these options for a pool of `pool_slots` slots (num_pages *
    // page_size): a default ring of 0 becomes the pool's slots, at least
    // kMinDefaultRingCapacitySlots, and max_ring_capacity_slots at least
    // that. Other values are kept.
    Options ForPool(int64_t pool_slots) const;
  };

  // `ring_budget`, when not null, is charged each ring's memory (rounded up
  // to the backend's allocation granularity) and must outlive the
  // registry.
  SessionRegistry(const Options& options, Backend* backend,
                  MemoryBudget* ring_budget = nullptr);

  // Opens a session with a fresh id and a random 32-byte token, and creates
  // its ring. Returns RESOURCE_EXHAUSTED at --max_sessions, when the ring
  // does not fit the ring budget (asked, in use, budget) and when the
  // daemon is short of descriptors ("descriptors exhausted: N open of
  // limit M"); INVALID_ARGUMENT for a bad ring size or quota, or a client
  // name that is longer than 128 bytes or fails CheckClientName.
  absl::StatusOr<std::shared_ptr<Session>> Open(std::string client_name,
                                                int64_t ring_capacity_slots,
                                                int64_t quota_pages,
                                                bool resumable = false)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A session's ring memory and its charge, as Open makes them.
  struct NewRing {
    std::unique_ptr<RingMemory> memory;
    MemoryBudget::Charge charge;
  };
  // Makes a ring of `ring_capacity_slots` (0: the default) for session
  // `session_id` (Resume's fresh ring), with Open's checks and errors:
  // INVALID_ARGUMENT for a bad size, RESOURCE_EXHAUSTED when the budget or
  // the descriptors are short.
  absl::StatusOr<NewRing> MakeRing(uint64_t session_id,
                                   int64_t ring_capacity_slots)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Registers a session of the daemon's kept state (its pool owner's
  // record) under its own id, detached, with a fresh ring and lease: it
  // waits for its client's Resume. Later Opens take ids above it.
  // ALREADY_EXISTS for an id registered already; Open's errors for the
  // ring.
  absl::StatusOr<std::shared_ptr<Session>> Restore(uint64_t session_id,
                                                   const KeptSession& kept)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Finds a session and checks its token (in constant time), renewing its
  // lease. Returns NOT_FOUND (unknown or expired) or UNAUTHENTICATED.
  absl::StatusOr<std::shared_ptr<Session>> Authenticate(uint64_t session_id,
                                                        absl::string_view token)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The session `session_id`, or null. No authentication: for the
  // daemon's own bookkeeping (its memory socket), never for a client.
  std::shared_ptr<Session> Find(uint64_t session_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Removes a session; returns it, or null when it was already gone.
  std::shared_ptr<Session> Remove(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes and returns the sessions whose lease ran out before `now`.
  std::vector<std::shared_ptr<Session>> TakeExpired(absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<std::shared_ptr<Session>> List() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  const Options& options() const { return options_; }

 private:
  const Options options_;
  Backend* const backend_;
  MemoryBudget* const ring_budget_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Session>> sessions_
      ABSL_GUARDED_BY(mu_);
};

// Compares two strings in time that depends only on their lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_SESSION_H_
