#include "allocator/page_pool.h"

#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "allocator/fake_executor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr OwnerId kAlice = 1;
constexpr OwnerId kBob = 2;

// Everything a refused call must leave unchanged.
struct Snapshot {
  std::vector<int64_t> free_list;
  std::vector<int64_t> parked;
  std::vector<OwnerId> owners;
  int64_t free_pages, parked_pages, used_pages, alice_pages, bob_pages;

  bool operator==(const Snapshot& o) const {
    return free_list == o.free_list && parked == o.parked &&
           owners == o.owners && free_pages == o.free_pages &&
           parked_pages == o.parked_pages && used_pages == o.used_pages &&
           alice_pages == o.alice_pages && bob_pages == o.bob_pages;
  }
};

// Members are public so that the table-driven refusal test can call them
// through a fixture reference.
class PagePoolTest : public ::testing::Test {
 public:
  void MakePool(int64_t num_pages, int64_t page_size,
                FreePolicy policy = FreePolicy::kLifo,
                Semantics semantics = Semantics::kPagealloc) {
    pool_.reset();
    auto pool =
        PagePool::Create({num_pages, page_size, policy, semantics}, &executor_);
    ASSERT_OK(pool.status());
    pool_ = std::move(*pool);
    ASSERT_OK(pool_->AddOwner(kAlice, 0));
    ASSERT_OK(pool_->AddOwner(kBob, 0));
  }

  // Runs `batch`, giving each request a poisoned buffer of its size; returns
  // each request's result and fills `slots`.
  std::vector<AllocResult> Run(std::vector<AllocRequest> batch,
                               std::vector<std::vector<int64_t>>* slots,
                               std::vector<CallSpan> calls = {}) {
    slots->assign(batch.size(), {});
    for (size_t i = 0; i < batch.size(); ++i) {
      ExtendShape shape = ToExtendShape(batch[i]);
      (*slots)[i].assign(std::max<int64_t>(shape.num_slots(), 0), -7);
      batch[i].destination = (*slots)[i].data();
      batch[i].index = i;
    }
    std::vector<AllocResult> results = pool_->Allocate(batch, calls);
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!results[i].status.ok()) (*slots)[i].clear();
    }
    EXPECT_OK(pool_->CheckInvariants());
    return results;
  }

  // Runs a one-request batch and returns its slots, or its status.
  absl::StatusOr<std::vector<int64_t>> RunOne(const AllocRequest& request) {
    std::vector<std::vector<int64_t>> slots;
    std::vector<AllocResult> results = Run({request}, &slots);
    if (!results[0].status.ok()) return results[0].status;
    return slots[0];
  }

  static AllocRequest Extend(OwnerId owner, int64_t prefix, int64_t seq,
                             int64_t last) {
    return {RequestKind::kExtend, owner, 0, prefix, seq, last, nullptr};
  }
  static AllocRequest Decode(OwnerId owner, int64_t seq, int64_t last) {
    return {RequestKind::kDecode, owner, 0, 0, seq, last, nullptr};
  }
  static AllocRequest Alloc(OwnerId owner, int64_t tokens) {
    return {RequestKind::kAlloc, owner, 0, 0, tokens, -1, nullptr};
  }

  Snapshot Take() {
    Snapshot s;
    s.free_list = pool_->FreeList();
    s.parked = pool_->ParkedPages();
    for (int64_t p = 0; p <= pool_->geometry().num_pages; ++p) {
      s.owners.push_back(pool_->OwnerOf(p));
    }
    PoolStats stats = pool_->Stats();
    s.free_pages = stats.free_pages;
    s.parked_pages = stats.parked_pages;
    s.used_pages = stats.used_pages;
    s.alice_pages = stats.owners[kAlice].pages_owned;
    s.bob_pages = stats.owners[kBob].pages_owned;
    return s;
  }

  FakeExecutor executor_;
  std::unique_ptr<PagePool> pool_;
};

TEST_F(PagePoolTest, StartsWithEveryPageFreeInOrder) {
  MakePool(6, 4);
  EXPECT_THAT(pool_->FreeList(), ElementsAre(1, 2, 3, 4, 5, 6));
  PoolStats stats = pool_->Stats();
  EXPECT_EQ(stats.total_pages, 6);
  EXPECT_EQ(stats.free_pages, 6);
  EXPECT_EQ(stats.used_pages, 0);
  EXPECT_EQ(stats.page_size, 4);
  EXPECT_EQ(pool_->OwnerOf(0), kNoOwner);
}

TEST_F(PagePoolTest, RejectsBadOptions) {
  EXPECT_THAT(
      PagePool::Create({0, 4, FreePolicy::kLifo}, &executor_),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_pages (0)")));
  EXPECT_THAT(
      PagePool::Create({8, 0, FreePolicy::kLifo}, &executor_),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page_size (0)")));
  EXPECT_THAT(
      PagePool::Create({8, 4, FreePolicy::kLifo}, nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("executor")));
}

// The same example through the pool: Alice owns page 1 (her prefix of 2
// tokens ends at slot 5) and pages 3, 4 are at the front of the free list.
TEST_F(PagePoolTest, ExtendFillsPartialPageThenNewPages) {
  MakePool(8, 4);
  ASSERT_THAT(RunOne(Alloc(kAlice, 16)),
              IsOkAndHolds(ElementsAreArray(
                  {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19})));
  ASSERT_THAT(pool_->FreePages(kAlice, {3, 4}), IsOkAndHolds(2));
  ASSERT_THAT(pool_->FreeList(), ElementsAre(3, 4, 5, 6, 7, 8));
  EXPECT_THAT(RunOne(Extend(kAlice, 2, 11, 5)),
              IsOkAndHolds(ElementsAre(6, 7, 12, 13, 14, 15, 16, 17, 18)));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(5, 6, 7, 8));
  EXPECT_EQ(pool_->OwnerOf(3), kAlice);
  EXPECT_EQ(pool_->OwnerOf(4), kAlice);
}

TEST_F(PagePoolTest, DecodeInsideAPageConsumesNoPage) {
  MakePool(8, 4);
  // A 5-token sequence on pages 1, 2 ends at slot 8, the first of page 2.
  ASSERT_THAT(RunOne(Extend(kAlice, 0, 5, -1)),
              IsOkAndHolds(ElementsAre(4, 5, 6, 7, 8)));
  EXPECT_THAT(RunOne(Decode(kAlice, 6, 8)), IsOkAndHolds(ElementsAre(9)));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(3, 4, 5, 6, 7, 8));
  EXPECT_EQ(pool_->Stats().owners[kAlice].pages_owned, 2);
}

TEST_F(PagePoolTest, DecodeThatStartsAPageConsumesOne) {
  MakePool(8, 4);
  ASSERT_THAT(RunOne(Extend(kAlice, 0, 4, -1)),
              IsOkAndHolds(ElementsAre(4, 5, 6, 7)));
  EXPECT_THAT(RunOne(Decode(kAlice, 5, 7)), IsOkAndHolds(ElementsAre(8)));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(3, 4, 5, 6, 7, 8));
  EXPECT_EQ(pool_->OwnerOf(2), kAlice);
}

TEST_F(PagePoolTest, DecodeBatchTakesPagesInRequestOrder) {
  MakePool(8, 2);
  // Three sequences of 2 tokens (pages 1, 2, 3); each decode opens a page.
  std::vector<std::vector<int64_t>> slots;
  auto results =
      Run({Alloc(kAlice, 2), Alloc(kAlice, 2), Alloc(kBob, 2)}, &slots);
  ASSERT_OK(results[2].status);
  results = Run(
      {Decode(kAlice, 3, 3), Decode(kAlice, 3, 5), Decode(kBob, 3, 7)}, &slots);
  EXPECT_THAT(slots,
              ElementsAre(ElementsAre(8), ElementsAre(10), ElementsAre(12)));
  EXPECT_EQ(results[1].num_new_pages, 1);
}

TEST_F(PagePoolTest, EmptyPrefixUsesLastLocMinusOne) {
  MakePool(8, 4);
  EXPECT_THAT(RunOne(Extend(kAlice, 0, 6, -1)),
              IsOkAndHolds(ElementsAre(4, 5, 6, 7, 8, 9)));
  EXPECT_THAT(RunOne(Decode(kBob, 1, -1)), IsOkAndHolds(ElementsAre(12)));
}

