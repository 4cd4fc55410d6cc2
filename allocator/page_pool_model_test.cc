// Randomized operation sequences against ReferenceModel (through
// PoolModelChecker): after every step the pool and the model agree on every
// slot, status code, the free list, the parked pages and the owner of every
// page, and the pool's invariants (executor mirror included) hold.

#include <cstdint>
#include <memory>
#include <random>

#include "absl/strings/str_format.h"
#include "allocator/page_pool.h"
#include "gtest/gtest.h"
#include "tests/pool_model_checker.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::ChoiceSource;
using ::pagealloc::testing::PoolModelChecker;

class RandomChoices : public ChoiceSource {
 public:
  explicit RandomChoices(uint64_t seed) : rng_(seed) {}
  int64_t Uniform(int64_t lo, int64_t hi) override {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

 private:
  std::mt19937_64 rng_;
};

struct Params {
  int64_t page_size;
  FreePolicy policy;
  Semantics semantics = Semantics::kPagealloc;
};

class PagePoolModelTest : public ::testing::TestWithParam<Params> {};

TEST_P(PagePoolModelTest, RandomOperationSequencesMatchTheModel) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  RandomChoices choices(seed);
  constexpr int kSequences = 250;
  constexpr int kStepsPerSequence = 60;
  std::map<std::pair<RequestKind, absl::StatusCode>, int64_t> outcomes;
  int64_t rolled_back = 0;
  int64_t refused_whole = 0;
  int64_t rollbacks_to_an_id = 0;
  for (int sequence = 0; sequence < kSequences; ++sequence) {
    // Small pools, so that out-of-pages, sorting and reuse happen often.
    const int64_t num_pages = choices.Uniform(24, 63);
    ASSERT_OK_AND_ASSIGN(
        auto checker, PoolModelChecker::Create(num_pages, GetParam().page_size,
                                               GetParam().policy, &choices,
                                               GetParam().semantics));
    for (int step = 0; step < kStepsPerSequence; ++step) {
      SCOPED_TRACE(absl::StrFormat("sequence %d step %d", sequence, step));
      ASSERT_OK(checker->Step());
      ASSERT_OK(checker->CheckSameState());
    }
    for (const auto& [key, count] : checker->outcomes()) outcomes[key] += count;
    rolled_back += checker->pages_rolled_back();
    refused_whole += checker->calls_refused_whole();
    rollbacks_to_an_id += checker->rollbacks_to_an_id();
  }
  using Code = absl::StatusCode;
  EXPECT_GT((outcomes[{RequestKind::kExtend, Code::kOk}]), 1000);
  EXPECT_GT((outcomes[{RequestKind::kDecode, Code::kOk}]), 1000);
  EXPECT_GT((outcomes[{RequestKind::kAlloc, Code::kOk}]), 500);
  EXPECT_GT((outcomes[{RequestKind::kExtend, Code::kResourceExhausted}]), 10);
  EXPECT_GT((outcomes[{RequestKind::kExtend, Code::kInvalidArgument}]), 10);
  EXPECT_GT((outcomes[{RequestKind::kExtend, Code::kNotFound}]), 10);
  if (GetParam().page_size > 1) {  // with page_size 1 no prefix ends in a page
    EXPECT_GT((outcomes[{RequestKind::kExtend, Code::kPermissionDenied}]), 10);
  }
  EXPECT_GT((outcomes[{RequestKind::kExtend, Code::kAborted}]), 10);
  EXPECT_GT(rolled_back, 100);
  EXPECT_GT(refused_whole, 100);
  EXPECT_GT(rollbacks_to_an_id, 100);
}

INSTANTIATE_TEST_SUITE_P(
    PageSizesPoliciesAndSemantics, PagePoolModelTest, ::testing::ValuesIn([] {
      std::vector<Params> params;
      for (Semantics semantics : {Semantics::kPagealloc, Semantics::kSglang}) {
        for (FreePolicy policy : {FreePolicy::kLifo, FreePolicy::kSorted}) {
          for (int64_t page_size : {1, 2, 16, 64}) {
            params.push_back({page_size, policy, semantics});
          }
        }
      }
      return params;
    }()),
    [](const ::testing::TestParamInfo<Params>& info) {
      return absl::StrFormat(
          "PageSize%d%s%s", info.param.page_size,
          info.param.policy == FreePolicy::kLifo ? "Lifo" : "Sorted",
          info.param.semantics == Semantics::kPagealloc ? "" : "Sglang");
    });

}  // namespace
}  // namespace pagealloc
