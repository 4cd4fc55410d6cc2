#include "server/release_queue.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::_;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// Two sessions' words, as their clients' streams would write them.
class ReleaseQueuesTest : public ::testing::Test {
 protected:
  ReleaseQueuesTest() {
    EXPECT_OK(queues_.Attach(1, word_a_));
    EXPECT_OK(queues_.Attach(2, word_b_));
  }

  const absl::Time t0_ = absl::UnixEpoch();
  std::shared_ptr<std::atomic<uint64_t>> word_a_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  std::shared_ptr<std::atomic<uint64_t>> word_b_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  ReleaseQueues queues_;
};

TEST_F(ReleaseQueuesTest, PagesWaitUntilTheirSessionsWordReachesTheValue) {
  ASSERT_OK(queues_.Add(1, 5, {3, 4}, t0_));
  EXPECT_TRUE(queues_.any_pending());
  EXPECT_EQ(queues_.pending_pages(), 2);
  EXPECT_EQ(queues_.pending_pages(1), 2);
  word_a_->store(4);
  EXPECT_THAT(queues_.TakeReleased(t0_), IsEmpty());
  // Another session's word says nothing about these pages.
  word_b_->store(100);
  EXPECT_THAT(queues_.TakeReleased(t0_), IsEmpty());
  word_a_->store(5);
  std::vector<ReleaseQueues::Released> released =
      queues_.TakeReleased(t0_ + absl::Milliseconds(3));
  ASSERT_THAT(released, SizeIs(1));
  EXPECT_EQ(released[0].owner, 1u);
  EXPECT_THAT(released[0].pages, ElementsAre(3, 4));
  EXPECT_EQ(released[0].waited, absl::Milliseconds(3));
  EXPECT_FALSE(queues_.any_pending());
  EXPECT_THAT(queues_.TakeReleased(t0_), IsEmpty());
}

TEST_F(ReleaseQueuesTest, AWordThatGoesBackwardsIsIgnored) {
  ASSERT_OK(queues_.Add(1, 8, {3}, t0_));
  word_a_->store(7);
  EXPECT_THAT(queues_.TakeReleased(t0_), IsEmpty());
  EXPECT_EQ(queues_.passed(1), 7u);
  word_a_->store(2);  // a hostile client rewinds its word
  EXPECT_THAT(queues_.TakeReleased(t0_), IsEmpty());
  EXPECT_EQ(queues_.passed(1), 7u);
  ASSERT_OK(queues_.Add(1, 6, {9}, t0_));  // below the maximum seen
  std::vector<ReleaseQueues::Released> released = queues_.TakeReleased(t0_);
  ASSERT_THAT(released, SizeIs(1));
  EXPECT_THAT(released[0].pages, ElementsAre(9));
  EXPECT_EQ(queues_.pending_pages(1), 1);
}

TEST_F(ReleaseQueuesTest, AWordFarAheadReleasesOnlyItsOwnSessionsPages) {
  ASSERT_OK(queues_.Add(1, 3, {3}, t0_));
  ASSERT_OK(queues_.Add(2, 3, {5}, t0_));
  word_a_->store(UINT64_MAX);
  std::vector<ReleaseQueues::Released> released = queues_.TakeReleased(t0_);
  ASSERT_THAT(released, SizeIs(1));
  EXPECT_EQ(released[0].owner, 1u);
  EXPECT_EQ(queues_.pending_pages(2), 1);
}

TEST_F(ReleaseQueuesTest, ValuesQueuedOutOfOrderReleaseByValue) {
  ASSERT_OK(queues_.Add(1, 9, {3}, t0_));
  ASSERT_OK(queues_.Add(1, 4, {5}, t0_));
  word_a_->store(4);
  std::vector<ReleaseQueues::Released> released = queues_.TakeReleased(t0_);
  ASSERT_THAT(released, SizeIs(1));
  EXPECT_THAT(released[0].pages, ElementsAre(5));
  EXPECT_EQ(queues_.pending_pages(1), 1);
}

TEST_F(ReleaseQueuesTest, APendingPageFreedAgainIsADoubleFree) {
  ASSERT_OK(queues_.Add(1, 5, {3, 4}, t0_));
  EXPECT_THAT(queues_.CheckNotPending(1, {7, 4}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("page 4 was already freed (double free): it "
                                 "waits for the session's release word to "
                                 "reach 5 (now 0)")));
  EXPECT_THAT(queues_.Add(1, 6, {4}, t0_),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("double free")));
  EXPECT_EQ(queues_.pending_pages(1), 2);
  // The same page id of another session is no business of session 1's.
  EXPECT_OK(queues_.CheckNotPending(2, {4}));
}

