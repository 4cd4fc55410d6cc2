// The CPU reference executor: the seed's golden vector, and agreement with
// the allocator's FakeExecutor (which allocator/ tests and benchmarks run
// on) over fresh random plans, so that the fake cannot drift from the
// reference.

#include "kernels/cpu_executor.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/fake_executor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/plan_packing.h"
#include "tests/random_plan.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::AddRandomRingCopies;
using ::pagealloc::testing::BindDestinations;
using ::pagealloc::testing::kPoison;
using ::pagealloc::testing::MakeRandomBatch;
using ::pagealloc::testing::RandomBatch;
using ::pagealloc::testing::RandomPlanSpec;
using ::pagealloc::testing::RandomRing;
using ::pagealloc::testing::StatusIs;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The seed's own worked example: page_size 4, prefix 2, seq 11, last_loc 1,
// free pages [3, 4].
TEST(ExpandRequestTest, SeedGoldenVector) {
  const std::vector<int64_t> ring = {3, 4};
  PlannedRequest request{2, 11, 1, 0, 0, nullptr};
  std::vector<int64_t> out(9, -7);
  ExpandRequest(request, 4, ring.data(), ring.size(), 0, out.data());
  EXPECT_THAT(out, ElementsAre(2, 3, 12, 13, 14, 15, 16, 17, 18));
}

struct CrossCheckCase {
  int64_t page_size;
  int64_t num_requests;
  int64_t max_prefix;
  int64_t max_extend;
  double decode_fraction;
};

// Both executors get the same ring and the same plan, each with its own
// poisoned output buffer; the buffers must come out identical, gaps
// between destinations included.
TEST(CpuExecutorTest, FakeExecutorWritesTheSameSlots) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  std::mt19937_64 rng(seed);
  const std::vector<CrossCheckCase> cases = {
      {1, 64, 200, 8, 0.3},      {2, 64, 200, 16, 0.3},
      {3, 64, 200, 16, 0.3},     {16, 256, 4096, 64, 0.3},
      {16, 512, 4096, 1, 1.0},   {64, 32, 4096, 1000, 0.1},
      {100, 32, 1000, 500, 0.2}, {256, 16, 8192, 2000, 0.0},
  };
  constexpr int kRoundsPerCase = 25;
  int64_t slots_compared = 0;
  for (const CrossCheckCase& c : cases) {
    SCOPED_TRACE(absl::StrFormat("page_size %d", c.page_size));
    RandomPlanSpec spec;
    spec.page_size = c.page_size;
    spec.num_requests = c.num_requests;
    spec.max_prefix = c.max_prefix;
    spec.max_extend = c.max_extend;
    spec.decode_fraction = c.decode_fraction;
    // A ring barely larger than the most pages a batch can take (what
    // MakeRandomBatch requires) makes many batches wrap around its end.
    spec.max_total_slots = c.num_requests * c.max_extend;
    const int64_t capacity = spec.max_total_slots + 17;
    for (int round = 0; round < kRoundsPerCase; ++round) {
      const std::vector<int64_t> ring = RandomRing(capacity, rng);
      RandomBatch batch = MakeRandomBatch(spec, capacity, rng);
      CpuExecutor cpu;
      FakeExecutor fake;
      ASSERT_OK(cpu.InitFreeRing(capacity));
      ASSERT_OK(fake.InitFreeRing(capacity));
      ASSERT_OK(cpu.WriteFreeRing(0, ring));
      ASSERT_OK(fake.WriteFreeRing(0, ring));
      std::vector<int64_t> cpu_out(batch.output_words, kPoison);
      std::vector<int64_t> fake_out(batch.output_words, kPoison);
      BindDestinations(batch, cpu_out.data());
      ASSERT_OK(cpu.Execute(batch.plan));
      BindDestinations(batch, fake_out.data());
      ASSERT_OK(fake.Execute(batch.plan));
      // The first difference only: whole buffers would flood the log.
      const auto [cpu_it, fake_it] =
          std::mismatch(cpu_out.begin(), cpu_out.end(), fake_out.begin());
      ASSERT_TRUE(cpu_it == cpu_out.end())
          << "round " << round << ": output word " << (cpu_it - cpu_out.begin())
          << " is " << *fake_it << " from the fake, " << *cpu_it
          << " from the CPU executor";
      slots_compared += batch.plan.num_slots;
    }
  }
  // The plans are not all empty: the comparison covers real work.
  EXPECT_GT(slots_compared, 100000);
}

