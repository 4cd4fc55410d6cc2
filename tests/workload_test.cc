#include "tests/workload.h"

#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/page_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_executor.h"
#include "tests/status_matchers.h"

namespace pagealloc::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kPageSize = 4;

// Everything Record may change, to check that a refused answer changed
// nothing.
std::vector<int64_t> State(const LiveSequence& s) {
  std::vector<int64_t> state = {s.len, s.last_loc, s.shared_len};
  state.insert(state.end(), s.pages.begin(), s.pages.end());
  return state;
}

TEST(SequenceSetTest, RecordsPrefillDecodeAndExtendAnswers) {
  SequenceSet live(kPageSize);
  const size_t i = live.Add();
  std::vector<int64_t> opened;
  // Prefill 6 tokens: pages 1 and 2 (slots 4..9).
  ASSERT_OK(live.Record(i, Prefill(6), {4, 5, 6, 7, 8, 9}, &opened));
  EXPECT_THAT(opened, ElementsAre(1, 2));
  EXPECT_EQ(live[i].len, 6);
  EXPECT_EQ(live[i].last_loc, 9);
  // A decode inside page 2.
  EXPECT_EQ(live[i].Decode().seq_len, 7);
  ASSERT_OK(live.Record(i, live[i].Decode(), {10}));
  // Chunked prefill: token 7 ends page 2, tokens 8 and 12 open pages 5, 8.
  const ExtendShape extend = live[i].Extend(6);
  EXPECT_EQ(extend.prefix_len, 7);
  EXPECT_EQ(extend.last_loc, 10);
  opened.clear();
  ASSERT_OK(live.Record(i, extend, {11, 20, 21, 22, 23, 32}, &opened));
  EXPECT_THAT(opened, ElementsAre(5, 8));
  EXPECT_THAT(live[i].pages, ElementsAre(1, 2, 5, 8));
  EXPECT_EQ(live[i].len, 13);
  EXPECT_EQ(live[i].last_loc, 32);
  EXPECT_THAT(live.SlotsOf(i),
              ElementsAre(4, 5, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23, 32));
  EXPECT_EQ(live.SlotOf(i, 8), 20);
  EXPECT_EQ(live.pages_held(), 4);
  // An empty extend changes nothing.
  ASSERT_OK(live.Record(i, live[i].Extend(0), {}));
  EXPECT_EQ(live[i].len, 13);
  EXPECT_EQ(live[i].last_loc, 32);
}

TEST(SequenceSetTest, AnswersThatBreakTheSemanticsAreRefusedAndChangeNothing) {
  SequenceSet live(kPageSize);
  const size_t i = live.Add();
  ASSERT_OK(live.Record(i, Prefill(6), {4, 5, 6, 7, 8, 9}));
  const std::vector<int64_t> before = State(live[i]);
  using C = absl::StatusCode;
  EXPECT_THAT(live.Record(i, live[i].Extend(3), {10, 11}),
              StatusIs(C::kDataLoss, HasSubstr("2 slots for 3 tokens")));
  EXPECT_THAT(
      live.Record(i, live[i].Decode(), {11}),
      StatusIs(C::kDataLoss, HasSubstr("token 6 got slot 11, expected 10")));
  EXPECT_THAT(live.Record(i, live[i].Extend(3), {10, 11, 13}),
              StatusIs(C::kDataLoss,
                       HasSubstr("token 8 opens a page but got slot 13")));
  EXPECT_THAT(
      live.Record(i, live[i].Extend(3), {10, 11, 0}),
      StatusIs(C::kDataLoss, HasSubstr("token 8 opens a page but got slot 0")));
  EXPECT_THAT(
      live.Record(i, {5, 6, 8}, {9}),
      StatusIs(C::kInvalidArgument, HasSubstr("does not continue sequence")));
  EXPECT_THAT(
      live.Record(i, {6, 7, 8}, {9}),
      StatusIs(C::kInvalidArgument, HasSubstr("does not continue sequence")));
  EXPECT_EQ(State(live[i]), before);
}

