// Shared prefix pages in the pool: publish, match and adopt, release to the
// cache, eviction inside a launch, pins, survival of a removed owner, reset,
// hostile calls; then a randomized model check over many owners with a
// host "slab" whose per-page pattern shows any page handed out while shared.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/fake_executor.h"
#include "allocator/page_pool.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kv_events/sink.h"
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

PrefixKey Key(int64_t tag) {
  PrefixKey key{};
  for (int b = 0; b < 8; ++b) key[b] = static_cast<uint8_t>(tag >> (8 * b));
  key[31] = 0x5a;
  return key;
}

// Records what the pool reports, in order.
class RecordingSink : public KvEventSink {
 public:
  void BlocksStored(const StoredBlocks& blocks) override {
    events.push_back(absl::StrFormat("stored %d", blocks.keys.size()));
    stored_keys.insert(stored_keys.end(), blocks.keys.begin(),
                       blocks.keys.end());
  }
  void BlocksRemoved(absl::Span<const std::string> keys) override {
    events.push_back(absl::StrFormat("removed %d", keys.size()));
    removed_keys.insert(removed_keys.end(), keys.begin(), keys.end());
  }
  void AllBlocksCleared() override { events.push_back("cleared"); }

  std::vector<std::string> events;
  std::vector<std::string> stored_keys;
  std::vector<std::string> removed_keys;
};

class PagePoolPrefixTest : public ::testing::Test {
 protected:
  void MakePool(int64_t num_pages, int64_t max_pins = 4,
                FreePolicy policy = FreePolicy::kLifo) {
    PoolOptions options;
    options.num_pages = num_pages;
    options.page_size = 4;
    options.free_policy = policy;
    options.max_pinned_pages_per_owner = max_pins;
    options.kv_event_sink = &sink_;
    ASSERT_OK_AND_ASSIGN(pool_, PagePool::Create(options, &executor_));
    ASSERT_OK(pool_->AddOwner(kAlice, 0));
    ASSERT_OK(pool_->AddOwner(kBob, 0));
  }

  // Allocates `n` pages for `owner` and returns their ids.
  std::vector<int64_t> Pages(OwnerId owner, int64_t n) {
    std::vector<int64_t> slots(n * 4, -1);
    AllocRequest request{RequestKind::kAlloc, owner, 0, 0, n * 4, -1,
                         slots.data()};
    std::vector<AllocResult> results = pool_->Allocate({request});
    EXPECT_OK(results[0].status);
    std::vector<int64_t> pages;
    for (int64_t k = 0; k < n; ++k) pages.push_back(slots[k * 4] / 4);
    return pages;
  }

  std::vector<PrefixKey> Keys(int64_t first, int64_t n) {
    std::vector<PrefixKey> keys;
    for (int64_t k = 0; k < n; ++k) keys.push_back(Key(first + k));
    return keys;
  }

  FakeExecutor executor_;
  RecordingSink sink_;
  std::unique_ptr<PagePool> pool_;
};

TEST_F(PagePoolPrefixTest, PublishedPagesAreMatchedAndAdoptedBySiblings) {
  MakePool(16);
  const std::vector<int64_t> pages = Pages(kAlice, 3);
  ASSERT_OK_AND_ASSIGN(PublishOutcome published,
                       pool_->Publish(kAlice, pages, Keys(1, 3), nullptr,
                                      /*pin=*/false));
  EXPECT_EQ(published.pages, pages);
  EXPECT_EQ(published.newly_published, 3);
  EXPECT_THAT(sink_.events, ElementsAre("stored 3"));
  EXPECT_EQ(pool_->OwnerOf(pages[0]), kSharedOwner);
  EXPECT_EQ(pool_->Stats().owners[kAlice].pages_owned, 0);
  EXPECT_EQ(pool_->Stats().owners[kAlice].shared_pages, 3);

  // A chain that leaves the cache after two keys matches two pages.
  std::vector<PrefixKey> chain = Keys(1, 2);
  chain.push_back(Key(99));
  chain.push_back(Key(3));
  EXPECT_THAT(pool_->MatchPrefix(kBob, chain, /*adopt=*/false),
              IsOkAndHolds(ElementsAre(pages[0], pages[1])));
  EXPECT_EQ(pool_->SharedCount(pages[0]), 1);
  EXPECT_THAT(pool_->MatchPrefix(kBob, chain, /*adopt=*/true),
              IsOkAndHolds(ElementsAre(pages[0], pages[1])));
  EXPECT_EQ(pool_->SharedCount(pages[0]), 2);
  EXPECT_EQ(pool_->SharedCount(pages[2]), 1);
  const PoolStats stats = pool_->Stats();
  EXPECT_EQ(stats.published_pages, 3);
  EXPECT_EQ(stats.prefix_lookup_pages, 8);
  EXPECT_EQ(stats.prefix_hit_pages, 4);
  EXPECT_EQ(stats.used_pages, 0);
  EXPECT_OK(pool_->CheckInvariants());
}

