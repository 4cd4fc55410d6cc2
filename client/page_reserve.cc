#include "client/page_reserve.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "fast_channel/codec.h"
#include "fast_channel/futex.h"

namespace pagealloc {

absl::StatusOr<std::unique_ptr<PageReserve>> PageReserve::Create(
    Client* client, const PageReserveOptions& options) {
  if (options.initial_batch < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "initial_batch (%d) must be >= 1", options.initial_batch));
  }
  if (options.max_pages < 0 || options.idle_ticks < 1 ||
      options.tick <= absl::ZeroDuration() ||
      options.starved_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_pages (%d) must be >= 0, idle_ticks (%d) >= 1, tick (%s) > 0 "
        "and starved_wait (%s) >= 0",
        options.max_pages, options.idle_ticks,
        absl::FormatDuration(options.tick),
        absl::FormatDuration(options.starved_wait)));
  }
  const int64_t quota = client->quota_pages();
  const int64_t bound = quota > 0 ? quota : client->pool().num_pages();
  const int64_t max_pages = options.max_pages > 0
                                ? std::min(options.max_pages, bound)
                                : std::max<int64_t>(1, bound / 4);
  return std::unique_ptr<PageReserve>(
      new PageReserve(client, options, max_pages));
}

PageReserve::PageReserve(Client* client, const PageReserveOptions& options,
                         int64_t max_pages)
    : client_(client),
      options_(options),
      max_pages_(max_pages),
      page_size_(client->pool().page_size()),
      batch_(std::min(options.initial_batch, MaxBatch(max_pages))) {
  handed_.assign(client->pool().num_pages() + 1, 0);
  release_tags_.assign(client->pool().num_pages() + 1, 0);
  {
    absl::MutexLock lock(&maintain_mu_);
    // The epoch first: a channel read after it is that link's or a later
    // one's (Client::Install publishes the channel before the epoch).
    link_epoch_ = client_->link_epoch();
    if (const fast_channel::ChannelCodec* channel =
            client_->reserve_channel()) {
      // Asks made before this reserve existed were for pages it never had.
      answered_seq_ = channel->ReclaimSeq();
    }
  }
  if (options_.background) thread_ = std::thread([this] { Loop(); });
}

PageReserve::~PageReserve() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  Ring();
  if (thread_.joinable()) thread_.join();
  std::vector<int64_t> rest;
  {
    absl::MutexLock lock(&mu_);
    rest.assign(reserve_.begin(), reserve_.end());
    reserve_.clear();
    Report();
  }
  // When the session is gone its pages were reclaimed with it.
  if (!rest.empty() && client_->session_status().ok()) (void)Return(rest);
}

void PageReserve::Ring() const {
  if (const fast_channel::ChannelCodec* channel = client_->reserve_channel()) {
    channel->RingReserveBell();
  } else {
    wake_.SignalAll();
  }
}

void PageReserve::Loop() {
  const fast_channel::ChannelCodec* channel = client_->reserve_channel();
  for (;;) {
    const uint32_t bell =
        channel != nullptr
            ? channel->reserve_bell()->load(std::memory_order_seq_cst)
            : 0;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    // Errors (the session gone, the pool short) leave the reserve as it
    // is; the next tick tries again, and the caller's calls say why.
    (void)Maintain();
    if (channel != nullptr) {
      // Woken by the daemon's ask or by a mark crossed (both ring the
      // bell after they change what Maintain looks at).
      fast_channel::FutexWait(channel->reserve_bell(), bell, options_.tick);
    } else {
      absl::MutexLock lock(&mu_);
      if (!stop_) wake_.WaitWithTimeout(&mu_, options_.tick);
    }
  }
}

int64_t PageReserve::QuotaRoom() const {
  const int64_t quota = client_->quota_pages();
  if (quota <= 0) return std::numeric_limits<int64_t>::max();
  // The session may own pages the reserve never saw (thin-path calls); the
  // daemon's quota check refuses what passes it, and a smaller refill then
  // follows.
  return std::max<int64_t>(
      0, quota - static_cast<int64_t>(reserve_.size()) - handed_out_);
}

absl::Status PageReserve::Refill(int64_t n, std::vector<int64_t>* out) {
  // One request of whole pages, answered inline: the slots come back in
  // host memory on either backend, and the session's output ring (which
  // the caller's own allocations use, released in order) is not touched.
  const int64_t tokens = n * page_size_;
  CallOptions options;
  options.return_inline = true;
  options.all_or_nothing = true;
  ASSIGN_OR_RETURN(Allocation allocation, client_->Alloc({tokens}, options));
  RETURN_IF_ERROR(allocation[0].status);
  const RequestSlots& slots = allocation[0];
  if (slots.count != tokens) {
    return absl::InternalError(
        absl::StrFormat("a refill of %d pages came back with %d slots, not %d",
                        n, slots.count, tokens));
  }
  const int64_t num_pages = client_->pool().num_pages();
  // Reversed: the reserve is a stack, and the refill's first page is the
  // next handed out.
  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t page = slots.slots[i * page_size_] / page_size_;
    if (page < 1 || page > num_pages) {
      return absl::InternalError(absl::StrFormat(
          "a refill came back with page %d, outside [1, %d]", page, num_pages));
    }
    out->push_back(page);
  }
  return absl::OkStatus();
}

