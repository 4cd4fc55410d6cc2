#include "allocator/prefix_index.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

PrefixKey Key(uint8_t tag) {
  PrefixKey key{};
  key[0] = tag;
  key[31] = 0xa5;
  return key;
}

class PrefixIndexTest : public ::testing::Test {
 protected:
  PrefixIndex index_{8};
};

TEST_F(PrefixIndexTest, InsertedPagesAreFoundAndPublished) {
  const PrefixKey parent = Key(1);
  index_.Insert(3, Key(1), nullptr);
  index_.Insert(5, Key(2), &parent);
  EXPECT_EQ(index_.Find(Key(1)), 3);
  EXPECT_EQ(index_.Find(Key(2)), 5);
  EXPECT_EQ(index_.Find(Key(3)), 0);
  EXPECT_TRUE(index_.Contains(5));
  EXPECT_FALSE(index_.Contains(4));
  EXPECT_FALSE(index_.has_parent(3));
  EXPECT_TRUE(index_.has_parent(5));
  EXPECT_EQ(index_.parent_key(5), parent);
  EXPECT_EQ(index_.Counts().published_pages, 2);
  EXPECT_EQ(index_.Counts().evictable_pages, 0);
  EXPECT_OK(index_.CheckInvariants());
}

TEST_F(PrefixIndexTest, LastReleaseCachesAndEvictionIsLeastRecentlyUsedFirst) {
  for (int64_t page = 1; page <= 4; ++page) {
    index_.Insert(page, Key(page), nullptr);
  }
  index_.AddRef(2);  // count 2
  index_.Release(3);
  index_.Release(1);
  index_.Release(2);  // still held once
  index_.Release(4);
  EXPECT_THAT(index_.LruOrder(), ElementsAre(3, 1, 4));
  index_.AddRef(1);   // adopted: leaves the LRU
  index_.Release(1);  // back, most recently used
  EXPECT_THAT(index_.LruOrder(), ElementsAre(3, 4, 1));
  EXPECT_EQ(index_.Counts().cached_pages, 3);
  EXPECT_EQ(index_.Counts().published_pages, 1);
  std::vector<int64_t> pages;
  std::vector<std::string> keys;
  EXPECT_EQ(index_.EvictLru(2, &pages, &keys), 2);
  EXPECT_THAT(pages, ElementsAre(3, 4));
  EXPECT_THAT(keys,
              ElementsAre(PrefixKeyBytes(Key(3)), PrefixKeyBytes(Key(4))));
  EXPECT_EQ(index_.Find(Key(3)), 0);
  EXPECT_FALSE(index_.Contains(3));
  EXPECT_EQ(index_.size(), 2);
  EXPECT_OK(index_.CheckInvariants());
}

TEST_F(PrefixIndexTest, PinnedPagesAreNeverEvicted) {
  index_.Insert(1, Key(1), nullptr);
  index_.Insert(2, Key(2), nullptr);
  index_.Pin(1);
  index_.Release(1);
  index_.Release(2);
  std::vector<int64_t> pages;
  EXPECT_EQ(index_.EvictLru(8, &pages, nullptr), 1);
  EXPECT_THAT(pages, ElementsAre(2));
  EXPECT_EQ(index_.Counts().pinned_pages, 1);
  EXPECT_EQ(index_.Counts().evictable_pages, 0);
  index_.Unpin(1);
  EXPECT_THAT(index_.LruOrder(), ElementsAre(1));
  EXPECT_OK(index_.CheckInvariants());
}

TEST_F(PrefixIndexTest, ClearForgetsEverything) {
  index_.Insert(1, Key(1), nullptr);
  index_.Release(1);
  index_.Clear();
  EXPECT_EQ(index_.size(), 0);
  EXPECT_TRUE(index_.LruOrder().empty());
  EXPECT_EQ(index_.Counts().cached_pages, 0);
  EXPECT_OK(index_.CheckInvariants());
}

TEST(PrefixKeyTest, KeysOfAnotherSizeAreRefusedWithTheirIndex) {
  EXPECT_THAT(ParsePrefixKey(std::string(31, 'x'), "keys", 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("keys[4] is 31 bytes; a prefix key is 32")));
  EXPECT_OK(ParsePrefixKey(std::string(32, 'x'), "keys", 0).status());
}

TEST(PrefixKeyTest, ChainsOfKeysOfAnotherSizeOrTooManyKeysAreRefused) {
  const std::string a(32, 'a'), b(32, 'b'), short_key(31, 'c');
  const std::vector<absl::string_view> chain = {a, b, a};
  EXPECT_THAT(ParsePrefixKeys(chain, "keys", 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("3 keys, more than the pool's 2 pages")));
  EXPECT_THAT(ParsePrefixKeys({a, short_key}, "keys", 8),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("keys[1] is 31 bytes")));
  // A repeat is the pool's to refuse (it looks where it is cheap).
  ASSERT_OK_AND_ASSIGN(const std::vector<PrefixKey> parsed,
                       ParsePrefixKeys(chain, "keys", 8));
  ASSERT_EQ(parsed.size(), 3u);
  EXPECT_EQ(PrefixKeyBytes(parsed[0]), a);
  EXPECT_EQ(PrefixKeyBytes(parsed[1]), b);
  EXPECT_EQ(PrefixKeyBytes(parsed[2]), a);
}

