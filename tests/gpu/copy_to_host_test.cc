// QueueCopyToHost (client/page_free.h) on a GPU: the copy of device slots
// to pinned host memory runs after the work queued before it on the
// caller's stream, so once an event recorded after it has passed the host
// holds what that work wrote, for copies in a row into one pinned buffer
// (the token allocator's ring) and on two streams. Without a GPU it skips.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "client/page_free.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu/copy_slots_kernel.h"
#include "tests/gpu/skip_without_gpu.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::LaunchCopySlots;
using ::pagealloc::testing::StatusIs;

constexpr int64_t kPoison = -0x5a5a5a5a5a5a5a5b;

TEST(QueueCopyToHostTest, HostHoldsWhatTheStreamWroteOnceAnEventPasses) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kSlots = 4096;
  constexpr int kCopies = 8;
  std::vector<int64_t> values(kSlots * kCopies);
  std::iota(values.begin(), values.end(), int64_t{1} << 40);
  int64_t* source = nullptr;
  int64_t* written = nullptr;
  int64_t* host = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&source), values.size() * 8),
            cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&written), values.size() * 8),
            cudaSuccess);
  ASSERT_EQ(cudaMemset(written, 0x5b, values.size() * 8), cudaSuccess);
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&host), values.size() * 8,
                          cudaHostAllocDefault),
            cudaSuccess);
  std::fill(host, host + values.size(), kPoison);
  cudaStream_t streams[2];
  for (cudaStream_t& stream : streams) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
              cudaSuccess);
  }
  ASSERT_EQ(cudaMemcpy(source, values.data(), values.size() * 8,
                       cudaMemcpyHostToDevice),
            cudaSuccess);

  // Each copy follows a kernel, on its stream, that writes the slots it
  // copies: the scheduler's work queued before its free.
  cudaEvent_t last[2] = {nullptr, nullptr};
  for (int c = 0; c < kCopies; ++c) {
    const cudaStream_t stream = streams[c % 2];
    const int64_t offset = c * kSlots;
    ASSERT_EQ(
        LaunchCopySlots(source + offset, written + offset, kSlots, stream),
        cudaSuccess);
    ASSERT_OK(
        QueueCopyToHost(written + offset, kSlots * 8, host + offset, stream));
    cudaEvent_t& event = last[c % 2];
    if (event == nullptr) {
      ASSERT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                cudaSuccess);
    }
    ASSERT_EQ(cudaEventRecord(event, stream), cudaSuccess);
  }
  for (cudaEvent_t event : last) {
    ASSERT_EQ(cudaEventSynchronize(event), cudaSuccess);
  }
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(host[i], values[i]) << "slot " << i;
  }

  // Nothing to copy is no call; a NULL buffer with bytes is refused.
  EXPECT_OK(QueueCopyToHost(nullptr, 0, nullptr, streams[0]));
  EXPECT_THAT(QueueCopyToHost(nullptr, 8, host, streams[0]),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("NULL")));

  for (int s = 0; s < 2; ++s) {
    cudaEventDestroy(last[s]);
    cudaStreamDestroy(streams[s]);
  }
  cudaFreeHost(host);
  cudaFree(written);
  cudaFree(source);
}

}  // namespace
}  // namespace pagealloc
