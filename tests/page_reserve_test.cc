// Session page reserves (client/page_reserve.h) against a real daemon on
// the CPU backend: the reserve's bookkeeping checked page by page against
// the daemon's pool over long random traces with several sessions, a
// session that ends with a full reserve, rebalancing when the pool is
// short (the daemon's reclaim asks), and a client that names pages it was
// never given.

#include "client/page_reserve.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "server/fast_channel_server.h"
#include "server/server.h"
#include "tests/in_process_server.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::CpuTestOptions;
using ::pagealloc::testing::InProcessServer;
using ::pagealloc::testing::StatusIs;

constexpr int64_t kPages = 64;
constexpr int64_t kPageSize = 4;

class PageReserveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(
        server_, InProcessServer::Start(CpuTestOptions(kPages, kPageSize)));
  }

  void TearDown() override { server_.reset(); }

  std::unique_ptr<Client> Connect(int64_t quota_pages = 0) {
    ClientOptions options;
    options.client_name = "reserve";
    options.quota_pages = quota_pages;
    absl::StatusOr<std::unique_ptr<Client>> client = server_->Connect(options);
    EXPECT_OK(client.status());
    if (!client.ok()) return nullptr;
    EXPECT_TRUE((*client)->uses_fast_channel());
    return *std::move(client);
  }

  // Pages of the pool the daemon records as `session`'s.
  int64_t OwnedBy(uint64_t session) {
    int64_t owned = 0;
    for (int64_t p = 1; p <= kPages; ++p) {
      owned += server_->pool().OwnerOf(p) == session;
    }
    return owned;
  }

  std::unique_ptr<InProcessServer> server_;
};

PageReserveOptions Manual(int64_t batch, int64_t max_pages = 0) {
  PageReserveOptions options;
  options.initial_batch = batch;
  options.max_pages = max_pages;
  options.background = false;
  options.starved_wait = absl::ZeroDuration();
  return options;
}

TEST_F(PageReserveTest, RefusesOptionsOutOfRange) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  PageReserveOptions options;
  options.initial_batch = 0;
  EXPECT_THAT(PageReserve::Create(client.get(), options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("initial_batch (0)")));
  options.initial_batch = 4;
  options.tick = absl::ZeroDuration();
  EXPECT_THAT(PageReserve::Create(client.get(), options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("tick (0) > 0")));
}

TEST_F(PageReserveTest, TakesFromTheReserveWithoutARoundTrip) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(auto reserve,
                       PageReserve::Create(client.get(), Manual(4, 16)));
  ASSERT_OK(reserve->Maintain());  // below the low mark: refills to 2 * 4
  EXPECT_EQ(reserve->stats().pages, 8);
  EXPECT_EQ(OwnedBy(client->session_id()), 8);

  std::vector<int64_t> pages;
  ASSERT_OK(reserve->Take(3, &pages));
  ASSERT_EQ(pages.size(), 3u);
  PageReserveStats stats = reserve->stats();
  EXPECT_EQ(stats.sync_refills, 0);
  EXPECT_EQ(stats.refills, 1);
  EXPECT_EQ(stats.pages, 5);
  EXPECT_EQ(stats.handed_out, 3);
  for (const int64_t page : pages) {
    EXPECT_EQ(server_->pool().OwnerOf(page), client->session_id());
  }
  // The session owns the reserve and what it handed out, nothing more.
  EXPECT_EQ(OwnedBy(client->session_id()), 8);

  // Put back, the pages are the reserve's again (and still the session's).
  ASSERT_OK(reserve->Put(pages));
  EXPECT_EQ(reserve->stats().pages, 8);
  EXPECT_EQ(reserve->pages().front(), pages.back());
  EXPECT_EQ(OwnedBy(client->session_id()), 8);

  // Short of what a Take needs: one refill on the caller's thread, and the
  // batch doubles, to half the bound at most (16 / 2): the low mark stays
  // below the high one (16).
  pages.clear();
  ASSERT_OK(reserve->Take(10, &pages));
  stats = reserve->stats();
  EXPECT_EQ(stats.sync_refills, 1);
  EXPECT_EQ(stats.batch, 8);
  EXPECT_EQ(OwnedBy(client->session_id()), 10);

  // The reserve's pages go back to the pool with it; handed-out pages stay.
  reserve.reset();
  EXPECT_EQ(OwnedBy(client->session_id()), 10);
}

