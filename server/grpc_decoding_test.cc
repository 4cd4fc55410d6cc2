// Request decoding as a table, through the gRPC messages down to DecodeCall
// (server/request_decoding.h): each malformed call gets INVALID_ARGUMENT and
// a message naming the field and the request's index in the call (or the
// per-call cap it exceeds); each good call decodes to the requests the wire
// describes.

#include "server/grpc_decoding.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "allocator/requests.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/pagealloc.pb.h"
#include "server/request_decoding.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::IsOk;
using ::pagealloc::testing::StatusIs;
using ::testing::AllOf;
using ::testing::Field;
using ::testing::HasSubstr;

constexpr OwnerId kOwner = 7;
// 16 usable pages of 4 slots: usable slots [4, 68), alloc at most 64 tokens.
constexpr PoolGeometry kGeometry = {/*page_size=*/4, /*num_pages=*/16};

v1::AllocExtendRequest ExtendMessage(std::vector<int64_t> prefix_lens,
                                     std::vector<int64_t> seq_lens,
                                     std::vector<int64_t> last_locs) {
  v1::AllocExtendRequest call;
  call.mutable_prefix_lens()->Add(prefix_lens.begin(), prefix_lens.end());
  call.mutable_seq_lens()->Add(seq_lens.begin(), seq_lens.end());
  call.mutable_last_locs()->Add(last_locs.begin(), last_locs.end());
  return call;
}

v1::AllocDecodeRequest DecodeMessage(std::vector<int64_t> seq_lens,
                                     std::vector<int64_t> last_locs) {
  v1::AllocDecodeRequest call;
  call.mutable_seq_lens()->Add(seq_lens.begin(), seq_lens.end());
  call.mutable_last_locs()->Add(last_locs.begin(), last_locs.end());
  return call;
}

v1::AllocRequest AllocMessage(std::vector<int64_t> num_tokens) {
  v1::AllocRequest call;
  call.mutable_num_tokens()->Add(num_tokens.begin(), num_tokens.end());
  return call;
}

v1::FreeRequest FreeMessage(std::vector<int64_t> slots,
                            std::vector<int64_t> pages) {
  v1::FreeRequest call;
  call.mutable_slots()->Add(slots.begin(), slots.end());
  call.mutable_pages()->Add(pages.begin(), pages.end());
  return call;
}

::testing::Matcher<const AllocRequest&> Request(RequestKind kind, int64_t index,
                                                int64_t prefix_len,
                                                int64_t seq_len,
                                                int64_t last_loc) {
  return AllOf(Field("kind", &AllocRequest::kind, kind),
               Field("owner", &AllocRequest::owner, kOwner),
               Field("index", &AllocRequest::index, index),
               Field("prefix_len", &AllocRequest::prefix_len, prefix_len),
               Field("seq_len", &AllocRequest::seq_len, seq_len),
               Field("last_loc", &AllocRequest::last_loc, last_loc),
               Field("destination", &AllocRequest::destination, nullptr));
}

// ---------------------------------------------------------------------------
// ArraysOf

TEST(ArraysOfTest, ExtendPointsIntoTheMessage) {
  const v1::AllocExtendRequest call = ExtendMessage({0, 6}, {6, 9}, {-1, 9});
  ASSERT_OK_AND_ASSIGN(const CallArrays arrays, ArraysOf(call));
  EXPECT_EQ(arrays.kind, RequestKind::kExtend);
  EXPECT_EQ(arrays.size, 2);
  EXPECT_EQ(arrays.prefix_lens, call.prefix_lens().data());
  EXPECT_EQ(arrays.seq_lens, call.seq_lens().data());
  EXPECT_EQ(arrays.last_locs, call.last_locs().data());
}

TEST(ArraysOfTest, DecodeHasNoPrefixArray) {
  const v1::AllocDecodeRequest call = DecodeMessage({1, 7, 8}, {-1, 9, 10});
  ASSERT_OK_AND_ASSIGN(const CallArrays arrays, ArraysOf(call));
  EXPECT_EQ(arrays.kind, RequestKind::kDecode);
  EXPECT_EQ(arrays.size, 3);
  EXPECT_EQ(arrays.prefix_lens, nullptr);
  EXPECT_EQ(arrays.seq_lens, call.seq_lens().data());
  EXPECT_EQ(arrays.last_locs, call.last_locs().data());
}