TEST_F(PagePoolTest, ZeroExtendLengthYieldsNothing) {
  MakePool(8, 4);
  ASSERT_THAT(RunOne(Extend(kAlice, 0, 3, -1)),
              IsOkAndHolds(ElementsAre(4, 5, 6)));
  const Snapshot before = Take();
  std::vector<std::vector<int64_t>> slots;
  auto results =
      Run({Extend(kAlice, 3, 3, 6), Extend(kBob, 0, 0, -1), Alloc(kBob, 0)},
          &slots);
  for (const AllocResult& r : results) {
    EXPECT_OK(r.status);
    EXPECT_EQ(r.num_slots, 0);
    EXPECT_EQ(r.num_new_pages, 0);
  }
  EXPECT_TRUE(before == Take());
}

TEST_F(PagePoolTest, PageSizeOneGivesOnePagePerToken) {
  MakePool(8, 1);
  ASSERT_THAT(RunOne(Extend(kAlice, 0, 3, -1)),
              IsOkAndHolds(ElementsAre(1, 2, 3)));
  // Every decode opens a page with page_size 1.
  EXPECT_THAT(RunOne(Decode(kAlice, 4, 3)), IsOkAndHolds(ElementsAre(4)));
  EXPECT_THAT(RunOne(Extend(kAlice, 4, 6, 4)), IsOkAndHolds(ElementsAre(5, 6)));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(7, 8));
}

TEST_F(PagePoolTest, MixedBatchOffsetsAndPagesAddUp) {
  MakePool(16, 4);
  std::vector<std::vector<int64_t>> slots;
  auto results =
      Run({Extend(kAlice, 0, 5, -1), Alloc(kBob, 8), Decode(kAlice, 1, -1)},
          &slots);
  EXPECT_THAT(slots, ElementsAre(ElementsAre(4, 5, 6, 7, 8),
                                 ElementsAre(12, 13, 14, 15, 16, 17, 18, 19),
                                 ElementsAre(20)));
  EXPECT_EQ(results[0].num_new_pages, 2);
  EXPECT_EQ(results[1].num_new_pages, 2);
  EXPECT_EQ(results[2].num_new_pages, 1);
  PoolStats stats = pool_->Stats();
  EXPECT_EQ(stats.owners[kAlice].pages_owned, 3);
  EXPECT_EQ(stats.owners[kBob].pages_owned, 2);
  EXPECT_EQ(stats.slots_allocated, 14);
  EXPECT_EQ(stats.batches_executed, 1);
}

TEST_F(PagePoolTest, LifoFreeReusesFreedPagesFirstInOrderGiven) {
  MakePool(8, 4);
  ASSERT_OK(RunOne(Alloc(kAlice, 16)).status());  // pages 1..4
  // Slots 5 and 6 are both page 1: freed once. Then page 3 (slot 12).
  EXPECT_THAT(pool_->FreeSlots(kAlice, {5, 6, 12}), IsOkAndHolds(2));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(1, 3, 5, 6, 7, 8));
  EXPECT_THAT(RunOne(Alloc(kBob, 4)), IsOkAndHolds(ElementsAre(4, 5, 6, 7)));
  PoolStats stats = pool_->Stats();
  EXPECT_EQ(stats.pages_freed, 2);
  EXPECT_EQ(stats.owners[kAlice].pages_owned, 2);
}

TEST_F(PagePoolTest, SortedPolicyParksThenMergesWhenShort) {
  MakePool(4, 2, FreePolicy::kSorted);
  ASSERT_OK(RunOne(Alloc(kAlice, 6)).status());  // pages 1, 2, 3
  ASSERT_THAT(pool_->FreePages(kAlice, {3, 1}), IsOkAndHolds(2));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(4));
  EXPECT_THAT(pool_->ParkedPages(), ElementsAre(3, 1));
  EXPECT_EQ(pool_->Stats().parked_pages, 2);
  // One page fits without merging.
  EXPECT_THAT(RunOne(Alloc(kBob, 2)), IsOkAndHolds(ElementsAre(8, 9)));
  EXPECT_EQ(pool_->Stats().free_list_sorts, 0);
  // Two pages do not: merge {} + {3, 1}, sort, take 1 then 3.
  EXPECT_THAT(RunOne(Alloc(kBob, 4)), IsOkAndHolds(ElementsAre(2, 3, 6, 7)));
  EXPECT_EQ(pool_->Stats().free_list_sorts, 1);
  EXPECT_THAT(pool_->ParkedPages(), IsEmpty());
}

TEST_F(PagePoolTest, RollbackRestoresTheFreeListExactly) {
  MakePool(8, 4);
  ASSERT_OK(RunOne(Alloc(kAlice, 8)).status());
  ASSERT_THAT(pool_->FreePages(kAlice, {1}), IsOkAndHolds(1));
  const Snapshot before = Take();
  ASSERT_OK(pool_->Checkpoint(kAlice));
  ASSERT_OK(RunOne(Extend(kAlice, 0, 9, -1)).status());
  ASSERT_OK(RunOne(Decode(kAlice, 10, 16)).status());
  EXPECT_THAT(pool_->Rollback(kAlice), IsOkAndHolds(3));
  EXPECT_TRUE(before == Take());
  EXPECT_OK(pool_->CheckInvariants());
  EXPECT_THAT(pool_->Rollback(kAlice),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no checkpoint")));
}

TEST_F(PagePoolTest, RollbackLeavesOtherOwnersAlone) {
  MakePool(8, 4, FreePolicy::kSorted);
  ASSERT_OK(pool_->Checkpoint(kAlice));
  ASSERT_OK(RunOne(Alloc(kAlice, 4)).status());                 // page 1
  ASSERT_OK(RunOne(Alloc(kBob, 4)).status());                   // page 2
  ASSERT_OK(RunOne(Alloc(kAlice, 8)).status());                 // pages 3, 4
  ASSERT_THAT(pool_->FreePages(kAlice, {3}), IsOkAndHolds(1));  // parked
  EXPECT_THAT(pool_->Rollback(kAlice), IsOkAndHolds(2));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(1, 4, 5, 6, 7, 8));
  EXPECT_THAT(pool_->ParkedPages(), ElementsAre(3));
  EXPECT_EQ(pool_->OwnerOf(2), kBob);
}

TEST_F(PagePoolTest, RemoveOwnerReclaimsEveryPage) {
  MakePool(8, 4);
  ASSERT_OK(RunOne(Alloc(kAlice, 8)).status());
  ASSERT_OK(RunOne(Alloc(kBob, 4)).status());
  EXPECT_THAT(pool_->RemoveOwner(kAlice), IsOkAndHolds(2));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(1, 2, 4, 5, 6, 7, 8));
  EXPECT_THAT(RunOne(Alloc(kAlice, 4)), StatusIs(absl::StatusCode::kNotFound,
                                                 HasSubstr("unknown owner 1")));
  EXPECT_OK(pool_->CheckInvariants());
}

TEST_F(PagePoolTest, ClearFreesEverything) {
  MakePool(4, 4);
  ASSERT_OK(RunOne(Alloc(kAlice, 8)).status());
  ASSERT_OK(pool_->Checkpoint(kBob));
  ASSERT_OK(pool_->Clear());
  EXPECT_THAT(pool_->FreeList(), ElementsAre(1, 2, 3, 4));
  PoolStats stats = pool_->Stats();
  EXPECT_EQ(stats.owners[kAlice].pages_owned, 0);
  EXPECT_FALSE(stats.owners[kBob].checkpoint_active);
  EXPECT_OK(pool_->CheckInvariants());
}