// A Take the pool refuses while the reserve's own refill is in flight
// waits for that refill, even with no starved_wait: those pages are the
// session's already, and the pool is not short of them. Here the thread's
// refill (by hand, on another thread) takes the whole pool while a Take
// of the whole pool runs: whichever comes first, the Take gets every page.
TEST_F(PageReserveTest, ATakeWaitsForTheReservesOwnRefillInFlight) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < 50; ++i) {
    ASSERT_OK_AND_ASSIGN(auto reserve,
                         PageReserve::Create(client.get(), Manual(32, kPages)));
    // (Refused when the Take emptied the pool first.)
    std::thread refill([&] {
      const absl::Status refilled = reserve->Maintain();
      EXPECT_TRUE(refilled.ok() || absl::IsResourceExhausted(refilled))
          << refilled;
    });
    std::vector<int64_t> pages;
    EXPECT_OK(reserve->Take(kPages, &pages)) << "iteration " << i;
    refill.join();
    EXPECT_EQ(OwnedBy(client->session_id()), kPages);
    ASSERT_OK(reserve->Put(pages));
    reserve.reset();  // every page back to the pool
    ASSERT_EQ(OwnedBy(client->session_id()), 0);
  }
}

// Peek names the pages the next Takes hand out, in the order they hand
// them out, and takes nothing; a Put's pages are on top (last put first).
TEST_F(PageReserveTest, PeekNamesWhatTheNextTakesHandOutAndTakesNothing) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(auto reserve,
                       PageReserve::Create(client.get(), Manual(4, 16)));
  ASSERT_OK(reserve->Maintain());  // refills to 2 * 4
  const PageReserveStats before = reserve->stats();
  ASSERT_EQ(before.pages, 8);

  std::vector<int64_t> peeked(8, -1);
  ASSERT_EQ(reserve->Peek(absl::MakeSpan(peeked)), 8);
  EXPECT_EQ(peeked, reserve->pages());
  // Room for none: nothing written. Room for more than the reserve holds:
  // the reserve's pages, the rest of `out` as it was.
  EXPECT_EQ(reserve->Peek(absl::Span<int64_t>()), 0);
  std::vector<int64_t> wide(12, -1);
  ASSERT_EQ(reserve->Peek(absl::MakeSpan(wide)), 8);
  EXPECT_EQ(std::vector<int64_t>(wide.begin(), wide.begin() + 8), peeked);
  EXPECT_EQ(std::vector<int64_t>(wide.begin() + 8, wide.end()),
            std::vector<int64_t>(4, -1));

  // Nothing taken, nothing counted.
  const PageReserveStats after = reserve->stats();
  EXPECT_EQ(after.pages, before.pages);
  EXPECT_EQ(after.handed_out, 0);
  EXPECT_EQ(after.takes, before.takes);
  EXPECT_EQ(after.batch, before.batch);
  EXPECT_EQ(after.refills, before.refills);
  EXPECT_EQ(after.returns, before.returns);
  EXPECT_EQ(after.sync_refills, before.sync_refills);
  EXPECT_EQ(OwnedBy(client->session_id()), 8);
  for (const int64_t page : peeked) {
    // Not handed out: a Put of it is refused.
    EXPECT_THAT(reserve->Put({page}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::HasSubstr("not handed out")));
  }

  // Consecutive Takes hand out the peeked pages in order.
  std::vector<int64_t> taken;
  ASSERT_OK(reserve->Take(3, &taken));
  ASSERT_OK(reserve->Take(2, &taken));
  EXPECT_EQ(taken, std::vector<int64_t>(peeked.begin(), peeked.begin() + 5));
  std::vector<int64_t> rest(8, -1);
  ASSERT_EQ(reserve->Peek(absl::MakeSpan(rest)), 3);
  EXPECT_EQ(std::vector<int64_t>(rest.begin(), rest.begin() + 3),
            std::vector<int64_t>(peeked.begin() + 5, peeked.end()));

  // Put back, the put pages come first, the last put first.
  ASSERT_OK(reserve->Put({taken[0], taken[1]}));
  std::vector<int64_t> next(5, -1);
  ASSERT_EQ(reserve->Peek(absl::MakeSpan(next)), 5);
  EXPECT_EQ(next, (std::vector<int64_t>{taken[1], taken[0], peeked[5],
                                        peeked[6], peeked[7]}));
  int64_t out[5] = {-1, -1, -1, -1, -1};
  ASSERT_OK(reserve->Take(5, out));
  EXPECT_EQ(std::vector<int64_t>(out, out + 5), next);
  EXPECT_EQ(reserve->Peek(absl::MakeSpan(next)), 0);
}