TEST(ArraysOfTest, AllocReadsNumTokensAsSeqLens) {
  const v1::AllocRequest call = AllocMessage({4, 8});
  ASSERT_OK_AND_ASSIGN(const CallArrays arrays, ArraysOf(call));
  EXPECT_EQ(arrays.kind, RequestKind::kAlloc);
  EXPECT_EQ(arrays.size, 2);
  EXPECT_EQ(arrays.prefix_lens, nullptr);
  EXPECT_EQ(arrays.seq_lens, call.num_tokens().data());
  EXPECT_EQ(arrays.last_locs, nullptr);
}

TEST(ArraysOfTest, EmptyCallsHaveSizeZero) {
  ASSERT_OK_AND_ASSIGN(const CallArrays extend,
                       ArraysOf(v1::AllocExtendRequest()));
  EXPECT_EQ(extend.size, 0);
  ASSERT_OK_AND_ASSIGN(const CallArrays decode,
                       ArraysOf(v1::AllocDecodeRequest()));
  EXPECT_EQ(decode.size, 0);
  ASSERT_OK_AND_ASSIGN(const CallArrays alloc, ArraysOf(v1::AllocRequest()));
  EXPECT_EQ(alloc.size, 0);
}

struct ArraysCase {
  std::string name;
  std::function<absl::Status()> arrays_of;
  std::string message;
};

TEST(ArraysOfTest, ParallelArraysOfDifferentLengthsAreNamed) {
  const std::vector<ArraysCase> cases = {
      {"extend: prefix_lens short",
       [] {
         return ArraysOf(ExtendMessage({0}, {4, 4}, {-1, -1})).status();
       },
       "parallel arrays differ in length: prefix_lens has 1, seq_lens has 2, "
       "last_locs has 2 entries"},
      {"extend: seq_lens short",
       [] {
         return ArraysOf(ExtendMessage({0, 0}, {4}, {-1, -1})).status();
       },
       "prefix_lens has 2, seq_lens has 1, last_locs has 2 entries"},
      {"extend: last_locs long",
       [] {
         return ArraysOf(ExtendMessage({0}, {4}, {-1, -1, -1})).status();
       },
       "prefix_lens has 1, seq_lens has 1, last_locs has 3 entries"},
      {"extend: last_locs missing",
       [] { return ArraysOf(ExtendMessage({0}, {4}, {})).status(); },
       "prefix_lens has 1, seq_lens has 1, last_locs has 0 entries"},
      {"decode: last_locs short",
       [] {
         return ArraysOf(DecodeMessage({1, 1}, {-1})).status();
       },
       "parallel arrays differ in length: seq_lens has 2, last_locs has 1 "
       "entries"},
      {"decode: seq_lens missing",
       [] { return ArraysOf(DecodeMessage({}, {-1})).status(); },
       "seq_lens has 0, last_locs has 1 entries"},
  };
  for (const ArraysCase& c : cases) {
    EXPECT_THAT(c.arrays_of(), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr(c.message)))
        << c.name;
  }
}

// ---------------------------------------------------------------------------
// Decoding good calls

TEST(DecodeTest, ExtendKeepsEveryFieldAndCountsSlots) {
  // Request 1's prefix of 6 ends at slot 9: (9 + 1) % 4 == 6 % 4.
  ASSERT_OK_AND_ASSIGN(
      const DecodedCall decoded,
      DecodeAllocExtend(ExtendMessage({0, 6, 8}, {6, 9, 8}, {-1, 9, 11}),
                        kOwner, kGeometry, CallLimits()));
  EXPECT_THAT(decoded.requests,
              ::testing::ElementsAre(
                  Request(RequestKind::kExtend, 0, 0, 6, -1),
                  Request(RequestKind::kExtend, 1, 6, 9, 9),
                  Request(RequestKind::kExtend, 2, 8, 8, 11)));  // no slots
  EXPECT_EQ(decoded.num_slots, 6 + 3 + 0);
}