// A refused free or extend says whether the free page it names was never
// handed out (a wrong page id) or was freed already (a double free).
TEST_F(PagePoolTest, AFreePageWasNeverAllocatedOrAlreadyFreed) {
  MakePool(8, 4);
  ASSERT_OK(RunOne(Alloc(kAlice, 8)).status());  // pages 1, 2
  ASSERT_THAT(pool_->FreePages(kAlice, {1}), IsOkAndHolds(1));
  EXPECT_THAT(pool_->FreePages(kAlice, {2, 1}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("pages[1] (1): page 1 was already freed "
                                 "(double free)")));
  EXPECT_THAT(pool_->FreeSlots(kAlice, {8, 12}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("slots[1] (12): page 3 was never allocated")));
  EXPECT_THAT(pool_->FreePages(kAlice, {3}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::Not(HasSubstr("double free"))));
  EXPECT_THAT(
      RunOne(Decode(kAlice, 2, 4)),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("last_locs[0] (4): page 1 was already freed")));
  EXPECT_THAT(RunOne(Decode(kAlice, 2, 12)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("last_locs[0] (12): page 3 was never "
                                 "allocated")));
  // Pages a rollback or Clear returned were handed out before.
  ASSERT_OK(pool_->Checkpoint(kBob));
  ASSERT_OK(RunOne(Alloc(kBob, 4)).status());  // page 1 again (LIFO)
  ASSERT_THAT(pool_->Rollback(kBob), IsOkAndHolds(1));
  ASSERT_OK(pool_->Clear());
  EXPECT_THAT(pool_->FreePages(kAlice, {2}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("page 2 was already freed")));
  EXPECT_THAT(pool_->FreePages(kAlice, {4}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("page 4 was never allocated")));
}

// A request that does not fit is refused alone; the rest of the batch
// proceeds and later requests may still fit.
TEST_F(PagePoolTest, OutOfPagesRefusesOnlyThatRequest) {
  MakePool(4, 4);
  std::vector<std::vector<int64_t>> slots;
  auto results =
      Run({Alloc(kAlice, 8), Alloc(kBob, 12), Alloc(kBob, 4)}, &slots);
  EXPECT_OK(results[0].status);
  EXPECT_THAT(results[1].status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("alloc request 1: out of pages: needs 3 "
                                 "pages, 2 free")));
  EXPECT_OK(results[2].status);
  EXPECT_THAT(slots[2], ElementsAre(12, 13, 14, 15));
  EXPECT_EQ(pool_->Stats().out_of_pages_refusals, 1);
}

TEST_F(PagePoolTest, QuotaCapsAnOwnersPages) {
  MakePool(8, 4);
  constexpr OwnerId kCarol = 3;
  ASSERT_OK(pool_->AddOwner(kCarol, 2));
  std::vector<std::vector<int64_t>> slots;
  auto results = Run({Alloc(kCarol, 4), Alloc(kCarol, 8)}, &slots);
  EXPECT_OK(results[0].status);
  EXPECT_THAT(results[1].status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("over quota: needs 2 pages, owner 3 holds 1 "
                                 "of its 2")));
  EXPECT_THAT(pool_->AddOwner(kCarol, 2),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("owner 3")));
  EXPECT_THAT(
      pool_->AddOwner(kNoOwner, 0),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reserved")));
}

// Each refusal: the right code, a message naming the field and index, and a
// pool exactly as it was.
struct RefusalCase {
  const char* name;
  std::function<absl::Status(PagePoolTest&)> call;
  absl::StatusCode code;
  const char* message;
};

class PagePoolRefusalTest : public PagePoolTest {};

TEST_F(PagePoolRefusalTest, EveryRefusalChangesNothing) {
  // Alice owns pages 1, 2 (slots 4..11) with a 6-token sequence ending at
  // slot 9; Bob owns page 3 (slots 12..15).
  auto one = [](PagePoolTest& t, AllocRequest r) {
    auto result = t.RunOne(r);
    return result.status();
  };
  const std::vector<RefusalCase> cases = {
      {"misaligned last_loc",
       [&](PagePoolTest& t) { return one(t, Extend(kAlice, 6, 8, 10)); },
       absl::StatusCode::kInvalidArgument, "last_locs[0] (10) is misaligned"},
      {"foreign last_loc",
       [&](PagePoolTest& t) { return one(t, Extend(kAlice, 2, 4, 13)); },
       absl::StatusCode::kPermissionDenied,
       "last_locs[0] (13): page 3 belongs to another session"},
      {"free last_loc",
       [&](PagePoolTest& t) { return one(t, Decode(kAlice, 3, 17)); },
       absl::StatusCode::kFailedPrecondition,
       "last_locs[0] (17): page 4 was never allocated"},
      {"seq_len < prefix_len",
       [&](PagePoolTest& t) { return one(t, Extend(kAlice, 6, 5, 9)); },
       absl::StatusCode::kInvalidArgument, "seq_lens[0] (5) < prefix_lens[0]"},
      {"unaligned alloc",
       [&](PagePoolTest& t) { return one(t, Alloc(kAlice, 5)); },
       absl::StatusCode::kInvalidArgument, "num_tokens[0] (5)"},
      {"out of pages",
       [&](PagePoolTest& t) { return one(t, Alloc(kBob, 4 * 6)); },
       absl::StatusCode::kResourceExhausted, "needs 6 pages, 5 free"},
      {"unknown owner", [&](PagePoolTest& t) { return one(t, Alloc(99, 4)); },
       absl::StatusCode::kNotFound, "unknown owner 99"},
      // Owner 0 (free pages) is never registered: refused like any unknown
      // owner, first in its batch or not.
      {"owner 0", [&](PagePoolTest& t) { return one(t, Alloc(kNoOwner, 4)); },
       absl::StatusCode::kNotFound, "unknown owner 0"},
      {"owner 0 after another",
       [&](PagePoolTest& t) {
         std::vector<std::vector<int64_t>> slots;
         return t.Run({Alloc(kAlice, 0), Extend(kNoOwner, 0, 4, -1)}, &slots)[1]
             .status;
       },
       absl::StatusCode::kNotFound, "unknown owner 0"},
      {"free a page never allocated",
       [](PagePoolTest& t) {
         return t.pool_->FreePages(kAlice, {1, 4}).status();
       },
       absl::StatusCode::kFailedPrecondition,
       "pages[1] (4): page 4 was never allocated"},
      {"free another's page",
       [](PagePoolTest& t) {
         return t.pool_->FreeSlots(kAlice, {4, 13}).status();
       },
       absl::StatusCode::kPermissionDenied,
       "slots[1] (13): page 3 belongs to another session"},
      {"free page 0",
       [](PagePoolTest& t) {
         return t.pool_->FreePages(kAlice, {1, 0}).status();
       },
       absl::StatusCode::kInvalidArgument, "pages[1] (0) is outside"},
      {"free slot of page 0",
       [](PagePoolTest& t) { return t.pool_->FreeSlots(kAlice, {2}).status(); },
       absl::StatusCode::kInvalidArgument, "page 0 is reserved"},
      {"slot out of range",
       [](PagePoolTest& t) {
         return t.pool_->FreeSlots(kAlice, {4, 36}).status();
       },
       absl::StatusCode::kInvalidArgument, "slots[1] (36) is outside"},
      {"negative slot",
       [](PagePoolTest& t) {
         return t.pool_->FreeSlots(kAlice, {-1}).status();
       },
       absl::StatusCode::kInvalidArgument, "slots[0] (-1) is outside"},
      {"free for unknown owner",
       [](PagePoolTest& t) { return t.pool_->FreePages(7, {1}).status(); },
       absl::StatusCode::kNotFound, "unknown owner 7"},
      {"rollback without checkpoint",
       [](PagePoolTest& t) { return t.pool_->Rollback(kBob).status(); },
       absl::StatusCode::kFailedPrecondition, "no checkpoint"},
      {"checkpoint for unknown owner",
       [](PagePoolTest& t) { return t.pool_->Checkpoint(5).status(); },
       absl::StatusCode::kNotFound, "unknown owner 5"},
      {"longer than the pool",
       [&](PagePoolTest& t) { return one(t, Extend(kAlice, 6, 33, 9)); },
       absl::StatusCode::kResourceExhausted,
       "seq_lens[0] (33) exceeds the pool's 32 usable slots (8 pages of 4)"},
      {"alloc longer than the pool",
       [&](PagePoolTest& t) { return one(t, Alloc(kBob, 36)); },
       absl::StatusCode::kResourceExhausted,
       "num_tokens[0] (36) exceeds the pool's 32 usable slots"},
      {"rollback to a checkpoint never taken",
       [](PagePoolTest& t) {
         EXPECT_OK(t.pool_->Checkpoint(kBob).status());
         EXPECT_OK(t.pool_->Rollback(kBob).status());
         return t.pool_->Rollback(kBob, 7).status();
       },
       absl::StatusCode::kFailedPrecondition, "no checkpoint"},
      {"clear a pool whose pages are owned",
       [](PagePoolTest& t) { return t.pool_->ClearPool(false).status(); },
       absl::StatusCode::kFailedPrecondition,
       "3 pages are owned, by owners 1 (2 pages), 2 (1 pages)"},
  };
  for (const RefusalCase& c : cases) {
    SCOPED_TRACE(c.name);
    MakePool(8, 4);
    ASSERT_OK(RunOne(Extend(kAlice, 0, 6, -1)).status());
    ASSERT_OK(RunOne(Alloc(kBob, 4)).status());
    const Snapshot before = Take();
    EXPECT_THAT(c.call(*this), StatusIs(c.code, HasSubstr(c.message)));
    EXPECT_TRUE(before == Take());
    EXPECT_OK(pool_->CheckInvariants());
  }
}

