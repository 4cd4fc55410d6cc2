// PackPlan's validation and layout, and the expand kernels' per-thread code
// (kernels/expand_plan.h) run on the host: every block and thread of each
// kernel variant is emulated over fresh random plans and the whole output
// is compared with the CPU reference. This checks, without a GPU, the exact
// functions the GPU kernels call; tests/gpu checks the kernels themselves.

#include "kernels/plan_packing.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/plan_expansion.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/expand_plan.h"
#include "tests/random_plan.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::BindDestinations;
using ::pagealloc::testing::kPoison;
using ::pagealloc::testing::MakeExtendBatch;
using ::pagealloc::testing::MakeRandomBatch;
using ::pagealloc::testing::RandomBatch;
using ::pagealloc::testing::RandomPlanSpec;
using ::pagealloc::testing::RandomRing;
using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

enum class Variant { kPerRequest, kTile1, kTile4, kTile8, kChunk };

// Runs every thread of one launch of `variant` on the host, over `plan`
// (an UploadedPlan or an InlinePlan) whose largest request writes
// max_request_slots slots (the chunk kernel's grid).
template <bool kPow2, class Plan>
void EmulateLaunch(const Plan& plan, Variant variant, int page_shift,
                   int64_t max_request_slots) {
  const int64_t threads = kExpandThreads;
  switch (variant) {
    case Variant::kChunk: {
      // Blocks in any order give the same output: no two threads write the
      // same slot. Each block's threads run in order.
      const int64_t chunks = ChunksPerRequest(max_request_slots);
      for (int64_t r = 0; r < plan.num_requests(); ++r) {
        for (int64_t c = 0; c < chunks; ++c) {
          for (int t = 0; t < threads; ++t) {
            ExpandChunkThread<kPow2>(plan, page_shift, c, r, t);
          }
        }
      }
      break;
    }
    case Variant::kPerRequest: {
      const int64_t blocks = (plan.num_requests() + threads - 1) / threads;
      for (int64_t r = 0; r < blocks * threads; ++r) {
        ExpandRequestThread<kPow2>(plan, page_shift, r);
      }
      break;
    }
    case Variant::kTile1:
    case Variant::kTile4:
    case Variant::kTile8: {
      const int per_thread = variant == Variant::kTile1   ? 1
                             : variant == Variant::kTile4 ? 4
                                                          : 8;
      const int64_t tile = kExpandTileSlots * per_thread;
      const int64_t blocks = (plan.num_slots() + tile - 1) / tile;
      for (int64_t b = 0; b < blocks; ++b) {
        for (int t = 0; t < threads; ++t) {
          if (per_thread == 1) {
            ExpandTileThread<kPow2, 1>(plan, page_shift, b, t);
          } else if (per_thread == 4) {
            ExpandTileThread<kPow2, 4>(plan, page_shift, b, t);
          } else {
            ExpandTileThread<kPow2, 8>(plan, page_shift, b, t);
          }
        }
      }
      break;
    }
  }
}

template <bool kPow2>
void EmulateLaunch(const ExpandParams& params, Variant variant,
                   int page_shift) {
  EmulateLaunch<kPow2>(UploadedPlan(params), variant, page_shift,
                       params.max_request_slots);
}

// Runs every thread of the inline decode kernel on the host.
void EmulateInlineDecode(const MaxInlineExpandParams& params) {
  const int64_t n = params.header.num_requests;
  const int64_t blocks = (n + kExpandThreads - 1) / kExpandThreads;
  for (int64_t r = 0; r < blocks * kExpandThreads; ++r) {
    ExpandDecodeThread(params, r);
  }
}

