// What the GPU benchmarks time with: the median of event-timed intervals.

#ifndef PAGEALLOC_BENCH_GPU_TIMING_H_
#define PAGEALLOC_BENCH_GPU_TIMING_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "bench/bench_check.h"

namespace pagealloc {

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median, in microseconds, of the `n` intervals events[2 i] ..
// events[2 i + 1], all recorded already. REQUIRES: n >= 1, the events done
// (their stream synchronized).
inline double MedianEventPairUs(const cudaEvent_t* events, int n) {
  std::vector<double> us(n);
  for (int i = 0; i < n; ++i) {
    float ms = 0;
    BENCH_CHECK_CUDA(
        cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
    us[i] = ms * 1000.0;
  }
  return Median(us);
}

}  // namespace pagealloc

#endif  // PAGEALLOC_BENCH_GPU_TIMING_H_