// Refills go under the pages the reserve holds: the top a caller peeked
// (and may have mirrored) is what the next Takes hand out, across the
// thread's refill; a short Take hands out the reserve's pages before its
// own refill's.
TEST_F(PageReserveTest, RefillsGoUnderThePagesTheReserveHolds) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(auto reserve,
                       PageReserve::Create(client.get(), Manual(4, 64)));
  ASSERT_OK(reserve->Maintain());  // refills to 2 * 4
  std::vector<int64_t> taken;
  ASSERT_OK(reserve->Take(5, &taken));  // 3 left: below the low mark
  std::vector<int64_t> top(3, -1);
  ASSERT_EQ(reserve->Peek(absl::MakeSpan(top)), 3);

  ASSERT_OK(reserve->Maintain());  // the thread's refill, back to 8
  const std::vector<int64_t> after_refill = reserve->pages();
  ASSERT_EQ(after_refill.size(), 8u);
  EXPECT_EQ(
      std::vector<int64_t>(after_refill.begin(), after_refill.begin() + 3),
      top);
  std::vector<int64_t> next;
  ASSERT_OK(reserve->Take(3, &next));
  EXPECT_EQ(next, top);

  // 5 pages held; a Take of 9 refills 4 on this thread, under them.
  const std::vector<int64_t> held = reserve->pages();
  ASSERT_EQ(held.size(), 5u);
  const int64_t sync_refills = reserve->stats().sync_refills;
  std::vector<int64_t> short_take;
  ASSERT_OK(reserve->Take(9, &short_take));
  EXPECT_EQ(reserve->stats().sync_refills, sync_refills + 1);
  ASSERT_EQ(short_take.size(), 9u);
  EXPECT_EQ(std::vector<int64_t>(short_take.begin(), short_take.begin() + 5),
            held);
  for (size_t i = 5; i < short_take.size(); ++i) {
    EXPECT_EQ(std::count(held.begin(), held.end(), short_take[i]), 0);
    EXPECT_EQ(server_->pool().OwnerOf(short_take[i]), client->session_id());
  }
}

// TakeHeld takes what the reserve holds, up to the room given, as Take
// hands it out: never a refill, so an empty reserve gives nothing though
// the pool has pages.
TEST_F(PageReserveTest, TakeHeldTakesWhatTheReserveHoldsWithoutARefill) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(auto reserve,
                       PageReserve::Create(client.get(), Manual(4, 16)));
  ASSERT_OK(reserve->Maintain());  // refills to 2 * 4
  const std::vector<int64_t> held = reserve->pages();
  ASSERT_EQ(held.size(), 8u);
  const PageReserveStats before = reserve->stats();

  std::vector<int64_t> first(3, -1);
  ASSERT_EQ(reserve->TakeHeld(absl::MakeSpan(first)), 3);
  EXPECT_EQ(first, std::vector<int64_t>(held.begin(), held.begin() + 3));
  // Room for more than it holds: the rest, the room beyond left alone.
  std::vector<int64_t> rest(12, -1);
  ASSERT_EQ(reserve->TakeHeld(absl::MakeSpan(rest)), 5);
  EXPECT_EQ(std::vector<int64_t>(rest.begin(), rest.begin() + 5),
            std::vector<int64_t>(held.begin() + 3, held.end()));
  EXPECT_EQ(std::vector<int64_t>(rest.begin() + 5, rest.end()),
            std::vector<int64_t>(7, -1));
  // Empty now: nothing, and no round trip for more.
  std::vector<int64_t> none(4, -1);
  EXPECT_EQ(reserve->TakeHeld(absl::MakeSpan(none)), 0);
  EXPECT_EQ(none, std::vector<int64_t>(4, -1));
  EXPECT_EQ(reserve->TakeHeld(absl::Span<int64_t>()), 0);

  const PageReserveStats after = reserve->stats();
  EXPECT_EQ(after.pages, 0);
  EXPECT_EQ(after.handed_out, 8);
  EXPECT_EQ(after.takes, before.takes + 2);
  EXPECT_EQ(after.refills, before.refills);
  EXPECT_EQ(after.sync_refills, before.sync_refills);
  EXPECT_EQ(OwnedBy(client->session_id()), 8);
  // Handed out as a Take's pages are: a Put takes them back, once.
  ASSERT_OK(reserve->Put(first));
  EXPECT_THAT(reserve->Put({first[0]}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("not handed out")));
  ASSERT_OK(reserve->Put(absl::MakeConstSpan(rest.data(), 5)));
  EXPECT_EQ(reserve->stats().handed_out, 0);
}