absl::Status PageReserve::Return(absl::Span<const int64_t> pages) {
  if (pages.empty()) return absl::OkStatus();
  // Pages put back behind a stream's work go back to the daemon behind
  // the latest of those fences (the release word is monotonic).
  uint64_t fence = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const int64_t page : pages) {
      fence = std::max(fence, release_tags_[page]);
    }
  }
  RETURN_IF_ERROR(client_->FreePagesAfter(pages, fence).status());
  absl::MutexLock lock(&mu_);
  for (const int64_t page : pages) release_tags_[page] = 0;
  return absl::OkStatus();
}

std::vector<int64_t> PageReserve::PopForReturn(int64_t n) {
  // From the bottom: the top is what Take hands out next (the hottest).
  n = std::min<int64_t>(n, reserve_.size());
  std::vector<int64_t> pages(reserve_.begin(), reserve_.begin() + n);
  reserve_.erase(reserve_.begin(), reserve_.begin() + n);
  return pages;
}

void PageReserve::Report() {
  if (const fast_channel::ChannelCodec* channel = client_->reserve_channel()) {
    channel->ReportReserve(static_cast<int64_t>(reserve_.size()),
                           stats_.refills, stats_.returns);
  }
}

absl::Status PageReserve::Maintain() {
  absl::MutexLock maintain(&maintain_mu_);
  const uint64_t epoch = client_->link_epoch();
  const fast_channel::ChannelCodec* channel = client_->reserve_channel();
  if (epoch != link_epoch_) {
    // The client reconnected (a daemon restarted with its state): the
    // reserve's pages are still the session's, but the new channel counts
    // the daemon's asks from 0 and has no report of this reserve yet.
    link_epoch_ = epoch;
    answered_seq_ = 0;
    absl::MutexLock lock(&mu_);
    Report();
  }

  // The daemon's ask first: another session starves.
  if (channel != nullptr) {
    const uint32_t seq = channel->ReclaimSeq();
    if (seq != answered_seq_) {
      std::vector<int64_t> back;
      {
        absl::MutexLock lock(&mu_);
        const int64_t size = reserve_.size();
        back = PopForReturn(std::max(size - batch_, (size + 1) / 2));
        batch_ = std::max<int64_t>(1, batch_ / 2);
      }
      const absl::Status returned = Return(back);
      absl::MutexLock lock(&mu_);
      if (!returned.ok()) {
        reserve_.insert(reserve_.begin(), back.begin(), back.end());
        return returned;
      }
      answered_seq_ = seq;
      ++stats_.reclaims;
      if (!back.empty()) {
        ++stats_.returns;
        stats_.pages_returned += back.size();
      }
      Report();
      channel->AnswerReclaim(seq);
      return absl::OkStatus();
    }
  }

  int64_t want = 0;
  std::vector<int64_t> back;
  {
    absl::MutexLock lock(&mu_);
    if (takes_since_tick_ == 0) {
      if (++idle_ticks_ >= options_.idle_ticks) {
        idle_ticks_ = 0;
        batch_ = std::max(
            std::min(options_.initial_batch, MaxBatch(max_pages_)), batch_ / 2);
      }
    } else {
      idle_ticks_ = 0;
    }
    takes_since_tick_ = 0;
    const int64_t size = reserve_.size();
    if (size < batch_) {
      want = std::min(Aim() - size, QuotaRoom());
    } else if (size > std::min(4 * batch_, max_pages_)) {
      back = PopForReturn(size - Aim());
    }
  }
  if (!back.empty()) {
    const absl::Status returned = Return(back);
    absl::MutexLock lock(&mu_);
    if (!returned.ok()) {
      reserve_.insert(reserve_.begin(), back.begin(), back.end());
      return returned;
    }
    ++stats_.returns;
    stats_.pages_returned += back.size();
    Report();
    return absl::OkStatus();
  }
  if (want <= 0) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    if (absl::Now() < refill_not_before_) {
      ++stats_.refills_backed_off;
      return absl::OkStatus();
    }
    refill_in_flight_ = true;
  }
  std::vector<int64_t> pages;
  // A short pool refuses the whole refill: try half as many, down to one;
  // but an ask that came meanwhile stops it there. Another session starves
  // too, and this thread answers the ask at once (it rang the bell) rather
  // than after every smaller refill has been refused.
  absl::Status refilled;
  for (; want >= 1; want /= 2) {
    refilled = Refill(want, &pages);
    if (refilled.code() != absl::StatusCode::kResourceExhausted) break;
    if (channel != nullptr && channel->ReclaimSeq() != answered_seq_) break;
  }
  absl::MutexLock lock(&mu_);
  // (A Take waiting on it sees the pages below once this lock is released.)
  refill_in_flight_ = false;
  if (!refilled.ok()) {
    if (refilled.code() == absl::StatusCode::kResourceExhausted) {
      ++stats_.refills_refused;
      refill_backoff_ = std::min(std::max(2 * refill_backoff_, options_.tick),
                                 kMaxRefillBackoffTicks * options_.tick);
      refill_not_before_ = absl::Now() + refill_backoff_;
    }
    return refilled;
  }
  EndRefillBackoff();
  // Under the pages the reserve holds: its top, which Take hands out next
  // and a caller may have mirrored (Peek), stays as it was.
  reserve_.insert(reserve_.begin(), pages.begin(), pages.end());
  ++stats_.refills;
  stats_.pages_refilled += pages.size();
  Report();
  return absl::OkStatus();
}

