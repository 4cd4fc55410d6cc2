#include "allocator/free_list_policy.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;

constexpr PoolGeometry kPages16{16, 100};  // 100 pages of 16 slots
constexpr PoolGeometry kTokens{1, 1000};   // SGLang's token allocator

AllocRequest Extend(int64_t prefix, int64_t seq, int64_t last) {
  return {RequestKind::kExtend, 1, 0, prefix, seq, last, nullptr};
}
AllocRequest Decode(int64_t seq, int64_t last) {
  return {RequestKind::kDecode, 1, 0, 0, seq, last, nullptr};
}
AllocRequest Alloc(int64_t tokens) {
  return {RequestKind::kAlloc, 1, 0, 0, tokens, -1, nullptr};
}

TEST(FreeListPolicyTest, NamesParseBack) {
  for (FreePolicy policy : {FreePolicy::kLifo, FreePolicy::kSorted}) {
    EXPECT_THAT(ParseFreePolicy(FreePolicyName(policy)), IsOkAndHolds(policy));
  }
  for (Semantics semantics : {Semantics::kPagealloc, Semantics::kSglang}) {
    EXPECT_THAT(ParseSemantics(SemanticsName(semantics)),
                IsOkAndHolds(semantics));
  }
  EXPECT_THAT(ParseFreePolicy("fifo"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "free_policy \"fifo\" is not one of \"lifo\", "
                       "\"sorted\""));
  EXPECT_THAT(ParseSemantics("vllm"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "semantics \"vllm\" is not one of \"pagealloc\", "
                       "\"sglang\""));
}

// Every variant of the table in free_list_policy.h, by (policy, semantics,
// page size).
TEST(FreeListPolicyTest, ReleaseTargetAndMergeTriggerPerVariant) {
  struct Row {
    FreePolicy policy;
    Semantics semantics;
    PoolGeometry geometry;
    ReleaseTarget release;
    MergeTrigger merge;
  };
  const std::vector<Row> rows = {
      {FreePolicy::kLifo, Semantics::kPagealloc, kPages16,
       ReleaseTarget::kFront, MergeTrigger::kNever},
      {FreePolicy::kLifo, Semantics::kPagealloc, kTokens, ReleaseTarget::kFront,
       MergeTrigger::kNever},
      {FreePolicy::kLifo, Semantics::kSglang, kPages16, ReleaseTarget::kFront,
       MergeTrigger::kNever},
      // SGLang's token allocator appends its frees: FIFO reuse.
      {FreePolicy::kLifo, Semantics::kSglang, kTokens, ReleaseTarget::kBack,
       MergeTrigger::kNever},
      {FreePolicy::kSorted, Semantics::kPagealloc, kPages16,
       ReleaseTarget::kPark, MergeTrigger::kPerBatch},
      {FreePolicy::kSorted, Semantics::kPagealloc, kTokens,
       ReleaseTarget::kPark, MergeTrigger::kPerBatch},
      {FreePolicy::kSorted, Semantics::kSglang, kPages16, ReleaseTarget::kPark,
       MergeTrigger::kPerCall},
      {FreePolicy::kSorted, Semantics::kSglang, kTokens, ReleaseTarget::kPark,
       MergeTrigger::kPerCall},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(::testing::Message()
                 << FreePolicyName(row.policy) << " "
                 << SemanticsName(row.semantics)
                 << " page_size=" << row.geometry.page_size);
    const FreeListPolicy policy(row.policy, row.semantics, row.geometry);
    EXPECT_EQ(policy.policy(), row.policy);
    EXPECT_EQ(policy.semantics(), row.semantics);
    EXPECT_EQ(policy.release_target(), row.release);
    EXPECT_EQ(policy.merge_trigger(), row.merge);
  }
}

TEST(FreeListPolicyTest, DefaultOrderIsAscendingOnlyForSglangSlotFrees) {
  const FreeListPolicy sglang(FreePolicy::kLifo, Semantics::kSglang, kPages16);
  EXPECT_EQ(sglang.ResolveOrder(FreeOrder::kDefault, /*values_are_slots=*/true),
            FreeOrder::kAscending);
  // Page ids are free_segment's form: their order stays.
  EXPECT_EQ(
      sglang.ResolveOrder(FreeOrder::kDefault, /*values_are_slots=*/false),
      FreeOrder::kFirstAppearance);
  const FreeListPolicy tokens(FreePolicy::kLifo, Semantics::kSglang, kTokens);
  EXPECT_EQ(tokens.ResolveOrder(FreeOrder::kDefault, /*values_are_slots=*/true),
            FreeOrder::kFirstAppearance);
  const FreeListPolicy own(FreePolicy::kSorted, Semantics::kPagealloc,
                           kPages16);
  EXPECT_EQ(own.ResolveOrder(FreeOrder::kDefault, /*values_are_slots=*/true),
            FreeOrder::kFirstAppearance);
  // An explicit order is kept under every variant.
  for (const FreeListPolicy* policy : {&sglang, &tokens, &own}) {
    for (bool slots : {true, false}) {
      EXPECT_EQ(policy->ResolveOrder(FreeOrder::kAscending, slots),
                FreeOrder::kAscending);
      EXPECT_EQ(policy->ResolveOrder(FreeOrder::kFirstAppearance, slots),
                FreeOrder::kFirstAppearance);
    }
  }
}