// A failed launch commits nothing: no page changes hands, no checkpoint
// records a page, no counter moves; a refusal from validation keeps its own
// status. The batch then succeeds as if the failure had not happened.
TEST_F(PagePoolTest, FailedLaunchCommitsNothing) {
  MakePool(8, 4);
  ASSERT_OK(RunOne(Alloc(kAlice, 4)).status());  // page 1
  ASSERT_OK(pool_->Checkpoint(kAlice));
  const Snapshot before = Take();
  const PoolStats stats_before = pool_->Stats();
  const std::vector<AllocRequest> batch = {Extend(kAlice, 2, 9, 5),
                                           Alloc(kBob, 5), Alloc(kBob, 8)};
  executor_.FailNextLaunches(
      1, absl::InternalError("CUDA error: an illegal memory access"));
  std::vector<std::vector<int64_t>> slots;
  std::vector<AllocResult> results = Run(batch, &slots);
  EXPECT_THAT(results[0].status,
              StatusIs(absl::StatusCode::kInternal, HasSubstr("CUDA error")));
  EXPECT_THAT(results[1].status, StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("num_tokens[1] (5)")));
  EXPECT_THAT(results[2].status,
              StatusIs(absl::StatusCode::kInternal, HasSubstr("CUDA error")));
  for (const AllocResult& result : results) {
    EXPECT_EQ(result.num_slots, 0);
    EXPECT_EQ(result.num_new_pages, 0);
  }
  EXPECT_TRUE(before == Take());
  const PoolStats stats_after = pool_->Stats();
  EXPECT_EQ(stats_after.pages_allocated, stats_before.pages_allocated);
  EXPECT_EQ(stats_after.slots_allocated, stats_before.slots_allocated);
  EXPECT_EQ(stats_after.batches_executed, stats_before.batches_executed);

  results = Run(batch, &slots);
  ASSERT_OK(results[0].status);
  ASSERT_OK(results[2].status);
  EXPECT_THAT(slots[0], ElementsAre(6, 7, 8, 9, 10, 11, 12));  // pages 2, 3
  EXPECT_THAT(slots[2], ElementsAre(16, 17, 18, 19, 20, 21, 22, 23));
  EXPECT_THAT(pool_->Rollback(kAlice), IsOkAndHolds(2));
}

// A batch whose every request is refused never reaches the executor.
TEST_F(PagePoolTest, BatchWithNothingAdmittedLaunchesNothing) {
  MakePool(4, 4);
  const int64_t launches = executor_.launches();
  std::vector<std::vector<int64_t>> slots;
  std::vector<AllocResult> results =
      Run({Alloc(kAlice, 5), Alloc(99, 4), Alloc(kBob, 20)}, &slots);
  for (const AllocResult& result : results) EXPECT_FALSE(result.status.ok());
  EXPECT_EQ(executor_.launches(), launches);
  EXPECT_EQ(pool_->Stats().batches_executed, 0);
  // One admitted request makes one launch for the whole batch.
  results = Run({Alloc(kAlice, 5), Alloc(kAlice, 4), Alloc(kBob, 4)}, &slots);
  EXPECT_EQ(executor_.launches(), launches + 1);
}

// SGLang's free puts the distinct pages back ascending (torch.unique); the
// daemon's own contract in order of first appearance. Freeing a free group
// of two requests, [8..11] then [4..7], decides which pages come next.
TEST_F(PagePoolTest, SlotFreeOrderFollowsTheSemanticsOrTheCall) {
  for (Semantics semantics : {Semantics::kPagealloc, Semantics::kSglang}) {
    SCOPED_TRACE(SemanticsName(semantics));
    MakePool(8, 4, FreePolicy::kLifo, semantics);
    ASSERT_OK(RunOne(Alloc(kAlice, 8)).status());  // pages 1, 2
    ASSERT_THAT(pool_->FreeSlots(kAlice, {8, 9, 10, 11, 4, 5, 6, 7}),
                IsOkAndHolds(2));
    if (semantics == Semantics::kSglang) {
      EXPECT_THAT(RunOne(Alloc(kBob, 4)),
                  IsOkAndHolds(ElementsAre(4, 5, 6, 7)));
    } else {
      EXPECT_THAT(RunOne(Alloc(kBob, 4)),
                  IsOkAndHolds(ElementsAre(8, 9, 10, 11)));
    }
    // The call chooses: each order under either semantics.
    MakePool(8, 4, FreePolicy::kLifo, semantics);
    ASSERT_OK(RunOne(Alloc(kAlice, 12)).status());  // pages 1, 2, 3
    ASSERT_THAT(
        pool_->FreeSlots(kAlice, {12, 4, 8}, FreeOrder::kFirstAppearance),
        IsOkAndHolds(3));
    EXPECT_THAT(pool_->FreeList(), ElementsAre(3, 1, 2, 4, 5, 6, 7, 8));
    ASSERT_OK(RunOne(Alloc(kAlice, 12)).status());
    ASSERT_THAT(pool_->FreePages(kAlice, {3, 1, 2}, FreeOrder::kAscending),
                IsOkAndHolds(3));
    EXPECT_THAT(pool_->FreeList(), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8));
    // Page ids keep their order by default (SGLang's free_segment).
    ASSERT_OK(RunOne(Alloc(kAlice, 12)).status());
    ASSERT_THAT(pool_->FreePages(kAlice, {3, 1, 2}), IsOkAndHolds(3));
    EXPECT_THAT(pool_->FreeList(), ElementsAre(3, 1, 2, 4, 5, 6, 7, 8));
  }
}

// With page_size 1 SGLang uses its token allocator, whose free appends: a
// freed slot is reused after every other free one (FIFO), in the order
// given.
TEST_F(PagePoolTest, SglangPageSizeOneFreesToTheBackInOrderGiven) {
  MakePool(6, 1, FreePolicy::kLifo, Semantics::kSglang);
  ASSERT_THAT(RunOne(Alloc(kAlice, 4)), IsOkAndHolds(ElementsAre(1, 2, 3, 4)));
  ASSERT_THAT(pool_->FreeSlots(kAlice, {3, 1, 3}), IsOkAndHolds(2));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(5, 6, 3, 1));
  EXPECT_THAT(RunOne(Alloc(kBob, 3)), IsOkAndHolds(ElementsAre(5, 6, 3)));
  // A reclaim goes to the back too, ascending; a rollback to the front.
  ASSERT_OK(pool_->Checkpoint(kBob).status());
  ASSERT_THAT(RunOne(Alloc(kBob, 1)), IsOkAndHolds(ElementsAre(1)));
  EXPECT_THAT(pool_->RemoveOwner(kAlice), IsOkAndHolds(2));  // pages 2, 4
  EXPECT_THAT(pool_->FreeList(), ElementsAre(2, 4));
  EXPECT_THAT(pool_->Rollback(kBob), IsOkAndHolds(1));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(1, 2, 4));
  // The daemon's own semantics stay LIFO.
  MakePool(6, 1);
  ASSERT_OK(RunOne(Alloc(kAlice, 4)).status());
  ASSERT_THAT(pool_->FreeSlots(kAlice, {3, 1}), IsOkAndHolds(2));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(3, 1, 5, 6));
}