class PlanPackingTest : public ::testing::Test {
 protected:
  // Packs `batch`, emulates `variant` (with and without the power-of-two
  // path where it applies) and compares the whole output buffer with
  // ExpandRequest's.
  void ExpectEmulationMatchesReference(RandomBatch& batch,
                                       const std::vector<int64_t>& ring,
                                       Variant variant) {
    const BatchPlan& plan = batch.plan;
    std::vector<int64_t> expected(batch.output_words, kPoison);
    BindDestinations(batch, expected.data());
    for (const PlannedRequest& request : plan.requests) {
      ExpandRequest(request, plan.page_size, ring.data(), ring.size(),
                    plan.free_ring_head, request.destination);
    }
    std::vector<int64_t> block(
        MaxPackedPlanBytes(plan.requests.size(), plan.num_slots) / 8);
    const int shift = PageShift(plan.page_size);
    for (const bool pow2 : {false, true}) {
      if (pow2 && shift < 0) continue;
      std::vector<int64_t> actual(batch.output_words, kPoison);
      BindDestinations(batch, actual.data());
      ASSERT_OK_AND_ASSIGN(
          const PackedPlan packed,
          PackPlan(batch.plan, ring.size(), absl::MakeSpan(block)));
      ASSERT_LE(packed.bytes, 8 * static_cast<int64_t>(block.size()));
      if (packed.num_requests > 0) {
        const ExpandParams params = MakeExpandParams(
            packed, block.data(), ring.data(), ring.size(), plan.page_size);
        if (pow2) {
          EmulateLaunch<true>(params, variant, shift);
        } else {
          EmulateLaunch<false>(params, variant, 0);
        }
      }
      ASSERT_EQ(actual, expected)
          << "variant " << static_cast<int>(variant) << " pow2 " << pow2;

      // The same variant over the plan packed into kernel parameters, when
      // it fits; the decode kernel when every request writes one slot.
      std::vector<int64_t> inline_actual(batch.output_words, kPoison);
      BindDestinations(batch, inline_actual.data());
      ASSERT_OK_AND_ASSIGN(const bool fits,
                           PackInlinePlan(batch.plan, ring.size(), ring.data(),
                                          inline_params_.get()));
      if (!fits) continue;
      ++inline_runs_;
      const InlinePlanHeader& header = inline_params_->header;
      ASSERT_EQ(header.page_shift, shift);
      if (header.kind == kInlineDecode) {
        ++inline_decode_runs_;
        EmulateInlineDecode(*inline_params_);
      } else {
        const InlinePlan<kMaxInlineWords> view(*inline_params_);
        if (pow2) {
          EmulateLaunch<true>(view, variant, shift, header.max_request_slots);
        } else {
          EmulateLaunch<false>(view, variant, 0, header.max_request_slots);
        }
      }
      ASSERT_EQ(inline_actual, expected)
          << "inline, variant " << static_cast<int>(variant) << " pow2 "
          << pow2;
    }
  }

  std::unique_ptr<MaxInlineExpandParams> inline_params_ =
      std::make_unique<MaxInlineExpandParams>();
  int64_t inline_runs_ = 0;
  int64_t inline_decode_runs_ = 0;

  std::mt19937_64 rng_{std::random_device{}()};
};

TEST_F(PlanPackingTest, EmulatedKernelsMatchReferenceOnRandomPlans) {
  const uint64_t seed = std::random_device{}();
  rng_.seed(seed);
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  for (const int64_t page_size : {1, 2, 3, 16, 64}) {
    for (int trial = 0; trial < 40; ++trial) {
      RandomPlanSpec spec;
      spec.page_size = page_size;
      spec.num_requests = 1 + rng_() % (trial % 4 == 0 ? 600 : 40);
      spec.max_prefix = 1 + rng_() % 300;
      // Small extends (the per-request kernel's range), large ones, mixed.
      spec.max_extend = trial % 3 == 0 ? 16 : 1 + rng_() % 3000;
      spec.decode_fraction = trial % 5 == 0 ? 1.0 : 0.3;
      spec.max_total_slots = 1 << 16;
      const int64_t capacity = spec.max_total_slots + rng_() % 100;
      std::vector<int64_t> ring = RandomRing(capacity, rng_);
      RandomBatch batch = MakeRandomBatch(spec, capacity, rng_);
      SCOPED_TRACE(absl::StrFormat(
          "page_size %d trial %d: %d requests, %d slots, head %d", page_size,
          trial, batch.plan.requests.size(), batch.plan.num_slots,
          batch.plan.free_ring_head));
      for (Variant variant :
           {Variant::kPerRequest, Variant::kTile1, Variant::kTile4,
            Variant::kTile8, Variant::kChunk}) {
        int64_t max_slots = 0;
        for (const PlannedRequest& r : batch.plan.requests) {
          max_slots = std::max(max_slots, r.seq_len - r.prefix_len);
        }
        // The per-request kernel is only launched for small requests.
        if (variant == Variant::kPerRequest &&
            !UsesPerRequestKernel(max_slots)) {
          continue;
        }
        ExpectEmulationMatchesReference(batch, ring, variant);
        if (HasFatalFailure()) return;
      }
    }
  }
  // Both inline layouts were exercised, not only the uploaded block.
  EXPECT_GT(inline_runs_, 100);
  EXPECT_GT(inline_decode_runs_, 5);
}

