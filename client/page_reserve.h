// PageReserve: a session's reserve of whole pages in the client process, so
// that a scheduler's step takes its new pages without a round trip to the
// daemon (tcmalloc's per-CPU cache over its central free list).
//
//   ASSIGN_OR_RETURN(auto reserve, pagealloc::PageReserve::Create(client));
//   std::vector<int64_t> pages;
//   RETURN_IF_ERROR(reserve->Take(4, &pages));  // no round trip, mostly
//   ...
//   RETURN_IF_ERROR(reserve->Put(pages));       // back into the reserve
//
// What a reserve page is. Every page in the reserve is owned by the session
// in the daemon's pool (docs/design.md, "Session page reserves"): a refill
// is an ordinary allocation of whole pages and a return an ordinary free,
// both validated by the daemon. So no page is ever free and reserved at
// once, a dead session's reserve comes back with its other pages, and a
// client that names pages it was never given is refused by the daemon and
// changes nothing. The reserve is only which of the session's pages the
// library has not handed to its caller.
//
// Order. The reserve is a stack: Take hands out its top first, a Put
// pushes on top, and refills and PutUnder go under the pages it holds (the
// bottom), each refill's pages in the daemon's order; returns leave from
// the bottom. So the pages a caller saw on top (Peek) stay there across
// refills.
//
// Marks. The reserve aims at `2 * batch` pages: below `batch` (the low
// mark) its thread refills up to the aim, above `4 * batch` (the high
// mark) it returns down to it. `batch` adapts to the session's rate: it
// doubles when a Take finds the reserve short, up to half of max_pages,
// and halves after PageReserveOptions::idle_ticks ticks without a Take.
// The high mark is at most max_pages: a refill never brings the reserve
// past it, and the reserve never asks for pages past the session's quota.
// A Put (or PutUnder) is not refused for crossing it: the pages are the
// session's either way, so they go into the reserve and the Put rings the
// thread, which returns the surplus down to the aim at once (without the
// thread, at the next Maintain).
//
// Off the step's path. Refills and returns are made by the reserve's own
// thread, which sleeps on the channel's reserve bell (the daemon rings it
// when it asks for the reserve, a Take or Put rings it when the reserve
// crosses a mark) at most one tick at a time. Only a Take that finds the
// reserve short of what it needs refills on the caller's thread.
//
// Sharing. When the pool cannot serve an allocation of some session, the
// daemon asks the other sessions for their unused reserve (the reclaim
// protocol, fast_channel/layout.h). The thread answers within one tick
// (it is woken at once; the tick bounds a missed wake): it returns its
// reserve above the low mark, and at least half of it, and halves `batch`.
//
// A full pool. A refill of the thread that the pool refuses (for want of
// pages, down to one page) backs the thread's refills off: the next waits
// a tick, then 2, 4, ... up to kMaxRefillBackoffTicks ticks, until a refill
// brings pages. Each refused refill also makes the daemon ask the other
// sessions for their reserves, so without the backoff a session on a full
// pool would cost the daemon a round of refused calls, and every other
// session an ask, every tick. A Take's own refill is never delayed, and
// one that brings pages ends the backoff.
//
// A reconnect (Client, "Reconnect"). The reserve carries on over the
// client's new link: its pages are still the session's, and at its next
// Maintain it reports itself on the new channel and reads the daemon's
// asks there, which count from 0 again.
//
// This class is thread-safe.

#ifndef PAGEALLOC_CLIENT_PAGE_RESERVE_H_
#define PAGEALLOC_CLIENT_PAGE_RESERVE_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/client.h"

