// The release fence (docs/design.md, "The release fence") against a real
// daemon on the CPU backend: a session's fenced free keeps its pages the
// session's, pending, until the session's release word reaches the free's
// value; another session's allocation that needs them does not get them
// before. The test writes a session's word directly through its channel's
// mapping, as its GPU stream would. Hostile words (backwards, far ahead),
// a session that ends with pages pending, and a fence on a session with no
// channel. No timing: a wait for the release poller is a bounded wait for
// an event, never a measured duration.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "client/client.h"
#include "client/page_reserve.h"
#include "fast_channel/codec.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/pagealloc.grpc.pb.h"
#include "server/server.h"
#include "tests/in_process_server.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::CpuTestOptions;
using ::pagealloc::testing::InProcessServer;
using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;
using ::pagealloc::testing::WaitFor;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

constexpr int64_t kPages = 16;
constexpr int64_t kPageSize = 4;

class ReleaseFenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(
        server_, InProcessServer::Start(CpuTestOptions(kPages, kPageSize)));
  }

  void TearDown() override { server_.reset(); }

  std::unique_ptr<Client> Connect(bool fast_channel = true) {
    ClientOptions options;
    options.client_name = "fence";
    options.fast_channel = fast_channel;
    absl::StatusOr<std::unique_ptr<Client>> client = server_->Connect(options);
    EXPECT_OK(client.status());
    if (!client.ok()) return nullptr;
    EXPECT_EQ((*client)->uses_fast_channel(), fast_channel);
    return *std::move(client);
  }

  // Allocates `n` whole pages for `client`; returns their ids.
  std::vector<int64_t> TakePages(Client& client, int64_t n) {
    CallOptions options;
    options.return_inline = true;
    absl::StatusOr<Allocation> a = client.Alloc({n * kPageSize}, options);
    EXPECT_OK(a.status());
    std::vector<int64_t> pages;
    if (!a.ok() || !a->status().ok()) return pages;
    for (int64_t i = 0; i < (*a)[0].count; i += kPageSize) {
      pages.push_back((*a)[0].slots[i] / kPageSize);
    }
    return pages;
  }

  // The session's release word, as its stream would write it.
  static std::atomic<uint64_t>& Word(const Client& client) {
    return *client.reserve_channel()->release_word();
  }

  int64_t OwnedBy(uint64_t session) {
    int64_t owned = 0;
    for (int64_t p = 1; p <= kPages; ++p) {
      owned += server_->pool().OwnerOf(p) == session;
    }
    return owned;
  }

  CallCore& core() { return server_->server().core(); }

  std::unique_ptr<InProcessServer> server_;
};