// A ring copy that wraps: ring positions 3, 0, 1.
TEST(CpuExecutorTest, RingCopyWrapsAroundTheRingEnd) {
  CpuExecutor cpu;
  ASSERT_OK(cpu.InitFreeRing(4));
  ASSERT_OK(cpu.WriteFreeRing(0, {5, 6, 7, 8}));
  std::vector<int64_t> out(5, -7);
  BatchPlan plan;
  plan.page_size = 1;
  plan.free_ring_head = 2;
  plan.free_ring_capacity = 4;
  plan.num_new_pages = 4;
  plan.num_slots = 3;
  plan.ring_copies.push_back({1, 3, out.data() + 1});
  ASSERT_OK(cpu.Execute(plan));
  EXPECT_THAT(out, ElementsAre(-7, 8, 5, 6, -7));
}

TEST(CpuExecutorTest, RefusesRingCopiesOutOfShapeWritingNothing) {
  CpuExecutor cpu;
  ASSERT_OK(cpu.InitFreeRing(8));
  ASSERT_OK(cpu.WriteFreeRing(0, {1, 2, 3, 4, 5, 6, 7, 8}));
  std::vector<int64_t> out(8, -7);
  BatchPlan plan;
  plan.page_size = 1;
  plan.free_ring_capacity = 8;
  plan.num_new_pages = 4;
  plan.num_slots = 4;
  plan.ring_copies.push_back({0, 2, out.data()});
  plan.ring_copies.push_back({2, 3, out.data() + 2});  // past the 4 pages
  EXPECT_THAT(cpu.Execute(plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ring_copies[1]: entries [2, 5) outside the "
                                 "batch's 4 new pages")));
  plan.ring_copies[1] = {2, 2, nullptr};
  EXPECT_THAT(cpu.Execute(plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ring_copies[1] has no destination")));
  plan.ring_copies[1] = {2, 2, out.data() + 2};
  plan.page_size = 2;
  EXPECT_THAT(cpu.Execute(plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("copies need page_size 1")));
  EXPECT_THAT(out, Each(-7));
  plan.page_size = 1;
  ASSERT_OK(cpu.Execute(plan));
  EXPECT_THAT(out, ElementsAre(1, 2, 3, 4, -7, -7, -7, -7));
}

// Random page-size-1 plans of requests and ring copies: the CPU executor,
// the fake, and the CPU executor on the plan rewritten as requests only
// (RingCopiesAsRequests, the CUDA executor's kernel route) write the same
// buffer, and each copy holds its ring entries.
TEST(CpuExecutorTest, RingCopiesMatchTheirRequestForm) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  std::mt19937_64 rng(seed);
  constexpr int64_t kCapacity = 5017;
  int64_t copied = 0;
  for (int round = 0; round < 200; ++round) {
    RandomPlanSpec spec;
    spec.page_size = 1;
    spec.num_requests = rng() % 3 == 0 ? 0 : 1 + rng() % 20;
    spec.max_prefix = 100;
    spec.max_extend = 8;
    spec.max_total_slots = 200;
    RandomBatch batch = MakeRandomBatch(spec, kCapacity, rng);
    AddRandomRingCopies(batch, 1 + rng() % 8, 1 + rng() % 600, rng);
    const std::vector<int64_t> ring = RandomRing(kCapacity, rng);
    CpuExecutor cpu;
    FakeExecutor fake;
    ASSERT_OK(cpu.InitFreeRing(kCapacity));
    ASSERT_OK(fake.InitFreeRing(kCapacity));
    ASSERT_OK(cpu.WriteFreeRing(0, ring));
    ASSERT_OK(fake.WriteFreeRing(0, ring));
    std::vector<int64_t> cpu_out(batch.output_words, kPoison);
    BindDestinations(batch, cpu_out.data());
    ASSERT_OK(cpu.Execute(batch.plan));
    for (const RingCopy& copy : batch.plan.ring_copies) {
      for (int64_t j = 0; j < copy.count; ++j) {
        ASSERT_EQ(copy.destination[j],
                  ring[(batch.plan.free_ring_head + copy.ring_offset + j) %
                       kCapacity]);
      }
      copied += copy.count;
    }
    std::vector<int64_t> fake_out(batch.output_words, kPoison);
    BindDestinations(batch, fake_out.data());
    ASSERT_OK(fake.Execute(batch.plan));
    ASSERT_EQ(fake_out, cpu_out) << "round " << round;
    std::vector<int64_t> as_requests_out(batch.output_words, kPoison);
    BindDestinations(batch, as_requests_out.data());
    BatchPlan as_requests;
    RingCopiesAsRequests(batch.plan, &as_requests);
    ASSERT_TRUE(as_requests.ring_copies.empty());
    ASSERT_EQ(as_requests.requests.size(),
              batch.plan.requests.size() + batch.plan.ring_copies.size());
    ASSERT_OK(ValidatePlan(as_requests, kCapacity).status());
    ASSERT_OK(cpu.Execute(as_requests));
    ASSERT_EQ(as_requests_out, cpu_out) << "round " << round;
  }
  EXPECT_GT(copied, 50000);
}