namespace pagealloc {

struct PageReserveOptions {
  // The first batch (the low mark); >= 1.
  int64_t initial_batch = 8;
  // The most pages the reserve holds (0: a quarter of the session's quota,
  // or of the pool without one).
  int64_t max_pages = 0;
  // The longest the thread sleeps between looks at the marks and the
  // daemon's asks (it is woken at once when either needs it).
  absl::Duration tick = absl::Milliseconds(1);
  // Ticks without a Take after which the batch halves.
  int64_t idle_ticks = 100;
  // How long a Take the pool cannot serve keeps retrying while the other
  // sessions answer the daemon's asks, before RESOURCE_EXHAUSTED.
  absl::Duration starved_wait = absl::Milliseconds(20);
  // Run the thread. Without it the reserve refills and returns only in
  // Take and in Maintain (tests that step it by hand).
  bool background = true;
};

// A snapshot of a reserve's counts.
struct PageReserveStats {
  int64_t pages = 0;       // in the reserve now
  int64_t handed_out = 0;  // taken by the caller and not put back
  int64_t batch = 0;       // the low mark now
  int64_t refills = 0;     // refill calls that brought pages
  int64_t pages_refilled = 0;
  int64_t returns = 0;  // return calls (marks and reclaims)
  int64_t pages_returned = 0;
  int64_t reclaims = 0;      // asks of the daemon answered
  int64_t sync_refills = 0;  // refills on the caller's thread (round trips)
  int64_t takes = 0;         // Take calls answered
  // The thread's refills the pool refused (each starts or lengthens the
  // backoff) and the times the thread skipped a refill for the backoff.
  int64_t refills_refused = 0;
  int64_t refills_backed_off = 0;
};

class PageReserve {
 public:
  // The longest backoff of the thread's refills on a full pool, in ticks.
  static constexpr int64_t kMaxRefillBackoffTicks = 64;

  // Starts a reserve for `client`'s session (and its thread, unless
  // options.background is off). It is empty until the first refill.
  // INVALID_ARGUMENT for options out of range. `client` must outlive it.
  static absl::StatusOr<std::unique_ptr<PageReserve>> Create(
      Client* client, const PageReserveOptions& options = {});

  // Stops the thread and returns the reserve's pages to the daemon (when
  // the session is gone the daemon has reclaimed them already). Pages
  // handed out stay the session's.
  ~PageReserve();

  PageReserve(const PageReserve&) = delete;
  PageReserve& operator=(const PageReserve&) = delete;

  // Appends `n` page ids of the session to `out`, taken from the reserve:
  // no round trip when it holds them. When it does not, refills on this
  // thread (a round trip), retrying for options.starved_wait while the pool
  // is short and other sessions return their reserves. A refusal while the
  // reserve's own thread has a refill in flight waits for that refill
  // first, however short starved_wait is: those pages are this session's
  // already. RESOURCE_EXHAUSTED (nothing taken) when the pool or the
  // session's quota cannot supply them; the session's error when it is
  // gone. n >= 0.
  absl::Status Take(int64_t n, std::vector<int64_t>* out)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same into `out[0..n)` (left as it was on failure).
  absl::Status Take(int64_t n, int64_t* out) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes k = min(out.size(), the pages in the reserve now) pages, as Take
  // hands them out, into `out[0..k)` and returns k: never a round trip,
  // so never short. For a caller that wants what the reserve can spare
  // (the SGLang adapter's head fills up ahead of its next calls) or all of
  // it (SGLang's merge, which puts the whole list back): read from stats()
  // and then taken with Take, such a count races the thread, whose return
  // past the high mark can leave Take short by the pages it returned, and
  // a short Take refills on the caller's thread. Counts as a Take when k
  // > 0 (the stats and the batch's rate).
  int64_t TakeHeld(absl::Span<int64_t> out) ABSL_LOCKS_EXCLUDED(mu_);
  // Puts pages the caller took back into the reserve; they stay the
  // session's. INVALID_ARGUMENT naming the page, and nothing changes, when
  // one is not handed out by this reserve (or is named twice).
  absl::Status Put(absl::Span<const int64_t> pages) ABSL_LOCKS_EXCLUDED(mu_);
  // The same for pages the caller's work on `cuda_stream` (a cudaStream_t;
  // null: the legacy default stream) may still read: the session's next
  // release value is queued on the stream (Client::QueueRelease) and the
  // pages are tagged with it, so that a return of them to the daemon
  // carries the largest tag among the pages returned (the release fence,
  // docs/design.md). A Take hands them out again at once: the session's
  // own work is ordered by its own streams. Client::QueueRelease's errors
  // (nothing is put back then).
  absl::Status Put(absl::Span<const int64_t> pages, void* cuda_stream)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Put and Put on a stream, but under the pages the reserve holds, as a
  // refill's go: the pages leave after all it holds now, pages[0] first
  // (the back of a free list, where SGLang's token allocator queues its
  // frees). Being the bottom, they are also the first a return to the
  // daemon takes (past the high mark, or for the daemon's ask).
  absl::Status PutUnder(absl::Span<const int64_t> pages)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status PutUnder(absl::Span<const int64_t> pages, void* cuda_stream)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The caller keeps `pages`, handed out by this reserve, out of its books
  // for good: they stay the session's, freed through the daemon, and a Put
  // refuses them from now on (pages published to the prefix index, which
  // are shared). Pages it has not handed out are skipped. Returns how many
  // it let go of.
  int64_t Disown(absl::Span<const int64_t> pages) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs the thread's work once: answers the daemon's ask, refills below
  // the low mark (unless backed off, above), returns above the high mark.
  // The thread calls it every tick; without the thread, tests call it.
  // Returns the first error of a call to the daemon (the reserve is
  // unchanged then).
  absl::Status Maintain() ABSL_LOCKS_EXCLUDED(mu_, maintain_mu_);

  PageReserveStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // The pages in the reserve now, in the order Take hands them out.
  std::vector<int64_t> pages() const ABSL_LOCKS_EXCLUDED(mu_);
  // Writes to `out[0..k)` the pages the next Takes would hand out, in the
  // order consecutive Takes hand them out (out[0] is the first page the
  // next Take writes), k = min(out.size(), the pages in the reserve), and
  // returns k. Takes nothing and changes nothing, the stats included: a
  // peek is not demand, so it neither counts as a Take for the batch nor
  // wakes the thread. A guess, not a hold: refills go under the pages the
  // reserve holds, so they leave it alone, but before the next Take the
  // reserve's thread may return the deepest of them to the daemon (a
  // reclaim, or past the high mark), a Put pushes its pages on top, and
  // another thread's Take may take them. So a caller that keeps them (the
  // SGLang adapter mirrors their slots on the GPU ahead of a step) checks each
  // Take's pages against them and falls back to what Take handed out.
  int64_t Peek(absl::Span<int64_t> out) const ABSL_LOCKS_EXCLUDED(mu_);
  // Returns the index in `pages` of the first page this reserve has not
  // handed out (never, or put back since; any id outside the pool), or -1
  // when it handed out all of them: the local expansion's check that a
  // last_loc lies in a page of the session (client/local_expansion.h).
  int64_t FirstNotHandedOut(absl::Span<const int64_t> pages) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Tokens per page of the session's pool.
  int64_t page_size() const { return page_size_; }