// Under the sorted policy SGLang merges when its over-estimate exceeds the
// free list (extend: slots // page_size + requests + 1; decode: requests),
// also when the call would fit; the daemon's own semantics only when the
// launch does not fit.
TEST_F(PagePoolTest, SglangMergesOnItsOverEstimate) {
  for (Semantics semantics : {Semantics::kPagealloc, Semantics::kSglang}) {
    SCOPED_TRACE(SemanticsName(semantics));
    const bool sglang = semantics == Semantics::kSglang;
    // Alice holds pages 1..6; 2 and 4 are parked; 7 and 8 are free.
    auto setup = [&] {
      MakePool(8, 4, FreePolicy::kSorted, semantics);
      ASSERT_OK(RunOne(Alloc(kAlice, 24)).status());
      ASSERT_THAT(pool_->FreePages(kAlice, {4, 2}), IsOkAndHolds(2));
      ASSERT_THAT(pool_->FreeList(), ElementsAre(7, 8));
    };
    // Extend of 4 slots: needs 1 page, SGLang estimates 4 / 4 + 1 + 1 = 3.
    setup();
    EXPECT_THAT(RunOne(Extend(kAlice, 0, 4, -1)),
                IsOkAndHolds(ElementsAreArray(
                    sglang ? std::vector<int64_t>{8, 9, 10, 11}
                           : std::vector<int64_t>{28, 29, 30, 31})));
    EXPECT_EQ(pool_->Stats().free_list_sorts, sglang ? 1 : 0);
    if (sglang) {
      EXPECT_THAT(pool_->ParkedPages(), IsEmpty());
    } else {
      EXPECT_THAT(pool_->ParkedPages(), ElementsAre(4, 2));
    }
    // Three decodes, one of which starts a page: 3 requests > 2 free.
    setup();
    std::vector<std::vector<int64_t>> slots;
    auto results =
        Run({Decode(kAlice, 2, 4), Decode(kAlice, 2, 12), Decode(kBob, 1, -1)},
            &slots);
    for (const AllocResult& result : results) ASSERT_OK(result.status);
    EXPECT_THAT(slots[2], ElementsAre(sglang ? 8 : 28));
    // An alloc merges only when it does not fit, under both.
    setup();
    EXPECT_THAT(RunOne(Alloc(kBob, 8)),
                IsOkAndHolds(ElementsAre(28, 29, 30, 31, 32, 33, 34, 35)));
    EXPECT_EQ(pool_->Stats().free_list_sorts, 0);
  }
}

// Under SGLang's semantics each call of a launch decides its own merge,
// from the pages left after the calls before it; a merge keeps the pages
// those calls were planned to take where they are.
TEST_F(PagePoolTest, SglangMergeIsPerCallWithinALaunch) {
  MakePool(8, 4, FreePolicy::kSorted, Semantics::kSglang);
  ASSERT_OK(RunOne(Alloc(kAlice, 24)).status());  // pages 1..6
  ASSERT_THAT(pool_->FreePages(kAlice, {4, 2}), IsOkAndHolds(2));
  // Call 1 (alloc 1 page) fits without a merge and takes page 7; call 2
  // (decode, 1 request, 1 free page left) does not merge either; call 3
  // (extend of 1 slot: 0 + 1 + 1 = 2 > 0 left) merges {2, 4}.
  std::vector<std::vector<int64_t>> slots;
  auto results =
      Run({Alloc(kBob, 4), Decode(kBob, 1, -1), Extend(kBob, 0, 1, -1)}, &slots,
          {{1, false, {}}, {1, false, {}}, {1, false, {}}});
  for (const AllocResult& result : results) ASSERT_OK(result.status);
  EXPECT_THAT(slots[0], ElementsAre(28, 29, 30, 31));
  EXPECT_THAT(slots[1], ElementsAre(32));
  EXPECT_THAT(slots[2], ElementsAre(8));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(4));
  EXPECT_EQ(pool_->Stats().free_list_sorts, 1);
}

// An all-or-nothing call is admitted whole or not at all; the other calls
// of the launch are not affected.
TEST_F(PagePoolTest, AllOrNothingCallIsRefusedWhole) {
  MakePool(4, 4);
  const Snapshot before = Take();
  std::vector<std::vector<int64_t>> slots;
  auto results =
      Run({Alloc(kAlice, 8), Alloc(kAlice, 12), Alloc(kBob, 4), Alloc(kBob, 8)},
          &slots, {{2, true, {}}, {2, false, {}}});
  EXPECT_THAT(results[0].status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("alloc request 0: refused with its "
                                 "all-or-nothing call: alloc request 1: out "
                                 "of pages: needs 3 pages, 2 free")));
  EXPECT_THAT(results[1].status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("alloc request 1: out of pages")));
  EXPECT_EQ(results[0].num_slots, 0);
  EXPECT_EQ(results[0].num_new_pages, 0);
  // Bob's call starts from the pages Alice's did not take.
  EXPECT_THAT(slots[2], ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(slots[3], ElementsAre(8, 9, 10, 11, 12, 13, 14, 15));
  EXPECT_EQ(pool_->Stats().owners[kAlice].pages_owned, 0);
  ASSERT_OK(pool_->FreePages(kBob, {1, 2, 3}).status());
  ASSERT_OK(pool_->ClearPool(false).status());
  EXPECT_TRUE(before == Take());
  // A request refused for another reason refuses the rest as ABORTED; an
  // over-long one counts as not fitting.
  results =
      Run({Alloc(kAlice, 4), Decode(kAlice, 2, 16)}, &slots, {{2, true, {}}});
  EXPECT_THAT(results[0].status,
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("request 1: last_locs[1] (16): page 4 was "
                                 "never allocated")));
  EXPECT_THAT(results[1].status, StatusIs(absl::StatusCode::kFailedPrecondition,
                                          HasSubstr("page 4")));
  results = Run({Alloc(kAlice, 4), Alloc(kAlice, 20)}, &slots, {{2, true, {}}});
  EXPECT_THAT(results[0].status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("exceeds the pool's 16 usable slots")));
  // Over quota decides like a shortage.
  constexpr OwnerId kCarol = 3;
  ASSERT_OK(pool_->AddOwner(kCarol, 1));
  results = Run({Alloc(kCarol, 4), Alloc(kCarol, 4)}, &slots, {{2, true, {}}});
  EXPECT_THAT(results[0].status, StatusIs(absl::StatusCode::kResourceExhausted,
                                          HasSubstr("over quota")));
  EXPECT_TRUE(before == Take());
  // The same call fits once there is room, whole.
  results = Run({Alloc(kAlice, 8), Alloc(kAlice, 8)}, &slots, {{2, true, {}}});
  EXPECT_OK(results[0].status);
  EXPECT_OK(results[1].status);
  // Calls that do not cover the batch are a caller's bug.
  results = Run({Alloc(kBob, 4)}, &slots, {{2, true, {}}});
  EXPECT_THAT(results[0].status, StatusIs(absl::StatusCode::kInternal,
                                          HasSubstr("cover 2 requests")));
}

// One bound for every kind: num_pages * page_size slots (page 0 never
// counts). A longer request is refused alone.
TEST_F(PagePoolTest, RequestsLongerThanThePoolAreRefusedAlone) {
  MakePool(8, 4);
  std::vector<std::vector<int64_t>> slots;
  auto results = Run({Extend(kAlice, 0, 33, -1), Alloc(kBob, 36),
                      Decode(kBob, 33, -1), Extend(kAlice, 0, 5, -1)},
                     &slots);
  EXPECT_THAT(results[0].status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("extend request 0: seq_lens[0] (33) exceeds "
                                 "the pool's 32 usable slots (8 pages of 4): "
                                 "it can never fit")));
  EXPECT_THAT(results[1].status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("num_tokens[1] (36) exceeds the pool's 32")));
  EXPECT_THAT(results[2].status, StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("last_locs[2] (-1)")));
  EXPECT_OK(results[3].status);
  // Exactly the pool fits.
  ASSERT_OK(pool_->FreePages(kAlice, {1, 2}).status());
  EXPECT_OK(RunOne(Extend(kBob, 0, 32, -1)).status());
}