TEST_F(ReleaseQueuesTest, RefusesAFenceWithoutAWordOrAValue) {
  EXPECT_THAT(queues_.Add(3, 5, {3}, t0_),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("session 3 has no release word (it has no "
                                 "fast channel)")));
  EXPECT_THAT(queues_.Add(1, 0, {3}, t0_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("release_value 0")));
  EXPECT_THAT(queues_.Attach(1, word_b_),
              StatusIs(absl::StatusCode::kAlreadyExists, _));
  EXPECT_THAT(queues_.Attach(4, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_FALSE(queues_.any_pending());
}

TEST_F(ReleaseQueuesTest, RetainDropsPagesGivenBackOtherwise) {
  ASSERT_OK(queues_.Add(1, 5, {3, 4}, t0_));
  ASSERT_OK(queues_.Add(1, 6, {7}, t0_));
  EXPECT_EQ(queues_.Retain(1, [](int64_t page) { return page == 4; }), 2);
  EXPECT_EQ(queues_.pending_pages(1), 1);
  EXPECT_EQ(queues_.pending_pages(), 1);
  EXPECT_OK(queues_.CheckNotPending(1, {3, 7}));
  word_a_->store(6);
  std::vector<ReleaseQueues::Released> released = queues_.TakeReleased(t0_);
  ASSERT_THAT(released, SizeIs(1));
  EXPECT_THAT(released[0].pages, ElementsAre(4));
}

TEST_F(ReleaseQueuesTest, ForgetDropsTheWordAndThePendingPages) {
  ASSERT_OK(queues_.Add(1, 5, {3, 4}, t0_));
  ASSERT_OK(queues_.Add(2, 5, {6}, t0_));
  const long uses = word_a_.use_count();
  EXPECT_EQ(queues_.Forget(1), 2);
  EXPECT_EQ(word_a_.use_count(), uses - 1);  // its memory is let go
  EXPECT_FALSE(queues_.HasWord(1));
  EXPECT_EQ(queues_.pending_pages(), 1);
  word_a_->store(5);
  EXPECT_THAT(queues_.TakeReleased(t0_), IsEmpty());
  EXPECT_EQ(queues_.Forget(1), 0);
}

// Random adds, word moves (forwards and backwards), retains and forgets
// against a model: a page is released exactly when the maximum its
// session's word has shown reaches its value, and never twice.
// A Resume replaces the session's fast channel: its pending pages come out
// whole, in arrival order, fence or not, and it may attach a new word.
TEST_F(ReleaseQueuesTest, DetachTakesEveryPendingPageAndTheWord) {
  ASSERT_OK(queues_.Add(1, 9, {3, 4}, t0_));
  ASSERT_OK(queues_.Add(1, 2, {7}, t0_ + absl::Milliseconds(1)));
  ASSERT_OK(queues_.Add(2, 1, {8}, t0_));
  std::vector<ReleaseQueues::Released> released =
      queues_.Detach(1, t0_ + absl::Milliseconds(5));
  ASSERT_THAT(released, SizeIs(2));
  EXPECT_THAT(released[0].pages, ElementsAre(3, 4));
  EXPECT_EQ(released[0].waited, absl::Milliseconds(5));
  EXPECT_THAT(released[1].pages, ElementsAre(7));
  EXPECT_FALSE(queues_.HasWord(1));
  EXPECT_EQ(queues_.pending_pages(1), 0);
  EXPECT_EQ(queues_.pending_pages(), 1);  // the other session's stays
  EXPECT_THAT(queues_.Add(1, 1, {5}, t0_),
              StatusIs(absl::StatusCode::kFailedPrecondition, _));
  auto fresh = std::make_shared<std::atomic<uint64_t>>(0);
  EXPECT_OK(queues_.Attach(1, fresh));
  EXPECT_THAT(queues_.Detach(3, t0_), IsEmpty());  // never attached
}

TEST_F(ReleaseQueuesTest, RandomTracesMatchAModel) {
  std::mt19937_64 rng(25);
  struct Model {
    uint64_t max_word = 0;
    absl::flat_hash_map<int64_t, uint64_t> pending;  // page -> value
  };
  absl::flat_hash_map<uint64_t, Model> model;
  model[1];
  model[2];
  std::shared_ptr<std::atomic<uint64_t>> words[3] = {nullptr, word_a_, word_b_};
  for (int step = 0; step < 5000; ++step) {
    const uint64_t owner = 1 + rng() % 2;
    Model& m = model[owner];
    switch (rng() % 4) {
      case 0: {  // a fenced free of 1..3 pages (page ids per owner apart)
        std::vector<int64_t> pages;
        for (int i = 0, n = 1 + rng() % 3; i < n; ++i) {
          const int64_t page = owner * 1000 + rng() % 50;
          if (!m.pending.contains(page) &&
              std::find(pages.begin(), pages.end(), page) == pages.end()) {
            pages.push_back(page);
          }
        }
        const uint64_t value = 1 + rng() % 40;
        ASSERT_OK(queues_.Add(owner, value, pages, t0_));
        for (int64_t page : pages) m.pending[page] = value;
        break;
      }
      case 1: {  // the word moves, sometimes backwards
        const uint64_t word = rng() % 45;
        words[owner]->store(word);
        m.max_word = std::max(m.max_word, word);
        break;
      }
      case 2: {
        for (ReleaseQueues::Released& r : queues_.TakeReleased(t0_)) {
          Model& owner_model = model[r.owner];
          for (int64_t page : r.pages) {
            auto it = owner_model.pending.find(page);
            ASSERT_NE(it, owner_model.pending.end()) << page;
            ASSERT_LE(it->second, owner_model.max_word);
            owner_model.pending.erase(it);
          }
        }
        // Whatever stays pending has not reached its value.
        for (auto& [id, om] : model) {
          for (auto& [page, value] : om.pending) {
            ASSERT_GT(value, om.max_word) << id << " " << page;
          }
        }
        break;
      }
      case 3: {  // a rollback gave back one page in ten
        const int64_t dropped =
            queues_.Retain(owner, [](int64_t page) { return page % 10 != 0; });
        int64_t expected = 0;
        for (auto it = m.pending.begin(); it != m.pending.end();) {
          if (it->first % 10 == 0) {
            ++expected;
            m.pending.erase(it++);
          } else {
            ++it;
          }
        }
        ASSERT_EQ(dropped, expected);
        break;
      }
    }
    int64_t total = 0;
    for (auto& [id, om] : model) {
      ASSERT_EQ(queues_.pending_pages(id),
                static_cast<int64_t>(om.pending.size()));
      total += om.pending.size();
    }
    ASSERT_EQ(queues_.pending_pages(), total);
  }
}

}  // namespace
}  // namespace pagealloc
