// The CUDA executor against the CPU reference, on a real GPU:
//   - fresh random batches (page sizes 1, 16, 64; 1 to 8192 requests;
//     extends of 0 to 65536 slots; up to 2M slots a batch; decodes inside a
//     page and across a page boundary), each run into a poisoned buffer
//     whose gaps between requests must stay poisoned;
//   - long random operation sequences through two PagePools, one on each
//     executor, under both free policies, with frees, checkpoints,
//     rollbacks and reclaims: identical results and slots, and
//     CheckInvariants() (which compares the device mirror with the host's
//     list) after every step;
//   - long extends that take the chunk kernel (bulk, one long request,
//     uneven lengths, lengths at chunk boundaries; page sizes 1, 3, 16, 64),
//     inline and uploaded;
//   - page-size-1 plans of ring copies (with and without requests), through
//     cudaMemcpyAsync and through the expand kernel (max_ring_memcpys), and
//     the two pools at page size 1 with one call's destinations contiguous
//     (one copy) or apart (a copy per request);
//   - the executor's own contract: size limits, ring writes larger than a
//     staging buffer, many batches queued without waiting.
// Without a GPU every test skips. PAGEALLOC_GPU_TEST_QUICK=1 shrinks the
// sizes so that compute-sanitizer runs finish in minutes.

#include "kernels/cuda_executor.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "allocator/page_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_executor.h"
#include "kernels/expand_plan.h"
#include "tests/random_plan.h"
#include "tests/status_matchers.h"
#include "tests/workload.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::AddRandomRingCopies;
using ::pagealloc::testing::BindDestinations;
using ::pagealloc::testing::kPoison;
using ::pagealloc::testing::LiveSequence;
using ::pagealloc::testing::MakeExtendBatch;
using ::pagealloc::testing::MakeRandomBatch;
using ::pagealloc::testing::RandomBatch;
using ::pagealloc::testing::RandomPlanSpec;
using ::pagealloc::testing::RandomRing;
using ::pagealloc::testing::SequenceSet;
using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

