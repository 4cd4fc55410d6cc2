// CudaExecutor::Create's errors, on any machine: bad options are refused
// before the device is touched, and a machine without a usable GPU gets a
// clear FAILED_PRECONDITION "no CUDA GPU: ..." instead of a crash. Whether
// this machine has a GPU is asked of the CUDA runtime directly, so the test
// checks the right outcome either way. The GPU suite is
// //tests/gpu:cuda_executor_test.

#include "kernels/cuda_executor.h"

#include <cuda_runtime_api.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

int UsableGpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  cudaGetLastError();  // clears a non-sticky error from the call above
  return count;
}

TEST(CudaExecutorCreateTest, WithoutAGpuSaysSoClearly) {
  absl::StatusOr<std::unique_ptr<CudaExecutor>> executor =
      CudaExecutor::Create(CudaExecutorOptions{});
  if (UsableGpus() == 0) {
    EXPECT_THAT(executor, StatusIs(absl::StatusCode::kFailedPrecondition,
                                   HasSubstr("no CUDA GPU: ")));
  } else {
    // With a GPU (sm_90 or newer, which is all we build for) it works.
    EXPECT_OK(executor.status());
  }
}

TEST(CudaExecutorCreateTest, AnOrdinalPastTheLastDeviceIsRefused) {
  CudaExecutorOptions options;
  options.device_ordinal = 1000;
  absl::StatusOr<std::unique_ptr<CudaExecutor>> executor =
      CudaExecutor::Create(options);
  if (UsableGpus() == 0) {
    EXPECT_THAT(executor, StatusIs(absl::StatusCode::kFailedPrecondition,
                                   HasSubstr("no CUDA GPU: ")));
  } else {
    EXPECT_THAT(executor, StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("device_ordinal (1000)")));
  }
}

TEST(CudaExecutorCreateTest, BadOptionsAreRefusedBeforeTheDevice) {
  auto create = [](auto mutate) {
    CudaExecutorOptions options;
    mutate(options);
    return CudaExecutor::Create(options).status();
  };
  EXPECT_THAT(create([](auto& o) { o.device_ordinal = -1; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("device_ordinal (-1)")));
  EXPECT_THAT(create([](auto& o) { o.max_requests_per_batch = 0; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_requests_per_batch (0)")));
  EXPECT_THAT(create([](auto& o) { o.max_slots_per_batch = 0; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_slots_per_batch (0)")));
  EXPECT_THAT(create([](auto& o) { o.max_pages_per_ring_write = 0; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_pages_per_ring_write (0)")));
  EXPECT_THAT(create([](auto& o) { o.num_staging_buffers = 1; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("num_staging_buffers (1)")));
}

}  // namespace
}  // namespace pagealloc