TEST(DecodeTest, DecodeTakesOneSlotPerRequest) {
  ASSERT_OK_AND_ASSIGN(const DecodedCall decoded,
                       DecodeAllocDecode(DecodeMessage({1, 7, 9}, {-1, 9, 11}),
                                         kOwner, kGeometry, CallLimits()));
  // The wire shape is kept (prefix_len 0); the planner derives seq_len - 1.
  EXPECT_THAT(
      decoded.requests,
      ::testing::ElementsAre(Request(RequestKind::kDecode, 0, 0, 1, -1),
                             Request(RequestKind::kDecode, 1, 0, 7, 9),
                             Request(RequestKind::kDecode, 2, 0, 9, 11)));
  EXPECT_EQ(decoded.num_slots, 3);
}

TEST(DecodeTest, AllocTakesWholePages) {
  ASSERT_OK_AND_ASSIGN(
      const DecodedCall decoded,
      DecodeAlloc(AllocMessage({4, 0, 64}), kOwner, kGeometry, CallLimits()));
  EXPECT_THAT(
      decoded.requests,
      ::testing::ElementsAre(Request(RequestKind::kAlloc, 0, 0, 4, -1),
                             Request(RequestKind::kAlloc, 1, 0, 0, -1),
                             Request(RequestKind::kAlloc, 2, 0, 64, -1)));
  EXPECT_EQ(decoded.num_slots, 68);
}

TEST(DecodeTest, AnEmptyCallDecodesToNothing) {
  ASSERT_OK_AND_ASSIGN(
      const DecodedCall decoded,
      DecodeAlloc(AllocMessage({}), kOwner, kGeometry, CallLimits()));
  EXPECT_TRUE(decoded.requests.empty());
  EXPECT_EQ(decoded.num_slots, 0);
}

// The fast channel hands DecodeCall its own copies, with only the arrays the
// kind uses: the others are never read.
TEST(DecodeTest, DecodeCallReadsOnlyTheArraysTheKindUses) {
  const int64_t seq_lens[] = {5, 8};
  const int64_t last_locs[] = {7, 10};
  CallArrays arrays;
  arrays.kind = RequestKind::kDecode;
  arrays.size = 2;
  arrays.seq_lens = seq_lens;
  arrays.last_locs = last_locs;
  DecodedCall out;
  ASSERT_OK(DecodeCall(arrays, kOwner, kGeometry, CallLimits(), &out));
  EXPECT_THAT(out.requests, ::testing::ElementsAre(
                                Request(RequestKind::kDecode, 0, 0, 5, 7),
                                Request(RequestKind::kDecode, 1, 0, 8, 10)));

  const int64_t num_tokens[] = {8};
  arrays = CallArrays{};
  arrays.kind = RequestKind::kAlloc;
  arrays.size = 1;
  arrays.seq_lens = num_tokens;
  ASSERT_OK(DecodeCall(arrays, kOwner, kGeometry, CallLimits(), &out));
  EXPECT_THAT(out.requests, ::testing::ElementsAre(
                                Request(RequestKind::kAlloc, 0, 0, 8, -1)));
  EXPECT_EQ(out.num_slots, 8);
}

// A reused DecodedCall (the fast channel keeps one per channel) holds only
// the new call afterwards.
TEST(DecodeTest, AReusedOutputHoldsOnlyTheNewCall) {
  const v1::AllocRequest big = AllocMessage({4, 4, 4, 4});
  const v1::AllocRequest small = AllocMessage({8});
  DecodedCall out;
  ASSERT_OK_AND_ASSIGN(CallArrays arrays, ArraysOf(big));
  ASSERT_OK(DecodeCall(arrays, kOwner, kGeometry, CallLimits(), &out));
  EXPECT_EQ(out.requests.size(), 4u);
  ASSERT_OK_AND_ASSIGN(arrays, ArraysOf(small));
  ASSERT_OK(DecodeCall(arrays, kOwner, kGeometry, CallLimits(), &out));
  EXPECT_THAT(out.requests, ::testing::ElementsAre(
                                Request(RequestKind::kAlloc, 0, 0, 8, -1)));
  EXPECT_EQ(out.num_slots, 8);
}

// ---------------------------------------------------------------------------
// Refusals

struct BadCase {
  std::string name;
  std::function<absl::Status()> decode;
  std::string message;
};