bool Quick() {
  const char* value = std::getenv("PAGEALLOC_GPU_TEST_QUICK");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// A device buffer of int64 words, poisoned on creation.
class DeviceWords {
 public:
  explicit DeviceWords(int64_t words) : words_(std::max<int64_t>(words, 1)) {
    EXPECT_EQ(
        cudaMalloc(reinterpret_cast<void**>(&data_), words_ * sizeof(int64_t)),
        cudaSuccess);
    Poison();
  }
  ~DeviceWords() { cudaFree(data_); }
  DeviceWords(const DeviceWords&) = delete;
  DeviceWords& operator=(const DeviceWords&) = delete;

  void Poison() {
    const std::vector<int64_t> poison(words_, kPoison);
    EXPECT_EQ(cudaMemcpy(data_, poison.data(), words_ * sizeof(int64_t),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  // Copies the buffer back. REQUIRES: the executor was synchronized.
  std::vector<int64_t> Read(int64_t words) const {
    std::vector<int64_t> out(words);
    EXPECT_EQ(cudaMemcpy(out.data(), data_, words * sizeof(int64_t),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }
  int64_t* data() const { return data_; }

 private:
  int64_t words_;
  int64_t* data_ = nullptr;
};

// Compares two output buffers and names the first difference (a plain
// EXPECT_EQ would print millions of values).
::testing::AssertionResult SameWords(const std::vector<int64_t>& actual,
                                     const std::vector<int64_t>& expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "sizes " << actual.size() << " vs " << expected.size();
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    if (actual[i] != expected[i]) {
      int64_t mismatches = 0;
      for (size_t j = i; j < actual.size(); ++j) {
        mismatches += actual[j] != expected[j];
      }
      return ::testing::AssertionFailure()
             << "word " << i << " is " << actual[i] << ", expected "
             << expected[i] << (expected[i] == kPoison ? " (poison)" : "")
             << "; " << mismatches << " of " << actual.size()
             << " words differ";
    }
  }
  return ::testing::AssertionSuccess();
}

// Runs `batch` on the CPU executor and on `executor` (the same free ring in
// both), each into its own poisoned copy of the destinations, and checks
// that the GPU wrote exactly what the CPU did.
void ExpectSameAsCpu(RandomBatch& batch, CpuExecutor& cpu,
                     CudaExecutor& executor) {
  std::vector<int64_t> expected(batch.output_words, kPoison);
  BindDestinations(batch, expected.data());
  ASSERT_OK(cpu.Execute(batch.plan));
  DeviceWords out(batch.output_words);
  BindDestinations(batch, out.data());
  ASSERT_OK(executor.Execute(batch.plan));
  ASSERT_OK(executor.Synchronize());
  ASSERT_TRUE(SameWords(out.Read(batch.output_words), expected));
}

// Creates the executor or skips the test when the machine has no GPU.
#define CREATE_OR_SKIP(executor, options)                               \
  do {                                                                  \
    absl::StatusOr<std::unique_ptr<CudaExecutor>> created =             \
        CudaExecutor::Create(options);                                  \
    if (absl::IsFailedPrecondition(created.status()) &&                 \
        absl::StrContains(created.status().message(), "no CUDA GPU")) { \
      GTEST_SKIP() << "skipped: this machine has no CUDA GPU ("         \
                   << created.status().message() << ")";                \
    }                                                                   \
    ASSERT_OK(created.status());                                        \
    executor = std::move(*created);                                     \
  } while (false)

class CudaExecutorTest : public ::testing::Test {
 protected:
  std::mt19937_64 rng_{std::random_device{}()};
};

struct Scenario {
  const char* name;
  int64_t max_requests;
  int64_t max_extend;
  int64_t max_prefix;
  double decode_fraction;
};

// Runs with plans in the kernel parameters where they fit (the default) and
// with every plan uploaded, so that both paths see every scenario.
class RandomBatchesTest : public CudaExecutorTest,
                          public ::testing::WithParamInterface<bool> {};

TEST_P(RandomBatchesTest, RandomBatchesMatchTheCpuExecutor) {
  const bool quick = Quick();
  const int64_t max_total = quick ? int64_t{1} << 16 : int64_t{1} << 21;
  const int64_t capacity = max_total + 4099;
  CudaExecutorOptions options;
  options.max_slots_per_batch = max_total;
  options.inline_plans = GetParam();
  std::unique_ptr<CudaExecutor> executor;
  CREATE_OR_SKIP(executor, options);
  ASSERT_OK(executor->InitFreeRing(capacity));
  CpuExecutor cpu;
  ASSERT_OK(cpu.InitFreeRing(capacity));

  const uint64_t seed = std::random_device{}();
  rng_.seed(seed);
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  const std::vector<Scenario> scenarios = {
      {"decode", 8192, 1, 8192, 1.0},
      {"small mixed (per-request kernel)", 8192, 16, 8192, 0.3},
      {"medium mixed", 1024, 512, 4096, 0.3},
      {"large extends", 64, 65536, 1024, 0.0},
      {"many requests, budget-clamped (empty tails)", 8192, 65536, 8192, 0.2},
      {"one request", 1, 65536, 100, 0.0},
  };
  int64_t decodes_in_page = 0;
  int64_t decodes_new_page = 0;
  for (const int64_t page_size : {1, 16, 64}) {
    for (const Scenario& scenario : scenarios) {
      for (int trial = 0; trial < (quick ? 1 : 3); ++trial) {
        RandomPlanSpec spec;
        spec.page_size = page_size;
        spec.num_requests =
            1 + rng_() % (quick ? std::min<int64_t>(scenario.max_requests, 512)
                                : scenario.max_requests);
        if (trial == 0) spec.num_requests = scenario.max_requests;
        if (quick)
          spec.num_requests = std::min<int64_t>(spec.num_requests, 1024);
        spec.max_extend = scenario.max_extend;
        spec.max_prefix = scenario.max_prefix;
        spec.decode_fraction = scenario.decode_fraction;
        spec.max_total_slots = max_total;
        RandomBatch batch = MakeRandomBatch(spec, capacity, rng_);
        SCOPED_TRACE(absl::StrFormat(
            "page_size %d, %s, trial %d: %d requests, %d slots, head %d",
            page_size, scenario.name, trial, batch.plan.requests.size(),
            batch.plan.num_slots, batch.plan.free_ring_head));
        for (const PlannedRequest& r : batch.plan.requests) {
          if (r.seq_len - r.prefix_len != 1 || r.prefix_len == 0) continue;
          ++(r.prefix_len % page_size == 0 ? decodes_new_page
                                           : decodes_in_page);
        }
        // A fresh ring each time, through the mirror's chunked writes.
        const std::vector<int64_t> ring = RandomRing(capacity, rng_);
        ASSERT_OK(cpu.WriteFreeRing(0, ring));
        ASSERT_OK(executor->WriteFreeRing(0, ring));

        ASSERT_NO_FATAL_FAILURE(ExpectSameAsCpu(batch, cpu, *executor));
      }
    }
  }
  EXPECT_GT(decodes_in_page, 100);
  EXPECT_GT(decodes_new_page, 100);
}

INSTANTIATE_TEST_SUITE_P(InlineAndUploaded, RandomBatchesTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Inline" : "Uploaded";
                         });

// Long extends, the chunk kernel's plans (kernels/expand_plan.h:
// UsesChunkKernel, checked here so that the shapes keep reaching it): a
// bulk of equal extends, one long request, uneven lengths, and lengths at
// the kernel's chunk boundaries; page sizes 1, 3 (not a power of two), 16
// and 64; random prefixes, most ending inside a page; destinations at odd
// and even slots (16-byte aligned or not); heads that make pages wrap; plans
// inline and uploaded.
TEST_P(RandomBatchesTest, LongExtendsMatchTheCpuExecutor) {
  const bool quick = Quick();
  const uint64_t seed = std::random_device{}();
  rng_.seed(seed);
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  const int64_t max_total = int64_t{1} << 20;
  const int64_t capacity = max_total + 4099;
  CudaExecutorOptions options;
  options.max_slots_per_batch = max_total;
  options.inline_plans = GetParam();
  std::unique_ptr<CudaExecutor> executor;
  CREATE_OR_SKIP(executor, options);
  ASSERT_OK(executor->InitFreeRing(capacity));
  CpuExecutor cpu;
  ASSERT_OK(cpu.InitFreeRing(capacity));

  struct Shape {
    const char* name;
    std::function<std::vector<int64_t>()> extends;
  };
  const std::vector<int64_t> edges = {kChunkSlots - 1, kChunkSlots,
                                      kChunkSlots + 1, 2 * kChunkSlots - 1,
                                      2 * kChunkSlots, 2 * kChunkSlots + 1};
  const std::vector<Shape> shapes = {
      {"bulk", [&] { return std::vector<int64_t>(quick ? 12 : 64, 16384); }},
      {"one long request",
       [&] { return std::vector<int64_t>{131073 + int64_t(rng_() % 5000)}; }},
      {"uneven",
       [&] {
         std::vector<int64_t> extends(24);
         for (int64_t& e : extends) e = 6000 + rng_() % 6001;
         return extends;
       }},
      {"chunk edges",
       [&] {
         // Enough requests that even all at the shortest edge make a plan
         // of more than kChunkMinSlots slots.
         std::vector<int64_t> extends(kChunkMinSlots / (kChunkSlots - 1) + 12);
         for (int64_t& e : extends) e = edges[rng_() % edges.size()];
         return extends;
       }},
  };
  int64_t odd_outputs = 0;
  for (const int64_t page_size : {1, 3, 16, 64}) {
    for (const Shape& shape : shapes) {
      for (int trial = 0; trial < (quick ? 1 : 2); ++trial) {
        RandomBatch batch =
            MakeExtendBatch(page_size, shape.extends(), capacity, rng_);
        int64_t max_request_slots = 0;
        for (size_t k = 0; k < batch.plan.requests.size(); ++k) {
          const PlannedRequest& r = batch.plan.requests[k];
          max_request_slots =
              std::max(max_request_slots, r.seq_len - r.prefix_len);
          odd_outputs += batch.destination_offset[k] % 2;
        }
        SCOPED_TRACE(absl::StrFormat(
            "page_size %d, %s, trial %d: %d requests, %d slots, head %d",
            page_size, shape.name, trial, batch.plan.requests.size(),
            batch.plan.num_slots, batch.plan.free_ring_head));
        ASSERT_TRUE(UsesChunkKernel(batch.plan.requests.size(),
                                    batch.plan.num_slots, max_request_slots));
        const std::vector<int64_t> ring = RandomRing(capacity, rng_);
        ASSERT_OK(cpu.WriteFreeRing(0, ring));
        ASSERT_OK(executor->WriteFreeRing(0, ring));

        ASSERT_NO_FATAL_FAILURE(ExpectSameAsCpu(batch, cpu, *executor));
      }
    }
  }
  EXPECT_GT(odd_outputs, 20);
}

// Ring-copy plans (page size 1) against the CPU executor: copies alone
// (device-to-device copies when few, else the expand kernel) and mixed with
// requests (always the kernel), with heads near the ring's end so that
// copies wrap. Every limit of max_ring_memcpys and both plan paths of the
// kernel route are covered.
TEST_F(CudaExecutorTest, RingCopiesMatchTheCpuExecutor) {
  const uint64_t seed = std::random_device{}();
  rng_.seed(seed);
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  const bool quick = Quick();
  const int64_t max_count = quick ? 4096 : 65536;
  const int64_t capacity = 64 * max_count + 4099;
  CpuExecutor cpu;
  ASSERT_OK(cpu.InitFreeRing(capacity));
  const std::vector<int64_t> ring = RandomRing(capacity, rng_);
  ASSERT_OK(cpu.WriteFreeRing(0, ring));
  int64_t slots_compared = 0;
  for (const int max_memcpys : {0, 1, 2, 64}) {
    for (const bool inline_plans : {true, false}) {
      CudaExecutorOptions options;
      options.max_ring_memcpys = max_memcpys;
      options.inline_plans = inline_plans;
      options.max_slots_per_batch = capacity;
      std::unique_ptr<CudaExecutor> executor;
      CREATE_OR_SKIP(executor, options);
      ASSERT_OK(executor->InitFreeRing(capacity));
      ASSERT_OK(executor->WriteFreeRing(0, ring));
      for (int trial = 0; trial < (quick ? 6 : 24); ++trial) {
        RandomPlanSpec spec;
        spec.page_size = 1;
        spec.num_requests = trial % 3 == 0 ? 1 + rng_() % 200 : 0;
        spec.max_extend = 16;
        spec.max_total_slots = 4096;
        RandomBatch batch = MakeRandomBatch(spec, capacity, rng_);
        const int64_t copies = trial % 2 == 0 ? 1 : 1 + rng_() % 63;
        AddRandomRingCopies(
            batch, copies, trial % 4 < 2 ? 2048 : 1 + rng_() % max_count, rng_);
        if (trial % 4 == 1) {
          // The batch's pages end past the ring's end: the copies wrap.
          batch.plan.free_ring_head =
              capacity - 1 - rng_() % batch.plan.num_new_pages;
        }
        SCOPED_TRACE(absl::StrFormat(
            "max_ring_memcpys %d, %s, trial %d: %d requests, %d copies, %d "
            "slots, head %d",
            max_memcpys, inline_plans ? "inline" : "uploaded", trial,
            batch.plan.requests.size(), batch.plan.ring_copies.size(),
            batch.plan.num_slots, batch.plan.free_ring_head));
        ASSERT_NO_FATAL_FAILURE(ExpectSameAsCpu(batch, cpu, *executor));
        slots_compared += batch.plan.num_slots;
      }
    }
  }
  EXPECT_GT(slots_compared, quick ? 10000 : 1000000);
}

TEST_F(CudaExecutorTest, RefusesRingCopiesOutOfShape) {
  CudaExecutorOptions options;
  options.max_requests_per_batch = 4;
  std::unique_ptr<CudaExecutor> executor;
  CREATE_OR_SKIP(executor, options);
  ASSERT_OK(executor->InitFreeRing(100));
  ASSERT_OK(executor->WriteFreeRing(0, RandomRing(100, rng_)));
  DeviceWords out(100);
  BatchPlan plan;
  plan.page_size = 1;
  plan.free_ring_capacity = 100;
  plan.num_new_pages = 10;
  plan.num_slots = 10;
  plan.ring_copies.push_back({0, 10, out.data()});
  EXPECT_OK(executor->Execute(plan));
  BatchPlan past_the_pages = plan;
  past_the_pages.ring_copies[0].count = 11;
  past_the_pages.num_slots = 11;
  EXPECT_THAT(executor->Execute(past_the_pages),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("entries [0, 11) outside the batch's 10")));
  BatchPlan paged = plan;
  paged.page_size = 16;
  EXPECT_THAT(executor->Execute(paged),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("copies need page_size 1")));
  BatchPlan too_many = plan;
  too_many.ring_copies.assign(5, RingCopy{0, 2, out.data()});
  EXPECT_THAT(executor->Execute(too_many),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("5 ring copies; max_requests_per_batch")));
  EXPECT_OK(executor->Synchronize());
}

TEST_F(CudaExecutorTest, ManyQueuedBatchesReuseStagingSafely) {
  // 40 batches queued back to back without waiting: every plan upload goes
  // through one of two staging buffers, so each is reused many times while
  // earlier copies may be in flight; small plans (InlineWordsLimit) go in
  // the kernel parameters instead, from one host buffer reused at once. Both
  // kinds interleave here; all outputs must still be right.
  CudaExecutorOptions options;
  options.max_slots_per_batch = 1 << 16;
  std::unique_ptr<CudaExecutor> executor;
  CREATE_OR_SKIP(executor, options);
  const int64_t capacity = (1 << 16) + 17;
  ASSERT_OK(executor->InitFreeRing(capacity));
  CpuExecutor cpu;
  ASSERT_OK(cpu.InitFreeRing(capacity));
  const std::vector<int64_t> ring = RandomRing(capacity, rng_);
  ASSERT_OK(cpu.WriteFreeRing(0, ring));
  ASSERT_OK(executor->WriteFreeRing(0, ring));

  constexpr int kBatches = 40;
  std::vector<RandomBatch> batches;
  std::vector<std::unique_ptr<DeviceWords>> outputs;
  for (int i = 0; i < kBatches; ++i) {
    RandomPlanSpec spec;
    spec.page_size = 16;
    spec.num_requests = 1 + rng_() % 2000;
    spec.max_extend = i % 2 == 0 ? 16 : 300;
    spec.max_total_slots = 1 << 16;
    batches.push_back(MakeRandomBatch(spec, capacity, rng_));
    outputs.push_back(
        std::make_unique<DeviceWords>(batches.back().output_words));
    BindDestinations(batches.back(), outputs.back()->data());
    ASSERT_OK(executor->Execute(batches.back().plan));
  }
  ASSERT_OK(executor->Synchronize());
  for (int i = 0; i < kBatches; ++i) {
    SCOPED_TRACE(absl::StrFormat("batch %d", i));
    std::vector<int64_t> expected(batches[i].output_words, kPoison);
    BindDestinations(batches[i], expected.data());
    ASSERT_OK(cpu.Execute(batches[i].plan));
    ASSERT_TRUE(SameWords(outputs[i]->Read(batches[i].output_words), expected));
  }
}

TEST_F(CudaExecutorTest, RingWritesLargerThanStagingRoundTrip) {
  CudaExecutorOptions options;
  options.max_pages_per_ring_write = 1000;
  options.debug_sync = true;
  std::unique_ptr<CudaExecutor> executor;
  CREATE_OR_SKIP(executor, options);
  ASSERT_OK(executor->InitFreeRing(10007));
  std::vector<int64_t> ring = RandomRing(10007, rng_);
  ASSERT_OK(executor->WriteFreeRing(0, ring));
  // A later write over part of it lands in order after the first.
  const std::vector<int64_t> patch = {-1, -2, -3};
  ASSERT_OK(executor->WriteFreeRing(10004, patch));
  std::copy(patch.begin(), patch.end(), ring.begin() + 10004);
  EXPECT_THAT(executor->ReadFreeRing(), ::pagealloc::testing::IsOkAndHolds(
                                            ::testing::ElementsAreArray(ring)));
  EXPECT_THAT(executor->WriteFreeRing(10005, patch),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("[10005, 10008) outside capacity 10007")));
  EXPECT_THAT(executor->InitFreeRing(5),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cannot resize")));
}

TEST_F(CudaExecutorTest, RefusesPlansPastItsLimitsAndBeforeTheRing) {
  CudaExecutorOptions options;
  options.max_requests_per_batch = 4;
  options.max_slots_per_batch = 100;
  std::unique_ptr<CudaExecutor> executor;
  CREATE_OR_SKIP(executor, options);
  DeviceWords out(200);
  BatchPlan plan;
  plan.page_size = 1;
  plan.free_ring_capacity = 1000;
  plan.num_new_pages = 10;
  plan.num_slots = 10;
  plan.requests.push_back({0, 10, -1, 0, 0, out.data()});
  EXPECT_THAT(executor->Execute(plan),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("before InitFreeRing")));
  ASSERT_OK(executor->InitFreeRing(1000));
  ASSERT_OK(executor->WriteFreeRing(0, RandomRing(1000, rng_)));
  EXPECT_OK(executor->Execute(plan));
  BatchPlan too_many = plan;
  too_many.requests.resize(5, PlannedRequest{0, 0, -1, 10, 10, nullptr});
  EXPECT_THAT(executor->Execute(too_many),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("5 requests; max_requests_per_batch is 4")));
  BatchPlan too_long = plan;
  too_long.requests[0].seq_len = 101;
  too_long.num_slots = 101;
  too_long.num_new_pages = 101;
  EXPECT_THAT(executor->Execute(too_long),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("101 slots; max_slots_per_batch is 100")));
  BatchPlan wrong_ring = plan;
  wrong_ring.free_ring_capacity = 999;
  EXPECT_THAT(executor->Execute(wrong_ring),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("free_ring_capacity (999)")));
  EXPECT_OK(executor->Synchronize());
}

