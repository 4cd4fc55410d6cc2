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
#include "server/backend.h"
#include "server/memory_budget.h"
#include "server/ring_space.h"

namespace pagealloc {

// This class is thread-safe.
class Session {
 public:
  // `ring_charge` is the ring's memory charged to the sessions' budget; it
  // is given back once the ring is gone.
  Session(uint64_t id, std::string token, std::string client_name,
          int64_t quota_pages, std::unique_ptr<RingMemory> ring,
          MemoryBudget::Charge ring_charge = {});

  uint64_t id() const { return id_; }
  const std::string& token() const { return token_; }
  const std::string& client_name() const { return client_name_; }
  int64_t quota_pages() const { return quota_pages_; }
  RingMemory& ring_memory() { return *ring_memory_; }

  // Reserves ring space for a call's slots; see RingSpace::Reserve.
  absl::StatusOr<int64_t> ReserveRing(int64_t n) ABSL_LOCKS_EXCLUDED(mu_);
  void UnreserveRing(int64_t position, int64_t n) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReleaseRing(int64_t up_to) ABSL_LOCKS_EXCLUDED(mu_);
  int64_t ring_reserved() const ABSL_LOCKS_EXCLUDED(mu_);

  // Renews the lease until now + lease.
  void Renew(absl::Time now, absl::Duration lease) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Time lease_deadline() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const uint64_t id_;
  const std::string token_;
  const std::string client_name_;
  const int64_t quota_pages_;
  // Declared before the ring, so that it is given back after the ring's
  // memory is released.
  MemoryBudget::Charge ring_charge_;
  const std::unique_ptr<RingMemory> ring_memory_;

  mutable absl::Mutex mu_;
  RingSpace ring_ ABSL_GUARDED_BY(mu_);
  absl::Time lease_deadline_ ABSL_GUARDED_BY(mu_);
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
                                                int64_t quota_pages)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Finds a session and checks its token (in constant time), renewing its
  // lease. Returns NOT_FOUND (unknown or expired) or UNAUTHENTICATED.
  absl::StatusOr<std::shared_ptr<Session>> Authenticate(uint64_t session_id,
                                                        absl::string_view token)
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