// A key given twice inside the matched prefix is refused, naming both, and
// changes nothing; keys after the first miss are not looked at, so a repeat
// there costs nothing and the match answers as without it.
TEST_F(PagePoolPrefixTest, AKeyRepeatedInTheMatchedPrefixIsRefused) {
  MakePool(16);
  const std::vector<int64_t> pages = Pages(kAlice, 3);
  ASSERT_OK(pool_->Publish(kAlice, pages, Keys(1, 3), nullptr, false));
  const PoolStats before = pool_->Stats();
  for (const bool adopt : {false, true}) {
    EXPECT_THAT(pool_->MatchPrefix(kBob, {Key(1), Key(2), Key(1)}, adopt),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("keys[2] repeats keys[0]")));
    EXPECT_THAT(
        pool_->MatchPrefix(kBob, {Key(1), Key(2), Key(3), Key(2)}, adopt),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr("keys[3] repeats keys[1]")));
  }
  const PoolStats after = pool_->Stats();
  EXPECT_EQ(after.prefix_lookup_pages, before.prefix_lookup_pages);
  EXPECT_EQ(after.prefix_pages_adopted, before.prefix_pages_adopted);
  EXPECT_EQ(pool_->SharedCount(pages[0]), 1);
  // The refused adopts took references as their walks found pages, and
  // gave every one back: Bob holds none (the invariants count them).
  EXPECT_OK(pool_->CheckInvariants());
  EXPECT_THAT(pool_->FreePages(kBob, {pages[0]}),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("holds no reference")));
  // After a miss (Key(9)), a repeat is past the match.
  EXPECT_THAT(pool_->MatchPrefix(kBob, {Key(1), Key(9), Key(1), Key(1)}, true),
              IsOkAndHolds(ElementsAre(pages[0])));
  EXPECT_EQ(pool_->SharedCount(pages[0]), 2);
  EXPECT_OK(pool_->CheckInvariants());
}

TEST_F(PagePoolPrefixTest, FreeDropsReferencesAndTheLastLeavesThePageCached) {
  MakePool(16);
  const std::vector<int64_t> pages = Pages(kAlice, 2);
  ASSERT_OK(pool_->Publish(kAlice, pages, Keys(1, 2), nullptr, false));
  ASSERT_OK(pool_->MatchPrefix(kBob, Keys(1, 2), true).status());
  EXPECT_THAT(pool_->FreePages(kAlice, pages), IsOkAndHolds(2));
  EXPECT_EQ(pool_->Stats().published_pages, 2);
  EXPECT_THAT(pool_->FreePages(kAlice, pages),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("holds no reference")));
  const int64_t free_before = pool_->Stats().free_pages;
  EXPECT_THAT(pool_->FreePages(kBob, pages), IsOkAndHolds(2));
  const PoolStats stats = pool_->Stats();
  EXPECT_EQ(stats.cached_pages, 2);
  EXPECT_EQ(stats.evictable_pages, 2);
  EXPECT_EQ(stats.free_pages, free_before);  // cached, not free
  // The last page of the free is evicted first: the deepest of the chain.
  EXPECT_THAT(pool_->EvictionOrder(), ElementsAre(pages[1], pages[0]));
  // A cached page is adopted back.
  EXPECT_THAT(pool_->MatchPrefix(kBob, Keys(1, 1), true),
              IsOkAndHolds(ElementsAre(pages[0])));
  EXPECT_THAT(pool_->EvictionOrder(), ElementsAre(pages[1]));
  EXPECT_OK(pool_->CheckInvariants());
}

