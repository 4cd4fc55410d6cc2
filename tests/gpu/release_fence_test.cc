// The release fence (docs/design.md section 6) on a real GPU: two clients
// of one CUDA daemon that owns the KV slab. Session A writes its pattern
// at every slot of the pool, queues on its stream a kernel that spins for
// a while (GPU work queued ahead, as a forward) and then checks that the
// slots still hold A's pattern, and frees the pages at once. Session B
// allocates as soon as it can and writes its own pattern at its slots on
// its own stream. With the free fenced on A's stream
// (Client::FreePages(pages, stream)) B gets the pages only after A's
// kernel has run, so A's read sees only A's KV: asserted, 4 runs. With a
// plain free B gets them at once and A's read can see B's KV: the hazard
// the fence removes, reported (printed), not asserted.
//
// Without a GPU every test skips.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/gpu/kv_pattern_kernel.h"
#include "tests/gpu/release_fence_kernel.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::Daemon;
using ::pagealloc::testing::KvPatternBuffer;
using ::pagealloc::testing::KvPatternParams;
using ::pagealloc::testing::LaunchSpinThenCheck;
using ::pagealloc::testing::LaunchWriteKvPattern;
using ::pagealloc::testing::ReadLog;
using ::pagealloc::testing::SpinThenCheckParams;
using ::pagealloc::testing::StartDaemon;

constexpr int64_t kPageSize = 16;
constexpr int64_t kPages = 64;
constexpr int kRuns = 4;
// GPU time A's kernel spends before its read: far longer than B's
// allocation and write take after A's free is answered.
constexpr int64_t kSpinNs = 20'000'000;
constexpr uint64_t kPatternA = 1, kPatternB = 2;

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// A client, its stream and its view of the slab for the kernels.
struct Side {
  std::unique_ptr<Client> client;
  cudaStream_t stream = nullptr;
  KvPatternBuffer* buffers = nullptr;  // device array
  int32_t num_buffers = 0;
  int64_t* slots = nullptr;  // device copy of the last allocation's slots
  unsigned long long* counters = nullptr;  // [2] device: bad, nonzero
};

class ReleaseFenceGpuTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "skipped: this machine has no CUDA GPU";
  }

  void TearDown() override {
    for (Side* side : {&a_, &b_}) {
      if (side->stream != nullptr) cudaStreamSynchronize(side->stream);
      cudaFree(side->buffers);
      cudaFree(side->slots);
      cudaFree(side->counters);
      if (side->stream != nullptr) cudaStreamDestroy(side->stream);
      side->client.reset();
    }
  }

  void Open(const Daemon& daemon, const std::string& name, Side* side) {
    ClientOptions options;
    options.target = daemon.target;
    options.client_name = name;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    ASSERT_OK(client.status()) << ReadLog(daemon.log_path);
    side->client = *std::move(client);
    ASSERT_TRUE(side->client->uses_fast_channel());
    ASSERT_EQ(side->client->pool().backend(), v1::BACKEND_CUDA);
    const std::vector<KvBuffer>& kv = side->client->kv_buffers();
    ASSERT_FALSE(kv.empty());
    std::vector<KvPatternBuffer> host;
    for (const KvBuffer& buffer : kv) {
      ASSERT_TRUE(buffer.on_device);
      host.push_back({static_cast<char*>(buffer.data), buffer.stride_bytes});
    }
    side->num_buffers = static_cast<int32_t>(host.size());
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&side->buffers),
                         host.size() * sizeof(KvPatternBuffer)),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(side->buffers, host.data(),
                         host.size() * sizeof(KvPatternBuffer),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&side->slots),
                         kPages * kPageSize * sizeof(int64_t)),
              cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&side->counters),
                         2 * sizeof(unsigned long long)),
              cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&side->stream, cudaStreamNonBlocking),
              cudaSuccess);
  }

  // Allocates `pages` whole pages inline; copies the slots to the side's
  // device array. False when the pool is short.
  bool Allocate(Side& side, int64_t pages, std::vector<int64_t>* slots) {
    CallOptions options;
    options.return_inline = true;
    absl::StatusOr<Allocation> a =
        side.client->Alloc({pages * kPageSize}, options);
    EXPECT_OK(a.status());
    if (!a.ok() || !a->status().ok()) return false;
    slots->assign((*a)[0].slots, (*a)[0].slots + (*a)[0].count);
    EXPECT_EQ(cudaMemcpyAsync(side.slots, slots->data(),
                              slots->size() * sizeof(int64_t),
                              cudaMemcpyHostToDevice, side.stream),
              cudaSuccess);
    return true;
  }

  void WritePattern(Side& side, int64_t count, uint64_t session) {
    KvPatternParams params;
    params.buffers = side.buffers;
    params.num_buffers = side.num_buffers;
    params.slots = side.slots;
    params.count = count;
    params.first_slot = kPageSize;
    params.num_slots = (kPages + 1) * kPageSize;
    params.session = session;
    params.bad_slots = side.counters;
    params.nonzero_bytes = side.counters + 1;
    ASSERT_EQ(LaunchWriteKvPattern(params, side.stream), cudaSuccess);
  }

  Side a_, b_;
};

