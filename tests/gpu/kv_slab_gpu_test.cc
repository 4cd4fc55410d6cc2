// The KV slab's scrub kernel on a GPU against the CPU reference
// (kernels/scrub_kernels.h through CudaExecutor). Without a GPU it skips.
// The slab's CUDA VMM export, import and mapping are
// //memory:cuda_vmm_test's; the cross-process path (daemon exports, clients
// import) is //tests:kv_slab_test with PAGEALLOC_TEST_BACKEND=cuda.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_executor.h"
#include "kernels/cuda_executor.h"
#include "tests/gpu/skip_without_gpu.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

// The scrub kernel zeroes exactly the listed pages in every buffer, as
// ScrubPage does on the host, and runs before the expand kernel.
TEST(CudaScrubTest, ScrubKernelMatchesTheCpuReference) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kPageSize = 16;
  constexpr int64_t kPages = 64;  // 0..63
  const int64_t strides[] = {2 * 8 * 128, 12, 576 * 2, 7};
  std::vector<int64_t> offsets;
  int64_t bytes = 0;
  for (int64_t stride : strides) {
    offsets.push_back(bytes);
    bytes += (kPages * kPageSize * stride + 255) / 256 * 256;
  }
  std::vector<char> host(bytes);
  std::mt19937 rng(11);
  for (char& byte : host) byte = static_cast<char>(rng() | 1);
  char* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), bytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice),
            cudaSuccess);
  KvScrubTarget on_device, on_host;
  on_device.page_size = on_host.page_size = kPageSize;
  for (size_t b = 0; b < offsets.size(); ++b) {
    on_device.buffers.push_back({device + offsets[b], strides[b]});
    on_host.buffers.push_back({host.data() + offsets[b], strides[b]});
  }
  CudaExecutorOptions options;
  options.max_slots_per_batch = 4096;
  ASSERT_OK_AND_ASSIGN(auto executor, CudaExecutor::Create(options));
  ASSERT_OK(executor->InitFreeRing(kPages - 1));
  std::vector<int64_t> ring(kPages - 1);
  for (int64_t i = 0; i < kPages - 1; ++i) ring[i] = i + 1;
  ASSERT_OK(executor->WriteFreeRing(0, ring));
  ASSERT_OK(executor->SetKvScrubTarget(on_device));
  int64_t* slots = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&slots),
                       3 * kPageSize * sizeof(int64_t)),
            cudaSuccess);
  BatchPlan plan;
  plan.page_size = kPageSize;
  plan.free_ring_capacity = kPages - 1;
  plan.num_new_pages = 3;
  plan.num_slots = 3 * kPageSize;
  plan.requests.push_back({0, 3 * kPageSize, -1, 0, 0, slots});
  plan.scrub_pages = {1, 3, 40};
  ASSERT_OK(executor->Execute(plan));
  ASSERT_OK(executor->Synchronize());
  for (int64_t page : plan.scrub_pages) ScrubPage(on_host, page);
  std::vector<char> read(bytes);
  ASSERT_EQ(cudaMemcpy(read.data(), device, bytes, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(read, host);
  cudaFree(slots);
  cudaFree(device);
}

}  // namespace
}  // namespace pagealloc