absl::Status PageReserve::Take(int64_t n, std::vector<int64_t>* out) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Take of %d pages (must be >= 0)", n));
  }
  const size_t before = out->size();
  out->resize(before + n);
  const absl::Status taken = Take(n, out->data() + before);
  if (!taken.ok()) out->resize(before);
  return taken;
}

absl::Status PageReserve::Take(int64_t n, int64_t* out) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Take of %d pages (must be >= 0)", n));
  }
  const absl::Time give_up = absl::Now() + options_.starved_wait;
  bool grew = false;
  for (;;) {
    int64_t short_by = 0;
    bool low = false;
    int64_t refills_seen = 0;  // the reserve's refills when found short
    {
      absl::MutexLock lock(&mu_);
      const int64_t size = reserve_.size();
      if (size >= n) {
        low = HandOut(n, out);
      } else {
        if (!grew) {
          // The rate outgrew the batch: double it (the thread refills to
          // twice the new batch).
          batch_ = std::min(std::max(2 * batch_, n), MaxBatch(max_pages_));
          grew = true;
        }
        short_by = n - size;
        refills_seen = stats_.refills;
        if (short_by > QuotaRoom()) {
          return absl::ResourceExhaustedError(absl::StrFormat(
              "Take of %d pages: the reserve holds %d and the session's "
              "quota (%d pages) leaves room for %d more",
              n, size, client_->quota_pages(), QuotaRoom()));
        }
      }
    }
    if (short_by == 0) {
      // Below the low mark: the thread refills, off this path.
      if (low) Ring();
      return absl::OkStatus();
    }
    // A round trip on the caller's thread: the reserve cannot serve it.
    std::vector<int64_t> pages;
    const absl::Status refilled = Refill(short_by, &pages);
    if (refilled.ok()) {
      absl::MutexLock lock(&mu_);
      EndRefillBackoff();  // the pool has pages again
      // Under the reserve's pages, as the thread's refills go: this Take
      // hands out those first.
      reserve_.insert(reserve_.begin(), pages.begin(), pages.end());
      ++stats_.refills;
      ++stats_.sync_refills;
      stats_.pages_refilled += pages.size();
      continue;
    }
    // The pool refused: not short, though, by the pages of this reserve's
    // own refill in flight, which will be the reserve's in a round trip.
    if (refilled.code() == absl::StatusCode::kResourceExhausted &&
        AwaitRefillInFlight(refills_seen)) {
      continue;
    }
    if (refilled.code() != absl::StatusCode::kResourceExhausted ||
        absl::Now() >= give_up) {
      return refilled;
    }
    // The daemon has asked the other sessions for their reserves (it does
    // when the pool cannot serve a call); their threads answer within a
    // tick. Try again shortly.
    absl::SleepFor(absl::Microseconds(50));
  }
}

absl::Status PageReserve::Put(absl::Span<const int64_t> pages) {
  return PutTagged(pages, /*release_value=*/0, PutAt::kTop);
}

absl::Status PageReserve::Put(absl::Span<const int64_t> pages,
                              void* cuda_stream) {
  ASSIGN_OR_RETURN(const uint64_t value, client_->QueueRelease(cuda_stream));
  return PutTagged(pages, value, PutAt::kTop);
}

absl::Status PageReserve::PutUnder(absl::Span<const int64_t> pages) {
  return PutTagged(pages, /*release_value=*/0, PutAt::kUnder);
}

