// The pool's state and change records: ExportState and CreateFromState give
// an indistinguishable pool, CreateFromState refuses every kind of
// inconsistent state with DATA_LOSS, owner metadata is kept, the change log
// sees every change (and only changes) in order with snapshots consistent
// with its records, and Replay of an allocation commits what the original
// did without writing slots. The randomized record-and-replay check with
// the codec in the loop is //pool_state:pool_replay_test.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/fake_executor.h"
#include "allocator/page_pool.h"
#include "allocator/pool_change_log.h"
#include "allocator/pool_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr OwnerId kAlice = 1;
constexpr OwnerId kBob = 2;
constexpr OwnerId kCarol = 3;
constexpr int64_t kPageSize = 4;

PrefixKey Key(int64_t tag) {
  PrefixKey key{};
  for (int b = 0; b < 8; ++b) key[b] = static_cast<uint8_t>(tag >> (8 * b));
  key[31] = 0x77;
  return key;
}

PoolOptions Options(FreePolicy policy, bool scrub) {
  PoolOptions options;
  options.num_pages = 32;
  options.page_size = kPageSize;
  options.free_policy = policy;
  options.scrub = scrub;
  options.max_pinned_pages_per_owner = 4;
  return options;
}

// Allocates `n` whole pages for `owner`; returns them.
std::vector<int64_t> Pages(PagePool& pool, OwnerId owner, int64_t n) {
  std::vector<int64_t> slots(n * kPageSize, -1);
  const AllocRequest request{RequestKind::kAlloc, owner, 0,           0,
                             n * kPageSize,       -1,    slots.data()};
  EXPECT_OK(pool.Allocate({request})[0].status);
  std::vector<int64_t> pages;
  for (int64_t k = 0; k < n; ++k) pages.push_back(slots[k * kPageSize] / 4);
  return pages;
}

// A pool with something in every part of its state: owners with metadata,
// quotas and checkpoints (with dead log entries), parked pages under
// kSorted, published, cached and pinned pages, an LRU of two, counters.
void MakeBusy(PagePool& pool) {
  ASSERT_OK(pool.AddOwner(kAlice, 0, "alice: token digest 1234"));
  ASSERT_OK(pool.AddOwner(kBob, 20, std::string("b\0b", 3)));
  ASSERT_OK(pool.AddOwner(kCarol, 0));
  const std::vector<int64_t> before = Pages(pool, kAlice, 2);
  ASSERT_OK(pool.Checkpoint(kAlice).status());
  const std::vector<int64_t> given = Pages(pool, kAlice, 3);
  ASSERT_OK(pool.FreePages(kAlice, {given[1]}).status());  // a dead entry
  ASSERT_OK(pool.Checkpoint(kAlice).status());
  Pages(pool, kAlice, 1);
  const std::vector<int64_t> chain = Pages(pool, kBob, 4);
  ASSERT_OK(pool.Publish(kBob, chain, {Key(1), Key(2), Key(3), Key(4)}, nullptr,
                         /*pin=*/false)
                .status());
  ASSERT_OK(pool.MatchPrefix(kCarol, {Key(1), Key(2)}, /*adopt=*/true));
  ASSERT_OK(pool.FreePages(kBob, {chain[2], chain[3]}).status());  // cached
  const std::vector<int64_t> pinned = Pages(pool, kCarol, 1);
  const PrefixKey parent = Key(2);
  ASSERT_OK(
      pool.Publish(kCarol, pinned, {Key(9)}, &parent, /*pin=*/true).status());
  const std::vector<int64_t> bobs = Pages(pool, kBob, 2);
  ASSERT_OK(pool.FreePages(kAlice, {before[0]}).status());
  ASSERT_OK(pool.MatchPrefix(kBob, {Key(7)}, /*adopt=*/false).status());
  // Freed behind a fence: one of Bob's pages, and a reference Carol holds.
  ASSERT_OK(pool.AwaitRelease(kBob, {bobs[1]}));
  ASSERT_OK(pool.AwaitRelease(kCarol, {chain[1]}));
  ASSERT_OK(pool.CheckInvariants());
}