// Checkpoints are values on a stack: nested ones roll back in any order,
// the same one twice, and what cannot be honoured is refused clearly.
TEST_F(PagePoolTest, CheckpointsNestAndRollBackToAnId) {
  MakePool(8, 4);
  ASSERT_OK(RunOne(Alloc(kAlice, 4)).status());  // page 1, before any
  const Snapshot at_outer = Take();
  ASSERT_OK_AND_ASSIGN(const uint64_t outer, pool_->Checkpoint(kAlice));
  ASSERT_OK(RunOne(Alloc(kAlice, 8)).status());  // pages 2, 3
  const Snapshot at_inner = Take();
  ASSERT_OK_AND_ASSIGN(const uint64_t inner, pool_->Checkpoint(kAlice));
  EXPECT_EQ(inner, outer + 1);
  EXPECT_EQ(pool_->Stats().owners[kAlice].checkpoints, 2);
  ASSERT_OK(RunOne(Alloc(kAlice, 4)).status());  // page 4
  EXPECT_THAT(pool_->Rollback(kAlice, inner), IsOkAndHolds(1));
  EXPECT_TRUE(at_inner == Take());
  // The same state again (SGLang's restore_state of one saved value).
  ASSERT_OK(RunOne(Alloc(kAlice, 8)).status());
  EXPECT_THAT(pool_->Rollback(kAlice, inner), IsOkAndHolds(2));
  EXPECT_TRUE(at_inner == Take());
  // The outer one, past the inner one, which ends.
  ASSERT_OK(RunOne(Alloc(kAlice, 4)).status());
  EXPECT_THAT(pool_->Rollback(kAlice, outer), IsOkAndHolds(3));
  EXPECT_TRUE(at_outer == Take());
  EXPECT_THAT(pool_->Rollback(kAlice, inner),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("checkpoint 2 of owner 1 has ended")));
  EXPECT_THAT(pool_->Rollback(kAlice, 9),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("owner 1 never took checkpoint 9")));
  // Without an id: the latest, which ends.
  EXPECT_THAT(pool_->Rollback(kAlice), IsOkAndHolds(0));
  EXPECT_THAT(pool_->Rollback(kAlice, outer),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no checkpoint")));
  EXPECT_EQ(pool_->Stats().owners[kAlice].checkpoints, 0);
}

// Frees between a checkpoint and its rollback stay frees, and a page freed
// and given again comes back once, for the give that still holds.
TEST_F(PagePoolTest, RollbackKeepsFreesAndReturnsARegivenPageOnce) {
  MakePool(8, 4);
  ASSERT_OK_AND_ASSIGN(const uint64_t id, pool_->Checkpoint(kAlice));
  ASSERT_THAT(RunOne(Alloc(kAlice, 8)),
              IsOkAndHolds(ElementsAre(4, 5, 6, 7, 8, 9, 10, 11)));
  ASSERT_THAT(pool_->FreePages(kAlice, {1}), IsOkAndHolds(1));
  ASSERT_THAT(RunOne(Alloc(kAlice, 4)), IsOkAndHolds(ElementsAre(4, 5, 6, 7)));
  ASSERT_THAT(pool_->FreePages(kAlice, {2}), IsOkAndHolds(1));
  EXPECT_THAT(pool_->Rollback(kAlice, id), IsOkAndHolds(1));  // page 1
  EXPECT_THAT(pool_->FreeList(), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8));
}

// The oldest checkpoint ends beyond kMaxCheckpoints, and the log of given
// pages stays bounded however long a checkpoint lives.
TEST_F(PagePoolTest, CheckpointStackAndLogStayBounded) {
  MakePool(8, 4);
  ASSERT_OK_AND_ASSIGN(const uint64_t first, pool_->Checkpoint(kAlice));
  for (int i = 1; i < PagePool::kMaxCheckpoints; ++i) {
    ASSERT_OK(pool_->Checkpoint(kAlice).status());
  }
  ASSERT_OK_AND_ASSIGN(const uint64_t last, pool_->Checkpoint(kAlice));
  EXPECT_EQ(pool_->Stats().owners[kAlice].checkpoints,
            PagePool::kMaxCheckpoints);
  EXPECT_THAT(
      pool_->Rollback(kAlice, first),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("has ended")));
  EXPECT_OK(pool_->Rollback(kAlice, first + 1).status());
  // Thousands of gives and frees under a live checkpoint: compaction keeps
  // the pages still held since it, in order.
  ASSERT_OK_AND_ASSIGN(const uint64_t held, pool_->Checkpoint(kAlice));
  EXPECT_GT(held, last);
  ASSERT_THAT(RunOne(Alloc(kAlice, 4)), IsOkAndHolds(ElementsAre(4, 5, 6, 7)));
  for (int i = 0; i < 5000; ++i) {
    ASSERT_OK(RunOne(Alloc(kAlice, 8)).status());
    ASSERT_OK(pool_->FreeSlots(kAlice, {8, 12}).status());
  }
  ASSERT_THAT(RunOne(Alloc(kAlice, 4)),
              IsOkAndHolds(ElementsAre(8, 9, 10, 11)));
  const Snapshot now = Take();
  EXPECT_THAT(pool_->Rollback(kAlice, held), IsOkAndHolds(2));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8));
  (void)now;
}

TEST_F(PagePoolTest, ClearOwnerFreesItsPagesAndResetsAnIdlePool) {
  MakePool(6, 4, FreePolicy::kSorted);
  ASSERT_OK(RunOne(Alloc(kAlice, 12)).status());  // pages 1, 2, 3
  ASSERT_OK(RunOne(Alloc(kBob, 4)).status());     // page 4
  ASSERT_OK(pool_->Checkpoint(kAlice).status());
  ASSERT_OK(pool_->FreePages(kAlice, {2}).status());  // parked
  EXPECT_THAT(pool_->ClearOwner(kAlice), IsOkAndHolds(2));
  EXPECT_THAT(pool_->ParkedPages(), ElementsAre(2, 1, 3));  // Bob holds 4
  PoolStats stats = pool_->Stats();
  EXPECT_EQ(stats.owners[kAlice].pages_owned, 0);
  EXPECT_EQ(stats.owners[kAlice].checkpoints, 0);
  // The owner stays registered and can allocate.
  EXPECT_THAT(RunOne(Alloc(kAlice, 4)),
              IsOkAndHolds(ElementsAre(20, 21, 22, 23)));
  ASSERT_OK(pool_->ClearOwner(kAlice).status());
  // The last holder clears: back to 1..num_pages, nothing parked.
  EXPECT_THAT(pool_->ClearOwner(kBob), IsOkAndHolds(1));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_THAT(pool_->ParkedPages(), IsEmpty());
  EXPECT_THAT(pool_->ClearOwner(9),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("owner 9")));
}

TEST_F(PagePoolTest, ClearPoolRefusesWhilePagesAreOwnedUnlessForced) {
  MakePool(4, 4);
  ASSERT_OK(RunOne(Alloc(kAlice, 8)).status());
  ASSERT_OK(pool_->FreePages(kAlice, {1}).status());
  const Snapshot before = Take();
  EXPECT_THAT(pool_->ClearPool(false),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("1 pages are owned, by owners 1 (1 pages)")));
  EXPECT_TRUE(before == Take());
  EXPECT_THAT(pool_->ClearPool(true), IsOkAndHolds(1));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(1, 2, 3, 4));
  // An idle pool clears without force (its order resets).
  ASSERT_OK(RunOne(Alloc(kAlice, 8)).status());
  ASSERT_OK(pool_->FreePages(kAlice, {1, 2}).status());
  EXPECT_THAT(pool_->FreeList(), ElementsAre(1, 2, 3, 4));
  ASSERT_OK(RunOne(Alloc(kAlice, 4)).status());
  ASSERT_OK(pool_->FreePages(kAlice, {1}).status());
  EXPECT_THAT(pool_->ClearPool(false), IsOkAndHolds(0));
  EXPECT_THAT(pool_->FreeList(), ElementsAre(1, 2, 3, 4));
}