TEST_F(PagePoolPrefixTest, AKeyAlreadyPublishedKeepsItsPage) {
  MakePool(16);
  const std::vector<int64_t> first = Pages(kAlice, 2);
  ASSERT_OK(pool_->Publish(kAlice, first, Keys(1, 2), nullptr, false));
  const std::vector<int64_t> second = Pages(kBob, 3);
  ASSERT_OK_AND_ASSIGN(
      PublishOutcome outcome,
      pool_->Publish(kBob, second, Keys(1, 3), nullptr, false));
  EXPECT_THAT(outcome.pages, ElementsAre(first[0], first[1], second[2]));
  EXPECT_THAT(outcome.existing, ElementsAre(true, true, false));
  EXPECT_EQ(outcome.newly_published, 1);
  // Bob's duplicates stay his, for him to free.
  EXPECT_EQ(pool_->OwnerOf(second[0]), kBob);
  EXPECT_THAT(pool_->FreePages(kBob, {second[0], second[1]}), IsOkAndHolds(2));
  EXPECT_EQ(pool_->Stats().prefix_publish_existing, 2);
  EXPECT_THAT(sink_.events, ElementsAre("stored 2", "stored 1"));
  EXPECT_OK(pool_->CheckInvariants());
}

TEST_F(PagePoolPrefixTest, AnAllocationThatDoesNotFitEvictsItsShortfallOnce) {
  MakePool(8);
  const std::vector<int64_t> pages = Pages(kAlice, 6);
  ASSERT_OK(pool_->Publish(kAlice, pages, Keys(1, 6), nullptr, false));
  ASSERT_OK(pool_->FreePages(kAlice, pages).status());  // all cached
  ASSERT_EQ(pool_->Stats().free_pages, 2);
  // Two calls of one launch need 5 pages together, 3 more than are free.
  std::vector<int64_t> a(8), b(12);
  std::vector<AllocRequest> batch = {
      {RequestKind::kAlloc, kBob, 0, 0, 8, -1, a.data()},
      {RequestKind::kAlloc, kBob, 1, 0, 12, -1, b.data()}};
  std::vector<CallSpan> calls = {{1, false, {}}, {1, false, {}}};
  const int64_t launches = executor_.launches();
  for (const AllocResult& result : pool_->Allocate(batch, calls)) {
    EXPECT_OK(result.status);
  }
  EXPECT_EQ(executor_.launches(), launches + 1);
  // The chain's tail went, least recently used first, in one decision.
  EXPECT_THAT(sink_.events, ElementsAre("stored 6", "removed 3"));
  EXPECT_EQ(sink_.removed_keys[0], PrefixKeyBytes(Key(6)));
  EXPECT_THAT(pool_->MatchPrefix(kBob, Keys(1, 6), false),
              IsOkAndHolds(ElementsAre(pages[0], pages[1], pages[2])));
  const PoolStats stats = pool_->Stats();
  EXPECT_EQ(stats.prefix_evicted_for_allocation, 3);
  EXPECT_EQ(stats.cached_pages, 3);
  EXPECT_OK(pool_->CheckInvariants());
}