// Runs the same operations on `pool`, writing slots to `out`; returns the
// results, for two pools to compare.
std::vector<std::string> Continue(PagePool& pool, std::vector<int64_t>* out) {
  std::vector<std::string> log;
  auto note = [&log](const absl::Status& status) {
    log.push_back(status.ToString());
  };
  out->assign(64 * kPageSize, -1);
  // More than the free pages: a merge under kSorted, evictions.
  for (int round = 0; round < 3; ++round) {
    std::vector<AllocRequest> batch;
    for (int i = 0; i < 3; ++i) {
      batch.push_back({RequestKind::kExtend, i == 2 ? kCarol : kAlice, i, 0, 9,
                       -1, out->data() + (round * 3 + i) * 9});
    }
    for (const AllocResult& result : pool.Allocate(batch)) {
      log.push_back(absl::StrFormat("%s %d %d", result.status.ToString(),
                                    result.num_slots, result.num_new_pages));
    }
  }
  note(pool.Rollback(kAlice, 1).status());
  note(pool.RemoveOwner(kBob).status());
  note(pool.MatchPrefix(kAlice, {Key(1), Key(2), Key(3)}, true).status());
  note(pool.ResetPrefixCache().status());
  for (const AllocResult& result : pool.Allocate(
           {{RequestKind::kAlloc, kAlice, 0, 0, 40, -1, out->data() + 100}})) {
    log.push_back(result.status.ToString());
  }
  note(pool.ClearOwner(kCarol).status());
  return log;
}

class PagePoolStateTest
    : public ::testing::TestWithParam<std::tuple<FreePolicy, Semantics, bool>> {
 protected:
  PoolOptions options() const {
    PoolOptions o = Options(std::get<0>(GetParam()), std::get<2>(GetParam()));
    o.semantics = std::get<1>(GetParam());
    return o;
  }
};

TEST_P(PagePoolStateTest, ARestoredPoolIsIndistinguishable) {
  FakeExecutor original_executor;
  ASSERT_OK_AND_ASSIGN(auto original,
                       PagePool::Create(options(), &original_executor));
  MakeBusy(*original);
  const PoolState state = original->ExportState();
  FakeExecutor restored_executor;
  ASSERT_OK_AND_ASSIGN(
      auto restored,
      PagePool::CreateFromState(options(), &restored_executor, state));
  ASSERT_OK(restored->CheckInvariants());
  EXPECT_EQ(FirstDifference(restored->ExportState(), state), "");
  EXPECT_EQ(restored->FreeList(), original->FreeList());
  EXPECT_EQ(restored->EvictionOrder(), original->EvictionOrder());
  EXPECT_THAT(restored->OwnerMetadata(kBob),
              IsOkAndHolds(std::string("b\0b", 3)));

  // Every later operation gives the same results, slots included (the
  // restored executor's mirror is the original's).
  std::vector<int64_t> original_slots;
  std::vector<int64_t> restored_slots;
  const std::vector<std::string> original_log =
      Continue(*original, &original_slots);
  EXPECT_EQ(Continue(*restored, &restored_slots), original_log);
  EXPECT_EQ(restored_slots, original_slots);
  EXPECT_EQ(FirstDifference(restored->ExportState(), original->ExportState()),
            "");
  EXPECT_OK(restored->CheckInvariants());
}

INSTANTIATE_TEST_SUITE_P(
    PoliciesSemanticsAndScrub, PagePoolStateTest,
    ::testing::Combine(
        ::testing::Values(FreePolicy::kLifo, FreePolicy::kSorted),
        ::testing::Values(Semantics::kPagealloc, Semantics::kSglang),
        ::testing::Bool()));

TEST(PagePoolMetadataTest, MetadataIsKeptAndBounded) {
  FakeExecutor executor;
  ASSERT_OK_AND_ASSIGN(
      auto pool,
      PagePool::Create(Options(FreePolicy::kLifo, false), &executor));
  ASSERT_OK(pool->AddOwner(kAlice, 0, "id=7 client=sglang"));
  ASSERT_OK(pool->AddOwner(kBob, 0));
  EXPECT_THAT(pool->OwnerMetadata(kAlice), IsOkAndHolds("id=7 client=sglang"));
  EXPECT_THAT(pool->OwnerMetadata(kBob), IsOkAndHolds(""));
  EXPECT_THAT(
      pool->OwnerMetadata(kCarol),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown owner")));
  EXPECT_THAT(
      pool->AddOwner(kCarol, 0, std::string(kMaxOwnerMetadataBytes + 1, 'x')),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("4097 bytes, over the 4096 allowed")));
  ASSERT_OK(
      pool->AddOwner(kCarol, 0, std::string(kMaxOwnerMetadataBytes, 'x')));
  const PoolState state = pool->ExportState();
  ASSERT_EQ(state.owners.size(), 3u);
  EXPECT_EQ(state.owners[0].metadata, "id=7 client=sglang");
  EXPECT_EQ(state.owners[2].metadata.size(), kMaxOwnerMetadataBytes);
}

