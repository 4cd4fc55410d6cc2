// A ring flood against the CUDA backend leaves the GPU to the others: a
// client registers sessions with the largest rings its daemon allows until
// Register refuses (RESOURCE_EXHAUSTED, the GPU budget spent), and this
// process, another tenant of the same GPU, can still allocate what the
// daemon left: the daemon took no more GPU memory than its budget
// (--session_gpu_memory, by default an eighth of the GPU memory free
// after the slab; docs/operations.md, "Sharing a GPU with engines").
// Skips without a GPU.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/hostile/hostile_daemon.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

int64_t FreeGpuBytes() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
  return static_cast<int64_t>(free);
}

TEST(RingFloodTest, AFloodOfTheLargestRingsLeavesTheGpuToOthers) {
  if (!HaveGpu()) GTEST_SKIP() << "skipped: this machine has no CUDA GPU";
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // our own context first
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon("ring-flood", {"--backend=cuda", "--max_sessions=1024",
                                 "--lease_ms=60000"}));
  int port = -1;
  ASSERT_TRUE(WaitFor([&] { return (port = MetricsPort(daemon)) > 0; },
                      absl::Seconds(30)));
  const int64_t budget = static_cast<int64_t>(MetricValue(
      port, "pagealloc_session_memory_budget_bytes{memory=\"gpu\"}"));
  ASSERT_GT(budget, 0) << ReadLog(daemon.log_path);
  const int64_t before = FreeGpuBytes();

  // Rings of a quarter of the budget, then default ones, until refused.
  std::unique_ptr<v1::PageAllocator::Stub> stub = RawStub(daemon);
  const int64_t big = std::min<int64_t>(budget / 8 / 4, int64_t{1} << 26);
  int sessions = 0;
  absl::Status refusal;
  for (int64_t slots : {big, int64_t{0}}) {
    refusal = absl::OkStatus();
    for (int i = 0; i < 1024 && refusal.ok(); ++i) {
      refusal =
          RawRegister(*stub, absl::StrCat("flood", sessions), slots).status();
      if (refusal.ok()) ++sessions;
    }
    EXPECT_THAT(refusal, StatusIs(absl::StatusCode::kResourceExhausted,
                                  HasSubstr("of gpu memory")));
  }
  const int64_t after = FreeGpuBytes();
  const int64_t taken = before - after;
  std::printf(
      "ring flood: %d sessions; the daemon took %.1f MiB of GPU memory for "
      "them (budget %.1f MiB); %.1f MiB left free\n",
      sessions, static_cast<double>(taken) / kMiB,
      static_cast<double>(budget) / kMiB, static_cast<double>(after) / kMiB);
  // The rings are charged whole, rounded to the granularity: the daemon
  // took at most its budget (and a little for its own bookkeeping).
  EXPECT_LE(taken, budget + 64 * kMiB);
  EXPECT_TRUE(daemon.process.running()) << ReadLog(daemon.log_path);

  // Another tenant allocates all but a sliver of what is left.
  void* mine = nullptr;
  const int64_t want = after - 256 * kMiB;
  ASSERT_GT(want, 0);
  EXPECT_EQ(cudaMalloc(&mine, want), cudaSuccess)
      << "could not allocate " << want / kMiB << " MiB beside the daemon";
  if (mine != nullptr) cudaFree(mine);
}

}  // namespace
}  // namespace pagealloc::testing