TEST_P(ReleaseFenceGpuTest, AQueuedReadOfFreedPagesSeesOnlyItsOwnKv) {
  const bool fenced = GetParam();
  absl::StatusOr<Daemon> daemon = StartDaemon(
      absl::StrFormat("release-fence-%d", fenced),
      {"--backend=cuda", "--gpu=0", absl::StrFormat("--num_pages=%d", kPages),
       absl::StrFormat("--page_size=%d", kPageSize),
       "--kv_layout=mha:layers=1,kv_heads=1,head_dim=64,dtype=bf16"});
  ASSERT_OK(daemon.status());
  ASSERT_NO_FATAL_FAILURE(Open(*daemon, "reader", &a_));
  ASSERT_NO_FATAL_FAILURE(Open(*daemon, "writer", &b_));
  unsigned long long* mismatched = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&mismatched),
                       sizeof(unsigned long long)),
            cudaSuccess);

  int hazards = 0;
  for (int run = 0; run < kRuns; ++run) {
    SCOPED_TRACE(absl::StrFormat("run %d", run));
    ASSERT_EQ(cudaMemset(mismatched, 0, sizeof(unsigned long long)),
              cudaSuccess);
    // A holds the whole pool and writes its KV there.
    std::vector<int64_t> slots_a;
    ASSERT_TRUE(Allocate(a_, kPages, &slots_a));
    WritePattern(a_, slots_a.size(), kPatternA);
    ASSERT_EQ(cudaStreamSynchronize(a_.stream), cudaSuccess);
    // A's forward: queued, still to read every slot.
    SpinThenCheckParams check;
    check.buffers = a_.buffers;
    check.num_buffers = a_.num_buffers;
    check.slots = a_.slots;
    check.count = static_cast<int64_t>(slots_a.size());
    check.session = kPatternA;
    check.spin_ns = kSpinNs;
    check.mismatched_bytes = mismatched;
    ASSERT_EQ(LaunchSpinThenCheck(check, a_.stream), cudaSuccess);
    absl::flat_hash_set<int64_t> distinct;
    std::vector<int64_t> pages;
    for (int64_t slot : slots_a) {
      if (distinct.insert(slot / kPageSize).second) {
        pages.push_back(slot / kPageSize);
      }
    }
    // The scheduler frees the pages as soon as it has queued the read.
    if (fenced) {
      ASSERT_OK(a_.client->FreePages(pages, a_.stream).status());
    } else {
      ASSERT_OK(a_.client->FreePages(pages).status());
    }
    // B allocates as soon as the pool lets it (bounded), and writes.
    std::vector<int64_t> slots_b;
    int refused = 0;
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (!Allocate(b_, kPages, &slots_b)) {
      ++refused;
      ASSERT_LT(absl::Now(), give_up) << "B never got the pages A freed";
      absl::SleepFor(absl::Microseconds(100));
    }
    WritePattern(b_, slots_b.size(), kPatternB);
    ASSERT_EQ(cudaStreamSynchronize(b_.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(a_.stream), cudaSuccess);
    unsigned long long seen = 0;
    ASSERT_EQ(
        cudaMemcpy(&seen, mismatched, sizeof(seen), cudaMemcpyDeviceToHost),
        cudaSuccess);
    std::printf(
        "%s free, run %d: B refused %d times before it got the "
        "pages; A's queued read saw %llu bytes not its own\n",
        fenced ? "fenced" : "plain", run, refused, seen);
    if (fenced) {
      EXPECT_EQ(seen, 0u) << "A's read saw B's KV through a fenced free";
    } else if (seen != 0) {
      ++hazards;
    }
    ASSERT_OK(b_.client->FreeSlots(slots_b).status());
  }
  if (!fenced) {
    std::printf("plain free: the hazard showed in %d of %d runs\n", hazards,
                kRuns);
  }
  cudaFree(mismatched);
}

INSTANTIATE_TEST_SUITE_P(FencedAndPlain, ReleaseFenceGpuTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Fenced" : "Plain";
                         });

}  // namespace
}  // namespace pagealloc