// PutUnder's pages go under what the reserve holds, in the order given:
// every page it held leaves before them, and they are the first a return
// takes. Its refusals are Put's.
TEST_F(PageReserveTest, PutUnderQueuesPagesBehindWhatTheReserveHolds) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(auto reserve,
                       PageReserve::Create(client.get(), Manual(4, 16)));
  ASSERT_OK(reserve->Maintain());  // refills to 2 * 4
  std::vector<int64_t> taken;
  ASSERT_OK(reserve->Take(5, &taken));
  const std::vector<int64_t> held = reserve->pages();
  ASSERT_EQ(held.size(), 3u);

  const std::vector<int64_t> back = {taken[3], taken[0], taken[4]};
  ASSERT_OK(reserve->PutUnder(back));
  std::vector<int64_t> order = held;
  order.insert(order.end(), back.begin(), back.end());
  EXPECT_EQ(reserve->pages(), order);
  EXPECT_EQ(reserve->stats().handed_out, 2);
  // Still the session's, as any reserve page.
  EXPECT_EQ(OwnedBy(client->session_id()), 8);

  // Refused as Put refuses, nothing changed: a page not handed out, one
  // named twice.
  EXPECT_THAT(reserve->PutUnder({taken[1], taken[0]}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("not handed out")));
  EXPECT_THAT(reserve->PutUnder({taken[1], taken[1]}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("named twice")));
  EXPECT_EQ(reserve->pages(), order);
  EXPECT_EQ(reserve->stats().handed_out, 2);

  // A Put on top and a PutUnder: each where it was put.
  ASSERT_OK(reserve->Put({taken[1]}));
  ASSERT_OK(reserve->PutUnder({taken[2]}));
  order.insert(order.begin(), taken[1]);
  order.push_back(taken[2]);
  EXPECT_EQ(reserve->pages(), order);
}

// Pages put under are the bottom, so a return past the high mark takes
// them first and the pages on top stay.
TEST_F(PageReserveTest, AReturnTakesThePagesPutUnderFirst) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  // Low mark 2, aim 4, high mark 8; Takes of what it holds never grow it.
  ASSERT_OK_AND_ASSIGN(auto reserve,
                       PageReserve::Create(client.get(), Manual(2, 16)));
  std::vector<int64_t> handed;
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK(reserve->Maintain());  // refills to 4
    ASSERT_OK(reserve->Take(4, &handed));
  }
  ASSERT_OK(reserve->Maintain());
  const std::vector<int64_t> top = reserve->pages();
  ASSERT_EQ(top.size(), 4u);
  ASSERT_EQ(reserve->stats().batch, 2);

  ASSERT_OK(reserve->PutUnder(handed));  // 12 pages: past the high mark
  ASSERT_OK(reserve->Maintain());        // returns 8, down to the aim
  EXPECT_EQ(reserve->pages(), top);
  EXPECT_EQ(reserve->stats().pages_returned, 8);
  EXPECT_EQ(OwnedBy(client->session_id()), 4);
  for (const int64_t page : handed) {
    EXPECT_EQ(server_->pool().OwnerOf(page), kNoOwner);
  }
}

TEST_F(PageReserveTest, ReturnsAboveTheHighMark) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(auto reserve,
                       PageReserve::Create(client.get(), Manual(2, 32)));
  std::vector<int64_t> first;
  ASSERT_OK(reserve->Take(12, &first));  // short: the batch grows to 12
  EXPECT_EQ(reserve->stats().batch, 12);
  ASSERT_OK(reserve->Maintain());  // below the low mark: refills to 24
  EXPECT_EQ(reserve->stats().pages, 24);
  std::vector<int64_t> second;
  ASSERT_OK(reserve->Take(24, &second));
  ASSERT_OK(reserve->Put(second));
  ASSERT_OK(reserve->Put(first));
  // 36 pages, past max_pages and so above the high mark (min(4 * 12,
  // 32)): the Puts are taken, and Maintain returns down to the aim.
  EXPECT_EQ(reserve->stats().pages, 36);
  ASSERT_OK(reserve->Maintain());
  EXPECT_EQ(reserve->stats().pages, 24);
  EXPECT_EQ(reserve->stats().returns, 1);
  EXPECT_EQ(reserve->stats().pages_returned, 12);
  EXPECT_EQ(OwnedBy(client->session_id()), 24);
}

