// The GPU benchmarks' checks: a CUDA call or a status that fails ends the
// benchmark binary with the file, line, call and reason (a benchmark has no
// caller to return an error to).

#ifndef PAGEALLOC_BENCH_BENCH_CHECK_H_
#define PAGEALLOC_BENCH_BENCH_CHECK_H_

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"

#define BENCH_CHECK_CUDA(expr)                                           \
  do {                                                                   \
    const cudaError_t bench_error_ = (expr);                             \
    if (bench_error_ != cudaSuccess) {                                   \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, \
                   #expr, cudaGetErrorString(bench_error_));             \
      std::exit(1);                                                      \
    }                                                                    \
  } while (false)

#define BENCH_CHECK_OK(expr)                                  \
  do {                                                        \
    const absl::Status bench_status_ = (expr);                \
    if (!bench_status_.ok()) {                                \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, \
                   bench_status_.ToString().c_str());         \
      std::exit(1);                                           \
    }                                                         \
  } while (false)

#endif  // PAGEALLOC_BENCH_BENCH_CHECK_H_
