// WaitFor: the one way tests wait for something another thread or process
// makes true (a lease to run out, a daemon to answer, a batcher to finish).
//
//   ASSERT_TRUE(WaitFor([&] { return pool.Stats().used_pages == 0; },
//                       absl::Seconds(5)));
//
// The timeout is a bound on a wait that normally ends much sooner, never the
// thing a test measures: pick it generously (CI has 2 cores).

#ifndef PAGEALLOC_TESTS_WAIT_FOR_H_
#define PAGEALLOC_TESTS_WAIT_FOR_H_

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"

namespace pagealloc::testing {

// How long WaitFor sleeps between two tries unless told otherwise.
inline constexpr absl::Duration kWaitForInterval = absl::Milliseconds(20);

// Calls `predicate` until it returns true or `timeout` has passed, sleeping
// `interval` between calls; returns whether it held. The predicate is called
// at least once, and once more after the deadline, so a zero timeout is a
// single check and a predicate that turns true during the last sleep counts.
bool WaitFor(absl::FunctionRef<bool()> predicate, absl::Duration timeout,
             absl::Duration interval = kWaitForInterval);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_WAIT_FOR_H_
