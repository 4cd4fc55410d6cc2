// The local expansion (client/local_expansion.h) on the CPU backend, against
// real daemons: its slots equal the thin path's on the same free list over
// random extend and decode batches at page sizes 1, 16 and 64; a call the
// reserve cannot supply takes nothing; hostile requests are refused with
// the request and its values, and leave the reserve as it was.

#include "client/local_expansion.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/page_reserve.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/in_process_server.h"
#include "tests/local_expansion_reference.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::ConnectSession;
using ::pagealloc::testing::ExpansionBatch;
using ::pagealloc::testing::ExpansionPair;
using ::pagealloc::testing::InProcessServer;
using ::pagealloc::testing::MakeExpansionBatch;
using ::pagealloc::testing::ManualReserve;
using ::pagealloc::testing::PutBackBatch;
using ::pagealloc::testing::StartExpansionDaemon;
using ::pagealloc::testing::StartExpansionPair;
using ::pagealloc::testing::StatusIs;
using ::pagealloc::testing::ThinSlotsOnFreeList;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kPages = 256;
constexpr int64_t kPoison = -0x5a5a5a5a5a5a5a5b;

class LocalExpansionTest : public ::testing::TestWithParam<int64_t> {};

// The identity: with the same requests, the in-process path's slots are the
// thin path's on a pool whose free list starts with the pages the reserve
// hands out, in that order. Daemon L serves a session through its reserve;
// daemon T's session is given the same prefix pages and its free list is
// made to start with L's reserve order; then one batch goes to each.
TEST_P(LocalExpansionTest, SlotsEqualTheThinPathsOnTheSameFreeList) {
  const int64_t page_size = GetParam();
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(absl::StrFormat("page_size %d seed %d", page_size, seed));
  ExpansionPair pair;
  ASSERT_OK(StartExpansionPair(kPages, page_size, &pair));
  PageReserve* const reserve = pair.reserve.get();
  Client& thin = *pair.thin;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalExpander> expander,
                       LocalExpander::Create(*pair.local, reserve));
  std::vector<int64_t> fresh(kPages);
  std::iota(fresh.begin(), fresh.end(), 1);
  ASSERT_EQ(reserve->pages(), fresh);

  for (int trial = 0; trial < 24; ++trial) {
    const bool decode = trial % 2 == 1;
    SCOPED_TRACE(
        absl::StrFormat("trial %d (%s)", trial, decode ? "decode" : "extend"));
    // The batch's prefixes lie in pages the reserve handed out.
    const int64_t requests = 1 + static_cast<int64_t>(rng() % 24);
    std::vector<int64_t> prefix_pages;
    ASSERT_OK(reserve->Take(requests, &prefix_pages));
    const ExpansionBatch batch =
        MakeExpansionBatch(decode, page_size, kPages * page_size, prefix_pages,
                           /*max_new_pages=*/96, rng);
    const std::vector<int64_t> order = reserve->pages();
    ASSERT_OK_AND_ASSIGN(
        const std::vector<int64_t> thin_slots,
        ThinSlotsOnFreeList(thin, kPages, prefix_pages, order, batch));

    // The in-process path.
    std::vector<int64_t> local_slots(batch.slots + 1, kPoison);
    absl::StatusOr<int64_t> written =
        decode ? expander->AllocDecode(batch.seq_lens, batch.last_locs.data(),
                                       local_slots.data(), nullptr)
               : expander->AllocExtend(batch.prefix_lens, batch.seq_lens,
                                       batch.last_locs.data(),
                                       local_slots.data(), nullptr);
    ASSERT_OK(written.status());
    EXPECT_EQ(*written, batch.slots);
    EXPECT_EQ(local_slots.back(), kPoison);  // nothing past the batch
    local_slots.pop_back();
    EXPECT_EQ(local_slots, thin_slots);
    if (HasFailure()) return;

    // The batch's pages back into the reserve, for the next trial.
    ASSERT_OK(PutBackBatch(*reserve, order, prefix_pages));
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizes, LocalExpansionTest,
                         ::testing::Values(1, 16, 64),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return absl::StrFormat("PageSize%d", info.param);
                         });