// FindAfter's hint never changes an answer: through inserts, evictions
// and pages published again under other keys (stale hints), every walk
// finds what Find does.
TEST(PrefixIndexWalkTest, FindAfterAnswersAsFindDoes) {
  constexpr int64_t kPages = 8;
  std::mt19937_64 random(28);
  PrefixIndex index(kPages);
  for (int step = 0; step < 5000; ++step) {
    const uint64_t op = random() % 4;
    if (op == 0) {  // publish a page not in the index under a new key
      const int64_t page = 1 + static_cast<int64_t>(random() % kPages);
      const PrefixKey key = Key(1 + random() % 12);
      if (!index.Contains(page) && index.Find(key) == 0) {
        index.Insert(page, key, nullptr);
      }
    } else if (op == 1) {  // drop a publisher's reference: cached
      const int64_t page = 1 + static_cast<int64_t>(random() % kPages);
      if (index.Contains(page) && index.count(page) > 0) index.Release(page);
    } else if (op == 2) {  // evict: the page can come back under another key
      std::vector<int64_t> pages;
      std::vector<std::string> keys;
      index.EvictLru(1 + random() % 3, &pages, &keys);
    } else {  // walk a chain of keys
      int64_t previous = 0;
      for (int i = 0; i < 6; ++i) {
        const PrefixKey key = Key(1 + random() % 12);
        const int64_t expected = index.Find(key);
        const int64_t found = index.FindAfter(previous, key);
        ASSERT_EQ(found, expected) << "step " << step << ", key " << i;
        if (found == 0) break;
        previous = found;
      }
    }
    ASSERT_OK(index.CheckInvariants()) << "step " << step;
  }
}

TEST_F(PrefixIndexTest, ExportedEntriesImportIntoTheSameIndex) {
  const PrefixKey parent = Key(1);
  for (int64_t page = 1; page <= 5; ++page) {
    index_.Insert(page, Key(page), page == 1 ? nullptr : &parent);
  }
  index_.AddRef(2);
  index_.Pin(5);
  index_.Release(4);
  index_.Release(1);
  index_.Release(5);  // cached but pinned: not on the LRU
  std::vector<PrefixEntryState> entries;
  std::vector<int64_t> lru;
  index_.Export(&entries, &lru);
  EXPECT_THAT(lru, ElementsAre(4, 1));
  ASSERT_EQ(entries.size(), 5u);
  EXPECT_EQ(entries[1].page, 2);
  EXPECT_EQ(entries[1].count, 2);
  EXPECT_TRUE(entries[1].has_parent);

  PrefixIndex copy(8);
  ASSERT_OK(copy.Import(entries, lru));
  EXPECT_OK(copy.CheckInvariants());
  std::vector<PrefixEntryState> again;
  std::vector<int64_t> lru_again;
  copy.Export(&again, &lru_again);
  EXPECT_EQ(again, entries);
  EXPECT_EQ(lru_again, lru);
  EXPECT_EQ(copy.Find(Key(3)), 3);
  EXPECT_EQ(copy.Counts().evictable_pages, 2);
  EXPECT_EQ(copy.Counts().pinned_pages, 1);
  // The copy evicts in the same order.
  std::vector<int64_t> evicted;
  copy.EvictLru(8, &evicted, nullptr);
  EXPECT_THAT(evicted, ElementsAre(4, 1));
}

TEST_F(PrefixIndexTest, ImportRefusesEntriesThatBreakTheInvariants) {
  auto entry = [](int64_t page, uint8_t key, int64_t count) {
    PrefixEntryState e;
    e.page = page;
    e.key = Key(key);
    e.count = count;
    return e;
  };
  struct Case {
    const char* name;
    std::vector<PrefixEntryState> entries;
    std::vector<int64_t> lru;
    const char* message;
  };
  PrefixEntryState with_stray_parent = entry(2, 2, 1);
  with_stray_parent.parent[3] = 1;
  const std::vector<Case> cases = {
      {"page out of range", {entry(9, 1, 1)}, {}, "outside [1, 8]"},
      {"page twice", {entry(2, 1, 1), entry(2, 2, 1)}, {}, "listed twice"},
      {"key twice", {entry(2, 1, 1), entry(3, 1, 1)}, {}, "key is also"},
      {"negative count", {entry(2, 1, -1)}, {}, "count -1"},
      {"stray parent", {with_stray_parent}, {}, "parent key but no parent"},
      {"cached page off the LRU", {entry(2, 1, 0)}, {}, "LRU lists 0"},
      {"published page on the LRU",
       {entry(2, 1, 1), entry(3, 2, 0)},
       {2},
       "not a cached, unpinned page"},
      {"LRU page twice",
       {entry(2, 1, 0), entry(3, 2, 0)},
       {3, 3},
       "listed twice"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PrefixIndex index(8);
    EXPECT_THAT(index.Import(c.entries, c.lru),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(c.message)));
    EXPECT_EQ(index.size(), 0);
    EXPECT_OK(index.CheckInvariants());
  }
}

}  // namespace
}  // namespace pagealloc