// ---------------------------------------------------------------------------
// Two pools, one per executor, driven by the same random operations.

struct PoolParams {
  int64_t page_size;
  FreePolicy policy;
};

class TwoPoolsTest : public ::testing::TestWithParam<PoolParams> {
 protected:
  static constexpr int kOwners = 3;

  void SetUp() override { CREATE_OR_SKIP(cuda_, CudaExecutorOptions{}); }

  // A fresh pair of pools on fresh executors (the mirror is sized once).
  void NewPools() {
    page_size_ = GetParam().page_size;
    num_pages_ = Uniform(200, 3000);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaExecutor> cuda,
                         CudaExecutor::Create(CudaExecutorOptions{}));
    cuda_pool_.reset();
    cuda_ = std::move(cuda);
    cpu_ = std::make_unique<CpuExecutor>();
    const PoolOptions options{num_pages_, page_size_, GetParam().policy};
    ASSERT_OK_AND_ASSIGN(cpu_pool_, PagePool::Create(options, cpu_.get()));
    ASSERT_OK_AND_ASSIGN(cuda_pool_, PagePool::Create(options, cuda_.get()));
    for (OwnerId o = 1; o <= kOwners; ++o) {
      const int64_t quota = o == kOwners ? num_pages_ / 3 : 0;
      ASSERT_OK(cpu_pool_->AddOwner(o, quota));
      ASSERT_OK(cuda_pool_->AddOwner(o, quota));
    }
    live_ = SequenceSet(page_size_);
  }

  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  void StepAllocate() {
    const int n = Uniform(1, 64);
    std::vector<AllocRequest> requests;
    std::vector<int> seq_of;
    std::vector<bool> used(live_.size(), false);
    for (int i = 0; i < n; ++i) {
      AllocRequest r;
      r.index = i;
      int seq_index = -1;
      const int pick = Uniform(0, 9);
      if (pick < 3 || live_.empty()) {
        r.kind = RequestKind::kExtend;
        r.owner = Uniform(1, kOwners);
        r.seq_len = Uniform(0, 4 * page_size_ + 3);
      } else if (pick < 9) {
        seq_index = Uniform(0, live_.size() - 1);
        if (used[seq_index]) continue;
        used[seq_index] = true;
        const LiveSequence& s = live_[seq_index];
        r.owner = s.owner;
        r.last_loc = s.last_loc;
        if (pick < 6) {
          r.kind = RequestKind::kDecode;
          r.seq_len = s.len + 1;
        } else {
          r.kind = RequestKind::kExtend;
          r.prefix_len = s.len;
          r.seq_len = s.len + Uniform(0, 3 * page_size_ + 1);
        }
      } else {
        r.kind = RequestKind::kAlloc;
        r.owner = Uniform(1, kOwners);
        r.seq_len = page_size_ * Uniform(0, 3);
      }
      requests.push_back(r);
      seq_of.push_back(seq_index);
    }
    // Host buffers for the CPU pool; one poisoned device buffer, one
    // region per request, for the CUDA pool.
    // Contiguous regions half the time, as the daemon writes one call's
    // slots: at page size 1 the batch is then one ring copy, else one per
    // request (the pool merges copies whose destinations follow each
    // other).
    const int64_t gap = Uniform(0, 1);
    std::vector<int64_t> offsets(requests.size() + 1, 0);
    for (size_t i = 0; i < requests.size(); ++i) {
      offsets[i + 1] =
          offsets[i] + ToExtendShape(requests[i]).num_slots() + gap;
    }
    std::vector<int64_t> host(offsets.back(), kPoison);
    DeviceWords device(offsets.back());
    std::vector<AllocRequest> cuda_requests = requests;
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i].destination = host.data() + offsets[i];
      cuda_requests[i].destination = device.data() + offsets[i];
    }
    const std::vector<AllocResult> cpu = cpu_pool_->Allocate(requests);
    const std::vector<AllocResult> cuda = cuda_pool_->Allocate(cuda_requests);
    ASSERT_OK(cuda_->Synchronize());
    ASSERT_EQ(cpu.size(), cuda.size());
    for (size_t i = 0; i < cpu.size(); ++i) {
      SCOPED_TRACE(
          absl::StrFormat("request %d: %s", i, cpu[i].status.ToString()));
      ASSERT_EQ(cuda[i].status.code(), cpu[i].status.code()) << cuda[i].status;
      ASSERT_EQ(cuda[i].num_slots, cpu[i].num_slots);
      ASSERT_EQ(cuda[i].num_new_pages, cpu[i].num_new_pages);
      ++outcomes_[cpu[i].status.code()];
    }
    ASSERT_TRUE(SameWords(device.Read(offsets.back()), host));
    // Track sequences from the (now equal) outputs.
    for (size_t i = 0; i < requests.size(); ++i) {
      if (!cpu[i].status.ok() || cpu[i].num_slots == 0) continue;
      const AllocRequest& r = requests[i];
      std::vector<int64_t> out(host.begin() + offsets[i],
                               host.begin() + offsets[i] + cpu[i].num_slots);
      slots_compared_ += out.size();
      const size_t s = seq_of[i] >= 0 ? seq_of[i] : live_.Add(r.owner);
      ASSERT_OK(live_.Record(s, ToExtendShape(r), out));
    }
  }

  void StepFree() {
    if (live_.empty()) return;
    const size_t k = Uniform(0, live_.size() - 1);
    std::vector<int64_t> values = live_.SlotsOf(k);
    const bool as_slots = Uniform(0, 1) == 0;
    if (!as_slots) {
      for (int64_t& v : values) v /= page_size_;
    }
    const OwnerId owner = live_[k].owner;
    absl::StatusOr<int64_t> cpu = as_slots
                                      ? cpu_pool_->FreeSlots(owner, values)
                                      : cpu_pool_->FreePages(owner, values);
    absl::StatusOr<int64_t> cuda = as_slots
                                       ? cuda_pool_->FreeSlots(owner, values)
                                       : cuda_pool_->FreePages(owner, values);
    ASSERT_EQ(cuda.status().code(), cpu.status().code()) << cuda.status();
    if (cpu.ok()) {
      ASSERT_EQ(*cuda, *cpu);
      live_.Remove(k);
    }
  }

  void StepCheckpointOrRollback() {
    const OwnerId o = Uniform(1, kOwners);
    if (Uniform(0, 1) == 0) {
      ASSERT_OK(cpu_pool_->Checkpoint(o));
      ASSERT_OK(cuda_pool_->Checkpoint(o));
      return;
    }
    absl::StatusOr<int64_t> cpu = cpu_pool_->Rollback(o);
    absl::StatusOr<int64_t> cuda = cuda_pool_->Rollback(o);
    ASSERT_EQ(cuda.status().code(), cpu.status().code()) << cuda.status();
    if (cpu.ok()) {
      ASSERT_EQ(*cuda, *cpu);
      rolled_back_ += *cpu;
    }
    ForgetDeadSequences();
  }

  void StepReclaim() {
    const OwnerId o = Uniform(1, kOwners);
    ASSERT_OK_AND_ASSIGN(const int64_t cpu, cpu_pool_->RemoveOwner(o));
    ASSERT_OK_AND_ASSIGN(const int64_t cuda, cuda_pool_->RemoveOwner(o));
    ASSERT_EQ(cuda, cpu);
    const int64_t quota = o == kOwners ? num_pages_ / 3 : 0;
    ASSERT_OK(cpu_pool_->AddOwner(o, quota));
    ASSERT_OK(cuda_pool_->AddOwner(o, quota));
    ForgetDeadSequences();
  }

  void ForgetDeadSequences() {
    live_.RemoveIf([&](const LiveSequence& s) {
      for (int64_t page : s.pages) {
        if (cpu_pool_->OwnerOf(page) != s.owner) return true;
      }
      return false;
    });
  }

  void ExpectSameState() {
    ASSERT_EQ(cuda_pool_->FreeList(), cpu_pool_->FreeList());
    ASSERT_EQ(cuda_pool_->ParkedPages(), cpu_pool_->ParkedPages());
    ASSERT_OK(cpu_pool_->CheckInvariants());
    // Reads the device mirror back and compares it with the host's list.
    ASSERT_OK(cuda_pool_->CheckInvariants());
  }

  std::mt19937_64 rng_{std::random_device{}()};
  int64_t page_size_ = 1;
  int64_t num_pages_ = 0;
  std::unique_ptr<CudaExecutor> cuda_;
  std::unique_ptr<CpuExecutor> cpu_;
  std::unique_ptr<PagePool> cpu_pool_;
  std::unique_ptr<PagePool> cuda_pool_;
  SequenceSet live_{1};
  std::map<absl::StatusCode, int64_t> outcomes_;
  int64_t rolled_back_ = 0;
  int64_t slots_compared_ = 0;
};