class LocalExpansionRefusalTest : public ::testing::Test {
 protected:
  static constexpr int64_t kPageSize = 16;

  void SetUp() override {
    daemon_ = StartExpansionDaemon(kPages, kPageSize);
    ASSERT_NE(daemon_, nullptr);
    client_ = ConnectSession(*daemon_, /*quota_pages=*/32);
    ASSERT_NE(client_, nullptr);
    ASSERT_OK_AND_ASSIGN(
        reserve_, PageReserve::Create(client_.get(), ManualReserve(4, 8)));
    ASSERT_OK_AND_ASSIGN(expander_,
                         LocalExpander::Create(*client_, reserve_.get()));
    // Two pages of the session hold prefixes.
    ASSERT_OK(reserve_->Take(2, &prefix_pages_));
  }

  // The reserve's pages, what it handed out, and the out buffer, to check
  // that a refusal changed none of them.
  struct Snapshot {
    std::vector<int64_t> pages;
    int64_t handed_out = 0;
    std::vector<int64_t> out;
    bool operator==(const Snapshot& o) const {
      return pages == o.pages && handed_out == o.handed_out && out == o.out;
    }
  };
  Snapshot Take() const {
    return {reserve_->pages(), reserve_->stats().handed_out, out_};
  }

  std::unique_ptr<InProcessServer> daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<PageReserve> reserve_;
  std::unique_ptr<LocalExpander> expander_;
  std::vector<int64_t> prefix_pages_;
  std::vector<int64_t> out_ = std::vector<int64_t>(4096, kPoison);
};