TEST_F(PlanPackingTest, InlinePlansStayWithinTheirKernelsLimit) {
  // Decodes: 2 words each, 2 KB tier: 122 fit, 123 are uploaded.
  std::vector<int64_t> ring = RandomRing(1000, rng_);
  std::vector<int64_t> out(2000, kPoison);
  auto decodes = [&](int64_t n) {
    BatchPlan plan;
    plan.page_size = 16;
    plan.free_ring_capacity = 1000;
    for (int64_t i = 0; i < n; ++i) {
      // Every other decode starts a page.
      const int64_t prefix = i % 2 == 0 ? 32 : 33;
      plan.requests.push_back({prefix, prefix + 1,
                               16 * (500 + i) + 15 - (i % 2 == 0 ? 0 : 15),
                               plan.num_new_pages, i, out.data() + i});
      plan.num_new_pages += i % 2 == 0 ? 1 : 0;
      ++plan.num_slots;
    }
    return plan;
  };
  auto params = std::make_unique<MaxInlineExpandParams>();
  EXPECT_THAT(PackInlinePlan(decodes(122), 1000, ring.data(), params.get()),
              ::pagealloc::testing::IsOkAndHolds(true));
  EXPECT_EQ(params->header.kind, kInlineDecode);
  EXPECT_LE(params->header.words_used, kInlineTierWords[0]);
  EXPECT_THAT(PackInlinePlan(decodes(123), 1000, ring.data(), params.get()),
              ::pagealloc::testing::IsOkAndHolds(false));
  // 200 requests of 40 slots (tiled): 700 words, the 8 KB tier.
  BatchPlan plan;
  plan.page_size = 16;
  plan.free_ring_capacity = 1000;
  std::vector<int64_t> big(8000, kPoison);
  for (int64_t i = 0; i < 200; ++i) {
    plan.requests.push_back({0, 40, -1, plan.num_new_pages, plan.num_slots,
                             big.data() + plan.num_slots});
    plan.num_new_pages += 3;
    plan.num_slots += 40;
  }
  EXPECT_THAT(PackInlinePlan(plan, 1000, ring.data(), params.get()),
              ::pagealloc::testing::IsOkAndHolds(true));
  EXPECT_EQ(params->header.words_used, InlineGeneralWords(200));
  EXPECT_GT(params->header.words_used, kInlineTierWords[0]);
}