// Each row breaks one invariant of a valid state; CreateFromState must
// refuse it with DATA_LOSS naming the violation (and never crash).
// Pages freed behind a fence await release while they stay their owner's;
// the mark ends with their owner's hold on them, however it ends.
TEST(PagePoolAwaitReleaseTest, PagesAwaitUntilTheyLeaveTheirOwner) {
  FakeExecutor executor;
  ASSERT_OK_AND_ASSIGN(
      auto pool,
      PagePool::Create(Options(FreePolicy::kLifo, false), &executor));
  ASSERT_OK(pool->AddOwner(kAlice, 0));
  ASSERT_OK(pool->AddOwner(kBob, 0));
  const std::vector<int64_t> a = Pages(*pool, kAlice, 4);
  ASSERT_OK(pool->Checkpoint(kAlice).status());
  const std::vector<int64_t> given = Pages(*pool, kAlice, 2);
  const std::vector<int64_t> b = Pages(*pool, kBob, 1);
  auto awaiting = [&](OwnerId owner) {
    return pool->PagesAwaitingRelease(owner).value_or(std::vector<int64_t>{});
  };

  // Refusals change nothing.
  EXPECT_THAT(pool->AwaitRelease(99, {a[0]}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("owner 99")));
  EXPECT_THAT(pool->AwaitRelease(kAlice, {a[0], 33}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pages[1] (33) is outside")));
  EXPECT_THAT(pool->AwaitRelease(kAlice, {a[0], b[0]}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("is not a page owner 1 holds")));
  EXPECT_THAT(
      pool->AwaitRelease(kAlice, {a[0], a[0]}),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("pages[1]")));
  EXPECT_THAT(awaiting(kAlice), ::testing::IsEmpty());

  ASSERT_OK(pool->AwaitRelease(kAlice, {a[2], a[0], given[0]}));
  EXPECT_THAT(awaiting(kAlice), ElementsAre(a[2], a[0], given[0]));
  EXPECT_THAT(pool->AwaitRelease(kAlice, {a[1], a[0]}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("pages[1] (" + std::to_string(a[0]) +
                                 ") awaits release already")));
  EXPECT_THAT(awaiting(kAlice), ElementsAre(a[2], a[0], given[0]));
  ASSERT_OK(pool->CheckInvariants());

  // Its free (the fence passed) ends the wait; so does a rollback.
  ASSERT_OK(pool->FreePages(kAlice, {a[0]}).status());
  EXPECT_THAT(awaiting(kAlice), ElementsAre(a[2], given[0]));
  ASSERT_OK(pool->Rollback(kAlice).status());
  EXPECT_THAT(awaiting(kAlice), ElementsAre(a[2]));
  // Published meanwhile, it awaits as the reference its owner holds, until
  // that is dropped.
  ASSERT_OK(pool->Publish(kAlice, {a[2]}, {Key(1)}, nullptr, false).status());
  EXPECT_THAT(awaiting(kAlice), ElementsAre(a[2]));
  ASSERT_OK(pool->CheckInvariants());
  ASSERT_OK(pool->FreePages(kAlice, {a[2]}).status());
  EXPECT_THAT(awaiting(kAlice), ::testing::IsEmpty());
  // A clear of the owner or of the pool ends every wait.
  ASSERT_OK(pool->AwaitRelease(kAlice, {a[1]}));
  ASSERT_OK(pool->ClearOwner(kAlice).status());
  EXPECT_THAT(awaiting(kAlice), ::testing::IsEmpty());
  ASSERT_OK(pool->AwaitRelease(kBob, {b[0]}));
  ASSERT_OK(pool->Clear());
  EXPECT_THAT(awaiting(kBob), ::testing::IsEmpty());
  ASSERT_OK(pool->CheckInvariants());
}

TEST(PagePoolRestoreTest, RefusesEveryKindOfInconsistentState) {
  for (const FreePolicy policy : {FreePolicy::kLifo, FreePolicy::kSorted}) {
    SCOPED_TRACE(FreePolicyName(policy));
    const PoolOptions options = Options(policy, /*scrub=*/true);
    FakeExecutor executor;
    ASSERT_OK_AND_ASSIGN(auto pool, PagePool::Create(options, &executor));
    MakeBusy(*pool);
    const PoolState valid = pool->ExportState();
    ASSERT_FALSE(valid.free_pages.empty());
    ASSERT_FALSE(valid.prefix_entries.empty());
    ASSERT_EQ(valid.owners.size(), 3u);
    const int64_t free_page = valid.free_pages[0];
    // A page of Bob's (who has no checkpoint, so no log names it) that
    // does not await release, and a cached page (no owner holds a
    // reference on it).
    int64_t owned_page = 0;
    const std::vector<int64_t>& bob_awaits = valid.owners[1].awaiting_release;
    for (int64_t p = 1; p <= valid.num_pages; ++p) {
      if (valid.owner_of[p] == kBob &&
          std::find(bob_awaits.begin(), bob_awaits.end(), p) ==
              bob_awaits.end()) {
        owned_page = p;
      }
    }
    ASSERT_NE(owned_page, 0);
    ASSERT_FALSE(valid.prefix_lru.empty());
    const int64_t cached_page = valid.prefix_lru[0];
    struct Case {
      const char* name;
      std::function<void(PoolState&)> corrupt;
      const char* message;
    };
    const std::vector<Case> cases = {
        {"a free page twice",
         [&](PoolState& s) { s.free_pages.push_back(free_page); },
         "is free twice"},
        {"a free page owned",
         [&](PoolState& s) { s.owner_of[free_page] = kAlice; },
         "is free and owned by 1"},
        {"a page lost",
         [&](PoolState& s) { s.free_pages.erase(s.free_pages.begin()); },
         "neither free nor owned (lost)"},
        {"an unknown owner", [&](PoolState& s) { s.owner_of[owned_page] = 77; },
         "owned by an unlisted owner 77"},
        {"an owned page in the index",
         [&](PoolState& s) { s.owner_of[cached_page] = kAlice; },
         "owned by a shared page's owner"},
        {"a wrong count", [](PoolState& s) { s.prefix_entries[0].count += 1; },
         "has count"},
        {"a reference on a page not shared",
         [&](PoolState& s) {
           s.owners[0].refs.insert(s.owners[0].refs.begin(), {owned_page, 1});
         },
         "is not a shared page's"},
        {"an LRU of the wrong pages",
         [](PoolState& s) { s.prefix_lru.pop_back(); }, "the LRU lists"},
        {"a ring head outside the ring",
         [](PoolState& s) { s.ring_head = s.num_pages; }, "ring head 32"},
        {"another geometry", [](PoolState& s) { s.num_pages += 1; },
         "33 pages of 4 tokens; this pool has 32 pages of 4"},
        {"another page size", [](PoolState& s) { s.page_size = 16; },
         "32 pages of 16"},
        {"another policy",
         [](PoolState& s) {
           s.free_policy = s.free_policy == FreePolicy::kLifo
                               ? FreePolicy::kSorted
                               : FreePolicy::kLifo;
         },
         "free policy"},
        {"another semantics version",
         [](PoolState& s) { s.semantics_version = 99; },
         "semantics version 99"},
        {"short per-page tables", [](PoolState& s) { s.owner_of.pop_back(); },
         "per-page tables"},
        {"no scrub table", [](PoolState& s) { s.last_owner.clear(); },
         "per-page tables"},
        {"page 0 owned", [](PoolState& s) { s.owner_of[0] = kAlice; },
         "page 0 (reserved)"},
        {"owners out of order",
         [](PoolState& s) { std::swap(s.owners[0], s.owners[1]); },
         "does not follow"},
        {"an owner with the shared id",
         [](PoolState& s) { s.owners[2].id = kSharedOwner; }, "reserved id"},
        {"a checkpoint past its log",
         [](PoolState& s) {
           s.owners[0].checkpoints.back().log_position =
               s.owners[0].given_log.size() + 1;
         },
         "out of order or bounds"},
        {"a checkpoint id not yet taken",
         [](PoolState& s) { s.owners[0].next_checkpoint_id = 2; },
         "out of order or bounds"},
        {"a log without a checkpoint",
         [](PoolState& s) {
           s.owners[2].given_log = {1};
           s.owners[2].given_live = {false};
         },
         "a log of 1 entries"},
        {"a live entry of another's page",
         [&](PoolState& s) {
           s.owners[0].given_log.push_back(s.prefix_entries[0].page);
           s.owners[0].given_live.push_back(true);
         },
         "is live but the page is not the owner's"},
        {"liveness bits short",
         [](PoolState& s) { s.owners[0].given_live.pop_back(); },
         "liveness bits"},
        {"a page awaiting release that is another's",
         [&](PoolState& s) {
           s.owners[0].awaiting_release.push_back(owned_page);
         },
         "awaiting_release[0] ("},
        {"a page awaiting release twice",
         [](PoolState& s) {
           s.owners[1].awaiting_release.push_back(
               s.owners[1].awaiting_release[0]);
         },
         "listed twice"},
        {"a cached page awaiting release",
         [&](PoolState& s) {
           s.owners[2].awaiting_release.push_back(cached_page);
         },
         "not a page the owner holds"},
        {"too many pins",
         [](PoolState& s) {
           for (int64_t k = 0; k < 5; ++k) s.owners[1].pins.push_back(40 + k);
         },
         "over the bound of 4"},
        {"metadata too long",
         [](PoolState& s) {
           s.owners[0].metadata.assign(kMaxOwnerMetadataBytes + 1, 'm');
         },
         "4097 bytes of metadata"},
        {"a negative counter",
         [](PoolState& s) { s.counters.pages_freed = -1; },
         "a counter is negative"},
        {"too many free pages",
         [](PoolState& s) { s.free_pages.resize(s.num_pages + 1, 1); },
         "free and"},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      PoolState state = valid;
      c.corrupt(state);
      FakeExecutor fresh;
      EXPECT_THAT(PagePool::CreateFromState(options, &fresh, state),
                  StatusIs(absl::StatusCode::kDataLoss, HasSubstr(c.message)));
    }
    if (policy == FreePolicy::kLifo) {
      PoolState state = valid;
      state.parked_pages.push_back(state.free_pages.back());
      state.free_pages.pop_back();
      FakeExecutor fresh;
      EXPECT_THAT(PagePool::CreateFromState(options, &fresh, state),
                  StatusIs(absl::StatusCode::kDataLoss,
                           HasSubstr("parked pages under free policy lifo")));
    }
    // The valid state itself restores, and options are checked as Create
    // checks them.
    FakeExecutor fresh;
    EXPECT_OK(PagePool::CreateFromState(options, &fresh, valid).status());
    PoolOptions bad = options;
    bad.page_size = 0;
    EXPECT_THAT(PagePool::CreateFromState(bad, &fresh, valid),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("page_size (0) must be >= 1")));
  }
}