TEST_F(PagePoolPrefixTest, PublishedAndPinnedPagesAreNeverEvicted) {
  MakePool(4, /*max_pins=*/1);
  const std::vector<int64_t> held = Pages(kAlice, 1);
  const std::vector<int64_t> pinned = Pages(kAlice, 1);
  ASSERT_OK(pool_->Publish(kAlice, held, Keys(1, 1), nullptr, false));
  ASSERT_OK(pool_->Publish(kAlice, pinned, Keys(2, 1), nullptr, true));
  ASSERT_OK(pool_->FreePages(kAlice, pinned).status());
  EXPECT_EQ(pool_->Stats().pinned_pages, 1);
  EXPECT_EQ(pool_->Stats().evictable_pages, 0);
  std::vector<int64_t> slots(12);
  AllocRequest request{RequestKind::kAlloc, kBob, 0, 0, 12, -1, slots.data()};
  EXPECT_THAT(pool_->Allocate({request})[0].status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("needs 3 pages, 2 free")));
  // A second pin is over Alice's bound; nothing changes.
  const std::vector<int64_t> more = Pages(kAlice, 1);
  EXPECT_THAT(pool_->Publish(kAlice, more, Keys(3, 1), nullptr, true),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("over its bound of 1")));
  EXPECT_EQ(pool_->OwnerOf(more[0]), kAlice);
  EXPECT_THAT(pool_->Unpin(kAlice, pinned), IsOkAndHolds(1));
  EXPECT_THAT(pool_->EvictionOrder(), ElementsAre(pinned[0]));
  EXPECT_OK(pool_->CheckInvariants());
}

TEST_F(PagePoolPrefixTest, PagesARemovedOwnerPublishedStayCached) {
  MakePool(16);
  const std::vector<int64_t> published = Pages(kAlice, 2);
  const std::vector<int64_t> unpublished = Pages(kAlice, 2);
  ASSERT_OK(pool_->Publish(kAlice, published, Keys(1, 2), nullptr, true));
  ASSERT_THAT(pool_->RemoveOwner(kAlice), IsOkAndHolds(2));
  const PoolStats stats = pool_->Stats();
  EXPECT_EQ(stats.cached_pages, 2);
  EXPECT_EQ(stats.pinned_pages, 0);  // pins end with their owner
  EXPECT_EQ(stats.free_pages, 14);
  EXPECT_THAT(pool_->MatchPrefix(kBob, Keys(1, 2), true),
              IsOkAndHolds(ElementsAreArray(published)));
  EXPECT_OK(pool_->CheckInvariants());
}

// The order in which a removed owner's references go decides the eviction
// order; it is the pages' (descending), never a hash set's, so that a pool
// replayed in another process evicts the same pages.
TEST_F(PagePoolPrefixTest, ARemovedOwnersPagesAreCachedInDescendingOrder) {
  MakePool(64);
  const std::vector<int64_t> pages = Pages(kAlice, 12);
  ASSERT_OK(pool_->Publish(kAlice, pages, Keys(1, 12), nullptr, false));
  // Bob adopts every page; Alice's references go, Bob's go with him.
  ASSERT_OK(pool_->MatchPrefix(kBob, Keys(1, 12), true).status());
  ASSERT_OK(pool_->ClearOwner(kAlice).status());
  ASSERT_OK(pool_->RemoveOwner(kBob).status());
  std::vector<int64_t> descending(pages.rbegin(), pages.rend());
  std::sort(descending.begin(), descending.end(), std::greater<int64_t>());
  EXPECT_THAT(pool_->EvictionOrder(), ElementsAreArray(descending));
  EXPECT_OK(pool_->CheckInvariants());
}

TEST_F(PagePoolPrefixTest, ResetEvictsEveryCachedUnpinnedPage) {
  MakePool(16);
  const std::vector<int64_t> pages = Pages(kAlice, 3);
  ASSERT_OK(pool_->Publish(kAlice, pages, Keys(1, 3), nullptr, false));
  ASSERT_OK(pool_->FreePages(kAlice, {pages[1], pages[2]}).status());
  EXPECT_THAT(pool_->ResetPrefixCache(), IsOkAndHolds(2));
  EXPECT_THAT(sink_.events, ElementsAre("stored 3", "removed 2"));
  EXPECT_EQ(pool_->Stats().published_pages, 1);
  ASSERT_OK(pool_->FreePages(kAlice, {pages[0]}).status());
  EXPECT_THAT(pool_->ResetPrefixCache(), IsOkAndHolds(1));
  EXPECT_THAT(sink_.events.back(), "cleared");
  EXPECT_EQ(pool_->Stats().free_pages, 16);
  EXPECT_THAT(pool_->ResetPrefixCache(), IsOkAndHolds(0));
  EXPECT_OK(pool_->CheckInvariants());
}

