// FreeWholePages (client/page_free.h) on the CPU backend, against a real
// daemon: whole pages go back on the reserve's top, the first named taken
// next; slots that are not whole pages, pages the reserve did not hand out
// (or let go of: PageReserve::Disown) and a page named twice are refused
// with nothing put; device slots need a
// library built with CUDA (tests/gpu and the Python GPU tests cover them),
// as does QueueCopyToHost, which refuses a NULL buffer first.

#include "client/page_free.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "client/client.h"
#include "client/local_expansion.h"
#include "client/page_reserve.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/in_process_server.h"
#include "tests/local_expansion_reference.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::ConnectSession;
using ::pagealloc::testing::InProcessServer;
using ::pagealloc::testing::ManualReserve;
using ::pagealloc::testing::StartExpansionDaemon;
using ::pagealloc::testing::StatusIs;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int64_t kPages = 64;
constexpr int64_t kPageSize = 4;

class PageFreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = StartExpansionDaemon(kPages, kPageSize);
    ASSERT_NE(daemon_, nullptr);
    client_ = ConnectSession(*daemon_, /*quota_pages=*/32);
    ASSERT_NE(client_, nullptr);
    ASSERT_OK_AND_ASSIGN(
        reserve_, PageReserve::Create(client_.get(), ManualReserve(4, 16)));
    ASSERT_OK(reserve_->Take(3, &taken_));
    ASSERT_OK(reserve_->Maintain());  // pages in the reserve too
    ASSERT_FALSE(reserve_->pages().empty());
  }

  // The slots of `pages`, page after page.
  static std::vector<int64_t> SlotsOf(const std::vector<int64_t>& pages) {
    std::vector<int64_t> slots;
    for (const int64_t page : pages) {
      for (int64_t i = 0; i < kPageSize; ++i) {
        slots.push_back(page * kPageSize + i);
      }
    }
    return slots;
  }

  absl::StatusOr<int64_t> Free(const std::vector<int64_t>& slots) {
    pages_.assign(slots.size() / kPageSize + 1, -1);
    return FreeWholePages(*reserve_, FreeSource{}, slots.data(),
                          static_cast<int64_t>(slots.size()), nullptr,
                          absl::MakeSpan(pages_));
  }

  // What a refusal must leave as it was.
  struct Snapshot {
    std::vector<int64_t> pages;
    int64_t handed_out = 0;
    bool operator==(const Snapshot& o) const {
      return pages == o.pages && handed_out == o.handed_out;
    }
  };
  Snapshot Now() const {
    return {reserve_->pages(), reserve_->stats().handed_out};
  }

  std::unique_ptr<InProcessServer> daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<PageReserve> reserve_;
  std::vector<int64_t> taken_;
  std::vector<int64_t> pages_;
};

TEST_F(PageFreeTest, WholePagesGoOnTopFirstNamedFirstTaken) {
  const std::vector<int64_t> named = {taken_[2], taken_[0]};
  ASSERT_OK_AND_ASSIGN(const int64_t freed, Free(SlotsOf(named)));
  EXPECT_EQ(freed, 2);
  EXPECT_THAT(std::vector<int64_t>(pages_.begin(), pages_.begin() + 2),
              ElementsAreArray(named));
  EXPECT_EQ(reserve_->stats().handed_out, 1);
  std::vector<int64_t> again;
  ASSERT_OK(reserve_->Take(2, &again));
  EXPECT_THAT(again, ElementsAreArray(named));
  // An empty free frees nothing.
  ASSERT_OK_AND_ASSIGN(const int64_t none, Free({}));
  EXPECT_EQ(none, 0);
}