// Keeps what it is told: each record's kind and a few fields, and the
// snapshots it asks for.
class TestLog : public PoolChangeLog {
 public:
  void Record(const PoolChange& change) override {
    std::string line(PoolChangeKindName(change.kind));
    if (change.kind == PoolChangeKind::kAllocate) {
      absl::StrAppendFormat(&line, " %d requests", change.requests.size());
      if (change.launch_failure != nullptr) {
        absl::StrAppend(&line, " failed: ", change.launch_failure->message());
      }
    }
    if (change.kind == PoolChangeKind::kFree) {
      absl::StrAppendFormat(&line, " %d+%d", change.pages.size(),
                            change.shared_pages.size());
    }
    if (change.kind == PoolChangeKind::kMatchPrefix && change.refused) {
      absl::StrAppend(&line, " refused");
    }
    if (change.kind == PoolChangeKind::kAddOwner) {
      absl::StrAppend(&line, " ", change.metadata);
    }
    records.push_back(line);
  }
  bool WantsSnapshot() override {
    return snapshot_after >= 0 &&
           static_cast<int64_t>(records.size()) == snapshot_after;
  }
  void WriteSnapshot(const PoolState& state) override {
    snapshots.push_back(state);
  }

  int64_t snapshot_after = -1;
  std::vector<std::string> records;
  std::vector<PoolState> snapshots;
};