TEST_F(PlanPackingTest, EmulatedChunkKernelMatchesReferenceOnLongExtends) {
  // Long extends, the chunk kernel's shape: lengths at and around its chunk
  // boundaries and random ones up to several chunks, every page size kind,
  // destinations at odd and even slots (16-byte aligned or not), prefixes
  // ending inside a page or on its end, heads that make pages wrap.
  const uint64_t seed = std::random_device{}();
  rng_.seed(seed);
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  const std::vector<int64_t> edges = {1,
                                      2,
                                      3,
                                      kChunkSlots - 1,
                                      kChunkSlots,
                                      kChunkSlots + 1,
                                      2 * kChunkSlots - 1,
                                      2 * kChunkSlots,
                                      2 * kChunkSlots + 1};
  int64_t odd_outputs = 0;
  int64_t partial_prefixes = 0;
  for (const int64_t page_size : {1, 3, 16, 64}) {
    for (int trial = 0; trial < 12; ++trial) {
      std::vector<int64_t> extends;
      const int64_t n = 1 + rng_() % 8;
      for (int64_t k = 0; k < n; ++k) {
        extends.push_back(trial % 2 == 0 ? edges[rng_() % edges.size()]
                                         : 1 + rng_() % (5 * kChunkSlots));
      }
      int64_t total = 0;
      for (int64_t e : extends) total += e;
      // Room for every page, and a head anywhere: pages wrap often.
      const int64_t capacity = total + 8 + rng_() % 100;
      const std::vector<int64_t> ring = RandomRing(capacity, rng_);
      RandomBatch batch = MakeExtendBatch(page_size, extends, capacity, rng_);
      SCOPED_TRACE(absl::StrFormat(
          "page_size %d trial %d: %d requests, %d slots, head %d", page_size,
          trial, batch.plan.requests.size(), batch.plan.num_slots,
          batch.plan.free_ring_head));
      for (size_t k = 0; k < batch.plan.requests.size(); ++k) {
        odd_outputs += batch.destination_offset[k] % 2;
        partial_prefixes += batch.plan.requests[k].prefix_len % page_size != 0;
      }
      ExpectEmulationMatchesReference(batch, ring, Variant::kChunk);
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_GT(odd_outputs, 20);
  EXPECT_GT(partial_prefixes, 20);
}

TEST_F(PlanPackingTest, ChunkKernelStoresAlignedPairsAfterAnOddHead) {
  // One request whose output starts at an odd slot of a 16-byte aligned
  // buffer: slot 0 is stored alone, then pairs. Page size 4, head at the
  // ring's last position: 2 slots finish prefix page 6, then pages ring[3]
  // = 7 and ring[0] = 5.
  std::vector<int64_t> ring = {5, 9, 2, 7};
  BatchPlan plan;
  plan.page_size = 4;
  plan.free_ring_capacity = 4;
  plan.free_ring_head = 3;
  plan.num_new_pages = 2;
  plan.num_slots = 10;
  alignas(16) int64_t out[12];
  std::fill(std::begin(out), std::end(out), kPoison);
  plan.requests.push_back({2, 12, 6 * 4 + 1, 0, 0, out + 1});
  std::vector<int64_t> block(MaxPackedPlanBytes(1, 10) / 8);
  ASSERT_OK_AND_ASSIGN(const PackedPlan packed,
                       PackPlan(plan, 4, absl::MakeSpan(block)));
  EmulateLaunch<true>(MakeExpandParams(packed, block.data(), ring.data(), 4, 4),
                      Variant::kChunk, 2);
  EXPECT_THAT(out, ::testing::ElementsAre(kPoison, 26, 27, 28, 29, 30, 31, 20,
                                          21, 22, 23, kPoison));
}

TEST_F(PlanPackingTest, PagesWrapAroundTheRingEnd) {
  // Head at the last ring position: the second page comes from position 0.
  std::vector<int64_t> ring = {5, 9, 2, 7};
  BatchPlan plan;
  plan.page_size = 4;
  plan.free_ring_capacity = 4;
  plan.free_ring_head = 3;
  plan.num_new_pages = 3;
  plan.num_slots = 10;
  std::vector<int64_t> out(10, kPoison);
  plan.requests.push_back({2, 12, 6 * 4 + 1, 0, 0, out.data()});
  std::vector<int64_t> block(MaxPackedPlanBytes(1, 10) / 8);
  ASSERT_OK_AND_ASSIGN(const PackedPlan packed,
                       PackPlan(plan, 4, absl::MakeSpan(block)));
  EmulateLaunch<true>(MakeExpandParams(packed, block.data(), ring.data(), 4, 4),
                      Variant::kTile1, 2);
  // 2 slots finish page 6, then pages ring[3] = 7, ring[0] = 5.
  EXPECT_EQ(out,
            (std::vector<int64_t>{26, 27, 28, 29, 30, 31, 20, 21, 22, 23}));
}

TEST_F(PlanPackingTest, RequestsWithoutSlotsAreLeftOut) {
  std::vector<int64_t> out(3, kPoison);
  BatchPlan plan;
  plan.page_size = 16;
  plan.free_ring_capacity = 8;
  plan.num_new_pages = 1;
  plan.num_slots = 3;
  plan.requests.push_back({5, 5, 20, 0, 0, nullptr});
  plan.requests.push_back({0, 3, -1, 0, 0, out.data()});
  plan.requests.push_back({7, 7, 30, 1, 3, nullptr});
  std::vector<int64_t> block(MaxPackedPlanBytes(3, 3) / 8);
  ASSERT_OK_AND_ASSIGN(const PackedPlan packed,
                       PackPlan(plan, 8, absl::MakeSpan(block)));
  EXPECT_EQ(packed.num_requests, 1);
  EXPECT_EQ(packed.num_slots, 3);
  EXPECT_EQ(packed.max_request_slots, 3);

  plan.requests.resize(1);
  plan.num_new_pages = 0;
  plan.num_slots = 0;
  ASSERT_OK_AND_ASSIGN(const PackedPlan empty,
                       PackPlan(plan, 8, absl::MakeSpan(block)));
  EXPECT_EQ(empty.num_requests, 0);
}

TEST_F(PlanPackingTest, RejectsInconsistentPlans) {
  std::vector<int64_t> out(40, kPoison);
  auto make = [&] {
    BatchPlan plan;
    plan.page_size = 16;
    plan.free_ring_capacity = 8;
    plan.free_ring_head = 2;
    plan.num_new_pages = 4;
    plan.num_slots = 40;
    plan.requests.push_back({0, 20, -1, 0, 0, out.data()});
    plan.requests.push_back({0, 20, -1, 2, 20, out.data() + 20});
    return plan;
  };
  std::vector<int64_t> block(MaxPackedPlanBytes(2, 40) / 8);
  auto pack = [&](const BatchPlan& plan) {
    return PackPlan(plan, 8, absl::MakeSpan(block)).status();
  };
  EXPECT_OK(pack(make()));

  BatchPlan plan = make();
  plan.requests[1].output_offset = 19;
  EXPECT_THAT(pack(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("requests[1].output_offset")));
  plan = make();
  plan.requests[1].destination = nullptr;
  EXPECT_THAT(pack(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("no destination")));
  plan = make();
  plan.requests[1].first_new_page = 3;  // pages [3, 5) of the batch's 4
  EXPECT_THAT(pack(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("pages [3, 5) outside")));
  plan = make();
  plan.requests[0].seq_len = -1;
  EXPECT_THAT(pack(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("requests[0]: seq_len (-1)")));
  plan = make();
  plan.num_slots = 41;
  EXPECT_THAT(pack(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("num_slots (41)")));
  plan = make();
  plan.free_ring_capacity = 9;
  EXPECT_THAT(pack(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("free_ring_capacity (9)")));
  plan = make();
  plan.free_ring_head = 8;
  EXPECT_THAT(pack(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("free_ring_head (8)")));
  plan = make();
  plan.num_new_pages = 9;
  EXPECT_THAT(pack(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("num_new_pages (9)")));
  plan = make();
  plan.page_size = 0;
  EXPECT_THAT(pack(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("page_size (0)")));

  std::vector<int64_t> small(MaxPackedPlanBytes(2, 40) / 8 - 1);
  EXPECT_THAT(
      PackPlan(make(), 8, absl::MakeSpan(small)).status(),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("needs")));
}

TEST_F(PlanPackingTest, TileMarksNameTheRequestOfEveryTilesFirstSlot) {
  // Requests of 100, 300 and 200 slots: tiles start at slots 0, 256, 512.
  std::vector<int64_t> out(600, kPoison);
  BatchPlan plan;
  plan.page_size = 1;
  plan.free_ring_capacity = 1000;
  plan.num_new_pages = 600;
  plan.num_slots = 600;
  plan.requests.push_back({0, 100, -1, 0, 0, out.data()});
  plan.requests.push_back({0, 300, -1, 100, 100, out.data() + 100});
  plan.requests.push_back({0, 200, -1, 400, 400, out.data() + 400});
  std::vector<int64_t> block(MaxPackedPlanBytes(3, 600) / 8);
  ASSERT_OK_AND_ASSIGN(const PackedPlan packed,
                       PackPlan(plan, 1000, absl::MakeSpan(block)));
  ASSERT_EQ(packed.num_tile_marks, 4);
  const int64_t* marks = block.data() + packed.tile_first_request_offset / 8;
  EXPECT_EQ(marks[0], 0);
  EXPECT_EQ(marks[1], 1);  // slot 256
  EXPECT_EQ(marks[2], 2);  // slot 512
  EXPECT_EQ(marks[3], 2);  // the last request
  const int64_t* slot_begin = block.data() + packed.slot_begin_offset / 8;
  EXPECT_EQ(slot_begin[3], 600);
}

// The local expansion's variant (LastLocPlan): the plan carries each
// request's batch index where last_loc goes, and the kernel reads last_loc
// from the caller's array. Emulated over random plans, every variant must
// write what the reference writes from the plan with last_loc in it.
class LastLocPlanTest : public PlanPackingTest {
 protected:
  // Runs `variant` over `batch` with its last_locs moved to an array and
  // returns the whole output buffer; `error` receives the kernel's report.
  std::vector<int64_t> RunLastLoc(RandomBatch& batch,
                                  const std::vector<int64_t>& ring,
                                  Variant variant, int64_t slot_limit,
                                  bool pow2,
                                  std::vector<int64_t>* last_locs_override,
                                  unsigned long long error[2]) {
    BatchPlan indexed = batch.plan;
    std::vector<int64_t> last_locs;
    for (size_t k = 0; k < indexed.requests.size(); ++k) {
      last_locs.push_back(indexed.requests[k].last_loc);
      indexed.requests[k].last_loc = static_cast<int64_t>(k);
    }
    if (last_locs_override != nullptr) last_locs = *last_locs_override;
    std::vector<int64_t> actual(batch.output_words, kPoison);
    RandomBatch bound = batch;
    bound.plan = indexed;
    BindDestinations(bound, actual.data());
    std::vector<int64_t> block(
        MaxPackedPlanBytes(indexed.requests.size(), indexed.num_slots) / 8);
    const absl::StatusOr<PackedPlan> packed =
        PackPlan(bound.plan, ring.size(), absl::MakeSpan(block));
    EXPECT_TRUE(packed.ok()) << packed.status();
    if (!packed.ok() || packed->num_requests == 0) return actual;
    const ExpandParams params = MakeExpandParams(
        *packed, block.data(), ring.data(), ring.size(), indexed.page_size);
    const DeviceLastLoc device{last_locs.data(), slot_limit, error};
    const LastLocPlan plan(params, device);
    const int shift = PageShift(indexed.page_size);
    if (pow2) {
      EmulateLaunch<true>(plan, variant, shift, params.max_request_slots);
    } else {
      EmulateLaunch<false>(plan, variant, 0, params.max_request_slots);
    }
    return actual;
  }
};

TEST_F(LastLocPlanTest, EmulatedKernelsMatchReferenceOnRandomPlans) {
  const uint64_t seed = std::random_device{}();
  rng_.seed(seed);
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  for (const int64_t page_size : {1, 3, 16, 64}) {
    for (int trial = 0; trial < 12; ++trial) {
      RandomPlanSpec spec;
      spec.page_size = page_size;
      spec.num_requests = 1 + rng_() % 300;
      spec.max_prefix = 1 + rng_() % 300;
      spec.max_extend = trial % 3 == 0 ? 16 : 1 + rng_() % 3000;
      spec.decode_fraction = trial % 4 == 0 ? 1.0 : 0.3;
      spec.max_total_slots = 1 << 16;
      const int64_t capacity = spec.max_total_slots + rng_() % 100;
      std::vector<int64_t> ring = RandomRing(capacity, rng_);
      RandomBatch batch = MakeRandomBatch(spec, capacity, rng_);
      std::vector<int64_t> expected(batch.output_words, kPoison);
      BindDestinations(batch, expected.data());
      for (const PlannedRequest& request : batch.plan.requests) {
        ExpandRequest(request, page_size, ring.data(), ring.size(),
                      batch.plan.free_ring_head, request.destination);
      }
      int64_t max_slots = 0;
      for (const PlannedRequest& r : batch.plan.requests) {
        max_slots = std::max(max_slots, r.seq_len - r.prefix_len);
      }
      const int64_t slot_limit = (capacity + 2000) * page_size;
      for (Variant variant : {Variant::kPerRequest, Variant::kTile1,
                              Variant::kTile8, Variant::kChunk}) {
        if (variant == Variant::kPerRequest &&
            !UsesPerRequestKernel(max_slots)) {
          continue;
        }
        for (const bool pow2 : {false, true}) {
          if (pow2 && PageShift(page_size) < 0) continue;
          SCOPED_TRACE(absl::StrFormat(
              "page_size %d trial %d variant %d pow2 %d: %d requests",
              page_size, trial, static_cast<int>(variant), pow2,
              batch.plan.requests.size()));
          unsigned long long error[2] = {0, 0};
          EXPECT_EQ(RunLastLoc(batch, ring, variant, slot_limit, pow2, nullptr,
                               error),
                    expected);
          EXPECT_EQ(error[0], 0u);
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST_F(LastLocPlanTest, RefusedLastLocGoesToPageZeroAndIsReported) {
  // Three extends at page size 16 continuing their prefix pages: prefix 5
  // (last_loc at offset 4 of its page), 3 new slots each.
  constexpr int64_t kPageSize = 16;
  RandomBatch batch;
  batch.plan.page_size = kPageSize;
  batch.plan.free_ring_head = 0;
  batch.plan.free_ring_capacity = 4;
  for (int64_t k = 0; k < 3; ++k) {
    PlannedRequest& r = batch.plan.requests.emplace_back();
    r.prefix_len = 5;
    r.seq_len = 8;
    r.last_loc = (k + 1) * kPageSize + 4;
    r.output_offset = 3 * k;
    batch.destination_offset.push_back(3 * k);
  }
  batch.plan.num_slots = 9;
  batch.output_words = 9;
  const std::vector<int64_t> ring = {7, 8, 9, 10};
  const int64_t slot_limit = 11 * kPageSize;
  // Request 1 names page 0; request 2 an offset whose slots would cross
  // into the next page (14 + 3 >= 16).
  std::vector<int64_t> last_locs = {kPageSize + 4, 4, 3 * kPageSize + 14};
  unsigned long long error[2] = {0, 0};
  const std::vector<int64_t> out =
      RunLastLoc(batch, ring, Variant::kPerRequest, slot_limit,
                 /*pow2=*/true, &last_locs, error);
  EXPECT_EQ(out, (std::vector<int64_t>{21, 22, 23, 0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(error[0], 2u);  // request 1, the first refused
  EXPECT_EQ(error[1], 4u);
  // Past the slab's end.
  last_locs = {11 * kPageSize + 4, kPageSize + 4, kPageSize + 4};
  error[0] = error[1] = 0;
  RunLastLoc(batch, ring, Variant::kTile1, slot_limit, /*pow2=*/false,
             &last_locs, error);
  EXPECT_EQ(error[0], 1u);
  EXPECT_EQ(error[1], static_cast<unsigned long long>(11 * kPageSize + 4));
}

// The client's local decode (LocalDecodeParams): packed on the host, every
// thread of its kernel emulated. Request r writes the first slot of the
// next new page when it takes one, else the slot after its last_loc.
class LocalDecodeTest : public ::testing::Test {
 protected:
  // Packs and runs the decode; returns out (one word past it poisoned).
  std::vector<int64_t> Run(const std::vector<int64_t>& new_pages,
                           const std::vector<int64_t>& pages,
                           const std::vector<int64_t>& last_locs,
                           int64_t page_size, int64_t slot_limit,
                           unsigned long long error[2]) {
    std::vector<int64_t> out(new_pages.size() + 1, kPoison);
    LocalDecodeHeader header;
    header.last_loc = DeviceLastLoc{last_locs.data(), slot_limit, error};
    header.out = out.data();
    header.page_size = page_size;
    const absl::StatusOr<bool> packed =
        PackLocalDecode(new_pages, pages, header, params_.get());
    EXPECT_TRUE(packed.ok() && *packed) << packed.status();
    const int64_t n = params_->header.num_requests;
    EXPECT_EQ(n, static_cast<int64_t>(new_pages.size()));
    const int64_t blocks = (n + kExpandThreads - 1) / kExpandThreads;
    for (int64_t r = 0; r < blocks * kExpandThreads; ++r) {
      ExpandLocalDecodeThread(*params_, r);
    }
    return out;
  }

  std::unique_ptr<MaxLocalDecodeParams> params_ =
      std::make_unique<MaxLocalDecodeParams>();
};

TEST_F(LocalDecodeTest, WritesEachRequestsSlotOnRandomBatches) {
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  for (const int64_t page_size : {1, 3, 16, 64}) {
    for (const int64_t n : {int64_t{1}, int64_t{2}, int64_t{255}, int64_t{500},
                            int64_t{501}, kMaxLocalDecodeRequests}) {
      const int64_t num_pages = int64_t{1} << 30;  // ids up to 2^30
      const int64_t slot_limit = (num_pages + 1) * page_size;
      std::vector<int64_t> new_pages(n);
      std::vector<int64_t> pages;
      std::vector<int64_t> last_locs(n);
      std::vector<int64_t> expected(n + 1, kPoison);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t page = 1 + static_cast<int64_t>(rng() % num_pages);
        const int64_t offset = static_cast<int64_t>(rng() % page_size);
        // A request continues its page unless the slot after last_loc
        // starts a new one (the host's plan: NewPagesNeeded).
        last_locs[r] = page * page_size + offset;
        new_pages[r] = page_size == 1 || offset == page_size - 1 ? 1 : 0;
        if (new_pages[r] == 1) {
          pages.push_back(1 + static_cast<int64_t>(rng() % num_pages));
          expected[r] = pages.back() * page_size;
        } else {
          expected[r] = last_locs[r] + 1;
        }
      }
      SCOPED_TRACE(absl::StrFormat("page_size %d, %d requests", page_size, n));
      unsigned long long error[2] = {0, 0};
      EXPECT_EQ(Run(new_pages, pages, last_locs, page_size, slot_limit, error),
                expected);
      EXPECT_EQ(error[0], 0u);
      if (HasFailure()) return;
    }
  }
}

TEST_F(LocalDecodeTest, RefusedLastLocGoesToPageZeroAndTheFirstIsReported) {
  constexpr int64_t kPageSize = 16;
  const int64_t slot_limit = 11 * kPageSize;
  // Request 1 names page 0; 2 the last slot of its page (no room);
  // 3 takes page 7; 4 lies past the slab's end; 5 is negative.
  const std::vector<int64_t> last_locs = {
      kPageSize + 4, 4, 2 * kPageSize + 15, 99, 11 * kPageSize + 4, -3};
  unsigned long long error[2] = {0, 0};
  const std::vector<int64_t> out =
      Run({0, 0, 0, 1, 0, 0}, {7}, last_locs, kPageSize, slot_limit, error);
  EXPECT_EQ(out, (std::vector<int64_t>{kPageSize + 5, 0, 0, 7 * kPageSize, 0, 0,
                                       kPoison}));
  EXPECT_EQ(error[0], 2u);  // request 1, the first refused
  EXPECT_EQ(error[1], 4u);
}

TEST_F(LocalDecodeTest, PackingRefusesWhatItCannotCarry) {
  LocalDecodeHeader header;
  header.page_size = 16;
  std::vector<int64_t> many(kMaxLocalDecodeRequests + 1, 0);
  EXPECT_THAT(PackLocalDecode(many, {}, header, params_.get()),
              ::pagealloc::testing::IsOkAndHolds(false));
  const int64_t wide = int64_t{1} << 31;
  EXPECT_THAT(PackLocalDecode({1}, {wide}, header, params_.get()),
              ::pagealloc::testing::IsOkAndHolds(false));
  EXPECT_THAT(PackLocalDecode({1}, {wide - 1}, header, params_.get()),
              ::pagealloc::testing::IsOkAndHolds(true));
  EXPECT_EQ(LocalDecodePage(params_->words, 0), wide - 1);
  EXPECT_THAT(PackLocalDecode({}, {}, header, params_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(PackLocalDecode({2}, {5, 6}, header, params_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("takes 2 new pages")));
  EXPECT_THAT(PackLocalDecode({1, 0}, {5, 6}, header, params_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not the 2 ids given")));
  EXPECT_THAT(PackLocalDecode({1, 1}, {5}, header, params_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(
      PackLocalDecode({1}, {0}, header, params_.get()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("takes page 0")));
}

}  // namespace
}  // namespace pagealloc