TEST_F(PagePoolPrefixTest, AdoptsCountTowardsTheQuota) {
  MakePool(16);
  ASSERT_OK(pool_->AddOwner(3, /*quota_pages=*/2));
  const std::vector<int64_t> pages = Pages(kAlice, 3);
  ASSERT_OK(pool_->Publish(kAlice, pages, Keys(1, 3), nullptr, false));
  EXPECT_THAT(pool_->MatchPrefix(3, Keys(1, 3), true),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("holds 0 of its 2")));
  EXPECT_EQ(pool_->SharedCount(pages[0]), 1);
  ASSERT_OK(pool_->MatchPrefix(3, Keys(1, 2), true).status());
  std::vector<int64_t> slots(4);
  AllocRequest request{RequestKind::kAlloc, 3, 0, 0, 4, -1, slots.data()};
  EXPECT_THAT(
      pool_->Allocate({request})[0].status,
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("over quota")));
}

// An adopt takes a published page's reference as its walk finds it and a
// cached page's after the quota check: a refusal gives back the first
// kind and never touches the second (nor the LRU order); an adopt that
// goes through holds every page once and takes the cached ones off the
// LRU.
TEST_F(PagePoolPrefixTest,
       ARefusedAdoptOfPublishedAndCachedPagesChangesNothing) {
  MakePool(16);
  ASSERT_OK(pool_->AddOwner(3, /*quota_pages=*/3));
  const std::vector<int64_t> pages = Pages(kAlice, 4);
  ASSERT_OK(pool_->Publish(kAlice, pages, Keys(1, 4), nullptr, false));
  // Pages 0 and 2 cached, 1 and 3 still Alice's.
  ASSERT_OK(pool_->FreePages(kAlice, {pages[2], pages[0]}).status());
  const std::vector<int64_t> lru = pool_->EvictionOrder();
  ASSERT_EQ(lru.size(), 2u);
  const std::vector<int64_t> counts = {0, 1, 0, 1};
  auto expect_unchanged = [&] {
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(pool_->SharedCount(pages[i]), counts[i]) << i;
    }
    EXPECT_EQ(pool_->EvictionOrder(), lru);
    EXPECT_OK(pool_->CheckInvariants());
  };
  EXPECT_THAT(pool_->MatchPrefix(3, Keys(1, 4), true),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("holds 0 of its 3")));
  expect_unchanged();
  EXPECT_THAT(pool_->MatchPrefix(3, {Key(1), Key(2), Key(3), Key(2)}, true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("keys[3] repeats keys[1]")));
  expect_unchanged();
  EXPECT_THAT(pool_->MatchPrefix(3, Keys(1, 3), true),
              IsOkAndHolds(ElementsAre(pages[0], pages[1], pages[2])));
  EXPECT_EQ(pool_->SharedCount(pages[0]), 1);
  EXPECT_EQ(pool_->SharedCount(pages[1]), 2);
  EXPECT_EQ(pool_->SharedCount(pages[2]), 1);
  EXPECT_EQ(pool_->SharedCount(pages[3]), 1);
  EXPECT_THAT(pool_->EvictionOrder(), IsEmpty());
  EXPECT_OK(pool_->CheckInvariants());
}