absl::Status PageReserve::PutUnder(absl::Span<const int64_t> pages,
                                   void* cuda_stream) {
  ASSIGN_OR_RETURN(const uint64_t value, client_->QueueRelease(cuda_stream));
  return PutTagged(pages, value, PutAt::kUnder);
}

absl::Status PageReserve::PutTagged(absl::Span<const int64_t> pages,
                                    uint64_t release_value, PutAt at) {
  bool high = false;
  {
    absl::MutexLock lock(&mu_);
    const int64_t limit = static_cast<int64_t>(handed_.size());
    // Each page named is marked 2 as it is checked, so a second naming is
    // seen; a refusal puts the marks back.
    for (size_t i = 0; i < pages.size(); ++i) {
      const int64_t page = pages[i];
      const uint8_t state = page >= 1 && page < limit ? handed_[page] : 0;
      if (state != 1) {
        for (size_t j = 0; j < i; ++j) handed_[pages[j]] = 1;
        return absl::InvalidArgumentError(absl::StrFormat(
            "pages[%d] (%d) was not handed out by this reserve%s", i, page,
            state == 2 ? " (named twice)" : ""));
      }
      handed_[page] = 2;
    }
    for (const int64_t page : pages) {
      handed_[page] = 0;
      release_tags_[page] = release_value;
    }
    // The deque's back is the top. On top the pages are pushed in order
    // (the last given is the next taken); under, pages[0] lies nearest the
    // pages held before, so that they leave in the order given.
    if (at == PutAt::kTop) {
      reserve_.insert(reserve_.end(), pages.begin(), pages.end());
    } else {
      reserve_.insert(reserve_.begin(), pages.rbegin(), pages.rend());
    }
    handed_out_ -= pages.size();
    high = static_cast<int64_t>(reserve_.size()) >
           std::min(4 * batch_, max_pages_);
    Report();
  }
  // Above the high mark: the thread returns, off this path.
  if (high) Ring();
  return absl::OkStatus();
}

int64_t PageReserve::Disown(absl::Span<const int64_t> pages) {
  absl::MutexLock lock(&mu_);
  const int64_t limit = static_cast<int64_t>(handed_.size());
  int64_t disowned = 0;
  for (const int64_t page : pages) {
    if (page < 1 || page >= limit || handed_[page] != 1) continue;
    handed_[page] = 0;
    ++disowned;
  }
  handed_out_ -= disowned;
  Report();
  return disowned;
}

PageReserveStats PageReserve::stats() const {
  absl::MutexLock lock(&mu_);
  PageReserveStats stats = stats_;
  stats.pages = reserve_.size();
  stats.handed_out = handed_out_;
  stats.batch = batch_;
  return stats;
}

int64_t PageReserve::FirstNotHandedOut(absl::Span<const int64_t> pages) const {
  absl::MutexLock lock(&mu_);
  const int64_t limit = static_cast<int64_t>(handed_.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    const int64_t page = pages[i];
    if (page < 0 || page >= limit || handed_[page] != 1) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

std::vector<int64_t> PageReserve::pages() const {
  absl::MutexLock lock(&mu_);
  return std::vector<int64_t>(reserve_.rbegin(), reserve_.rend());
}

bool PageReserve::AwaitRefillInFlight(int64_t refills_seen) {
  absl::MutexLock lock(&mu_);
  if (RefillLanded()) return stats_.refills != refills_seen;
  mu_.AwaitWithTimeout(absl::Condition(this, &PageReserve::RefillLanded),
                       kRefillLandingWait);
  return true;
}

int64_t PageReserve::TakeHeld(absl::Span<int64_t> out) {
  int64_t n = 0;
  bool low = false;
  {
    absl::MutexLock lock(&mu_);
    n = std::min<int64_t>(out.size(), reserve_.size());
    if (n == 0) return 0;
    low = HandOut(n, out.data());
  }
  if (low) Ring();
  return n;
}

bool PageReserve::HandOut(int64_t n, int64_t* out) {
  const int64_t size = reserve_.size();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t page = reserve_[size - 1 - i];
    out[i] = page;
    handed_[page] = 1;
    // The session's own work on it is ordered by its own streams.
    release_tags_[page] = 0;
  }
  reserve_.resize(size - n);
  handed_out_ += n;
  ++stats_.takes;
  ++takes_since_tick_;
  Report();
  return static_cast<int64_t>(reserve_.size()) < batch_;
}

int64_t PageReserve::Peek(absl::Span<int64_t> out) const {
  absl::MutexLock lock(&mu_);
  const int64_t n = std::min<int64_t>(out.size(), reserve_.size());
  // From the top of the stack down, as Take writes out[0], out[1], ...
  std::copy_n(reserve_.rbegin(), n, out.begin());
  return n;
}

}  // namespace pagealloc