absl::Status Extend(std::vector<int64_t> prefix_lens,
                    std::vector<int64_t> seq_lens,
                    std::vector<int64_t> last_locs,
                    CallLimits limits = CallLimits()) {
  return DecodeAllocExtend(ExtendMessage(prefix_lens, seq_lens, last_locs),
                           kOwner, kGeometry, limits)
      .status();
}
absl::Status Decode(std::vector<int64_t> seq_lens,
                    std::vector<int64_t> last_locs,
                    CallLimits limits = CallLimits()) {
  return DecodeAllocDecode(DecodeMessage(seq_lens, last_locs), kOwner,
                           kGeometry, limits)
      .status();
}
absl::Status Alloc(std::vector<int64_t> num_tokens,
                   CallLimits limits = CallLimits()) {
  return DecodeAlloc(AllocMessage(num_tokens), kOwner, kGeometry, limits)
      .status();
}

// The bad request sits after good ones, so that its index in the message is
// the caller's, not the first.
TEST(DecodeTest, MalformedRequestsAreNamedByFieldAndIndex) {
  const std::vector<BadCase> cases = {
      // Extend.
      {"extend: negative prefix",
       [] {
         return Extend({0, -1}, {4, 4}, {-1, -1});
       },
       "extend request 1: prefix_lens[1] (-1) is negative"},
      {"extend: seq_len below prefix_len",
       [] {
         return Extend({0, 5}, {4, 3}, {-1, 8});
       },
       "extend request 1: seq_lens[1] (3) < prefix_lens[1] (5)"},
      {"extend: last_loc set for an empty prefix",
       [] {
         return Extend({0, 0}, {4, 4}, {-1, 7});
       },
       "extend request 1: last_locs[1] (7) must be -1 when the prefix is "
       "empty"},
      {"extend: last_loc missing for a prefix",
       [] {
         return Extend({0, 4}, {4, 8}, {-1, -1});
       },
       "extend request 1: last_locs[1] (-1) is outside the usable slots [4, "
       "68)"},
      {"extend: last_loc in page 0",
       [] {
         return Extend({0, 4}, {4, 8}, {-1, 3});
       },
       "extend request 1: last_locs[1] (3) is outside the usable slots [4, "
       "68)"},
      {"extend: last_loc past the pool",
       [] {
         return Extend({0, 4}, {4, 8}, {-1, 71});
       },
       "extend request 1: last_locs[1] (71) is outside the usable slots [4, "
       "68)"},
      {"extend: last_loc misaligned",
       [] {
         return Extend({0, 6}, {4, 8}, {-1, 8});
       },
       "extend request 1: last_locs[1] (8) is misaligned: (last_loc + 1) % "
       "page_size is 1 but prefix_len % page_size is 2"},
      // Stricter than the brief: checked for a page-aligned prefix too.
      {"extend: last_loc misaligned, aligned prefix",
       [] {
         return Extend({0, 4}, {4, 8}, {-1, 9});
       },
       "extend request 1: last_locs[1] (9) is misaligned"},
      // Decode.
      {"decode: seq_len 0",
       [] {
         return Decode({1, 0}, {-1, -1});
       },
       "decode request 1: seq_lens[1] (0) must be >= 1 for a decode"},
      {"decode: negative seq_len",
       [] {
         return Decode({1, -3}, {-1, -1});
       },
       "decode request 1: seq_lens[1] (-3) must be >= 1"},
      {"decode: last_loc for the first token",
       [] {
         return Decode({1, 1}, {-1, 4});
       },
       "decode request 1: last_locs[1] (4) must be -1 when the prefix is "
       "empty"},
      {"decode: last_loc missing",
       [] {
         return Decode({1, 2}, {-1, -1});
       },
       "decode request 1: last_locs[1] (-1) is outside the usable slots"},
      {"decode: last_loc misaligned",
       [] {
         return Decode({1, 7}, {-1, 8});
       },
       "decode request 1: last_locs[1] (8) is misaligned: (last_loc + 1) % "
       "page_size is 1 but prefix_len % page_size is 2"},
      // Alloc.
      {"alloc: negative",
       [] {
         return Alloc({4, -4});
       },
       "alloc request 1: num_tokens[1] (-4) is negative"},
      {"alloc: unaligned",
       [] {
         return Alloc({4, 8, 6});
       },
       "alloc request 2: num_tokens[2] (6) is not a multiple of page_size "
       "(4)"},
      // The first malformed request is the one named.
      {"alloc: first of two bad ones",
       [] {
         return Alloc({4, 5, -4});
       },
       "alloc request 1: num_tokens[1] (5) is not a multiple"},
      // The arrays are checked before any element.
      {"extend: arrays differ",
       [] {
         return Extend({-1, 0}, {4}, {-1});
       },
       "parallel arrays differ in length: prefix_lens has 2, seq_lens has 1, "
       "last_locs has 1 entries"},
      {"decode: arrays differ",
       [] {
         return Decode({0}, {-1, -1});
       },
       "parallel arrays differ in length: seq_lens has 1, last_locs has 2 "
       "entries"},
  };
  for (const BadCase& c : cases) {
    EXPECT_THAT(c.decode(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr(c.message)))
        << c.name;
  }
}