TEST(PagePoolChangeLogTest, EveryChangeIsRecordedInOrderAndRefusalsAreNot) {
  TestLog log;
  FakeExecutor executor;
  PoolOptions options = Options(FreePolicy::kLifo, false);
  options.change_log = &log;
  ASSERT_OK_AND_ASSIGN(auto pool, PagePool::Create(options, &executor));
  ASSERT_OK(pool->AddOwner(kAlice, 0, "meta"));
  ASSERT_OK(pool->AddOwner(kBob, 3));
  EXPECT_THAT(pool->AddOwner(kBob, 0),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("already registered")));
  const std::vector<int64_t> pages = Pages(*pool, kAlice, 4);
  executor.FailNextLaunches(1, absl::InternalError("launch lost"));
  std::vector<int64_t> slots(8);
  EXPECT_THAT(pool->Allocate({{RequestKind::kAlloc, kAlice, 0, 0, 8, -1,
                               slots.data()}})[0]
                  .status,
              StatusIs(absl::StatusCode::kInternal, HasSubstr("launch lost")));
  ASSERT_OK(pool->Checkpoint(kAlice).status());
  EXPECT_THAT(pool->Rollback(kBob),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no checkpoint")));
  ASSERT_OK(pool->Publish(kAlice, {pages[0], pages[1]}, {Key(1), Key(2)},
                          nullptr, true)
                .status());
  ASSERT_OK(pool->MatchPrefix(kBob, {Key(1), Key(2)}, false).status());
  EXPECT_OK(pool->MatchPrefix(kBob, {}, true).status());  // changes nothing
  ASSERT_OK(pool->FreePages(kAlice, {pages[0], pages[2]}).status());
  EXPECT_THAT(pool->FreePages(kAlice, {pages[2]}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("double free")));
  ASSERT_OK(pool->Unpin(kAlice, {pages[0], pages[1]}).status());
  ASSERT_OK(pool->AwaitRelease(kAlice, {pages[3]}));
  EXPECT_THAT(pool->AwaitRelease(kAlice, {pages[3]}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("awaits release already")));
  Pages(*pool, kBob, 3);
  EXPECT_THAT(
      pool->MatchPrefix(kBob, {Key(1)}, true),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("over quota")));
  ASSERT_OK(pool->Rollback(kAlice).status());
  ASSERT_OK(pool->ResetPrefixCache().status());
  EXPECT_THAT(pool->ClearPool(false),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("pages are owned")));
  ASSERT_OK(pool->ClearOwner(kBob).status());
  ASSERT_OK(pool->RemoveOwner(kBob).status());
  ASSERT_OK(pool->Clear());
  EXPECT_THAT(
      log.records,
      ElementsAre("add_owner meta", "add_owner ", "allocate 1 requests",
                  "allocate 1 requests failed: launch lost", "checkpoint",
                  "publish", "match_prefix", "free 1+1", "unpin",
                  "await_release", "allocate 1 requests",
                  "match_prefix refused", "rollback", "reset_prefix_cache",
                  "clear_owner", "remove_owner", "clear_pool"));
}

