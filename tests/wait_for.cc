#include "tests/wait_for.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace pagealloc::testing {

bool WaitFor(absl::FunctionRef<bool()> predicate, absl::Duration timeout,
             absl::Duration interval) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    // Read the clock before calling: a predicate that is slow (an RPC) and
    // then true still counts, and the last call starts after the deadline.
    const bool expired = absl::Now() >= deadline;
    if (predicate()) return true;
    if (expired) return false;
    absl::SleepFor(std::min(interval, deadline - absl::Now()));
  }
}

}  // namespace pagealloc::testing