// Every hostile publish, as a row: the code, the message, and a pool that
// has not changed.
TEST_F(PagePoolPrefixTest, HostilePublishesAreRefusedAndChangeNothing) {
  MakePool(16);
  const std::vector<int64_t> alice = Pages(kAlice, 2);
  const std::vector<int64_t> bob = Pages(kBob, 1);
  const std::vector<int64_t> shared = Pages(kAlice, 1);
  ASSERT_OK(pool_->Publish(kAlice, shared, Keys(50, 1), nullptr, false));
  struct Row {
    std::vector<int64_t> pages;
    std::vector<PrefixKey> keys;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Row> rows = {
      {{alice[0]},
       Keys(1, 2),
       absl::StatusCode::kInvalidArgument,
       "1 pages and 2 keys"},
      {{alice[0], alice[1]},
       {Key(1), Key(1)},
       absl::StatusCode::kInvalidArgument,
       "keys[1] repeats keys[0]"},
      {{alice[0], alice[0]},
       Keys(1, 2),
       absl::StatusCode::kInvalidArgument,
       "pages[1] (" + std::to_string(alice[0]) + ") repeats pages[0]"},
      {{alice[0], 0},
       Keys(1, 2),
       absl::StatusCode::kInvalidArgument,
       "pages[1] (0) is outside the usable pages [1, 16]"},
      {{alice[0], bob[0]},
       Keys(1, 2),
       absl::StatusCode::kPermissionDenied,
       "belongs to another session"},
      {{alice[0], 16},
       Keys(1, 2),
       absl::StatusCode::kFailedPrecondition,
       "was never allocated"},
      {{alice[0], shared[0]},
       Keys(1, 2),
       absl::StatusCode::kFailedPrecondition,
       "already shared under another key"},
      {std::vector<int64_t>(17, 1), Keys(1, 17),
       absl::StatusCode::kInvalidArgument, "more than the pool's 16 pages"},
  };
  const PoolStats before = pool_->Stats();
  for (size_t r = 0; r < rows.size(); ++r) {
    SCOPED_TRACE(absl::StrFormat("row %d", r));
    EXPECT_THAT(
        pool_->Publish(kAlice, rows[r].pages, rows[r].keys, nullptr, false),
        StatusIs(rows[r].code, HasSubstr(rows[r].message)));
    const PoolStats after = pool_->Stats();
    EXPECT_EQ(after.published_pages, before.published_pages);
    EXPECT_EQ(after.owners.at(kAlice).pages_owned,
              before.owners.at(kAlice).pages_owned);
    EXPECT_EQ(pool_->OwnerOf(alice[0]), kAlice);
    EXPECT_THAT(pool_->MatchPrefix(kBob, Keys(1, 1), false),
                IsOkAndHolds(IsEmpty()));
  }
  EXPECT_THAT(
      pool_->Publish(9, alice, Keys(1, 2), nullptr, false),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown owner 9")));
  // A shared page is read-only: an extend that would write into it (a
  // prefix ending inside it) is refused.
  std::vector<int64_t> slots(2);
  AllocRequest write{RequestKind::kExtend, kBob,        0, 2, 4,
                     shared[0] * 4 + 1,    slots.data()};
  ASSERT_OK(pool_->MatchPrefix(kBob, Keys(50, 1), true).status());
  EXPECT_THAT(pool_->Allocate({write})[0].status,
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("shared prefix page, read-only")));
  EXPECT_OK(pool_->CheckInvariants());
}

// The randomized check: several owners allocate, publish, match, adopt,
// free, get removed and re-added, while a host "slab" holds, per page, the
// pattern its last writer stored. Invariants after every step: the pool's
// own (a shared page's count is the references its owners hold, no free
// page is shared), the model's reference counts per owner and page, and
// every adopted page still holds the pattern published under its key (no
// page is handed out while shared).
class PrefixModel {
 public:
  PrefixModel(uint64_t seed, int64_t num_pages, FreePolicy policy)
      : rng_(seed) {
    PoolOptions options;
    options.num_pages = num_pages;
    options.page_size = 2;
    options.free_policy = policy;
    options.max_pinned_pages_per_owner = 3;
    pool_ = *PagePool::Create(options, &executor_);
    slab_.assign(num_pages + 1, 0);
    for (OwnerId owner = 1; owner <= kOwners; ++owner) {
      (void)pool_->AddOwner(owner, 0);
    }
  }

  static constexpr OwnerId kOwners = 4;
  static constexpr int64_t kKeySpace = 24;

  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  absl::Status Step() {
    const OwnerId owner = Uniform(1, kOwners);
    switch (Uniform(0, 6)) {
      case 0:
      case 1:
        return Allocate(owner);
      case 2:
        return Publish(owner);
      case 3:
        return Adopt(owner);
      case 4:
        return FreeSome(owner);
      case 5:
        if (Uniform(0, 3) == 0) return Kill(owner);
        return FreeSome(owner);
      default:
        if (Uniform(0, 7) == 0) {
          auto reset = pool_->ResetPrefixCache();
          if (!reset.ok()) return reset.status();
          ++resets_;
        }
        return Adopt(owner);
    }
  }

  absl::Status Check() {
    RETURN_IF_ERROR(pool_->CheckInvariants());
    for (OwnerId owner = 1; owner <= kOwners; ++owner) {
      for (const auto& [page, count] : refs_[owner]) {
        if (pool_->OwnerOf(page) != kSharedOwner) {
          return absl::InternalError(absl::StrFormat(
              "owner %d holds %d references on page %d, which is not shared",
              owner, count, page));
        }
      }
      for (int64_t page : owned_[owner]) {
        if (pool_->OwnerOf(page) != owner) {
          return absl::InternalError(
              absl::StrFormat("page %d should be owner %d's, is %d's", page,
                              owner, pool_->OwnerOf(page)));
        }
      }
    }
    std::map<int64_t, int64_t> total;
    for (auto& [owner, refs] : refs_) {
      for (const auto& [page, count] : refs) total[page] += count;
    }
    for (const auto& [page, count] : total) {
      if (pool_->SharedCount(page) != count) {
        return absl::InternalError(
            absl::StrFormat("page %d: count %d, the sessions hold %d", page,
                            pool_->SharedCount(page), count));
      }
    }
    return absl::OkStatus();
  }

  int64_t adopted_checked() const { return adopted_checked_; }
  int64_t evicted() const {
    return pool_->Stats().prefix_evicted_for_allocation;
  }
  int64_t resets() const { return resets_; }

 private:
  absl::Status Allocate(OwnerId owner) {
    const int64_t n = Uniform(1, 6);
    std::vector<int64_t> slots(2 * n);
    AllocRequest request{RequestKind::kAlloc, owner, 0, 0, 2 * n, -1,
                         slots.data()};
    const AllocResult result = pool_->Allocate({request})[0];
    if (!result.status.ok()) {
      if (result.status.code() != absl::StatusCode::kResourceExhausted) {
        return result.status;
      }
      return absl::OkStatus();
    }
    for (int64_t k = 0; k < n; ++k) {
      const int64_t page = slots[2 * k] / 2;
      if (pool_->OwnerOf(page) != owner) {
        return absl::InternalError(
            absl::StrFormat("page %d was handed to %d but is %d's", page, owner,
                            pool_->OwnerOf(page)));
      }
      // The writer fills its page: the pattern names the give.
      slab_[page] = ++writes_;
      owned_[owner].push_back(page);
    }
    return absl::OkStatus();
  }

  absl::Status Publish(OwnerId owner) {
    std::vector<int64_t>& owned = owned_[owner];
    if (owned.empty()) return absl::OkStatus();
    const int64_t n = Uniform(1, std::min<int64_t>(4, owned.size()));
    const int64_t first_key = Uniform(0, kKeySpace - n);
    std::vector<int64_t> pages(owned.end() - n, owned.end());
    std::vector<PrefixKey> keys;
    for (int64_t k = 0; k < n; ++k) keys.push_back(Key(first_key + k));
    const bool pin = Uniform(0, 5) == 0;
    auto outcome = pool_->Publish(owner, pages, keys, nullptr, pin);
    if (!outcome.ok()) {
      if (pin &&
          outcome.status().code() == absl::StatusCode::kResourceExhausted) {
        return absl::OkStatus();
      }
      return outcome.status();
    }
    for (int64_t k = 0; k < n; ++k) {
      if (outcome->existing[k]) continue;
      owned.erase(std::find(owned.begin(), owned.end(), pages[k]));
      ++refs_[owner][pages[k]];
      pattern_of_key_[first_key + k] = slab_[pages[k]];
    }
    return absl::OkStatus();
  }

  absl::Status Adopt(OwnerId owner) {
    const int64_t first_key = Uniform(0, kKeySpace - 1);
    const int64_t n = Uniform(1, 6);
    std::vector<PrefixKey> keys;
    for (int64_t k = 0; k < n; ++k) keys.push_back(Key(first_key + k));
    auto pages = pool_->MatchPrefix(owner, keys, /*adopt=*/true);
    if (!pages.ok()) return pages.status();
    for (size_t k = 0; k < pages->size(); ++k) {
      const int64_t page = (*pages)[k];
      const int64_t expected = pattern_of_key_[first_key + k];
      if (slab_[page] != expected) {
        return absl::InternalError(absl::StrFormat(
            "adopted page %d for key %d holds pattern %d, published %d", page,
            first_key + k, slab_[page], expected));
      }
      ++refs_[owner][page];
      ++adopted_checked_;
    }
    return absl::OkStatus();
  }

  absl::Status FreeSome(OwnerId owner) {
    std::vector<int64_t> pages;
    std::vector<int64_t>& owned = owned_[owner];
    while (!owned.empty() && Uniform(0, 2) != 0) {
      pages.push_back(owned.back());
      owned.pop_back();
    }
    std::map<int64_t, int64_t>& refs = refs_[owner];
    for (auto it = refs.begin(); it != refs.end();) {
      if (Uniform(0, 2) == 0) {
        ++it;
        continue;
      }
      pages.push_back(it->first);
      if (--it->second == 0) {
        it = refs.erase(it);
      } else {
        ++it;
      }
    }
    if (pages.empty()) return absl::OkStatus();
    auto freed = pool_->FreePages(owner, pages);
    if (!freed.ok()) return freed.status();
    if (*freed != static_cast<int64_t>(pages.size())) {
      return absl::InternalError(absl::StrFormat(
          "freed %d pages and references, asked %d", *freed, pages.size()));
    }
    return absl::OkStatus();
  }

  absl::Status Kill(OwnerId owner) {
    auto removed = pool_->RemoveOwner(owner);
    if (!removed.ok()) return removed.status();
    owned_[owner].clear();
    refs_[owner].clear();
    return pool_->AddOwner(owner, 0);
  }

  std::mt19937_64 rng_;
  FakeExecutor executor_;
  std::unique_ptr<PagePool> pool_;
  std::vector<int64_t> slab_;
  int64_t writes_ = 0;
  std::map<OwnerId, std::vector<int64_t>> owned_;
  std::map<OwnerId, std::map<int64_t, int64_t>> refs_;
  std::map<int64_t, int64_t> pattern_of_key_;
  int64_t adopted_checked_ = 0;
  int64_t resets_ = 0;
};

class PrefixModelTest : public ::testing::TestWithParam<FreePolicy> {};

TEST_P(PrefixModelTest, RandomSequencesKeepCountsAndCachedBytes) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  int64_t adopted = 0, evicted = 0;
  for (int sequence = 0; sequence < 100; ++sequence) {
    PrefixModel model(seed + sequence, 24 + sequence % 17, GetParam());
    for (int step = 0; step < 300; ++step) {
      SCOPED_TRACE(absl::StrFormat("sequence %d step %d", sequence, step));
      ASSERT_OK(model.Step());
      ASSERT_OK(model.Check());
    }
    adopted += model.adopted_checked();
    evicted += model.evicted();
  }
  // The generator reaches the paths that matter.
  EXPECT_GT(adopted, 1000);
  EXPECT_GT(evicted, 100);
}

INSTANTIATE_TEST_SUITE_P(Policies, PrefixModelTest,
                         ::testing::Values(FreePolicy::kLifo,
                                           FreePolicy::kSorted));

}  // namespace
}  // namespace pagealloc