// Scrubbing zeroes exactly the listed pages' slots, in every buffer, and
// nothing else; a plan that lists pages without a KV target is refused.
TEST(CpuExecutorTest, ScrubZeroesTheListedPagesInEveryBuffer) {
  constexpr int64_t kPageSize = 3;
  constexpr int64_t kPages = 5;  // 0..4
  const int64_t strides[] = {2, 7};
  std::vector<std::vector<char>> memory;
  KvScrubTarget target;
  target.page_size = kPageSize;
  for (int64_t stride : strides) {
    memory.emplace_back(kPages * kPageSize * stride, '\x5a');
    target.buffers.push_back({memory.back().data(), stride});
  }
  CpuExecutor executor;
  ASSERT_OK(executor.InitFreeRing(4));
  ASSERT_OK(executor.WriteFreeRing(0, {1, 2, 3, 4}));
  BatchPlan plan;
  plan.page_size = kPageSize;
  plan.free_ring_capacity = 4;
  plan.num_new_pages = 2;
  plan.scrub_pages = {3, 1};
  EXPECT_THAT(executor.Execute(plan),
              pagealloc::testing::StatusIs(
                  absl::StatusCode::kInternal,
                  ::testing::HasSubstr("the plan scrubs 2 pages of 3 slots")));
  for (const auto& buffer : memory) {
    EXPECT_TRUE(std::all_of(buffer.begin(), buffer.end(),
                            [](char c) { return c == '\x5a'; }));
  }
  executor.SetKvScrubTarget(target);
  ASSERT_OK(executor.Execute(plan));
  for (size_t b = 0; b < memory.size(); ++b) {
    for (int64_t slot = 0; slot < kPages * kPageSize; ++slot) {
      const int64_t page = slot / kPageSize;
      const char expected = page == 1 || page == 3 ? 0 : '\x5a';
      for (int64_t byte = 0; byte < strides[b]; ++byte) {
        ASSERT_EQ(memory[b][slot * strides[b] + byte], expected)
            << "buffer " << b << " slot " << slot << " byte " << byte;
      }
    }
  }
}

}  // namespace
}  // namespace pagealloc