// What one call may ask for: at most max_requests requests and max_slots
// slots, each cap inclusive.
TEST(DecodeTest, CallLimitsCapRequestsAndSlots) {
  CallLimits limits;
  limits.max_requests = 3;
  limits.max_slots = 10;
  struct LimitCase {
    std::string name;
    absl::Status status;
    std::string message;  // empty: OK
  };
  const std::vector<LimitCase> cases = {
      {"alloc: requests at the cap", Alloc({0, 4, 4}, limits), ""},
      {"alloc: one request over", Alloc({0, 0, 0, 0}, limits),
       "the call has 4 requests; at most 3 per call (--max_batch_requests)"},
      {"extend: one request over",
       Extend({0, 0, 0, 0}, {1, 1, 1, 1}, {-1, -1, -1, -1}, limits),
       "the call has 4 requests; at most 3 per call"},
      {"decode: one request over",
       Decode({1, 1, 1, 1}, {-1, -1, -1, -1}, limits),
       "the call has 4 requests; at most 3 per call"},
      // The request cap comes first: no element is looked at.
      {"alloc: over the request cap and malformed",
       Alloc({-1, -1, -1, -1}, limits), "the call has 4 requests"},
      {"extend: slots at the cap", Extend({0, 4}, {6, 8}, {-1, 7}, limits), ""},
      {"extend: one slot over", Extend({0, 4}, {7, 8}, {-1, 7}, limits),
       "the call asks for 11 slots; at most 10 per call (--max_batch_tokens)"},
      {"alloc: slots over", Alloc({8, 4}, limits),
       "the call asks for 12 slots; at most 10 per call (--max_batch_tokens)"},
      {"decode: slots are one per request",
       Decode({1, 1, 1}, {-1, -1, -1}, limits), ""},
      // Longer than the pool is a request the pool refuses alone; the call
      // still has to fit a launch, and huge lengths cannot overflow the sum.
      {"extend: past the pool", Extend({0, 0}, {4, 69}, {-1, -1}), ""},
      {"decode: past the pool", Decode({1, 69}, {-1, 67}), ""},
      {"alloc: past the pool", Alloc({4, 68}), ""},
      {"extend: huge lengths",
       Extend({0, 0},
              {std::numeric_limits<int64_t>::max(),
               std::numeric_limits<int64_t>::max()},
              {-1, -1}, limits),
       "the call asks for at least 9223372036854775807 slots"},
  };
  for (const LimitCase& c : cases) {
    if (c.message.empty()) {
      EXPECT_THAT(c.status, IsOk()) << c.name;
    } else {
      EXPECT_THAT(c.status, StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr(c.message)))
          << c.name;
    }
  }
}

// ---------------------------------------------------------------------------
// ValidateFree

TEST(ValidateFreeTest, SlotsOrPagesButNotBoth) {
  EXPECT_OK(ValidateFree(FreeMessage({}, {})));
  EXPECT_OK(ValidateFree(FreeMessage({4, 5, 9}, {})));
  EXPECT_OK(ValidateFree(FreeMessage({}, {1, 2})));
  EXPECT_THAT(ValidateFree(FreeMessage({4, 5}, {1})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("set either slots (2 given) or pages (1 "
                                 "given), not both")));
}

}  // namespace
}  // namespace pagealloc