TEST_F(PageReserveTest, TheQuotaIsNeverPassed) {
  std::unique_ptr<Client> client = Connect(/*quota_pages=*/10);
  ASSERT_NE(client, nullptr);
  ASSERT_EQ(client->quota_pages(), 10);
  ASSERT_OK_AND_ASSIGN(auto reserve,
                       PageReserve::Create(client.get(), Manual(8, 64)));
  ASSERT_OK(reserve->Maintain());
  EXPECT_LE(reserve->stats().pages, 10);
  std::vector<int64_t> pages;
  EXPECT_THAT(reserve->Take(11, &pages),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::HasSubstr("quota (10 pages)")));
  EXPECT_TRUE(pages.empty());
  ASSERT_OK(reserve->Take(10, &pages));
  EXPECT_EQ(OwnedBy(client->session_id()), 10);
  ASSERT_OK(reserve->Maintain());  // no room left: asks for nothing
  EXPECT_EQ(OwnedBy(client->session_id()), 10);
}

// A full pool: the refused refill backs the thread's refills off, and
// while backed off the reserve calls the daemon for nothing; a Take's own
// refill is not delayed and, bringing pages, ends the backoff.
TEST_F(PageReserveTest, ARefusedRefillBacksOffUntilARefillBringsPages) {
  std::unique_ptr<Client> hog = Connect();
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(hog, nullptr);
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(Allocation all, hog->Alloc({kPages * kPageSize}));
  ASSERT_OK(all[0].status);
  PageReserveOptions options = Manual(4, 16);
  options.tick = absl::Hours(1);  // the backoff outlasts the test
  ASSERT_OK_AND_ASSIGN(auto reserve,
                       PageReserve::Create(client.get(), options));

  EXPECT_THAT(reserve->Maintain(),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
  PageReserveStats stats = reserve->stats();
  EXPECT_EQ(stats.refills_refused, 1);
  EXPECT_EQ(stats.refills_backed_off, 0);
  // The refused round: 8 pages, then 4, 2 and 1.
  const int64_t refused = server_->pool().Stats().out_of_pages_refusals;
  EXPECT_EQ(refused, 4);

  // Backed off: no call, even once the pool has pages again.
  ASSERT_OK(reserve->Maintain());
  ASSERT_OK(hog->FreePages({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}).status());
  ASSERT_OK(reserve->Maintain());
  stats = reserve->stats();
  EXPECT_EQ(stats.refills_refused, 1);
  EXPECT_EQ(stats.refills_backed_off, 2);
  EXPECT_EQ(stats.refills, 0);
  EXPECT_EQ(server_->pool().Stats().out_of_pages_refusals, refused);
  EXPECT_EQ(OwnedBy(client->session_id()), 0);

  // A Take refills on the caller's thread at once, and the pages it brings
  // end the backoff: the next Maintain refills to the aim.
  std::vector<int64_t> pages;
  ASSERT_OK(reserve->Take(2, &pages));
  EXPECT_EQ(reserve->stats().sync_refills, 1);
  ASSERT_OK(reserve->Maintain());
  stats = reserve->stats();
  EXPECT_EQ(stats.refills, 2);
  EXPECT_EQ(stats.refills_backed_off, 2);
  EXPECT_EQ(stats.refills_refused, 1);
  // The pool's last 8 pages (the short Take doubled the batch: the aim is
  // 16, and the refill of 16 came back at half).
  EXPECT_EQ(stats.pages, 8);
  EXPECT_EQ(OwnedBy(client->session_id()), 10);
  ASSERT_OK(server_->pool().CheckInvariants());
}

// The thread on a full pool for 300 ms at a 1 ms tick: the backoff
// doubles to 64 ticks, so it tries a handful of times, not 300 (a slower
// machine only tries less often).
TEST_F(PageReserveTest, TheThreadOnAFullPoolTriesRarely) {
  std::unique_ptr<Client> hog = Connect();
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(hog, nullptr);
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(Allocation all, hog->Alloc({kPages * kPageSize}));
  ASSERT_OK(all[0].status);
  PageReserveOptions options;
  options.initial_batch = 4;
  options.tick = absl::Milliseconds(1);
  const absl::Time start = absl::Now();  // before the thread's first try
  ASSERT_OK_AND_ASSIGN(auto reserve,
                       PageReserve::Create(client.get(), options));
  ASSERT_TRUE(::pagealloc::testing::WaitFor(
      [&] { return reserve->stats().refills_refused >= 1; },
      absl::Seconds(30)));
  absl::SleepFor(absl::Milliseconds(300));
  const PageReserveStats stats = reserve->stats();
  const int64_t elapsed_ms = absl::ToInt64Milliseconds(absl::Now() - start);
  // Tries at most at 0, 1, 3, 7, 15, 31 and 63 ms after the first, then
  // every 64 ms: a bound that holds however slowly this host runs.
  const int64_t most = 7 + (elapsed_ms - 63) / 64 + 1;
  EXPECT_LE(stats.refills_refused, most) << elapsed_ms << " ms";
  EXPECT_EQ(stats.refills, 0);
  // Each try is one round of at most 4 refused calls (8, 4, 2, 1 pages).
  EXPECT_LE(server_->pool().Stats().out_of_pages_refusals,
            4 * stats.refills_refused);
  reserve.reset();
  ASSERT_OK(server_->pool().CheckInvariants());
}

TEST_F(PageReserveTest, ASessionEndedWithAFullReserveGivesItAllBack) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(
      auto reserve, PageReserve::Create(client.get(), Manual(kPages, kPages)));
  ASSERT_OK(reserve->Maintain());
  ASSERT_EQ(reserve->stats().pages, kPages);
  EXPECT_EQ(server_->pool().Stats().free_pages, 0);
  // The session ends with its reserve full (as when its process dies: the
  // daemon reclaims the session's pages, the reserve's among them).
  ASSERT_OK(client->Close());
  EXPECT_EQ(server_->pool().Stats().free_pages, kPages);
  EXPECT_EQ(OwnedBy(client->session_id()), 0);
  reserve.reset();  // nothing left to return
  EXPECT_EQ(server_->pool().Stats().free_pages, kPages);
  ASSERT_OK(server_->pool().CheckInvariants());
}