TEST_F(ReleaseFenceTest, AnotherSessionGetsFencedPagesOnlyOnceTheFencePasses) {
  std::unique_ptr<Client> a = Connect();
  std::unique_ptr<Client> b = Connect();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<int64_t> all = TakePages(*a, kPages);
  ASSERT_EQ(all.size(), static_cast<size_t>(kPages));
  const std::vector<int64_t> freed(all.begin(), all.begin() + 4);

  // A's stream has queued value 5 behind work that still reads the pages.
  ASSERT_THAT(a->FreePagesAfter(freed, 5), IsOkAndHolds(4));
  EXPECT_EQ(OwnedBy(a->session_id()), kPages);  // still A's, pending
  EXPECT_EQ(core().release_pending_pages(), 4);
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats,
                       a->GetStats(/*include_sessions=*/true));
  EXPECT_EQ(stats.release_pending_pages(), 4);
  EXPECT_EQ(stats.used_pages(), kPages);
  for (const v1::SessionStats& session : stats.sessions()) {
    EXPECT_EQ(session.release_pending_pages(),
              session.session_id() == a->session_id() ? 4 : 0);
  }

  // B needs them and does not get them: the pool has nothing else.
  ASSERT_OK_AND_ASSIGN(Allocation refused, b->Alloc({4 * kPageSize}));
  EXPECT_THAT(refused.status(),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
  // The word short of the value changes nothing.
  Word(*a).store(4);
  ASSERT_OK_AND_ASSIGN(refused, b->Alloc({4 * kPageSize}));
  EXPECT_THAT(refused.status(),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
  EXPECT_EQ(core().release_pending_pages(), 4);

  // A's stream passes its write: B's next launch sees the pages free.
  Word(*a).store(5);
  std::vector<int64_t> got = TakePages(*b, 4);
  EXPECT_THAT(got, UnorderedElementsAreArray(freed));
  EXPECT_EQ(core().release_pending_pages(), 0);
  EXPECT_EQ(OwnedBy(a->session_id()), kPages - 4);
  EXPECT_EQ(core().pages_released(), 4);
  EXPECT_OK(server_->pool().CheckInvariants());
}

TEST_F(ReleaseFenceTest, ThePollerFreesPassedPagesWithoutALaunch) {
  std::unique_ptr<Client> a = Connect();
  ASSERT_NE(a, nullptr);
  const std::vector<int64_t> pages = TakePages(*a, 3);
  ASSERT_THAT(a->FreePagesAfter(pages, 2), IsOkAndHolds(3));
  EXPECT_EQ(server_->pool().Stats().free_pages, kPages - 3);
  Word(*a).store(2);
  // Nobody allocates: the release poller (every kReleasePollInterval while
  // pages are pending) frees them. A bound on a wait, not a measurement.
  EXPECT_TRUE(WaitFor([&] { return core().release_pending_pages() == 0; },
                      absl::Seconds(30), absl::Milliseconds(1)));
  EXPECT_EQ(server_->pool().Stats().free_pages, kPages);
}

TEST_F(ReleaseFenceTest, AWordThatGoesBackwardsIsIgnored) {
  std::unique_ptr<Client> a = Connect();
  ASSERT_NE(a, nullptr);
  std::vector<int64_t> pages = TakePages(*a, 3);
  Word(*a).store(10);
  // Passed already: freed at once.
  ASSERT_THAT(a->FreePagesAfter({pages[0]}, 8), IsOkAndHolds(1));
  EXPECT_EQ(core().release_pending_pages(), 0);
  EXPECT_EQ(server_->pool().OwnerOf(pages[0]), kNoOwner);
  // A hostile rewind: the daemon keeps the maximum it has seen.
  Word(*a).store(3);
  ASSERT_THAT(a->FreePagesAfter({pages[1]}, 9), IsOkAndHolds(1));
  EXPECT_EQ(core().release_pending_pages(), 0);
  ASSERT_THAT(a->FreePagesAfter({pages[2]}, 11), IsOkAndHolds(1));
  EXPECT_EQ(core().release_pending_pages(), 1);
  Word(*a).store(10);
  core().PollReleases();
  EXPECT_EQ(core().release_pending_pages(), 1);
  EXPECT_EQ(server_->pool().OwnerOf(pages[2]), a->session_id());
}

TEST_F(ReleaseFenceTest, AWordFarAheadFreesOnlyItsOwnSessionsPages) {
  std::unique_ptr<Client> a = Connect();
  std::unique_ptr<Client> b = Connect();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<int64_t> pa = TakePages(*a, 2);
  const std::vector<int64_t> pb = TakePages(*b, 2);
  ASSERT_THAT(b->FreePagesAfter(pb, 7), IsOkAndHolds(2));
  Word(*a).store(UINT64_MAX);
  ASSERT_THAT(a->FreePagesAfter(pa, UINT64_MAX), IsOkAndHolds(2));
  core().PollReleases();
  EXPECT_EQ(OwnedBy(a->session_id()), 0);  // its own hazard
  EXPECT_EQ(OwnedBy(b->session_id()), 2);  // B's word says 0
  EXPECT_EQ(core().release_pending_pages(b->session_id()), 2);
}

TEST_F(ReleaseFenceTest, APendingPageFreedAgainIsADoubleFree) {
  std::unique_ptr<Client> a = Connect();
  ASSERT_NE(a, nullptr);
  const std::vector<int64_t> pages = TakePages(*a, 2);
  ASSERT_THAT(a->FreePagesAfter({pages[0]}, 3), IsOkAndHolds(1));
  EXPECT_THAT(a->FreePages({pages[1], pages[0]}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("double free")));
  EXPECT_THAT(a->FreePagesAfter({pages[0]}, 4),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("double free")));
  const std::vector<int64_t> pending = {pages[0]};
  CallOptions first;
  first.free_pages_first = pending;
  EXPECT_THAT(a->Alloc({kPageSize}, first),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("double free")));
  // Nothing changed: both pages A's, one pending.
  EXPECT_EQ(OwnedBy(a->session_id()), 2);
  EXPECT_EQ(core().release_pending_pages(), 1);
  // The pool's own checks come first, with its messages.
  EXPECT_THAT(a->FreePagesAfter({kPages + 1}, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pages[0] (17) is outside")));
}

TEST_F(ReleaseFenceTest, ASessionThatEndsWithPagesPendingGivesThemAllBack) {
  std::unique_ptr<Client> a = Connect();
  std::unique_ptr<Client> b = Connect();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<int64_t> pa = TakePages(*a, 6);
  ASSERT_THAT(a->FreePagesAfter(pa, 1), IsOkAndHolds(6));
  const std::vector<int64_t> pb = TakePages(*b, 2);
  ASSERT_THAT(b->FreePagesAfter(pb, 1), IsOkAndHolds(2));
  // A's process dies (its CUDA context, and its queued work, with it).
  ASSERT_TRUE(core().ReclaimSession(a->session_id(), "client gone"));
  EXPECT_TRUE(WaitFor([&] { return OwnedBy(a->session_id()) == 0; },
                      absl::Seconds(30)));
  EXPECT_EQ(core().release_pending_pages(), 2);  // B's stay B's
  EXPECT_EQ(core().release_pending_pages(b->session_id()), 2);
  // B closes: its pending pages are freed with its others.
  ASSERT_OK(b->Close());
  EXPECT_EQ(core().release_pending_pages(), 0);
  EXPECT_EQ(server_->pool().Stats().free_pages, kPages);
  EXPECT_OK(server_->pool().CheckInvariants());
}

TEST_F(ReleaseFenceTest, ClearAndRollbackTakePendingPagesOutOfTheQueue) {
  std::unique_ptr<Client> a = Connect();
  ASSERT_NE(a, nullptr);
  ASSERT_OK_AND_ASSIGN(const uint64_t checkpoint, a->CheckpointId());
  const std::vector<int64_t> pages = TakePages(*a, 4);
  ASSERT_THAT(a->FreePagesAfter({pages[0], pages[1]}, 9), IsOkAndHolds(2));
  ASSERT_THAT(a->Rollback(checkpoint), IsOkAndHolds(4));
  EXPECT_EQ(core().release_pending_pages(), 0);
  // The pages come back to A and are not freed when the fence passes.
  const std::vector<int64_t> again = TakePages(*a, 4);
  ASSERT_THAT(a->FreePagesAfter({again[0]}, 9), IsOkAndHolds(1));
  ASSERT_THAT(a->ClearSession(), IsOkAndHolds(4));
  EXPECT_EQ(core().release_pending_pages(), 0);
  ASSERT_EQ(TakePages(*a, 4).size(), 4u);
  Word(*a).store(9);
  core().PollReleases();
  EXPECT_EQ(OwnedBy(a->session_id()), 4);
  EXPECT_OK(server_->pool().CheckInvariants());
}

TEST_F(ReleaseFenceTest, AFenceOverGrpcHoldsAsOneOnTheChannel) {
  std::unique_ptr<Client> a = Connect();
  ASSERT_NE(a, nullptr);
  const std::vector<int64_t> pages = TakePages(*a, 2);
  std::unique_ptr<v1::PageAllocator::Stub> stub = server_->NewStub();
  v1::FreeRequest request;
  request.mutable_session()->set_session_id(a->session_id());
  request.mutable_session()->set_session_token(a->session_token());
  request.mutable_pages()->Add(pages.begin(), pages.end());
  request.set_release_value(3);
  v1::FreeResponse response;
  grpc::ClientContext context;
  const grpc::Status status = stub->Free(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.pages_freed(), 2);
  EXPECT_EQ(core().release_pending_pages(), 2);
  EXPECT_EQ(OwnedBy(a->session_id()), 2);
  Word(*a).store(3);
  EXPECT_TRUE(WaitFor([&] { return OwnedBy(a->session_id()) == 0; },
                      absl::Seconds(30), absl::Milliseconds(1)));
}

TEST_F(ReleaseFenceTest, AFenceWithoutAFastChannelIsRefusedAndChangesNothing) {
  std::unique_ptr<Client> a = Connect(/*fast_channel=*/false);
  ASSERT_NE(a, nullptr);
  const std::vector<int64_t> pages = TakePages(*a, 2);
  EXPECT_THAT(a->FreePagesAfter(pages, 3),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("has no release word (it has no fast "
                                 "channel)")));
  EXPECT_THAT(a->FreePages(pages, /*cuda_stream=*/nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no release word")));
  EXPECT_EQ(OwnedBy(a->session_id()), 2);
  EXPECT_EQ(core().release_pending_pages(), 0);
  EXPECT_THAT(a->FreePages(pages), IsOkAndHolds(2));
}

TEST_F(ReleaseFenceTest, OnTheCpuBackendAStreamFreeIsOrderedAtOnce) {
  std::unique_ptr<Client> a = Connect();
  ASSERT_NE(a, nullptr);
  const std::vector<int64_t> pages = TakePages(*a, 3);
  // Program order is the order: the word is written before the free goes.
  ASSERT_THAT(a->FreePages({pages[0]}, /*cuda_stream=*/nullptr),
              IsOkAndHolds(1));
  EXPECT_EQ(a->last_release_value(), 1u);
  EXPECT_EQ(Word(*a).load(), 1u);
  ASSERT_THAT(a->FreeSlots({pages[1] * kPageSize, pages[2] * kPageSize + 1},
                           /*cuda_stream=*/nullptr),
              IsOkAndHolds(2));
  EXPECT_EQ(a->last_release_value(), 2u);
  EXPECT_EQ(core().release_pending_pages(), 0);
  EXPECT_EQ(OwnedBy(a->session_id()), 0);
}

TEST_F(ReleaseFenceTest, AReserveReturnCarriesTheFenceOfPagesPutOnAStream) {
  std::unique_ptr<Client> a = Connect();
  ASSERT_NE(a, nullptr);
  PageReserveOptions manual;
  manual.initial_batch = 2;
  manual.background = false;
  manual.starved_wait = absl::ZeroDuration();
  {
    // Put back without a stream: returned as an ordinary free.
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PageReserve> reserve,
                         PageReserve::Create(a.get(), manual));
    std::vector<int64_t> pages;
    ASSERT_OK(reserve->Take(2, &pages));
    ASSERT_OK(reserve->Put(pages));
  }
  EXPECT_EQ(OwnedBy(a->session_id()), 0);
  EXPECT_EQ(core().pages_released(), 0);
  int64_t returned = 0;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PageReserve> reserve,
                         PageReserve::Create(a.get(), manual));
    std::vector<int64_t> pages;
    ASSERT_OK(reserve->Take(2, &pages));
    ASSERT_OK(reserve->Put(pages, /*cuda_stream=*/nullptr));
    EXPECT_EQ(a->last_release_value(), 1u);
    returned = OwnedBy(a->session_id());
    EXPECT_GE(returned, 2);
  }
  // The return (the reserve's end) carried value 1: its pages went through
  // the release queue, whose fence (written at once on the CPU) had passed.
  EXPECT_EQ(OwnedBy(a->session_id()), 0);
  EXPECT_EQ(core().pages_released(), returned);
  EXPECT_EQ(core().release_pending_pages(), 0);
  {
    // Under the reserve's pages, the same.
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PageReserve> reserve,
                         PageReserve::Create(a.get(), manual));
    std::vector<int64_t> pages;
    ASSERT_OK(reserve->Take(2, &pages));
    ASSERT_OK(reserve->PutUnder(pages, /*cuda_stream=*/nullptr));
    EXPECT_EQ(a->last_release_value(), 2u);
    returned += OwnedBy(a->session_id());
  }
  EXPECT_EQ(OwnedBy(a->session_id()), 0);
  EXPECT_EQ(core().pages_released(), returned);
  EXPECT_EQ(core().release_pending_pages(), 0);
}

}  // namespace
}  // namespace pagealloc