TEST(SequenceSetTest, ANewSequenceMayContinueAPageAlignedSharedPrefix) {
  SequenceSet live(kPageSize);
  const size_t i = live.Add(/*owner=*/2);
  // Tokens 0..7 are someone else's (last slot 27); token 8 opens page 10.
  ASSERT_OK(live.Record(i, {8, 10, 27}, {40, 41}));
  EXPECT_EQ(live[i].owner, 2u);
  EXPECT_EQ(live[i].shared_len, 8);
  EXPECT_EQ(live[i].len, 10);
  EXPECT_THAT(live[i].pages, ElementsAre(10));
  EXPECT_THAT(live.SlotsOf(i), ElementsAre(40, 41));
  // Continuing it is an ordinary decode.
  ASSERT_OK(live.Record(i, live[i].Decode(), {42}));
  EXPECT_THAT(live.SlotsOf(i), ElementsAre(40, 41, 42));

  const size_t j = live.Add();
  EXPECT_THAT(live.Record(j, {6, 7, 9}, {10}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a whole number")));
  EXPECT_EQ(live[j].len, 0);
}

TEST(SequenceSetTest, RemovesByIndexByIndicesAndByPredicate) {
  SequenceSet live(1);
  for (int64_t page = 1; page <= 5; ++page) {
    ASSERT_OK(live.Record(live.Add(), Prefill(1), {page}));
  }
  std::vector<int64_t> pages;
  live.Remove(1, &pages);  // page 2
  EXPECT_THAT(pages, ElementsAre(2));
  live.RemoveAll({3, 0}, &pages);  // pages 5, 1
  EXPECT_THAT(pages, ElementsAre(2, 5, 1));
  ASSERT_EQ(live.size(), 2u);
  EXPECT_EQ(live[0].last_loc, 3);
  EXPECT_EQ(live[1].last_loc, 4);
  live.RemoveIf([](const LiveSequence& s) { return s.last_loc == 4; });
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].last_loc, 3);
  EXPECT_THAT(live[0].pages, ElementsAre(3));  // kept in place, intact
  // Ids stay: sequence 3 of 5 is still the one with id 3.
  EXPECT_EQ(live[0].id, 3u);
  live.Remove(0);
  EXPECT_TRUE(live.empty());
}

TEST(SequenceSetTest, FinishedAtTheTargetLength) {
  SequenceSet live(kPageSize);
  const size_t i = live.Add(kNoOwner, /*target_len=*/2);
  EXPECT_FALSE(live[i].finished());
  ASSERT_OK(live.Record(i, Prefill(1), {4}));
  EXPECT_FALSE(live[i].finished());
  ASSERT_OK(live.Record(i, live[i].Decode(), {5}));
  EXPECT_TRUE(live[i].finished());
  const size_t endless = live.Add();
  ASSERT_OK(live.Record(endless, Prefill(3), {8, 9, 10}));
  EXPECT_FALSE(live[endless].finished());
}

TEST(SequenceSetTest, RollbackDropsSequencesThatOpenedPagesSinceTheMark) {
  SequenceSet live(kPageSize);
  const size_t a = live.Add();
  const size_t b = live.Add();
  ASSERT_OK(live.Record(a, Prefill(2), {4, 5}));          // page 1
  ASSERT_OK(live.Record(b, Prefill(4), {8, 9, 10, 11}));  // page 2
  const SequenceSet::Mark mark = live.MarkCheckpoint();
  ASSERT_OK(live.Record(a, live[a].Decode(), {6}));   // inside page 1
  ASSERT_OK(live.Record(b, live[b].Decode(), {12}));  // opens page 3
  const size_t c = live.Add();
  ASSERT_OK(live.Record(c, Prefill(1), {16}));  // page 4, after the mark
  std::vector<int64_t> returned, orphaned;
  live.Rollback(mark, &returned, &orphaned);
  EXPECT_THAT(returned, ElementsAre(3, 4));
  EXPECT_THAT(orphaned, ElementsAre(2));
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].len, 3);  // a keeps its decoded token
  EXPECT_EQ(live[0].last_loc, 6);
}

TEST(CallArraysTest, HoldsTheClientLibrarysArrays) {
  CallArrays call;
  EXPECT_TRUE(call.empty());
  call.Add(Prefill(5));
  call.Add({7, 8, 10});
  EXPECT_THAT(call.prefix_lens, ElementsAre(0, 7));
  EXPECT_THAT(call.seq_lens, ElementsAre(5, 8));
  EXPECT_THAT(call.last_locs, ElementsAre(-1, 10));
  ASSERT_EQ(call.size(), 2u);
  EXPECT_EQ(call[1].prefix_len, 7);
  EXPECT_EQ(call[1].seq_len, 8);
  EXPECT_EQ(call[1].last_loc, 10);
}