TEST_F(PagePoolTest, FreeListsReadsBothListsBounded) {
  MakePool(6, 2, FreePolicy::kSorted);
  ASSERT_OK(RunOne(Alloc(kAlice, 8)).status());  // pages 1..4
  ASSERT_OK(pool_->FreePages(kAlice, {3, 1, 2}).status());
  FreeListsView view = pool_->FreeLists(2);
  EXPECT_THAT(view.free_pages, ElementsAre(5, 6));
  EXPECT_THAT(view.parked_pages, ElementsAre(3, 1));
  EXPECT_EQ(view.free_count, 2);
  EXPECT_EQ(view.parked_count, 3);
  view = pool_->FreeLists(0);
  EXPECT_THAT(view.free_pages, IsEmpty());
  EXPECT_THAT(view.parked_pages, IsEmpty());
  EXPECT_EQ(view.parked_count, 3);
}

TEST(SemanticsTest, ParsesNames) {
  EXPECT_THAT(ParseSemantics("pagealloc"), IsOkAndHolds(Semantics::kPagealloc));
  EXPECT_THAT(ParseSemantics("sglang"), IsOkAndHolds(Semantics::kSglang));
  EXPECT_EQ(SemanticsName(Semantics::kSglang), "sglang");
  EXPECT_THAT(
      ParseSemantics("vllm"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"vllm\"")));
}

TEST(FreePolicyTest, ParsesNames) {
  EXPECT_THAT(ParseFreePolicy("lifo"), IsOkAndHolds(FreePolicy::kLifo));
  EXPECT_THAT(ParseFreePolicy("sorted"), IsOkAndHolds(FreePolicy::kSorted));
  EXPECT_THAT(
      ParseFreePolicy("fifo"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"fifo\"")));
}

// A LIFO pool of `num_pages` pages of `page_size` that scrubs pages changing
// owner (--kv_scrub), with Alice and Bob as owners.
absl::StatusOr<std::unique_ptr<PagePool>> ScrubbingPool(
    PlanExecutor* executor, int64_t num_pages, int64_t page_size,
    bool ring_copy_plans = true) {
  PoolOptions options{num_pages, page_size, FreePolicy::kLifo};
  options.scrub = true;
  options.ring_copy_plans = ring_copy_plans;
  absl::StatusOr<std::unique_ptr<PagePool>> pool =
      PagePool::Create(options, executor);
  if (!pool.ok()) return pool;
  for (OwnerId owner : {kAlice, kBob}) {
    const absl::Status added = (*pool)->AddOwner(owner, 0);
    if (!added.ok()) return added;
  }
  return pool;
}

// --kv_scrub: a page is listed for zeroing exactly when it goes to an owner
// other than its last one; fresh pages, and pages coming back to their last
// owner, are not.
TEST_F(PagePoolTest, ScrubListsPagesChangingOwner) {
  FakeExecutor executor;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PagePool> pool,
                       ScrubbingPool(&executor, 4, 2));
  std::vector<int64_t> out(8);
  auto alloc = [&](OwnerId owner, int64_t tokens) {
    AllocRequest request = Alloc(owner, tokens);
    request.destination = out.data();
    return pool->Allocate({request})[0].status;
  };
  // Fresh pages 1, 2 to Alice, 3 to Bob: nothing to scrub.
  ASSERT_OK(alloc(kAlice, 4));
  ASSERT_OK(alloc(kBob, 2));
  EXPECT_THAT(executor.scrubbed_pages(), IsEmpty());
  EXPECT_EQ(pool->LastOwnerOf(1), kAlice);
  EXPECT_EQ(pool->LastOwnerOf(3), kBob);
  EXPECT_EQ(pool->LastOwnerOf(4), kNoOwner);
  // Alice frees 1 and 2 (lifo: the list is 2, 1, 4); freeing keeps the
  // last owner.
  ASSERT_THAT(pool->FreePages(kAlice, {1, 2}), IsOkAndHolds(2));
  EXPECT_EQ(pool->OwnerOf(1), kNoOwner);
  EXPECT_EQ(pool->LastOwnerOf(1), kAlice);
  // Bob takes 1 and 2 (Alice's: scrubbed) and 4 (fresh: not).
  ASSERT_OK(alloc(kBob, 6));
  EXPECT_THAT(executor.scrubbed_pages(), ElementsAre(1, 2));
  EXPECT_EQ(pool->Stats().pages_scrubbed, 2);
  // Bob frees 3 and takes it back: his own, not scrubbed.
  ASSERT_THAT(pool->FreePages(kBob, {3}), IsOkAndHolds(1));
  ASSERT_OK(alloc(kBob, 2));
  EXPECT_THAT(executor.scrubbed_pages(), ElementsAre(1, 2));
  // Alice gets Bob's page 2 back: scrubbed again.
  ASSERT_THAT(pool->FreePages(kBob, {2}), IsOkAndHolds(1));
  ASSERT_OK(alloc(kAlice, 2));
  EXPECT_THAT(executor.scrubbed_pages(), ElementsAre(1, 2, 2));
  // A removed owner's pages are scrubbed for the next one.
  ASSERT_THAT(pool->RemoveOwner(kBob), IsOkAndHolds(3));
  ASSERT_OK(alloc(kAlice, 2));
  EXPECT_EQ(executor.scrubbed_pages().size(), 4u);
  EXPECT_EQ(pool->Stats().pages_scrubbed, 4);
  EXPECT_OK(pool->CheckInvariants());
}

// A failed launch lists nothing as scrubbed and commits no last owner.
TEST_F(PagePoolTest, ScrubOfAFailedLaunchCommitsNothing) {
  FakeExecutor executor;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PagePool> pool,
                       ScrubbingPool(&executor, 2, 1));
  int64_t slot = 0;
  AllocRequest request = Alloc(kAlice, 1);
  request.destination = &slot;
  ASSERT_OK(pool->Allocate({request})[0].status);
  ASSERT_THAT(pool->FreePages(kAlice, {1}), IsOkAndHolds(1));
  executor.FailNextLaunches(1, absl::InternalError("device lost"));
  request.owner = kBob;
  EXPECT_THAT(pool->Allocate({request})[0].status,
              StatusIs(absl::StatusCode::kInternal, HasSubstr("device lost")));
  EXPECT_THAT(executor.scrubbed_pages(), IsEmpty());
  EXPECT_EQ(pool->LastOwnerOf(1), kAlice);
  EXPECT_EQ(pool->Stats().pages_scrubbed, 0);
  ASSERT_OK(pool->Allocate({request})[0].status);
  EXPECT_THAT(executor.scrubbed_pages(), ElementsAre(1));
  EXPECT_EQ(pool->LastOwnerOf(1), kBob);
}

// An all-or-nothing call refused after some of its requests were planned
// lists none of their pages for scrubbing; the next call of the launch plans
// from where the refused one began. In both plan forms at page size 1.
TEST_F(PagePoolTest, ScrubOfARefusedAllOrNothingCallListsNothing) {
  for (bool ring_copies : {true, false}) {
    SCOPED_TRACE(ring_copies ? "ring copies" : "request plans");
    FakeExecutor executor;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PagePool> pool,
                         ScrubbingPool(&executor, 4, 1, ring_copies));
    std::vector<int64_t> out(6, -7);
    AllocRequest first = Alloc(kAlice, 2);
    first.destination = out.data();
    ASSERT_OK(pool->Allocate({first})[0].status);
    // Alice's pages 1 and 2 go back to the front: the list is 1, 2, 3, 4.
    ASSERT_THAT(pool->FreePages(kAlice, {1, 2}), IsOkAndHolds(2));
    // Bob's first call would take 1, 2 and then 3 more of the 2 left: it
    // is refused whole. His second call takes page 1, Alice's: scrubbed.
    std::vector<AllocRequest> batch = {Alloc(kBob, 2), Alloc(kBob, 3),
                                       Alloc(kBob, 1)};
    batch[0].destination = out.data();
    batch[1].destination = out.data() + 2;
    batch[2].destination = out.data() + 5;
    const std::vector<AllocResult> results =
        pool->Allocate(batch, {{2, true, {}}, {1, false, {}}});
    EXPECT_THAT(results[0].status,
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("refused with its all-or-nothing call")));
    EXPECT_THAT(results[1].status,
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("needs 3 pages, 2 free")));
    ASSERT_OK(results[2].status);
    EXPECT_EQ(results[0].num_slots, 0);
    EXPECT_EQ(out[5], 1);
    EXPECT_THAT(executor.scrubbed_pages(), ElementsAre(1));
    EXPECT_EQ(pool->Stats().pages_scrubbed, 1);
    EXPECT_EQ(pool->OwnerOf(1), kBob);
    EXPECT_EQ(pool->OwnerOf(2), kNoOwner);
    EXPECT_EQ(pool->LastOwnerOf(2), kAlice);
    EXPECT_THAT(pool->FreeList(), ElementsAre(2, 3, 4));
    EXPECT_OK(pool->CheckInvariants());
  }
}