TEST_F(PageReserveTest, AClientThatNamesPagesItWasNeverGivenIsRefused) {
  std::unique_ptr<Client> owner = Connect();
  std::unique_ptr<Client> liar = Connect();
  ASSERT_NE(owner, nullptr);
  ASSERT_NE(liar, nullptr);
  ASSERT_OK_AND_ASSIGN(auto reserve,
                       PageReserve::Create(owner.get(), Manual(8, 16)));
  ASSERT_OK(reserve->Maintain());
  const std::vector<int64_t> theirs = reserve->pages();
  ASSERT_EQ(theirs.size(), 16u);

  // Returning another session's reserve pages as its own: refused by the
  // daemon, and nothing changes.
  const PoolStats before = server_->pool().Stats();
  EXPECT_THAT(liar->FreePages(theirs),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       ::testing::HasSubstr(absl::StrFormat(
                           "page %d belongs to another session", theirs[0]))));
  EXPECT_EQ(server_->pool().Stats().free_pages, before.free_pages);
  for (const int64_t page : theirs) {
    EXPECT_EQ(server_->pool().OwnerOf(page), owner->session_id());
  }
  // Pages that are free in the pool: refused too.
  std::vector<int64_t> free_pages;
  for (int64_t p = 1; p <= kPages && free_pages.size() < 2; ++p) {
    if (server_->pool().OwnerOf(p) == kNoOwner) free_pages.push_back(p);
  }
  EXPECT_THAT(liar->FreePages(free_pages),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::HasSubstr(
                           absl::StrFormat("pages[0] (%d)", free_pages[0]))));
  EXPECT_EQ(server_->pool().Stats().free_pages, before.free_pages);

  // Its own reserve refuses what it never handed out, and changes nothing.
  ASSERT_OK_AND_ASSIGN(auto liars_reserve,
                       PageReserve::Create(liar.get(), Manual(2, 4)));
  ASSERT_OK(liars_reserve->Maintain());
  std::vector<int64_t> taken;
  ASSERT_OK(liars_reserve->Take(1, &taken));
  EXPECT_THAT(liars_reserve->Put({taken[0], theirs[0]}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("pages[1]")));
  EXPECT_THAT(liars_reserve->Put({taken[0], taken[0]}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("named twice")));
  EXPECT_EQ(liars_reserve->stats().handed_out, 1);
  EXPECT_EQ(liars_reserve->stats().pages, 3);
  ASSERT_OK(server_->pool().CheckInvariants());
}