TEST_P(TwoPoolsTest, RandomOperationSequencesGiveIdenticalSlots) {
  const uint64_t seed = std::random_device{}();
  rng_.seed(seed);
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  const bool quick = Quick();
  const int sequences = quick ? 2 : 12;
  const int steps = quick ? 30 : 120;
  for (int sequence = 0; sequence < sequences; ++sequence) {
    NewPools();
    if (HasFatalFailure()) return;
    for (int step = 0; step < steps; ++step) {
      SCOPED_TRACE(absl::StrFormat("sequence %d step %d", sequence, step));
      const int op = Uniform(0, 19);
      if (op < 11) {
        StepAllocate();
      } else if (op < 16) {
        StepFree();
      } else if (op < 19) {
        StepCheckpointOrRollback();
      } else {
        StepReclaim();
      }
      if (HasFatalFailure()) return;
      ExpectSameState();
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_GT(outcomes_[absl::StatusCode::kOk], quick ? 50 : 2000);
  EXPECT_GT(slots_compared_, quick ? 500 : 20000);
  if (!quick) {
    EXPECT_GT(outcomes_[absl::StatusCode::kResourceExhausted], 0);
    EXPECT_GT(rolled_back_, 10);
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizesAndPolicies, TwoPoolsTest,
                         ::testing::Values(PoolParams{1, FreePolicy::kLifo},
                                           PoolParams{16, FreePolicy::kLifo},
                                           PoolParams{64, FreePolicy::kLifo},
                                           PoolParams{1, FreePolicy::kSorted},
                                           PoolParams{16, FreePolicy::kSorted},
                                           PoolParams{64, FreePolicy::kSorted}),
                         [](const ::testing::TestParamInfo<PoolParams>& info) {
                           return absl::StrFormat(
                               "PageSize%d%s", info.param.page_size,
                               info.param.policy == FreePolicy::kLifo
                                   ? "Lifo"
                                   : "Sorted");
                         });

}  // namespace
}  // namespace pagealloc
