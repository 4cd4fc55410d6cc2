// CudaStatus's words for each way a machine can lack a usable GPU. The
// expectation for an insufficient driver comes from the machine itself:
// whether the driver library can be loaded at all.

#include "common/cuda_status.h"

#include <dlfcn.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

bool DriverLibraryLoads() {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return false;
  dlclose(handle);
  return true;
}

TEST(CudaStatusTest, SuccessIsOk) {
  EXPECT_OK(CudaStatus(cudaSuccess, "cudaMalloc"));
}

TEST(CudaStatusTest, InsufficientDriverSaysWhetherADriverIsThere) {
  const absl::Status status =
      CudaStatus(cudaErrorInsufficientDriver, "cudaGetDeviceCount");
  if (DriverLibraryLoads()) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition,
                                 AllOf(HasSubstr("no CUDA GPU: the NVIDIA "
                                                 "driver supports CUDA"),
                                       HasSubstr("update the driver"))));
  } else {
    EXPECT_THAT(status,
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("no CUDA GPU: no NVIDIA driver"),
                               HasSubstr("cudaGetDeviceCount: "),
                               HasSubstr("cudaErrorInsufficientDriver"))));
  }
}

TEST(CudaStatusTest, NoDeviceSaysTheDriverFindsNoGpu) {
  EXPECT_THAT(CudaStatus(cudaErrorNoDevice, "cudaGetDeviceCount"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no CUDA GPU: the NVIDIA driver is installed "
                                 "but finds no GPU")));
}

TEST(CudaStatusTest, OutOfDeviceMemoryIsResourceExhausted) {
  EXPECT_THAT(CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc (free ring)"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("cudaMalloc (free ring): ")));
}

TEST(CudaStatusTest, OtherErrorsAreInternal) {
  EXPECT_THAT(CudaStatus(cudaErrorIllegalAddress, "cudaStreamSynchronize"),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("cudaStreamSynchronize: ")));
}

}  // namespace
}  // namespace pagealloc
