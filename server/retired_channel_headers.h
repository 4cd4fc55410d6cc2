// RetiredChannelHeaders: the header pages of ended sessions' fast channels,
// kept a while and then freed, even where the client still maps them.
//
// When a session ends, the daemon frees its channel's memory at once
// (SharedRegion::Discard, MADV_REMOVE on the daemon's mapping: the client's
// mapping then reads zeros, at the client's own expense) but for the header
// page: its session_ended word and end_reason tell a client that still maps
// the channel that its session ended, and why (the stale-answer fence,
// docs/design.md section 8). Kept for good, that page would let a client
// that registers and ends sessions in a loop, keeping the mappings, grow
// the daemon's memory by a page a session. So the header pages wait here,
// each charged a page of the sessions' budget, at most `max_headers` of them
// and for at most `keep_for`; then the page is freed too. A client whose
// header reads zeros takes its session as ended (ChannelCodec::SessionEnded
// checks the header's magic), without the reason.
//
// This class is thread-safe.

#ifndef PAGEALLOC_SERVER_RETIRED_CHANNEL_HEADERS_H_
#define PAGEALLOC_SERVER_RETIRED_CHANNEL_HEADERS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "memory/shared_region.h"
#include "server/memory_budget.h"

namespace pagealloc {

class RetiredChannelHeaders {
 public:
  struct Options {
    // The most header pages kept; >= 0 (0: none, freed at once).
    int64_t max_headers = 1024;
    // The longest one is kept.
    absl::Duration keep_for = absl::Seconds(10);
    // Charged a page per header kept (null: nothing charged).
    MemoryBudget* budget = nullptr;
  };

  explicit RetiredChannelHeaders(const Options& options) : options_(options) {}
  // Frees every header still kept (unless LeaveToClients was called).
  ~RetiredChannelHeaders();

  RetiredChannelHeaders(const RetiredChannelHeaders&) = delete;
  RetiredChannelHeaders& operator=(const RetiredChannelHeaders&) = delete;

  // Takes an ended session's channel: discards all of it but its first
  // `header_bytes` (rounded up to pages) now, keeps that header, and frees
  // the headers past the bounds, oldest first. When the budget has no page
  // for it the header is freed at once too.
  void Retire(std::unique_ptr<SharedRegion> region, size_t header_bytes,
              absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Frees the headers kept for `keep_for` by `now`. The fast channel's
  // first poller calls it when next_expiry() comes (it sleeps no longer).
  void FreeExpired(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // When the oldest header kept is due (InfiniteFuture when none is).
  absl::Time next_expiry() const ABSL_LOCKS_EXCLUDED(mu_);

  // Calls `first_kept` (under the lock: it must not block or call back)
  // when a header is kept where none was, so that whoever calls
  // FreeExpired learns of the new next_expiry(). Null: nothing is called.
  void SetFirstKept(std::function<void()> first_kept) ABSL_LOCKS_EXCLUDED(mu_);

  // The daemon goes away with every session (FastChannelServer::Stop):
  // from now on no header is freed, neither those kept nor those retired
  // later (kept uncharged, past the bounds), nor at destruction, so that a
  // client that reads its channel after the daemon exited still finds why
  // its session ended. Their pages go with the clients' mappings.
  void LeaveToClients() ABSL_LOCKS_EXCLUDED(mu_);

  // Headers kept now.
  int64_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  // Headers freed, by the bounds or for want of budget.
  int64_t freed_total() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Kept {
    std::unique_ptr<SharedRegion> region;
    MemoryBudget::Charge charge;
    absl::Time retired_at;
  };
  void Prune(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  std::deque<Kept> kept_ ABSL_GUARDED_BY(mu_);
  int64_t freed_total_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> first_kept_ ABSL_GUARDED_BY(mu_);
  // LeaveToClients was called.
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_RETIRED_CHANNEL_HEADERS_H_