// Several sessions with reserves, stepped by hand, against a model: after
// every operation each page is free in the pool, in exactly one live
// session's reserve, or handed out by exactly one live session's reserve,
// and the daemon's owner of it says the same.
TEST_F(PageReserveTest, BookkeepingMatchesTheModelOverRandomTraces) {
  constexpr int kSessions = 3;
  constexpr int kSteps = 3000;
  std::mt19937_64 rng(20261201);
  struct Live {
    std::unique_ptr<Client> client;
    std::unique_ptr<PageReserve> reserve;
    std::vector<int64_t> handed;  // pages the "caller" holds
  };
  std::vector<Live> sessions(kSessions);
  auto start = [&](Live& live) {
    live.client = Connect();
    ASSERT_NE(live.client, nullptr);
    PageReserveOptions options = Manual(1 + rng() % 6, 8 + rng() % 24);
    options.idle_ticks = 1 + rng() % 4;
    ASSERT_OK_AND_ASSIGN(live.reserve,
                         PageReserve::Create(live.client.get(), options));
    live.handed.clear();
  };
  for (Live& live : sessions) start(live);

  auto check = [&](int step) {
    std::map<int64_t, uint64_t> expected;  // page -> session
    for (const Live& live : sessions) {
      const uint64_t id = live.client->session_id();
      for (const int64_t page : live.reserve->pages()) {
        ASSERT_TRUE(expected.emplace(page, id).second)
            << "step " << step << ": page " << page << " twice";
      }
      for (const int64_t page : live.handed) {
        ASSERT_TRUE(expected.emplace(page, id).second)
            << "step " << step << ": page " << page << " twice";
      }
      const PageReserveStats stats = live.reserve->stats();
      ASSERT_EQ(stats.handed_out, static_cast<int64_t>(live.handed.size()));
    }
    for (int64_t p = 1; p <= kPages; ++p) {
      auto it = expected.find(p);
      const uint64_t want = it == expected.end() ? kNoOwner : it->second;
      ASSERT_EQ(server_->pool().OwnerOf(p), want)
          << "step " << step << ": page " << p;
    }
  };

  for (int step = 0; step < kSteps; ++step) {
    Live& live = sessions[rng() % kSessions];
    switch (rng() % 8) {
      case 0:
      case 1:
      case 2: {  // a step takes pages
        std::vector<int64_t> pages;
        const int64_t n = rng() % 6;
        const absl::Status taken = live.reserve->Take(n, &pages);
        if (taken.ok()) {
          ASSERT_EQ(pages.size(), static_cast<size_t>(n));
          live.handed.insert(live.handed.end(), pages.begin(), pages.end());
        } else {
          ASSERT_EQ(taken.code(), absl::StatusCode::kResourceExhausted)
              << taken;
          ASSERT_TRUE(pages.empty());
        }
        break;
      }
      case 3:
      case 4: {  // requests finish: some pages go back
        std::shuffle(live.handed.begin(), live.handed.end(), rng);
        const size_t n = rng() % (live.handed.size() + 1);
        std::vector<int64_t> back(live.handed.end() - n, live.handed.end());
        if (rng() % 2 == 0) {
          ASSERT_OK(live.reserve->Put(back));
        } else {
          ASSERT_OK(live.reserve->PutUnder(back));
        }
        live.handed.resize(live.handed.size() - n);
        break;
      }
      case 5:
      case 6: {  // the reserve's thread runs
        const absl::Status kept = live.reserve->Maintain();
        ASSERT_TRUE(kept.ok() ||
                    kept.code() == absl::StatusCode::kResourceExhausted)
            << kept;
        break;
      }
      case 7:
        if (rng() % 16 == 0) {  // the session ends, reserve and all
          const uint64_t ended = live.client->session_id();
          ASSERT_OK(live.client->Close());
          EXPECT_EQ(OwnedBy(ended), 0);
          live.reserve.reset();
          live.client.reset();
          start(live);
        } else {  // the thread again (after another's refusal, an ask)
          const absl::Status kept = live.reserve->Maintain();
          ASSERT_TRUE(kept.ok() ||
                      kept.code() == absl::StatusCode::kResourceExhausted)
              << kept;
        }
        break;
    }
    check(step);
    if (::testing::Test::HasFatalFailure()) return;
  }
  ASSERT_OK(server_->pool().CheckInvariants());
  // The trace ran the pool short, so the daemon's asks were answered (by
  // the sessions alive at the end, at least).
  int64_t reclaims = 0;
  for (const Live& live : sessions) reclaims += live.reserve->stats().reclaims;
  EXPECT_GT(reclaims, 0);
  EXPECT_GT(server_->server().fast_channels()->reclaim_asks(), 0);
}