TEST_F(LocalExpansionRefusalTest, ExhaustionTakesNothing) {
  ASSERT_OK(reserve_->Maintain());
  const Snapshot before = Take();
  // 40 pages of 16 tokens are past the session's quota of 32.
  const std::vector<int64_t> prefix = {0, 0};
  const std::vector<int64_t> seq = {20 * kPageSize, 20 * kPageSize};
  const std::vector<int64_t> last = {-1, -1};
  EXPECT_THAT(
      expander_->AllocExtend(prefix, seq, last.data(), out_.data(), nullptr)
          .status(),
      StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
  EXPECT_TRUE(Take() == before);
  EXPECT_EQ(expander_->stats().refused, 1);
  EXPECT_EQ(expander_->stats().pages_taken, 0);
  // A batch that fits afterwards is served.
  const std::vector<int64_t> small = {kPageSize, 3};
  ASSERT_OK_AND_ASSIGN(
      const int64_t slots,
      expander_->AllocExtend(prefix, small, last.data(), out_.data(), nullptr));
  EXPECT_EQ(slots, kPageSize + 3);
}

TEST_F(LocalExpansionRefusalTest, HostileRequestsAreRefusedWithTheirValues) {
  const int64_t p = prefix_pages_[0];
  const int64_t never = [&] {
    // A page of the pool the session was never given.
    for (int64_t page = 1; page <= kPages; ++page) {
      if (daemon_->pool().OwnerOf(page) != client_->session_id()) return page;
    }
    return int64_t{0};
  }();
  ASSERT_NE(never, 0);
  struct Row {
    std::string name;
    bool decode;
    std::vector<int64_t> prefix;
    std::vector<int64_t> seq;
    std::vector<int64_t> last;
    absl::StatusCode code;
    std::vector<std::string> message;
  };
  const std::vector<Row> rows = {
      {"negative prefix",
       false,
       {3, -1},
       {5, 4},
       {p * 16 + 2, -1},
       absl::StatusCode::kInvalidArgument,
       {"[1]", "-1"}},
      {"prefix beyond seq",
       false,
       {0, 40},
       {4, 12},
       {-1, p * 16 + 7},
       absl::StatusCode::kInvalidArgument,
       {"seq_lens[1] (12)", "40"}},
      {"decode of nothing",
       true,
       {},
       {5, 0},
       {p * 16 + 3, -1},
       absl::StatusCode::kInvalidArgument,
       {"[1]", "0"}},
      {"last_loc in a page never given",
       false,
       {5},
       {9},
       {never * 16 + 4},
       absl::StatusCode::kInvalidArgument,
       {"request 0", absl::StrFormat("(%d)", never * 16 + 4),
        absl::StrFormat("page %d", never)}},
      {"last_loc of the wrong offset",
       false,
       {5},
       {9},
       {p * 16 + 9},
       absl::StatusCode::kInvalidArgument,
       {"[0]", absl::StrFormat("%d", p * 16 + 9)}},
      {"last_loc missing",
       false,
       {0, 5},
       {3, 9},
       {-1, -1},
       absl::StatusCode::kInvalidArgument,
       {"[1]"}},
      {"last_loc in page 0",
       false,
       {5},
       {9},
       {4},
       absl::StatusCode::kInvalidArgument,
       {"[0]", "(4)"}},
      {"longer than the pool",
       false,
       {0},
       {(kPages + 1) * 16},
       {-1},
       absl::StatusCode::kResourceExhausted,
       {"seq_lens[0]", absl::StrFormat("(%d)", (kPages + 1) * 16),
        "never fit"}},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const Snapshot before = Take();
    const absl::StatusOr<int64_t> got =
        row.decode
            ? expander_->AllocDecode(row.seq, row.last.data(), out_.data(),
                                     nullptr)
            : expander_->AllocExtend(row.prefix, row.seq, row.last.data(),
                                     out_.data(), nullptr);
    EXPECT_THAT(got.status(), StatusIs(row.code, ::testing::_));
    for (const std::string& part : row.message) {
      EXPECT_THAT(got.status().message(), HasSubstr(part));
    }
    EXPECT_TRUE(Take() == before);
  }
  // Mismatched arrays and null buffers.
  const std::vector<int64_t> one = {3};
  const std::vector<int64_t> two = {3, 4};
  const std::vector<int64_t> last = {-1, -1};
  EXPECT_THAT(
      expander_->AllocExtend(one, two, last.data(), out_.data(), nullptr)
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("prefix_lens has 1"), HasSubstr("seq_lens 2"))));
  EXPECT_THAT(
      expander_->AllocDecode(two, nullptr, out_.data(), nullptr).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("last_loc")));
  const std::vector<int64_t> zero = {0, 0};
  EXPECT_THAT(
      expander_->AllocExtend(zero, two, last.data(), nullptr, nullptr).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("7 slots")));
  // A page put back is no longer the caller's to extend.
  ASSERT_OK(reserve_->Put({prefix_pages_[1]}));
  const std::vector<int64_t> put_back = {prefix_pages_[1] * 16 + 4};
  EXPECT_THAT(
      expander_->AllocExtend({5}, {9}, put_back.data(), out_.data(), nullptr)
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr(absl::StrFormat("page %d", prefix_pages_[1]))));
  EXPECT_EQ(expander_->stats().calls, 0);
  // Device expansion is refused where it cannot run: the CPU backend's
  // slots are host memory (and without CUDA there is no device path).
}

TEST(LocalExpanderCreateTest, RefusesOptionsOutOfRange) {
  std::unique_ptr<InProcessServer> daemon = StartExpansionDaemon(kPages, 16);
  ASSERT_NE(daemon, nullptr);
  std::unique_ptr<Client> client = ConnectSession(*daemon);
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PageReserve> reserve,
                       PageReserve::Create(client.get(), ManualReserve(4, 8)));
  LocalExpanderOptions options;
  options.staging_buffers = 1;
  EXPECT_THAT(LocalExpander::Create(*client, reserve.get(), options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("staging_buffers (1)")));
  EXPECT_THAT(LocalExpander::Create(*client, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

}  // namespace
}  // namespace pagealloc
