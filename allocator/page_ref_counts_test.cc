#include "allocator/page_ref_counts.h"

#include <cstdint>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pagealloc {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

std::vector<std::pair<int64_t, int64_t>> Listed(const PageRefCounts& refs) {
  std::vector<std::pair<int64_t, int64_t>> out;
  refs.ForEach(
      [&](int64_t page, int64_t count) { out.emplace_back(page, count); });
  return out;
}

TEST(PageRefCountsTest, CountsAddAndDropPerPage) {
  PageRefCounts refs;
  EXPECT_TRUE(refs.empty());
  EXPECT_EQ(refs.count(7), 0);
  EXPECT_TRUE(refs.Add(7));
  EXPECT_FALSE(refs.Add(7));
  EXPECT_TRUE(refs.Add(PageRefCounts::kLeafPages * 3 + 1));
  EXPECT_EQ(refs.size(), 2u);
  EXPECT_EQ(refs.count(7), 2);
  EXPECT_TRUE(refs.contains(7));
  EXPECT_FALSE(refs.contains(8));
  EXPECT_FALSE(refs.contains(PageRefCounts::kLeafPages * 100));
  EXPECT_EQ(refs.Drop(7), 1);
  EXPECT_EQ(refs.size(), 2u);
  EXPECT_EQ(refs.Drop(7), 0);
  EXPECT_EQ(refs.size(), 1u);
  EXPECT_FALSE(refs.contains(7));
  EXPECT_THAT(Listed(refs),
              ElementsAre(Pair(PageRefCounts::kLeafPages * 3 + 1, 1)));
  refs.Clear();
  EXPECT_TRUE(refs.empty());
  EXPECT_THAT(Listed(refs), ElementsAre());
}

TEST(PageRefCountsTest, SetRestoresAndClearsCounts) {
  PageRefCounts refs;
  refs.Set(5, 3);
  refs.Set(2, 1);
  EXPECT_EQ(refs.size(), 2u);
  refs.Set(5, 4);
  EXPECT_EQ(refs.size(), 2u);
  refs.Set(2, 0);
  EXPECT_EQ(refs.size(), 1u);
  EXPECT_THAT(Listed(refs), ElementsAre(Pair(5, 4)));
}

// Against a std::map over random adds and drops across many leaves: the
// counts, the size and the ascending listing agree at every step.
TEST(PageRefCountsTest, AgreesWithAMapOverRandomAddsAndDrops) {
  std::mt19937_64 random(25);
  PageRefCounts refs;
  std::map<int64_t, int64_t> model;
  for (int step = 0; step < 20000; ++step) {
    const int64_t page = 1 + static_cast<int64_t>(random() % 4000);
    if (random() % 3 != 0 || model[page] == 0) {
      const bool fresh = model[page] == 0;
      EXPECT_EQ(refs.Add(page), fresh);
      ++model[page];
    } else {
      EXPECT_EQ(refs.Drop(page), --model[page]);
    }
    if (model[page] == 0) model.erase(page);
    ASSERT_EQ(refs.size(), model.size()) << "step " << step;
    ASSERT_EQ(refs.count(page), model.count(page) ? model[page] : 0);
  }
  const std::vector<std::pair<int64_t, int64_t>> expected(model.begin(),
                                                          model.end());
  EXPECT_EQ(Listed(refs), expected);
}

}  // namespace
}  // namespace pagealloc