TEST(PagePoolChangeLogTest, ASnapshotIsTheStateAfterItsRecord) {
  TestLog log;
  log.snapshot_after = 4;
  FakeExecutor executor;
  PoolOptions options = Options(FreePolicy::kSorted, true);
  options.change_log = &log;
  ASSERT_OK_AND_ASSIGN(auto pool, PagePool::Create(options, &executor));
  ASSERT_OK(pool->AddOwner(kAlice, 0));
  const std::vector<int64_t> pages = Pages(*pool, kAlice, 5);
  ASSERT_OK(pool->Checkpoint(kAlice).status());
  ASSERT_OK(pool->FreePages(kAlice, {pages[3], pages[1]}).status());
  const PoolState after_fourth = pool->ExportState();
  Pages(*pool, kAlice, 2);
  ASSERT_EQ(log.records.size(), 5u);
  ASSERT_EQ(log.snapshots.size(), 1u);
  EXPECT_EQ(FirstDifference(log.snapshots[0], after_fourth), "");
  EXPECT_THAT(log.snapshots[0].parked_pages, ElementsAre(pages[3], pages[1]));
}

// Replay of an allocation: the same results and state as the original, the
// same mirror, and no slot written.
TEST(PagePoolReplayTest, ReplayedAllocationsCommitWithoutWritingSlots) {
  for (const int64_t page_size : {1, 4}) {
    SCOPED_TRACE(page_size);
    PoolOptions options = Options(FreePolicy::kLifo, true);
    options.page_size = page_size;
    FakeExecutor a_executor;
    FakeExecutor b_executor;
    ASSERT_OK_AND_ASSIGN(auto a, PagePool::Create(options, &a_executor));
    ASSERT_OK_AND_ASSIGN(auto b, PagePool::Create(options, &b_executor));
    for (PagePool* pool : {a.get(), b.get()}) {
      ASSERT_OK(pool->AddOwner(kAlice, 0));
      ASSERT_OK(pool->AddOwner(kBob, 6));
    }
    std::vector<int64_t> a_slots(200, -1);
    std::vector<int64_t> b_slots(200, -1);
    auto batch = [&](std::vector<int64_t>& slots) {
      std::vector<AllocRequest> requests;
      for (int i = 0; i < 6; ++i) {
        requests.push_back({RequestKind::kExtend, i < 3 ? kAlice : kBob, i, 0,
                            3 * page_size + 1, -1, slots.data() + 20 * i});
      }
      requests.push_back({RequestKind::kExtend, kBob, 6, 0, 1, -1, nullptr});
      return requests;
    };
    const std::vector<CallSpan> calls = {{3, false, {}}, {4, true, {}}};
    for (int round = 0; round < 4; ++round) {
      SCOPED_TRACE(round);
      if (round == 2)
        a_executor.FailNextLaunches(1, absl::UnavailableError("x"));
      const std::vector<AllocRequest> a_batch = batch(a_slots);
      const std::vector<AllocResult> original = a->Allocate(a_batch, calls);
      const std::vector<AllocRequest> b_batch = batch(b_slots);
      PoolChange change;
      change.kind = PoolChangeKind::kAllocate;
      change.requests = b_batch;
      change.calls = calls;
      const absl::Status failure = absl::UnavailableError("x");
      if (round == 2) change.launch_failure = &failure;
      std::vector<AllocResult> replayed;
      ASSERT_OK(b->Replay(change, &replayed));
      ASSERT_EQ(replayed.size(), original.size());
      for (size_t i = 0; i < original.size(); ++i) {
        EXPECT_EQ(replayed[i].status, original[i].status) << i;
        EXPECT_EQ(replayed[i].num_slots, original[i].num_slots) << i;
        EXPECT_EQ(replayed[i].num_new_pages, original[i].num_new_pages) << i;
      }
      EXPECT_EQ(FirstDifference(b->ExportState(), a->ExportState()), "");
      ASSERT_OK(b->CheckInvariants());  // the mirror too
    }
    EXPECT_EQ(b_executor.launches(), 0);
    EXPECT_EQ(b_slots, std::vector<int64_t>(200, -1));
  }
}