TEST_F(PageFreeTest, SlotsThatAreNotWholePagesAreRefused) {
  const Snapshot before = Now();
  std::vector<int64_t> partial = SlotsOf({taken_[0]});
  partial.pop_back();
  EXPECT_THAT(Free(partial).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not whole pages")));
  std::vector<int64_t> shuffled = SlotsOf({taken_[0], taken_[1]});
  std::swap(shuffled[1], shuffled[2]);
  EXPECT_THAT(
      Free(shuffled).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slots[0:4]")));
  // A page's slots starting inside it: not a whole page either.
  std::vector<int64_t> shifted = SlotsOf({taken_[1]});
  for (int64_t& slot : shifted) ++slot;
  EXPECT_THAT(Free(shifted).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not one whole page")));
  std::vector<int64_t> negative = SlotsOf({taken_[1]});
  for (int64_t& slot : negative) slot -= 10 * kPages * kPageSize;
  EXPECT_THAT(Free(negative).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_TRUE(Now() == before);
}

TEST_F(PageFreeTest, PagesNotHandedOutOrNamedTwiceAreRefused) {
  const Snapshot before = Now();
  // A page of the reserve itself, one past the pool, and one named twice.
  const std::vector<int64_t> in_reserve = reserve_->pages();
  EXPECT_THAT(Free(SlotsOf({taken_[0], in_reserve[0]})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not handed out")));
  EXPECT_THAT(Free(SlotsOf({kPages + 1})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not handed out")));
  // The last whole page below INT64_MAX.
  const int64_t top = std::numeric_limits<int64_t>::max() / kPageSize;
  EXPECT_THAT(Free(SlotsOf({top})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not handed out")));
  EXPECT_THAT(
      Free(SlotsOf({taken_[1], taken_[1]})).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("named twice")));
  EXPECT_TRUE(Now() == before);
  // The pages themselves are still the caller's to free.
  ASSERT_OK_AND_ASSIGN(const int64_t freed, Free(SlotsOf(taken_)));
  EXPECT_EQ(freed, 3);
}

TEST_F(PageFreeTest, DisownedPagesAreRefused) {
  // taken_[0] is published, say: the reserve lets go of it.
  EXPECT_EQ(reserve_->Disown({taken_[0], taken_[0], kPages + 7}), 1);
  EXPECT_EQ(reserve_->stats().handed_out, 2);
  EXPECT_EQ(reserve_->Disown({taken_[0]}), 0);
  EXPECT_THAT(Free(SlotsOf({taken_[1], taken_[0]})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not handed out")));
  EXPECT_EQ(reserve_->stats().handed_out, 2);
  ASSERT_OK_AND_ASSIGN(const int64_t freed, Free(SlotsOf({taken_[1]})));
  EXPECT_EQ(freed, 1);
}

TEST_F(PageFreeTest, ShortPagesBufferIsRefused) {
  const std::vector<int64_t> slots = SlotsOf(taken_);
  std::vector<int64_t> pages(2);
  EXPECT_THAT(FreeWholePages(*reserve_, FreeSource{}, slots.data(),
                             static_cast<int64_t>(slots.size()), nullptr,
                             absl::MakeSpan(pages))
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pages holds 2 ids")));
  EXPECT_EQ(reserve_->stats().handed_out, 3);
}

#if !defined(PAGEALLOC_HAVE_CUDA)
TEST_F(PageFreeTest, DeviceSlotsNeedCuda) {
  const std::vector<int64_t> slots = SlotsOf({taken_[0]});
  std::vector<int64_t> staging(slots.size());
  std::vector<int64_t> pages(1);
  EXPECT_THAT(
      FreeWholePages(*reserve_, FreeSource{ExpansionMemory::kDevice},
                     slots.data(), static_cast<int64_t>(slots.size()),
                     staging.data(), absl::MakeSpan(pages))
          .status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("CUDA")));
  EXPECT_EQ(reserve_->stats().handed_out, 3);
}

TEST(QueueCopyToHostTest, NeedsCuda) {
  int64_t slot = 7;
  int64_t host = 0;
  EXPECT_THAT(
      QueueCopyToHost(&slot, sizeof(slot), &host, nullptr),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("CUDA")));
  EXPECT_EQ(host, 0);
}
#endif

TEST(QueueCopyToHostTest, RefusesANullBuffer) {
  int64_t slot = 7;
  EXPECT_THAT(QueueCopyToHost(&slot, sizeof(slot), nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NULL")));
  EXPECT_THAT(QueueCopyToHost(nullptr, sizeof(slot), &slot, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NULL")));
}

}  // namespace
}  // namespace pagealloc