 private:
  PageReserve(Client* client, const PageReserveOptions& options,
              int64_t max_pages);
  void Loop();
  // Asks the daemon for `n` whole pages; appends their ids to `out`.
  absl::Status Refill(int64_t n, std::vector<int64_t>* out);
  // Hands `pages` back to the daemon, behind the largest release tag among
  // them (0: an ordinary free).
  absl::Status Return(absl::Span<const int64_t> pages) ABSL_LOCKS_EXCLUDED(mu_);
  // Where a Put's pages go: on top (the next taken) or under.
  enum class PutAt { kTop, kUnder };
  // Put, tagging the pages with `release_value` (0: none).
  absl::Status PutTagged(absl::Span<const int64_t> pages,
                         uint64_t release_value, PutAt at)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Hands out the reserve's top `n` pages (n <= its size) into out[0..n),
  // as a Take does; returns whether the reserve fell below the low mark.
  bool HandOut(int64_t n, int64_t* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes up to `n` pages off the back of the reserve for a return.
  std::vector<int64_t> PopForReturn(int64_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A refill brought pages: the thread's next refill need not wait.
  void EndRefillBackoff() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    refill_backoff_ = absl::ZeroDuration();
    refill_not_before_ = absl::InfinitePast();
  }
  // Tells the daemon's metrics what the reserve holds (a hint).
  void Report() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the thread (a mark crossed).
  void Ring() const;
  // The largest batch: half the bound, so that the low mark stays below
  // the high one. At the bound, every Take would leave the reserve below
  // its low mark (a refill) and every Put past the bound above its high
  // mark (a return): the session's whole rate through the daemon.
  static int64_t MaxBatch(int64_t max_pages) {
    return std::max<int64_t>(1, max_pages / 2);
  }
  int64_t Aim() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::min(2 * batch_, max_pages_);
  }
  // Pages the session may still ask for without passing its quota.
  int64_t QuotaRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RefillLanded() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !refill_in_flight_ || stop_;
  }
  // After the pool refused a Take's refill: waits (at most
  // kRefillLandingWait) for the thread's refill in flight, if one is.
  // Returns whether the reserve may hold more than when the Take found it
  // short (`refills_seen`, stats_.refills then): it waited, or a refill
  // landed meanwhile; the Take looks at the reserve again.
  bool AwaitRefillInFlight(int64_t refills_seen) ABSL_LOCKS_EXCLUDED(mu_);
  // A bound on one refill's round trip, for AwaitRefillInFlight.
  static constexpr absl::Duration kRefillLandingWait = absl::Seconds(1);

  Client* const client_;
  const PageReserveOptions options_;
  const int64_t max_pages_;
  const int64_t page_size_;

  mutable absl::Mutex mu_;
  // The reserve as a stack: Take pops from the back, Put pushes there (a
  // page just freed is the next handed out, warm in caches), returns take
  // the bottom. A deque: refills and PutUnder add at the front, a
  // PutUnder at each free of SGLang's token allocator, which a vector
  // would pay for with a move of the whole reserve.
  std::deque<int64_t> reserve_ ABSL_GUARDED_BY(mu_);
  // Per page id (1..num_pages): 1 while handed out by this reserve. A
  // byte per page of the pool: no hashing on the step's path.
  std::vector<uint8_t> handed_ ABSL_GUARDED_BY(mu_);
  int64_t handed_out_ ABSL_GUARDED_BY(mu_) = 0;
  // Per page id: the release value it was put back behind (0: none).
  std::vector<uint64_t> release_tags_ ABSL_GUARDED_BY(mu_);
  int64_t batch_ ABSL_GUARDED_BY(mu_);
  int64_t takes_since_tick_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t idle_ticks_ ABSL_GUARDED_BY(mu_) = 0;
  // The thread's refills wait until refill_not_before_ after a refusal;
  // refill_backoff_ is the last wait (zero: none).
  absl::Duration refill_backoff_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  absl::Time refill_not_before_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  PageReserveStats stats_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // True while the thread's refill is in flight: its pages have left the
  // pool and not reached the reserve yet, so a Take the pool refuses then
  // waits for them (RefillLanded) before it counts the pool as short.
  bool refill_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  // Without a fast channel the thread sleeps on this instead of the bell.
  mutable absl::CondVar wake_;

  // One Maintain at a time (the thread's, or a test's).
  absl::Mutex maintain_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // The last ask answered, on the channel of link `link_epoch_`
  // (Client::link_epoch): a reconnect's new channel counts its asks from 0.
  uint32_t answered_seq_ ABSL_GUARDED_BY(maintain_mu_) = 0;
  uint64_t link_epoch_ ABSL_GUARDED_BY(maintain_mu_) = 0;

  std::thread thread_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_CLIENT_PAGE_RESERVE_H_
