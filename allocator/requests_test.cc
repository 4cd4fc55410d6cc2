#include "allocator/requests.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

constexpr PoolGeometry kGeometry{/*page_size=*/4, /*num_pages=*/10};

AllocRequest Extend(int64_t prefix, int64_t seq, int64_t last,
                    int64_t index = 0) {
  return {RequestKind::kExtend, 1, index, prefix, seq, last, nullptr};
}

TEST(PageArithmeticTest, NewPagesFollowTheGenericFormula) {
  EXPECT_EQ(NewPagesNeeded({2, 11, 1}, 4), 2);  // pages 1..3 minus page 1
  EXPECT_EQ(NewPagesNeeded({4, 5, 15}, 4), 1);  // decode opening a page
  EXPECT_EQ(NewPagesNeeded({5, 6, 20}, 4), 0);  // decode inside a page
  EXPECT_EQ(NewPagesNeeded({0, 0, -1}, 4), 0);  // nothing to do
  // page_size 1: every token is a page; SGLang's `seq % ps == 1` decode test
  // would say 0 here.
  EXPECT_EQ(NewPagesNeeded({6, 7, 9}, 1), 1);
  EXPECT_EQ(PartialPageSlots({2, 11, 1}, 4), 2);
  EXPECT_EQ(PartialPageSlots({2, 3, 1}, 4), 1);
  EXPECT_EQ(PartialPageSlots({4, 9, 15}, 4), 0);
  EXPECT_EQ(PartialPageSlots({6, 7, 9}, 1), 0);
}

TEST(PageArithmeticTest, FastDivisionAgreesWithDivision) {
  // Powers of two take the shift path, the rest divide; both must agree
  // with / and % on every non-negative value, up to the 2^40-slot limit.
  for (int64_t b : {1, 2, 3, 4, 7, 16, 48, 64, 100, 128, 4096}) {
    for (int64_t a : {int64_t{0}, int64_t{1}, b - 1, b, b + 1, 3 * b + 2,
                      int64_t{123456789}, (int64_t{1} << 40) - 1}) {
      EXPECT_EQ(DivNonNegative(a, b), a / b) << a << " / " << b;
      EXPECT_EQ(ModNonNegative(a, b), a % b) << a << " % " << b;
      EXPECT_EQ(CeilDiv(a, b), (a + b - 1) / b) << a << " / " << b;
    }
  }
}

TEST(ValidateShapeTest, AcceptsWellFormedRequests) {
  EXPECT_OK(ValidateShape(Extend(0, 9, -1), kGeometry));
  EXPECT_OK(ValidateShape(Extend(2, 11, 5), kGeometry));  // page 1, offset 1
  EXPECT_OK(ValidateShape(Extend(4, 11, 7), kGeometry));  // aligned prefix
  EXPECT_OK(ValidateShape(Extend(3, 3, 6), kGeometry));   // extend_len 0
  AllocRequest decode{RequestKind::kDecode, 1, 0, 0, 1, -1, nullptr};
  EXPECT_OK(ValidateShape(decode, kGeometry));
  AllocRequest alloc{RequestKind::kAlloc, 1, 0, 0, 8, 0, nullptr};
  EXPECT_OK(ValidateShape(alloc, kGeometry));
}

TEST(ValidateShapeTest, NamesTheFieldAndTheRequestIndex) {
  EXPECT_THAT(ValidateShape(Extend(40, 12, 5, 3), kGeometry),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("seq_lens[3] (12) < prefix_lens[3] (40)")));
  EXPECT_THAT(ValidateShape(Extend(-1, 2, -1, 2), kGeometry),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prefix_lens[2] (-1) is negative")));
  EXPECT_THAT(ValidateShape(Extend(0, 4, 7, 1), kGeometry),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("last_locs[1] (7) must be -1")));
  EXPECT_THAT(ValidateShape(Extend(2, 4, 6, 5), kGeometry),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("last_locs[5] (6) is misaligned")));
  EXPECT_THAT(ValidateShape(Extend(2, 4, 1, 0), kGeometry),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("last_locs[0] (1) is outside")));
  EXPECT_THAT(ValidateShape(Extend(2, 4, 45, 0), kGeometry),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("last_locs[0] (45) is outside")));
  // Longer than the pool is well formed: the pool refuses it alone.
  EXPECT_OK(ValidateShape(Extend(0, 1 << 20, -1, 4), kGeometry));
  AllocRequest decode{RequestKind::kDecode, 1, 7, 0, 0, -1, nullptr};
  EXPECT_THAT(ValidateShape(decode, kGeometry),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("decode request 7: seq_lens[7] (0)")));
  AllocRequest alloc{RequestKind::kAlloc, 1, 2, 0, 6, 0, nullptr};
  EXPECT_THAT(ValidateShape(alloc, kGeometry),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("num_tokens[2] (6) is not a multiple of "
                                 "page_size (4)")));
  alloc.seq_len = -4;
  EXPECT_THAT(ValidateShape(alloc, kGeometry),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("num_tokens[2] (-4) is negative")));
}

// IsValidShape (the planning loops' fast check) and the checks that explain
// (CheckShapeInDetail) must agree on every request, and ValidateShape must
// report exactly the explained result: an exhaustive sweep of small values
// around every boundary, all kinds, several page sizes.
TEST(ValidateShapeTest, FastPredicateAgreesWithTheDescribedChecks) {
  int checked = 0;
  for (int64_t ps : {1, 3, 4, 16}) {
    const PoolGeometry g{ps, 6};
    const int64_t limit = g.slot_limit();
    for (RequestKind kind :
         {RequestKind::kExtend, RequestKind::kDecode, RequestKind::kAlloc}) {
      for (int64_t prefix = -2; prefix <= limit + 2; ++prefix) {
        for (int64_t seq = -2; seq <= limit + 2; ++seq) {
          for (int64_t last = -2; last <= limit + 2; ++last) {
            const AllocRequest r{kind, 1, 7, prefix, seq, last, nullptr};
            const absl::Status status = CheckShapeInDetail(r, g);
            ASSERT_EQ(IsValidShape(r, g), status.ok())
                << RequestKindName(kind) << " ps " << ps << " prefix " << prefix
                << " seq " << seq << " last " << last << ": " << status;
            ASSERT_EQ(ValidateShape(r, g), status);
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

}  // namespace
}  // namespace pagealloc
