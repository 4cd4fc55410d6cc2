// CUDA VMM memory shared as file descriptors (memory/cuda_vmm.h): exported
// memory imported again is the same memory, sizes are checked against the
// granularity, and the stream write and wait order one stream after
// another through such memory. Without a GPU those tests skip, and the
// entry points are checked to answer "no CUDA GPU". The cross-process paths
// (daemon exports, clients import) are //tests/gpu:completion_counter_test
// and //tests:kv_slab_test with PAGEALLOC_TEST_BACKEND=cuda.

#include "memory/cuda_vmm.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/unique_fd.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace cuda_vmm {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

bool HaveGpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return false;
  }
  return true;
}

#define SKIP_WITHOUT_GPU()                                     \
  do {                                                         \
    if (!HaveGpu()) {                                          \
      GTEST_SKIP() << "skipped: this machine has no CUDA GPU"; \
    }                                                          \
  } while (0)

// A duplicate of `fd`, as the memory socket hands one to each session.
UniqueFd Duplicate(int fd) { return UniqueFd(dup(fd)); }

TEST(CudaVmmTest, ADeviceThatIsNotThereIsRefused) {
  const std::string kUnknownUuid = "GPU-00000000-0000-0000-0000-000000000000";
  if (!HaveGpu()) {
    // Every entry point says why, in the runtime's words.
    const auto no_gpu = StatusIs(absl::StatusCode::kFailedPrecondition,
                                 HasSubstr("no CUDA GPU"));
    EXPECT_THAT(Granularity(0).status(), no_gpu);
    EXPECT_THAT(CheckSupport(0), no_gpu);
    EXPECT_THAT(DeviceByUuid(kUnknownUuid).status(), no_gpu);
    EXPECT_THAT(Allocation::Create(0, 1).status(), no_gpu);
    EXPECT_THAT(Mapping::Import(UniqueFd(), int64_t{2} << 20, 0).status(),
                no_gpu);
    EXPECT_THAT(ExportedMemory::Create(0, 8).status(), no_gpu);
    EXPECT_THAT(StreamWriteValue(nullptr, nullptr, 1), no_gpu);
    EXPECT_THAT(StreamWaitValueAtLeast(nullptr, nullptr, 1), no_gpu);
    return;
  }
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_THAT(DeviceByUuid(kUnknownUuid).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("not visible to this process")));
  EXPECT_THAT(
      Granularity(count).status(),
      StatusIs(absl::StatusCode::kInternal, HasSubstr("cudaSetDevice")));
}

