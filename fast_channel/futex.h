// futex(2) on a 32-bit word in memory shared between processes (not
// FUTEX_PRIVATE): how a fast-channel client sleeps on its answer.

#ifndef PAGEALLOC_FAST_CHANNEL_FUTEX_H_
#define PAGEALLOC_FAST_CHANNEL_FUTEX_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace pagealloc {
namespace fast_channel {

// Sleeps while *word == expected, at most `timeout`. Spurious returns are
// possible (a signal, a wake for another value), so callers re-check their
// condition in a loop.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               absl::Duration timeout);
// Wakes every thread, in any process, sleeping on `word`.
void FutexWakeAll(std::atomic<uint32_t>* word);

}  // namespace fast_channel
}  // namespace pagealloc

#endif  // PAGEALLOC_FAST_CHANNEL_FUTEX_H_