// The same with every reserve's thread running and each session's steps on
// a thread of their own, the pool small enough that the sessions take
// pages from each other: once the reserves are gone (their pages
// returned), each session owns exactly the pages its steps hold.
TEST_F(PageReserveTest, ConcurrentSessionsNeverLoseOrShareAPage) {
  constexpr int kSessions = 3;
  constexpr int kSteps = 400;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<PageReserve>> reserves;
  for (int s = 0; s < kSessions; ++s) {
    clients.push_back(Connect());
    ASSERT_NE(clients.back(), nullptr);
    PageReserveOptions options;
    options.initial_batch = 2;
    options.max_pages = 16;
    options.idle_ticks = 3;
    options.starved_wait = absl::Milliseconds(2);
    ASSERT_OK_AND_ASSIGN(auto reserve,
                         PageReserve::Create(clients.back().get(), options));
    reserves.push_back(std::move(reserve));
  }
  std::vector<std::vector<int64_t>> held(kSessions);
  std::vector<std::thread> steps;
  for (int s = 0; s < kSessions; ++s) {
    steps.emplace_back([&, s] {
      std::mt19937_64 rng(7 + s);
      for (int step = 0; step < kSteps; ++step) {
        if (rng() % 2 == 0) {
          std::vector<int64_t> pages;
          const absl::Status taken = reserves[s]->Take(1 + rng() % 4, &pages);
          if (taken.ok()) {
            held[s].insert(held[s].end(), pages.begin(), pages.end());
          } else {
            EXPECT_EQ(taken.code(), absl::StatusCode::kResourceExhausted)
                << taken;
          }
        } else if (!held[s].empty()) {
          const size_t n = 1 + rng() % held[s].size();
          std::vector<int64_t> back(held[s].end() - n, held[s].end());
          EXPECT_OK(reserves[s]->Put(back));
          held[s].resize(held[s].size() - n);
        }
        // Never more than 20 held, so the pool always has room to share.
        while (held[s].size() > 20) {
          EXPECT_OK(reserves[s]->Put({held[s].back()}));
          held[s].pop_back();
        }
      }
    });
  }
  for (std::thread& thread : steps) thread.join();
  reserves.clear();  // each returns its reserve
  for (int s = 0; s < kSessions; ++s) {
    EXPECT_EQ(OwnedBy(clients[s]->session_id()),
              static_cast<int64_t>(held[s].size()));
    for (const int64_t page : held[s]) {
      EXPECT_EQ(server_->pool().OwnerOf(page), clients[s]->session_id());
    }
  }
  ASSERT_OK(server_->pool().CheckInvariants());
}

// With the reserves' threads running: one session's reserve holds the
// whole pool, another needs pages; the daemon asks the first for its
// reserve and the second gets them.
TEST_F(PageReserveTest, PagesFollowDemandAcrossSessions) {
  std::unique_ptr<Client> rich = Connect();
  std::unique_ptr<Client> poor = Connect();
  ASSERT_NE(rich, nullptr);
  ASSERT_NE(poor, nullptr);
  PageReserveOptions options;
  options.initial_batch = kPages / 2;
  options.max_pages = kPages;
  options.idle_ticks = 1 << 30;  // it would keep its reserve but for asks
  options.tick = absl::Milliseconds(5);
  ASSERT_OK_AND_ASSIGN(auto rich_reserve,
                       PageReserve::Create(rich.get(), options));
  ASSERT_TRUE(::pagealloc::testing::WaitFor(
      [&] { return rich_reserve->stats().pages == kPages; },
      absl::Seconds(30)));
  EXPECT_EQ(server_->pool().Stats().free_pages, 0);

  PageReserveOptions poor_options;
  poor_options.initial_batch = 4;
  poor_options.max_pages = kPages;
  // A bound on a wait that normally ends within a tick of the rich
  // reserve's thread, never a measured time.
  poor_options.starved_wait = absl::Seconds(30);
  ASSERT_OK_AND_ASSIGN(auto poor_reserve,
                       PageReserve::Create(poor.get(), poor_options));
  std::vector<int64_t> pages;
  ASSERT_OK(poor_reserve->Take(8, &pages));
  EXPECT_EQ(pages.size(), 8u);
  for (const int64_t page : pages) {
    EXPECT_EQ(server_->pool().OwnerOf(page), poor->session_id());
  }
  // The rich thread counts its answer once its return call is answered,
  // which may be after the poor session's retry got the pages.
  EXPECT_TRUE(::pagealloc::testing::WaitFor(
      [&] { return rich_reserve->stats().reclaims >= 1; }, absl::Seconds(30)));
  EXPECT_GE(server_->server().fast_channels()->reclaim_asks(), 1);
  EXPECT_GE(server_->server().fast_channels()->reclaim_returns(), 1);

  // The rich session keeps working from what it has left.
  std::vector<int64_t> rich_pages;
  ASSERT_OK(rich_reserve->Take(4, &rich_pages));
  ASSERT_OK(server_->pool().CheckInvariants());
}

}  // namespace
}  // namespace pagealloc
