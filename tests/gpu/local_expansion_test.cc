// The local expansion's CUDA path (client/local_expansion.h, kDevice) on a
// GPU: for random extend and decode batches at page sizes 1, 16 and 64,
// with last_loc on the device and several batches queued on one stream with
// no host sync between a call and the check but the final one, the slots
// equal, slot for slot, the host expansion's over the same reserve pages
// and the thin path's on the same free list (a CPU-backend daemon: the
// CUDA thin path is held to it by cuda_executor_test). A last_loc outside
// the slab is reported and its slots go to page 0. Each runs with decodes
// passed in the kernel's parameters (the default) and uploaded as plans.
// Without a GPU it skips.

#include "client/local_expansion.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/client.h"
#include "client/page_reserve.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu/skip_without_gpu.h"
#include "tests/local_expansion_reference.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::ConnectSession;
using ::pagealloc::testing::ExpansionBatch;
using ::pagealloc::testing::ExpansionPair;
using ::pagealloc::testing::InProcessServer;
using ::pagealloc::testing::MakeExpansionBatch;
using ::pagealloc::testing::ManualReserve;
using ::pagealloc::testing::PutBackBatch;
using ::pagealloc::testing::StartExpansionDaemon;
using ::pagealloc::testing::StartExpansionPair;
using ::pagealloc::testing::StatusIs;
using ::pagealloc::testing::ThinSlotsOnFreeList;
using ::testing::HasSubstr;

// Every kernel is loaded when CUDA starts. Loaded lazily (CUDA's default),
// a kernel's first launch waits for the device, which never comes free
// while DeviceSlotsEqualTheHostAndThinPaths holds its stream.
const bool kEagerModuleLoading = [] {
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/1);
  return true;
}();

constexpr int64_t kPages = 256;
constexpr int64_t kPoison = -0x5a5a5a5a5a5a5a5b;
constexpr int kBatches = 12;

// A device copy of `values` plus a poisoned device buffer of `out` words.
struct DeviceBatch {
  int64_t* last_loc = nullptr;
  int64_t* out = nullptr;
  int64_t out_words = 0;
  ~DeviceBatch() {
    cudaFree(last_loc);
    cudaFree(out);
  }
};

void Upload(const std::vector<int64_t>& last_locs, int64_t out_words,
            DeviceBatch* batch) {
  const size_t loc_bytes = std::max<size_t>(1, last_locs.size()) * 8;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&batch->last_loc), loc_bytes),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(batch->last_loc, last_locs.data(), last_locs.size() * 8,
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  batch->out_words = out_words;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&batch->out), out_words * 8),
            cudaSuccess);
  std::vector<int64_t> poison(out_words, kPoison);
  ASSERT_EQ(cudaMemcpy(batch->out, poison.data(), out_words * 8,
                       cudaMemcpyHostToDevice),
            cudaSuccess);
}

