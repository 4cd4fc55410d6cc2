// The benchmark's one clock: steady, in nanoseconds.

#ifndef PAGEALLOC_BENCH_CLOCK_H_
#define PAGEALLOC_BENCH_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace pagealloc::bench {

inline int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_CLOCK_H_
