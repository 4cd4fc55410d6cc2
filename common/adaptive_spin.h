// AdaptiveSpin: how long a thread that waits for work (the batcher thread,
// a fast-channel poller) spins before it sleeps, learned from the gaps it
// has seen between becoming idle and the next work arriving.
//
// A spin that catches the next piece of work saves a wake-up (a futex or
// eventfd wake, tens of microseconds on a virtual machine) and costs the
// CPU of the gap; a spin that runs out costs its whole budget for nothing.
// So the budget follows the gaps:
//   - a gap no longer than the cap (caught spinning, or slept through)
//     raises the budget to at least kHeadroom times that gap (up to the
//     cap): spinning that long would catch the next one like it;
//   - a gap longer than the cap (the thread slept, and spinning for the cap
//     would not have caught it) halves the budget; below kMinBudget it is 0
//     and the thread sleeps at once.
// A client calling back to back keeps the budget near its gap; one calling
// once per forward pass (milliseconds) drives it to 0 within a few calls,
// and an idle thread sleeps. The cap is the operator's spin flag: the
// longest the thread ever spins.
//
// The policy reads no clock: the caller measures the gaps, so tests drive
// it with exact durations.
//
// This class is thread-compatible.

#ifndef PAGEALLOC_COMMON_ADAPTIVE_SPIN_H_
#define PAGEALLOC_COMMON_ADAPTIVE_SPIN_H_

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"

namespace pagealloc {

class AdaptiveSpin {
 public:
  // The budget covers this many times the last short gap: gaps of one
  // client vary by about 2x from call to call.
  static constexpr int kHeadroom = 2;
  // A budget that halves below this becomes 0: a spin this short catches
  // almost nothing a sleep would not.
  static constexpr absl::Duration kMinBudget = absl::Microseconds(2);

  // Starts at the cap (the first calls of a burst spin as a fixed spin
  // would). A cap of zero never spins.
  explicit AdaptiveSpin(absl::Duration cap)
      : cap_(std::max(cap, absl::ZeroDuration())), budget_(cap_) {}

  // How long to spin now, from when the thread became idle.
  absl::Duration budget() const { return budget_; }
  absl::Duration cap() const { return cap_; }

  // Work arrived `gap` after the thread became idle, while it spun.
  void Caught(absl::Duration gap) {
    ++caught_;
    Cover(gap);
  }

  // The thread spun out its budget and slept; work woke it `gap` after it
  // became idle (spin included).
  void Slept(absl::Duration gap) {
    ++slept_;
    if (gap <= cap_) {
      // A longer spin would have caught it.
      Cover(gap);
      return;
    }
    budget_ = budget_ / 2;
    if (budget_ < kMinBudget) budget_ = absl::ZeroDuration();
  }

  // Idle periods that ended while spinning, and after a sleep.
  int64_t caught() const { return caught_; }
  int64_t slept() const { return slept_; }

 private:
  void Cover(absl::Duration gap) {
    budget_ = std::min(cap_, std::max(budget_, kHeadroom * gap));
  }

  const absl::Duration cap_;
  absl::Duration budget_;
  int64_t caught_ = 0;
  int64_t slept_ = 0;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_COMMON_ADAPTIVE_SPIN_H_