// A scheduler's steps on a real PagePool: every answer passes Record, and
// what the set says each sequence holds is what the pool says it owns.
class SequenceSetOnAPoolTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(SequenceSetOnAPoolTest, AgreesWithThePoolUnderRandomSteps) {
  const int64_t page_size = GetParam();
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  constexpr OwnerId kOwner = 1;
  constexpr int64_t kPages = 96;
  CpuExecutor executor;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<PagePool> pool,
      PagePool::Create({kPages, page_size, FreePolicy::kLifo}, &executor));
  ASSERT_OK(pool->AddOwner(kOwner, 0));
  SequenceSet live(page_size);
  // Issues `shapes` (kind `kind`) for the sequences at `places`, or for new
  // sequences where a place is -1; records every answer.
  auto allocate = [&](RequestKind kind, const std::vector<int>& places,
                      const std::vector<ExtendShape>& shapes,
                      int64_t* refused) -> absl::Status {
    std::vector<AllocRequest> requests(shapes.size());
    std::vector<std::vector<int64_t>> out(shapes.size());
    for (size_t k = 0; k < shapes.size(); ++k) {
      AllocRequest& r = requests[k];
      r.kind = kind;
      r.owner = kOwner;
      r.index = k;
      r.prefix_len = shapes[k].prefix_len;
      r.seq_len = shapes[k].seq_len;
      r.last_loc = shapes[k].last_loc;
      out[k].assign(shapes[k].num_slots(), -1);
      r.destination = out[k].data();
    }
    const std::vector<AllocResult> results = pool->Allocate(requests);
    for (size_t k = 0; k < shapes.size(); ++k) {
      if (results[k].status.code() == absl::StatusCode::kResourceExhausted) {
        ++*refused;
        continue;
      }
      if (!results[k].status.ok()) return results[k].status;
      const size_t i = places[k] >= 0 ? places[k] : live.Add(kOwner);
      std::vector<int64_t> opened;
      if (absl::Status s = live.Record(i, shapes[k], out[k], &opened);
          !s.ok()) {
        return s;
      }
      if (static_cast<int64_t>(opened.size()) != results[k].num_new_pages) {
        return absl::InternalError("new pages disagree");
      }
    }
    return absl::OkStatus();
  };
  int64_t refused = 0, rolled_back = 0, steps_with_pages = 0;
  for (int step = 0; step < 2000; ++step) {
    SCOPED_TRACE(absl::StrFormat("step %d", step));
    const int op = uniform(0, 9);
    std::vector<int> places;
    std::vector<ExtendShape> shapes;
    if (op < 3 || live.empty()) {  // admit a few
      for (int k = uniform(1, 3); k > 0; --k) {
        places.push_back(-1);
        shapes.push_back(Prefill(uniform(1, 3 * page_size + 1)));
      }
      ASSERT_OK(allocate(RequestKind::kExtend, places, shapes, &refused));
    } else if (op < 6) {  // decode every sequence
      for (size_t i = 0; i < live.size(); ++i) {
        places.push_back(i);
        shapes.push_back(live[i].Decode());
      }
      ASSERT_OK(allocate(RequestKind::kDecode, places, shapes, &refused));
    } else if (op < 7) {  // a chunk for one
      places.push_back(uniform(0, live.size() - 1));
      shapes.push_back(live[places[0]].Extend(uniform(0, 2 * page_size)));
      ASSERT_OK(allocate(RequestKind::kExtend, places, shapes, &refused));
    } else if (op < 9) {  // finish one
      std::vector<int64_t> pages;
      live.Remove(uniform(0, live.size() - 1), &pages);
      if (!pages.empty()) {
        ASSERT_THAT(pool->FreePages(kOwner, pages),
                    IsOkAndHolds(static_cast<int64_t>(pages.size())));
      }
    } else {  // a speculative step, rolled back
      ASSERT_OK(pool->Checkpoint(kOwner));
      const SequenceSet::Mark mark = live.MarkCheckpoint();
      for (size_t i = 0; i < live.size(); ++i) {
        places.push_back(i);
        shapes.push_back(live[i].Decode());
      }
      ASSERT_OK(allocate(RequestKind::kDecode, places, shapes, &refused));
      ASSERT_OK_AND_ASSIGN(const int64_t rolled, pool->Rollback(kOwner));
      std::vector<int64_t> returned, orphaned;
      live.Rollback(mark, &returned, &orphaned);
      ASSERT_EQ(rolled, static_cast<int64_t>(returned.size()));
      rolled_back += rolled;
      if (!orphaned.empty()) {
        ASSERT_OK(pool->FreePages(kOwner, orphaned).status());
      }
    }
    // The set's pages are exactly the owner's.
    ASSERT_EQ(live.pages_held(), pool->Stats().used_pages);
    for (const LiveSequence& s : live) {
      for (int64_t page : s.pages) ASSERT_EQ(pool->OwnerOf(page), kOwner);
    }
    steps_with_pages += live.pages_held() > 0;
  }
  EXPECT_GT(refused, 0) << "the pool never ran short";
  EXPECT_GT(rolled_back, 0) << "no rollback returned a page";
  EXPECT_GT(steps_with_pages, 1000);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, SequenceSetOnAPoolTest,
                         ::testing::Values(1, 4, 16));

}  // namespace
}  // namespace pagealloc::testing
