// SKIP_WITHOUT_GPU(): skips the current test, with a message, where CUDA
// finds no device (CI), clearing the error CUDA recorded for it.

#ifndef PAGEALLOC_TESTS_GPU_SKIP_WITHOUT_GPU_H_
#define PAGEALLOC_TESTS_GPU_SKIP_WITHOUT_GPU_H_

#include <cuda_runtime_api.h>

#include "gtest/gtest.h"

#define SKIP_WITHOUT_GPU()                                         \
  do {                                                             \
    int count = 0;                                                 \
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) { \
      cudaGetLastError();                                          \
      GTEST_SKIP() << "skipped: this machine has no CUDA GPU";     \
    }                                                              \
  } while (0)

#endif  // PAGEALLOC_TESTS_GPU_SKIP_WITHOUT_GPU_H_