TEST(FreeListPolicyTest, PerBatchMergeOnlyWhenTheBatchDoesNotFit) {
  const FreeListPolicy policy(FreePolicy::kSorted, Semantics::kPagealloc,
                              kPages16);
  EXPECT_FALSE(policy.MergeBeforeBatch(/*batch_pages=*/10, /*free_pages=*/10,
                                       /*parked_pages=*/5));
  EXPECT_TRUE(policy.MergeBeforeBatch(11, 10, 5));
  // Nothing parked: a merge would only sort.
  EXPECT_FALSE(policy.MergeBeforeBatch(11, 10, 0));
  // The per-call trigger never fires under the per-batch one.
  const std::vector<AllocRequest> call = {Alloc(16 * 50)};
  EXPECT_FALSE(policy.MergeBeforeCall(call, /*available_pages=*/0, 5));
  // Nor either under kLifo, or the per-batch one under kPerCall.
  const FreeListPolicy lifo(FreePolicy::kLifo, Semantics::kPagealloc, kPages16);
  EXPECT_FALSE(lifo.MergeBeforeBatch(11, 10, 5));
  const FreeListPolicy sglang(FreePolicy::kSorted, Semantics::kSglang,
                              kPages16);
  EXPECT_FALSE(sglang.MergeBeforeBatch(11, 10, 5));
}

// SGLang's figures (its allocators' need_sort tests), worked by hand.
TEST(FreeListPolicyTest, SglangEstimatePerKind) {
  // Extend: two requests of 40 new tokens each (prefixes end inside pages):
  // 80 // 16 + 2 + 1 = 8, although they need 2 pages each.
  const std::vector<AllocRequest> extend = {Extend(8, 48, 16 + 7),
                                            Extend(8, 48, 32 + 7)};
  EXPECT_EQ(SglangCallEstimate(extend, kPages16), 80 / 16 + 2 + 1);
  // Decode: the batch size, whether or not a page starts.
  const std::vector<AllocRequest> decode = {Decode(17, 16 + 15),
                                            Decode(5, 16 + 3), Decode(9, 39)};
  EXPECT_EQ(SglangCallEstimate(decode, kPages16), 3);
  // Alloc: the pages it needs.
  const std::vector<AllocRequest> alloc = {Alloc(32), Alloc(16)};
  EXPECT_EQ(SglangCallEstimate(alloc, kPages16), 3);
  // The token allocator: the slots (pages) needed, for every kind.
  const std::vector<AllocRequest> token_extend = {Extend(3, 10, 7),
                                                  Extend(0, 5, -1)};
  EXPECT_EQ(SglangCallEstimate(token_extend, kTokens), 7 + 5);
  const std::vector<AllocRequest> token_decode = {Decode(4, 9), Decode(2, 20)};
  EXPECT_EQ(SglangCallEstimate(token_decode, kTokens), 2);
  EXPECT_EQ(SglangCallEstimate({}, kPages16), 0);
}

TEST(FreeListPolicyTest, SglangEstimateCountsMalformedRequestsOnlyAsRequests) {
  // seq_len < prefix_len: no tokens, but it is one of the batch.
  const std::vector<AllocRequest> extend = {Extend(40, 12, 16 + 7),
                                            Extend(0, 32, -1)};
  EXPECT_EQ(SglangCallEstimate(extend, kPages16), 32 / 16 + 2 + 1);
  // An alloc that is not page-aligned adds no pages.
  const std::vector<AllocRequest> alloc = {Alloc(17), Alloc(32)};
  EXPECT_EQ(SglangCallEstimate(alloc, kPages16), 2);
}

TEST(FreeListPolicyTest, SglangEstimateClampsLengthsToThePool) {
  // Two requests far longer than the pool: clamped to its slot range, so the
  // sum neither overflows nor falls below the pool's size.
  const int64_t huge = int64_t{1} << 62;
  const std::vector<AllocRequest> extend = {Extend(0, huge, -1),
                                            Extend(0, huge, -1)};
  const int64_t limit = kPages16.slot_limit();
  EXPECT_EQ(SglangCallEstimate(extend, kPages16), 2 * limit / 16 + 2 + 1);
  const std::vector<AllocRequest> alloc = {Alloc(huge), Alloc(huge)};
  EXPECT_EQ(SglangCallEstimate(alloc, kPages16), 2 * (limit / 16));
}

TEST(FreeListPolicyTest, PerCallMergeWhenTheEstimateExceedsThePagesLeft) {
  const FreeListPolicy policy(FreePolicy::kSorted, Semantics::kSglang,
                              kPages16);
  // Decode of 3 requests: estimate 3.
  const std::vector<AllocRequest> decode = {Decode(17, 16 + 15),
                                            Decode(5, 16 + 3), Decode(9, 39)};
  EXPECT_FALSE(policy.MergeBeforeCall(decode, /*available_pages=*/3,
                                      /*parked_pages=*/1));
  // Merges although the call needs only one page (SGLang over-estimates).
  EXPECT_TRUE(policy.MergeBeforeCall(decode, 2, 1));
  EXPECT_FALSE(policy.MergeBeforeCall(decode, 2, 0));
  EXPECT_FALSE(policy.MergeBeforeCall({}, 0, 1));
}

}  // namespace
}  // namespace pagealloc