TEST(CudaVmmTest, AnExportedAllocationImportedAgainIsTheSameMemory) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(const int64_t granularity, Granularity(0));
  ASSERT_GT(granularity, 0);
  ASSERT_OK_AND_ASSIGN(auto memory, Allocation::Create(0, 3 * granularity - 5));
  EXPECT_EQ(memory->bytes(), 3 * granularity);
  ASSERT_OK_AND_ASSIGN(auto own, Mapping::Map(*memory));
  ASSERT_OK_AND_ASSIGN(UniqueFd fd, memory->Export());
  ASSERT_TRUE(fd.valid());
  ASSERT_OK_AND_ASSIGN(auto imported,
                       Mapping::Import(std::move(fd), memory->bytes(), 0));
  ASSERT_NE(own->data(), imported->data());
  EXPECT_EQ(imported->bytes(), memory->bytes());
  EXPECT_EQ(imported->device(), 0);
  std::vector<uint8_t> pattern(memory->bytes());
  std::mt19937 rng(7);
  for (uint8_t& byte : pattern) byte = static_cast<uint8_t>(rng());
  ASSERT_EQ(cudaMemcpy(own->data(), pattern.data(), pattern.size(),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  std::vector<uint8_t> read(pattern.size());
  ASSERT_EQ(cudaMemcpy(read.data(), imported->data(), read.size(),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(read, pattern);
  // A size that is not a multiple of the granularity is refused.
  ASSERT_OK_AND_ASSIGN(UniqueFd again, memory->Export());
  EXPECT_THAT(
      Mapping::Import(std::move(again), granularity + 1, 0),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("granularity")));
  EXPECT_THAT(Allocation::Create(0, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a VMM allocation of 0 bytes")));
}

// Export, import and map of 1, 10 and 100 GiB in this process (the
// client's side of Register): printed, not asserted.
TEST(CudaVmmTest, ImportAndMapTimes) {
  SKIP_WITHOUT_GPU();
  for (int64_t gib : {1, 10, 100}) {
    size_t free = 0, total = 0;
    ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
    if (static_cast<int64_t>(free) < (gib << 30) + (int64_t{1} << 30)) {
      std::printf("%lld GiB: skipped (%zu bytes free)\n",
                  static_cast<long long>(gib), free);
      continue;
    }
    absl::Time start = absl::Now();
    ASSERT_OK_AND_ASSIGN(auto memory, Allocation::Create(0, gib << 30));
    ASSERT_OK_AND_ASSIGN(UniqueFd fd, memory->Export());
    const absl::Duration created = absl::Now() - start;
    start = absl::Now();
    ASSERT_OK_AND_ASSIGN(auto mapped,
                         Mapping::Import(std::move(fd), memory->bytes(), 0));
    const absl::Duration imported = absl::Now() - start;
    std::printf("%lld GiB: create+export %s, import+reserve+map+access %s\n",
                static_cast<long long>(gib),
                absl::FormatDuration(created).c_str(),
                absl::FormatDuration(imported).c_str());
  }
}

// The daemon's completion counter and a client's wait on it: a stream that
// waits for a value through an imported mapping runs its next work only
// after another stream's write of that value through the exporter's
// mapping, and then sees what that stream wrote before it.
TEST(CudaVmmTest, AStreamWaitingForAValueSeesTheWorkBeforeItsWrite) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK(CheckSupport(0));
  ASSERT_OK_AND_ASSIGN(auto counter, ExportedMemory::Create(0, 8));
  ASSERT_OK_AND_ASSIGN(const int64_t granularity, Granularity(0));
  EXPECT_EQ(counter->bytes(), granularity);
  ASSERT_OK_AND_ASSIGN(auto imported, Mapping::Import(Duplicate(counter->fd()),
                                                      counter->bytes(), 0));
  ASSERT_EQ(cudaMemset(counter->data(), 0, counter->bytes()), cudaSuccess);
  ASSERT_OK_AND_ASSIGN(auto buffer, ExportedMemory::Create(0, 4096));
  ASSERT_EQ(cudaMemset(buffer->data(), 0, 4096), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  cudaStream_t writer = nullptr, reader = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking),
            cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking),
            cudaSuccess);
  uint8_t* host = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&host), 4096), cudaSuccess);
  std::memset(host, 0x5a, 4096);

  // The reader waits for 1, which nothing has written yet: its copy is held.
  ASSERT_OK(StreamWaitValueAtLeast(reader, imported->data(), 1));
  ASSERT_EQ(cudaMemcpyAsync(host, buffer->data(), 4096, cudaMemcpyDeviceToHost,
                            reader),
            cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(reader), cudaErrorNotReady);
  EXPECT_EQ(host[0], 0x5a);

  ASSERT_EQ(cudaMemsetAsync(buffer->data(), 0xab, 4096, writer), cudaSuccess);
  ASSERT_OK(StreamWriteValue(writer, counter->data(), 1));
  ASSERT_EQ(cudaStreamSynchronize(reader), cudaSuccess);
  EXPECT_EQ(std::vector<uint8_t>(host, host + 4096),
            std::vector<uint8_t>(4096, 0xab));
  uint64_t value = 0;
  ASSERT_EQ(cudaMemcpy(&value, imported->data(), sizeof(value),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(value, 1u);

  ASSERT_EQ(cudaStreamSynchronize(writer), cudaSuccess);
  cudaFreeHost(host);
  cudaStreamDestroy(reader);
  cudaStreamDestroy(writer);
}

}  // namespace
}  // namespace cuda_vmm
}  // namespace pagealloc