// Without PoolOptions.scrub nothing is tracked or listed.
TEST_F(PagePoolTest, NoScrubWithoutTheOption) {
  MakePool(2, 1);
  int64_t slot = 0;
  AllocRequest request = Alloc(kAlice, 1);
  request.destination = &slot;
  ASSERT_OK(pool_->Allocate({request})[0].status);
  ASSERT_THAT(pool_->FreePages(kAlice, {1}), IsOkAndHolds(1));
  request.owner = kBob;
  ASSERT_OK(pool_->Allocate({request})[0].status);
  EXPECT_THAT(executor_.scrubbed_pages(), IsEmpty());
  EXPECT_EQ(pool_->LastOwnerOf(1), kNoOwner);
}

// Expansion::kPool: the pool writes the slots the executor would have, from
// its own free list, and never calls the executor. Two pools take the same
// random trace (extends that start or continue a sequence, decodes, whole
// pages, frees, several owners), one expanded by the executor and one by
// the pool; every result and slot must match.
class PoolExpansionTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(PoolExpansionTest, ThePoolWritesTheExecutorsSlots) {
  const int64_t page_size = GetParam();
  FakeExecutor by_executor_executor, by_pool_executor;
  const PoolOptions options{512, page_size, FreePolicy::kLifo,
                            Semantics::kSglang};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PagePool> by_executor,
                       PagePool::Create(options, &by_executor_executor));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PagePool> by_pool,
                       PagePool::Create(options, &by_pool_executor));
  for (OwnerId owner : {kAlice, kBob}) {
    ASSERT_OK(by_executor->AddOwner(owner, 0));
    ASSERT_OK(by_pool->AddOwner(owner, 0));
  }
  struct Sequence {
    OwnerId owner;
    std::vector<int64_t> slots;
  };
  std::vector<Sequence> sequences;
  std::mt19937_64 rng(page_size);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int step = 0; step < 300; ++step) {
    // A batch of up to 4 requests, each of a sequence of its own.
    std::vector<AllocRequest> batch;
    std::vector<int> of;  // the sequence each request extends, or -1
    std::vector<bool> taken(sequences.size(), false);
    for (int64_t n = uniform(1, 4); n > 0; --n) {
      const int64_t pick =
          uniform(-1, static_cast<int64_t>(sequences.size()) - 1);
      if (pick < 0 || taken[pick]) {
        const OwnerId owner = uniform(0, 1) ? kAlice : kBob;
        batch.push_back(
            uniform(0, 2) == 0
                ? PagePoolTest::Alloc(owner, page_size * uniform(1, 3))
                : PagePoolTest::Extend(owner, 0, uniform(1, 40), -1));
        of.push_back(-1);
        continue;
      }
      taken[pick] = true;
      const Sequence& sequence = sequences[pick];
      const int64_t len = static_cast<int64_t>(sequence.slots.size());
      batch.push_back(uniform(0, 1)
                          ? PagePoolTest::Decode(sequence.owner, len + 1,
                                                 sequence.slots.back())
                          : PagePoolTest::Extend(sequence.owner, len,
                                                 len + uniform(1, 20),
                                                 sequence.slots.back()));
      of.push_back(static_cast<int>(pick));
    }
    std::vector<std::vector<int64_t>> executor_slots(batch.size()),
        pool_slots(batch.size());
    std::vector<AllocRequest> executor_batch = batch, pool_batch = batch;
    for (size_t i = 0; i < batch.size(); ++i) {
      const int64_t n = ToExtendShape(batch[i]).num_slots();
      executor_slots[i].assign(n, -7);
      pool_slots[i].assign(n, -9);
      executor_batch[i].destination = executor_slots[i].data();
      pool_batch[i].destination = pool_slots[i].data();
    }
    std::vector<AllocResult> executor_results, pool_results;
    by_executor->Allocate(executor_batch, {}, &executor_results);
    by_pool->Allocate(pool_batch, {}, &pool_results, Expansion::kPool);
    for (size_t i = 0; i < batch.size(); ++i) {
      ASSERT_EQ(executor_results[i].status, pool_results[i].status)
          << "step " << step << " request " << i;
      if (!pool_results[i].status.ok()) continue;
      ASSERT_EQ(executor_slots[i], pool_slots[i])
          << "step " << step << " request " << i;
      if (of[i] < 0) {
        sequences.push_back({batch[i].owner, pool_slots[i]});
      } else {
        std::vector<int64_t>& slots = sequences[of[i]].slots;
        slots.insert(slots.end(), pool_slots[i].begin(), pool_slots[i].end());
      }
    }
    // Now and then a sequence ends and frees its slots.
    while (!sequences.empty() && uniform(0, 2) == 0) {
      const size_t end = uniform(0, static_cast<int64_t>(sequences.size()) - 1);
      const Sequence sequence = sequences[end];
      sequences.erase(sequences.begin() + end);
      ASSERT_OK(
          by_executor->FreeSlots(sequence.owner, sequence.slots).status());
      ASSERT_OK(by_pool->FreeSlots(sequence.owner, sequence.slots).status());
    }
    ASSERT_EQ(by_executor->FreeList(), by_pool->FreeList());
  }
  EXPECT_GT(by_executor_executor.launches(), 0);
  EXPECT_EQ(by_pool_executor.launches(), 0);
  EXPECT_OK(by_pool->CheckInvariants());
}

INSTANTIATE_TEST_SUITE_P(PageSizes, PoolExpansionTest,
                         ::testing::Values(1, 4, 16));

// Under --kv_scrub the pool expands a batch only when none of its pages
// needs zeroing, which only the executor can do: a batch with a page
// changing owner is refused whole, and nothing changes.
TEST(PoolExpansionScrubTest, ABatchWithPagesToScrubIsRefused) {
  FakeExecutor executor;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PagePool> pool,
                       ScrubbingPool(&executor, 4, 2));
  EXPECT_TRUE(pool->scrubs());
  std::vector<int64_t> out(8, -1);
  auto alloc = [&](OwnerId owner, int64_t tokens) {
    AllocRequest request = PagePoolTest::Alloc(owner, tokens);
    request.destination = out.data();
    std::vector<AllocResult> results;
    pool->Allocate({request}, {}, &results, Expansion::kPool);
    return results[0].status;
  };
  // Fresh pages: nothing to zero, expanded by the pool.
  ASSERT_OK(alloc(kAlice, 2));
  EXPECT_THAT(out, ElementsAre(2, 3, -1, -1, -1, -1, -1, -1));
  ASSERT_THAT(pool->FreePages(kAlice, {1}), IsOkAndHolds(1));
  const std::vector<int64_t> free_list = pool->FreeList();
  // Alice's old page would go to Bob unzeroed.
  EXPECT_THAT(alloc(kBob, 2), StatusIs(absl::StatusCode::kFailedPrecondition,
                                       HasSubstr("scrub")));
  EXPECT_EQ(pool->FreeList(), free_list);
  EXPECT_EQ(pool->OwnerOf(1), kNoOwner);
  EXPECT_EQ(executor.launches(), 0);
  EXPECT_OK(pool->CheckInvariants());
}

}  // namespace
}  // namespace pagealloc