// Keeps the match records the pool makes, with their pages.
class MatchLog : public PoolChangeLog {
 public:
  void Record(const PoolChange& change) override {
    if (change.kind != PoolChangeKind::kMatchPrefix) return;
    matches.push_back(change);
    pages.emplace_back(change.pages.begin(), change.pages.end());
  }
  bool WantsSnapshot() override { return false; }
  void WriteSnapshot(const PoolState&) override {}

  std::vector<PoolChange> matches;  // pages point into `pages`
  std::vector<std::vector<int64_t>> pages;
};

// A match is recorded by what its walk found, beside its keys; that
// record without the keys (record format 2) and one with only the keys
// (format 1) replay to the pool's state exactly,
// for an adopt that takes published and cached pages, a plain match, and
// an adopt refused over quota.
TEST(PagePoolReplayTest, AMatchReplaysFromWhatItFoundAsFromItsKeys) {
  constexpr OwnerId kDave = 4;  // a quota of 1 page
  const std::vector<PrefixKey> keys = {Key(1), Key(2), Key(3), Key(4), Key(50)};
  struct Match {
    OwnerId owner;
    bool adopt;
  };
  for (const Match& match :
       {Match{kCarol, true}, Match{kAlice, false}, Match{kDave, true}}) {
    SCOPED_TRACE(
        absl::StrFormat("owner %d adopt %d", match.owner, match.adopt));
    MatchLog log;
    FakeExecutor executors[3];
    std::unique_ptr<PagePool> pools[3];
    for (int i = 0; i < 3; ++i) {
      PoolOptions options = Options(FreePolicy::kLifo, false);
      if (i == 0) options.change_log = &log;
      ASSERT_OK_AND_ASSIGN(pools[i], PagePool::Create(options, &executors[i]));
      MakeBusy(*pools[i]);
      ASSERT_OK(pools[i]->AddOwner(kDave, 1));
    }
    log.matches.clear();
    log.pages.clear();
    const absl::StatusOr<std::vector<int64_t>> taken =
        pools[0]->MatchPrefix(match.owner, keys, match.adopt);
    ASSERT_EQ(log.matches.size(), 1u);
    PoolChange recorded = log.matches[0];
    EXPECT_TRUE(std::equal(recorded.keys.begin(), recorded.keys.end(),
                           keys.begin(), keys.end()));
    // As record format 2 stores it: no keys.
    recorded.keys = {};
    EXPECT_EQ(recorded.keys_looked_up, 5);
    EXPECT_EQ(recorded.pages_found, 4);  // Key(50) is in no chain
    EXPECT_EQ(recorded.refused, !taken.ok());
    EXPECT_EQ(recorded.pages.size(), match.adopt && taken.ok() ? 4u : 0u);
    if (match.owner == kDave) {
      EXPECT_EQ(taken.status().code(), absl::StatusCode::kResourceExhausted);
    }

    ASSERT_OK(pools[1]->Replay(recorded));
    PoolChange format1;
    format1.kind = PoolChangeKind::kMatchPrefix;
    format1.owner = match.owner;
    format1.keys = keys;
    format1.adopt = match.adopt;
    format1.refused = recorded.refused;
    ASSERT_OK(pools[2]->Replay(format1));
    const PoolState original = pools[0]->ExportState();
    EXPECT_EQ(FirstDifference(pools[1]->ExportState(), original), "");
    EXPECT_EQ(FirstDifference(pools[2]->ExportState(), original), "");
  }
}