std::vector<int64_t> Download(const DeviceBatch& batch) {
  std::vector<int64_t> host(batch.out_words);
  EXPECT_EQ(cudaMemcpy(host.data(), batch.out, batch.out_words * 8,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

// Options for a device expander: decodes inline (the default) or uploaded.
LocalExpanderOptions DeviceOptions(bool inline_decodes) {
  LocalExpanderOptions options;
  options.memory = ExpansionMemory::kDevice;
  if (!inline_decodes) options.inline_decode_requests = 0;
  return options;
}

// (page size, decodes inline)
class LocalExpansionGpuTest
    : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {};

TEST_P(LocalExpansionGpuTest, DeviceSlotsEqualTheHostAndThinPaths) {
  SKIP_WITHOUT_GPU();
  const auto [page_size, inline_decodes] = GetParam();
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(absl::StrFormat("page_size %d inline %d seed %d", page_size,
                               inline_decodes, seed));
  ExpansionPair pair;
  ASSERT_OK(StartExpansionPair(kPages, page_size, &pair));
  PageReserve* const reserve = pair.reserve.get();
  Client& thin = *pair.thin;
  LocalExpanderOptions device_options = DeviceOptions(inline_decodes);
  // Two buffers to begin with, and room for one per batch: with the stream
  // held until every call is made, each call after the second finds every
  // buffer queued and adds one rather than wait on the host (which would
  // never return here).
  device_options.staging_buffers = 2;
  device_options.max_staging_buffers = kBatches;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<LocalExpander> device,
      LocalExpander::Create(*pair.local, reserve, device_options));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalExpander> host,
                       LocalExpander::Create(*pair.local, reserve));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  // GPU work queued ahead of the calls: the stream runs nothing past this
  // host function while `held` (static: the function may read it after a
  // failed assertion left the test; the guard lets the stream go then).
  static std::atomic<bool> held;
  held.store(true);
  struct LetGo {
    ~LetGo() { held.store(false); }
  } let_go;
  ASSERT_EQ(cudaLaunchHostFunc(
                stream,
                [](void*) {
                  while (held.load()) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(1));
                  }
                },
                nullptr),
            cudaSuccess);

  std::vector<std::unique_ptr<DeviceBatch>> on_device;
  std::vector<std::vector<int64_t>> host_slots;
  std::vector<std::vector<int64_t>> thin_slots;
  for (int b = 0; b < kBatches; ++b) {
    const bool decode = b % 2 == 1;
    const int64_t requests = 1 + static_cast<int64_t>(rng() % 16);
    std::vector<int64_t> prefix_pages;
    ASSERT_OK(reserve->Take(requests, &prefix_pages));
    const ExpansionBatch batch =
        MakeExpansionBatch(decode, page_size, kPages * page_size, prefix_pages,
                           /*max_new_pages=*/8, rng);
    const std::vector<int64_t> order = reserve->pages();
    ASSERT_OK_AND_ASSIGN(
        std::vector<int64_t> thin_batch,
        ThinSlotsOnFreeList(thin, kPages, prefix_pages, order, batch));
    thin_slots.push_back(std::move(thin_batch));

    auto device_batch = std::make_unique<DeviceBatch>();
    Upload(batch.last_locs, batch.slots + 1, device_batch.get());
    if (HasFatalFailure()) return;
    ASSERT_OK_AND_ASSIGN(
        const int64_t written,
        decode ? device->AllocDecode(batch.seq_lens, device_batch->last_loc,
                                     device_batch->out, stream)
               : device->AllocExtend(batch.prefix_lens, batch.seq_lens,
                                     device_batch->last_loc, device_batch->out,
                                     stream));
    EXPECT_EQ(written, batch.slots);
    on_device.push_back(std::move(device_batch));

    // The same pages again, in the same order, for the host expansion: put
    // back in reverse, the first taken is on top.
    const size_t used = order.size() - reserve->pages().size();
    std::vector<int64_t> taken(order.begin(), order.begin() + used);
    std::reverse(taken.begin(), taken.end());
    ASSERT_OK(reserve->Put(taken));
    std::vector<int64_t> expanded(batch.slots + 1, kPoison);
    ASSERT_OK(decode ? host->AllocDecode(batch.seq_lens, batch.last_locs.data(),
                                         expanded.data(), nullptr)
                           .status()
                     : host->AllocExtend(batch.prefix_lens, batch.seq_lens,
                                         batch.last_locs.data(),
                                         expanded.data(), nullptr)
                           .status());
    host_slots.push_back(std::move(expanded));
    // Everything back for the next batch (the device's staging has its own
    // copy of the page ids).
    ASSERT_OK(PutBackBatch(*reserve, order, prefix_pages));
  }
  held.store(false);
  // The only host sync between the calls and the check.
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_OK(device->TakeDeviceError());
  EXPECT_EQ(device->stats().staging_waits, 0);
  // Each call that staged a batch while every buffer was queued added one;
  // a batch without slots stages nothing, nor does an inline decode.
  if (!inline_decodes) {
    EXPECT_GE(device->stats().staging_adds, 1);
  }
  EXPECT_LE(device->stats().staging_adds, kBatches - 2);
  EXPECT_EQ(device->stats().inline_decodes, inline_decodes ? kBatches / 2 : 0);
  for (int b = 0; b < kBatches; ++b) {
    SCOPED_TRACE(absl::StrFormat("batch %d", b));
    std::vector<int64_t> slots = Download(*on_device[b]);
    EXPECT_EQ(slots.back(), kPoison);  // nothing past the batch
    EXPECT_EQ(slots, host_slots[b]);
    slots.pop_back();
    EXPECT_EQ(slots, thin_slots[b]);
  }
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(
    PageSizes, LocalExpansionGpuTest,
    ::testing::Combine(::testing::Values(1, 16, 64), ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<int64_t, bool>>& info) {
      return absl::StrFormat("PageSize%d%s", std::get<0>(info.param),
                             std::get<1>(info.param) ? "Inline" : "Uploaded");
    });

class LocalExpansionGpuRefusalTest : public ::testing::TestWithParam<bool> {};

TEST_P(LocalExpansionGpuRefusalTest, LastLocOutsideTheSlabGoesToPageZero) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kPageSize = 16;
  std::unique_ptr<InProcessServer> daemon =
      StartExpansionDaemon(kPages, kPageSize);
  ASSERT_NE(daemon, nullptr);
  std::unique_ptr<Client> client = ConnectSession(*daemon);
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PageReserve> reserve,
                       PageReserve::Create(client.get(), ManualReserve(4, 8)));
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<LocalExpander> expander,
      LocalExpander::Create(*client, reserve.get(), DeviceOptions(GetParam())));
  std::vector<int64_t> page;
  ASSERT_OK(reserve->Take(1, &page));
  // Request 0 continues its page; request 1 names a slot past the slab.
  const std::vector<int64_t> last = {page[0] * kPageSize + 4,
                                     (kPages + 5) * kPageSize + 4};
  DeviceBatch batch;
  Upload(last, 2, &batch);
  if (HasFatalFailure()) return;
  ASSERT_OK(expander->AllocDecode({6, 6}, batch.last_loc, batch.out, nullptr)
                .status());
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(Download(batch),
            (std::vector<int64_t>{page[0] * kPageSize + 5, 0}));
  EXPECT_THAT(
      expander->TakeDeviceError(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr(absl::StrFormat("last_locs[1] (%d)",
                                         (kPages + 5) * kPageSize + 4))));
  EXPECT_OK(expander->TakeDeviceError());  // taken: cleared
  EXPECT_EQ(expander->stats().inline_decodes, GetParam() ? 1 : 0);
}

INSTANTIATE_TEST_SUITE_P(Decodes, LocalExpansionGpuRefusalTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Inline" : "Uploaded";
                         });

}  // namespace
}  // namespace pagealloc
