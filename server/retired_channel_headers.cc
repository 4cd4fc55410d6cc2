#include "server/retired_channel_headers.h"

#include <unistd.h>

#include <utility>

namespace pagealloc {

RetiredChannelHeaders::~RetiredChannelHeaders() {
  absl::MutexLock lock(&mu_);
  if (leaving_) return;
  for (Kept& kept : kept_) kept.region->Discard(0);
}

void RetiredChannelHeaders::Retire(std::unique_ptr<SharedRegion> region,
                                   size_t header_bytes, absl::Time now) {
  if (region == nullptr) return;
  region->Discard(header_bytes);
  {
    absl::MutexLock lock(&mu_);
    if (leaving_) {
      // The daemon is going: the header stays with the client's mapping.
      kept_.push_back(Kept{std::move(region), MemoryBudget::Charge(), now});
      return;
    }
  }
  Kept kept{std::move(region), MemoryBudget::Charge(), now};
  if (options_.budget != nullptr) {
    absl::StatusOr<MemoryBudget::Charge> page = options_.budget->Take(
        sysconf(_SC_PAGESIZE), "an ended session's channel header");
    if (!page.ok()) {
      kept.region->Discard(0);
      absl::MutexLock lock(&mu_);
      ++freed_total_;
      return;
    }
    kept.charge = *std::move(page);
  }
  absl::MutexLock lock(&mu_);
  const bool first = kept_.empty();
  kept_.push_back(std::move(kept));
  Prune(now);
  // The one that frees them may sleep without a deadline until told.
  if (first && first_kept_) first_kept_();
}

void RetiredChannelHeaders::SetFirstKept(std::function<void()> first_kept) {
  absl::MutexLock lock(&mu_);
  first_kept_ = std::move(first_kept);
}

void RetiredChannelHeaders::LeaveToClients() {
  absl::MutexLock lock(&mu_);
  leaving_ = true;
}

void RetiredChannelHeaders::Prune(absl::Time now) {
  if (leaving_) return;
  while (!kept_.empty() &&
         (static_cast<int64_t>(kept_.size()) > options_.max_headers ||
          now - kept_.front().retired_at >= options_.keep_for)) {
    kept_.front().region->Discard(0);
    kept_.pop_front();
    ++freed_total_;
  }
}

void RetiredChannelHeaders::FreeExpired(absl::Time now) {
  absl::MutexLock lock(&mu_);
  Prune(now);
}

absl::Time RetiredChannelHeaders::next_expiry() const {
  absl::MutexLock lock(&mu_);
  if (kept_.empty()) return absl::InfiniteFuture();
  return kept_.front().retired_at + options_.keep_for;
}

int64_t RetiredChannelHeaders::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(kept_.size());
}

int64_t RetiredChannelHeaders::freed_total() const {
  absl::MutexLock lock(&mu_);
  return freed_total_;
}

}  // namespace pagealloc