TEST(PagePoolReplayTest, RecordsThatDoNotApplyAreDataLossAndChangeNothing) {
  TestLog log;
  FakeExecutor executor;
  PoolOptions options = Options(FreePolicy::kLifo, false);
  options.change_log = &log;
  ASSERT_OK_AND_ASSIGN(auto pool, PagePool::Create(options, &executor));
  PoolChange add;
  add.kind = PoolChangeKind::kAddOwner;
  add.owner = kAlice;
  ASSERT_OK(pool->Replay(add));
  const std::vector<int64_t> pages = Pages(*pool, kAlice, 2);
  log.records.clear();
  const PoolState before = pool->ExportState();

  PoolChange free;
  free.kind = PoolChangeKind::kFree;
  free.owner = kBob;
  free.pages = pages;
  EXPECT_THAT(pool->Replay(free),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("replaying a free of owner 2: NOT_FOUND")));
  free.owner = kAlice;
  const std::vector<int64_t> twice = {pages[0], pages[0]};
  free.pages = twice;
  EXPECT_THAT(pool->Replay(free),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("resolve to 1 owned and 0 shared")));

  const absl::Status failure = absl::InternalError("lost");
  const std::vector<AllocRequest> nothing = {
      {RequestKind::kAlloc, kCarol, 0, 0, 4, -1, nullptr}};  // unknown owner
  PoolChange allocate;
  allocate.kind = PoolChangeKind::kAllocate;
  allocate.requests = nothing;
  allocate.launch_failure = &failure;
  EXPECT_THAT(pool->Replay(allocate),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("here nothing was launched")));
  const std::vector<CallSpan> short_calls = {{2, false, {}}};
  allocate.launch_failure = nullptr;
  allocate.calls = short_calls;
  EXPECT_THAT(pool->Replay(allocate),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("do not cover its 1 requests")));

  const std::vector<PrefixKey> keys = {Key(5)};
  PoolChange match;
  match.kind = PoolChangeKind::kMatchPrefix;
  match.owner = kAlice;
  match.keys = keys;
  match.adopt = true;
  match.refused = true;
  EXPECT_THAT(pool->Replay(match),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("recorded as refused, here OK")));
  // A match recorded by what its walk found, which cannot be what a walk
  // found here.
  const std::vector<int64_t> unpublished = {pages[0]};
  PoolChange found;
  found.kind = PoolChangeKind::kMatchPrefix;
  found.owner = kAlice;
  found.adopt = true;
  found.keys_looked_up = 2;
  found.pages_found = 1;
  found.pages = unpublished;
  EXPECT_THAT(pool->Replay(found),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("is not in the prefix index")));
  found.pages = {};
  EXPECT_THAT(pool->Replay(found), StatusIs(absl::StatusCode::kDataLoss,
                                            HasSubstr("0 pages listed for 1")));
  found.refused = true;
  found.pages_found = 0;
  EXPECT_THAT(pool->Replay(found),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("refused, yet it adopted nothing")));
  found.refused = false;
  found.pages_found = 3;
  EXPECT_THAT(pool->Replay(found),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("3 pages found for 2 keys")));
  found.owner = kBob;
  found.pages_found = 0;
  EXPECT_THAT(pool->Replay(found), StatusIs(absl::StatusCode::kDataLoss,
                                            HasSubstr("unknown owner 2")));
  PoolChange unknown;
  unknown.kind = static_cast<PoolChangeKind>(40);
  EXPECT_THAT(pool->Replay(unknown),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("unknown kind")));

  // The match counted its lookup (as the original did); nothing else moved,
  // and nothing replayed was recorded again.
  PoolState after = pool->ExportState();
  after.counters.prefix_lookup_pages -= 1;
  EXPECT_EQ(FirstDifference(after, before), "");
  EXPECT_TRUE(log.records.empty());
}

}  // namespace
}  // namespace pagealloc
