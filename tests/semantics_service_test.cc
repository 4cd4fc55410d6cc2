// The daemon in-process, for what SGLang's allocators need of it: the
// --semantics profile, all-or-nothing calls, free order, checkpoint ids,
// per-request refusal of requests longer than the pool, ClearSession,
// ClearPool and GetFreeLists. Each session call runs through the client
// library over both transports (gRPC and the fast channel).

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/admin.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/pagealloc.grpc.pb.h"
#include "server/server.h"
#include "tests/in_process_server.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::InProcessServer;
using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct ServerSetup {
  int64_t num_pages = 8;
  int64_t page_size = 4;
  FreePolicy policy = FreePolicy::kLifo;
  Semantics semantics = Semantics::kPagealloc;
  bool allow_forced_clear = false;
};

// Parameter: whether the client uses the fast channel.
class SemanticsServiceTest : public ::testing::TestWithParam<bool> {
 protected:
  void StartServer(const ServerSetup& setup = {}) {
    clients_.clear();
    server_.reset();
    ServerOptions options;
    options.backend = "cpu";
    options.pool = {setup.num_pages, setup.page_size, setup.policy,
                    setup.semantics};
    options.allow_forced_clear = setup.allow_forced_clear;
    options.sessions.default_ring_capacity_slots = 256;
    options.batcher.max_batch_requests = 64;
    options.batcher.max_batch_tokens = 4096;
    options.debug_checks = true;
    ASSERT_OK_AND_ASSIGN(server_, InProcessServer::Start(options));
  }

  void TearDown() override {
    clients_.clear();
    server_.reset();
  }

  Client* Connect(const std::string& name = "sched") {
    ClientOptions options;
    options.client_name = name;
    options.fast_channel = GetParam();
    absl::StatusOr<std::unique_ptr<Client>> client = server_->Connect(options);
    EXPECT_OK(client.status());
    if (!client.ok()) return nullptr;
    EXPECT_EQ((*client)->uses_fast_channel(), GetParam());
    clients_.push_back(*std::move(client));
    return clients_.back().get();
  }

  AdminOptions Admin() const {
    AdminOptions admin;
    admin.channel = server_->channel();
    return admin;
  }

  static std::vector<int64_t> Slots(const RequestSlots& r) {
    return std::vector<int64_t>(r.slots, r.slots + r.count);
  }

  std::vector<int64_t> AllPages() const {
    std::vector<int64_t> pages(server_->pool().geometry().num_pages);
    std::iota(pages.begin(), pages.end(), 1);
    return pages;
  }

  std::unique_ptr<InProcessServer> server_;
  std::vector<std::unique_ptr<Client>> clients_;
};

TEST_P(SemanticsServiceTest, RegisterNamesThePoolsSemantics) {
  StartServer();
  Client* client = Connect();
  EXPECT_EQ(client->pool().semantics(), "pagealloc");
  StartServer({.semantics = Semantics::kSglang});
  client = Connect();
  EXPECT_EQ(client->pool().semantics(), "sglang");
}

// AllocOptions.all_or_nothing: the whole call or nothing, as SGLang's
// alloc_extend returns None; without it the requests that fit proceed.
TEST_P(SemanticsServiceTest, AllOrNothingCallsAreRefusedWhole) {
  StartServer();
  Client* client = Connect();
  const std::vector<int64_t> before = server_->pool().FreeList();
  CallOptions whole;
  whole.all_or_nothing = true;
  ASSERT_OK_AND_ASSIGN(Allocation refused,
                       client->AllocExtend({0, 0}, {8, 28}, {-1, -1}, whole));
  EXPECT_THAT(refused[0].status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("refused with its all-or-nothing call: "
                                 "extend request 1: out of pages: needs 7 "
                                 "pages, 6 free")));
  EXPECT_THAT(refused[1].status, StatusIs(absl::StatusCode::kResourceExhausted,
                                          HasSubstr("needs 7 pages")));
  EXPECT_EQ(refused[0].count, 0);
  EXPECT_EQ(server_->pool().FreeList(), before);
  client->Release(refused);
  ASSERT_OK_AND_ASSIGN(Allocation partial,
                       client->AllocExtend({0, 0}, {8, 28}, {-1, -1}));
  EXPECT_OK(partial[0].status);
  EXPECT_THAT(Slots(partial[0]), ElementsAre(4, 5, 6, 7, 8, 9, 10, 11));
  EXPECT_THAT(partial[1].status, StatusIs(absl::StatusCode::kResourceExhausted,
                                          HasSubstr("needs 7 pages, 6 free")));
  client->Release(partial);
  // Decode and Alloc carry the option too.
  ASSERT_OK_AND_ASSIGN(Allocation decodes,
                       client->AllocDecode({9, 1}, {11, -1}, whole));
  EXPECT_OK(decodes.status());
  ASSERT_OK_AND_ASSIGN(Allocation allocs, client->Alloc({4, 24}, whole));
  EXPECT_THAT(allocs[0].status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("refused with its all-or-nothing call")));
}

// A request longer than the pool (8 pages of 4: 32 usable slots) is refused
// alone, for every kind, with one bound.
TEST_P(SemanticsServiceTest, RequestsLongerThanThePoolAreRefusedAlone) {
  StartServer();
  Client* client = Connect();
  ASSERT_OK_AND_ASSIGN(Allocation extends,
                       client->AllocExtend({0, 0}, {4, 33}, {-1, -1}));
  EXPECT_OK(extends[0].status);
  EXPECT_THAT(extends[1].status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("extend request 1: seq_lens[1] (33) exceeds "
                                 "the pool's 32 usable slots (8 pages of 4): "
                                 "it can never fit")));
  ASSERT_OK_AND_ASSIGN(Allocation allocs, client->Alloc({36, 4}));
  EXPECT_THAT(allocs[0].status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("num_tokens[0] (36) exceeds the pool's 32 "
                                 "usable slots")));
  EXPECT_OK(allocs[1].status);
}

// FreeRequest.order and the profile's default: SGLang's free puts the
// distinct pages back ascending, the daemon's own contract in order of
// first appearance.
TEST_P(SemanticsServiceTest, FreeOrderFollowsTheProfileAndTheCall) {
  for (Semantics semantics : {Semantics::kPagealloc, Semantics::kSglang}) {
    SCOPED_TRACE(SemanticsName(semantics));
    StartServer({.semantics = semantics});
    Client* client = Connect();
    ASSERT_OK_AND_ASSIGN(Allocation a, client->Alloc({8}));  // pages 1, 2
    EXPECT_THAT(client->FreeSlots({8, 9, 10, 11, 4, 5, 6, 7}), IsOkAndHolds(2));
    ASSERT_OK_AND_ASSIGN(Allocation b, client->Alloc({4}));
    EXPECT_THAT(Slots(b[0]), semantics == Semantics::kSglang
                                 ? ElementsAre(4, 5, 6, 7)
                                 : ElementsAre(8, 9, 10, 11));
    client->Release(b);
    // The call's order wins: ascending, then first appearance.
    ASSERT_OK_AND_ASSIGN(Allocation c, client->Alloc({8}));
    const std::vector<int64_t> held = {Slots(c[0])[4], Slots(c[0])[0],
                                       Slots(b[0])[0]};
    EXPECT_THAT(client->FreeSlots(held, v1::FREE_ORDER_ASCENDING),
                IsOkAndHolds(3));
    std::vector<int64_t> front = server_->pool().FreeList();
    EXPECT_THAT(std::vector<int64_t>(front.begin(), front.begin() + 3),
                ElementsAre(1, 2, 3));
    ASSERT_OK_AND_ASSIGN(Allocation d, client->Alloc({12}));  // 1, 2, 3
    EXPECT_THAT(client->FreePages({3, 1, 2}, v1::FREE_ORDER_FIRST_APPEARANCE),
                IsOkAndHolds(3));
    front = server_->pool().FreeList();
    EXPECT_THAT(std::vector<int64_t>(front.begin(), front.begin() + 3),
                ElementsAre(3, 1, 2));
    client->Release(d);
  }
}

// Checkpoint returns an id; Rollback(id) restores to it (again, too) and
// ends the later ones; Rollback() takes the latest and ends it.
TEST_P(SemanticsServiceTest, CheckpointIdsNestAndRollBackToAnId) {
  StartServer();
  Client* client = Connect();
  const std::vector<int64_t> at_outer = server_->pool().FreeList();
  ASSERT_OK_AND_ASSIGN(const uint64_t outer, client->CheckpointId());
  ASSERT_OK_AND_ASSIGN(Allocation a, client->Alloc({8}));
  const std::vector<int64_t> at_inner = server_->pool().FreeList();
  ASSERT_OK_AND_ASSIGN(const uint64_t inner, client->CheckpointId());
  EXPECT_EQ(inner, outer + 1);
  ASSERT_OK_AND_ASSIGN(Allocation b, client->Alloc({4}));
  EXPECT_THAT(client->Rollback(inner), IsOkAndHolds(1));
  EXPECT_EQ(server_->pool().FreeList(), at_inner);
  ASSERT_OK_AND_ASSIGN(Allocation c, client->Alloc({12}));
  EXPECT_THAT(client->Rollback(inner), IsOkAndHolds(3));
  EXPECT_EQ(server_->pool().FreeList(), at_inner);
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, client->GetStats(true));
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.sessions(0).checkpoints(), 2);
  EXPECT_TRUE(stats.sessions(0).checkpoint_active());
  EXPECT_THAT(client->Rollback(outer), IsOkAndHolds(2));
  EXPECT_EQ(server_->pool().FreeList(), at_outer);
  EXPECT_THAT(
      client->Rollback(inner),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("has ended")));
  EXPECT_THAT(client->Rollback(outer + 40),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("never took checkpoint")));
  EXPECT_THAT(client->Rollback(), IsOkAndHolds(0));  // outer, which ends
  EXPECT_THAT(client->Rollback(outer),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no checkpoint")));
  // checkpoint_first takes one too.
  CallOptions first;
  first.checkpoint_first = true;
  ASSERT_OK_AND_ASSIGN(Allocation d, client->Alloc({4}, first));
  EXPECT_THAT(client->Rollback(), IsOkAndHolds(1));
}

// ClearSession frees the session's pages and keeps the session; the last
// holder's clear puts the pool back to its first state (SGLang's clear).
TEST_P(SemanticsServiceTest, ClearSessionFreesItsPagesAndKeepsTheSession) {
  StartServer({.policy = FreePolicy::kSorted});
  Client* alice = Connect("alice");
  Client* bob = Connect("bob");
  ASSERT_OK_AND_ASSIGN(Allocation a, alice->Alloc({12}));  // pages 1..3
  ASSERT_OK_AND_ASSIGN(Allocation b, bob->Alloc({4}));     // page 4
  ASSERT_OK(alice->CheckpointId().status());
  EXPECT_THAT(alice->ClearSession(), IsOkAndHolds(3));
  EXPECT_THAT(server_->pool().ParkedPages(), ElementsAre(1, 2, 3));
  EXPECT_EQ(server_->pool().OwnerOf(4), bob->session_id());
  EXPECT_THAT(alice->Rollback(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                          HasSubstr("no checkpoint")));
  ASSERT_OK_AND_ASSIGN(Allocation again, alice->Alloc({4}));
  EXPECT_OK(again.status());
  EXPECT_THAT(alice->ClearSession(), IsOkAndHolds(1));
  EXPECT_THAT(bob->ClearSession(), IsOkAndHolds(1));
  EXPECT_EQ(server_->pool().FreeList(), AllPages());
  EXPECT_TRUE(server_->pool().ParkedPages().empty());
}

// ClearPool is an operator's call, like GetStats: refused while sessions
// hold pages unless forced, and forced only where the daemon allows it.
TEST_P(SemanticsServiceTest, ClearPoolRefusesOwnedPagesUnlessForcedAndAllowed) {
  StartServer();
  Client* client = Connect();
  ASSERT_OK_AND_ASSIGN(Allocation a, client->Alloc({8}));
  ASSERT_OK(client->FreePages({2}).status());
  EXPECT_THAT(
      ClearDaemonPool(Admin()),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr(absl::StrFormat("1 pages are owned, by owners %d",
                                         client->session_id()))));
  EXPECT_THAT(ClearDaemonPool(Admin(), /*force=*/true),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("--allow_forced_clear")));
  EXPECT_EQ(server_->pool().OwnerOf(1), client->session_id());
  ASSERT_OK(client->FreePages({1}).status());
  // Nothing owned: an ordinary clear resets the order.
  EXPECT_THAT(ClearDaemonPool(Admin()), IsOkAndHolds(0));
  EXPECT_EQ(server_->pool().FreeList(), AllPages());

  StartServer({.allow_forced_clear = true});
  client = Connect();
  ASSERT_OK_AND_ASSIGN(Allocation b, client->Alloc({8}));
  EXPECT_THAT(ClearDaemonPool(Admin(), /*force=*/true), IsOkAndHolds(2));
  EXPECT_EQ(server_->pool().FreeList(), AllPages());
  // The session lives on; its old pages are gone.
  EXPECT_THAT(client->FreePages({1}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("was already freed")));
}

// GetFreeLists: both lists, read together, each bounded.
TEST_P(SemanticsServiceTest, GetFreeListsReadsBothListsBounded) {
  StartServer({.policy = FreePolicy::kSorted, .semantics = Semantics::kSglang});
  Client* client = Connect();
  ASSERT_OK_AND_ASSIGN(Allocation a, client->Alloc({16}));  // pages 1..4
  ASSERT_OK(client->FreeSlots({12, 4, 8}).status());        // ascending
  ASSERT_OK_AND_ASSIGN(v1::GetFreeListsResponse lists,
                       GetDaemonFreeLists(Admin()));
  EXPECT_THAT(lists.free_pages(), ElementsAre(5, 6, 7, 8));
  EXPECT_THAT(lists.parked_pages(), ElementsAre(1, 2, 3));
  EXPECT_EQ(lists.free_count(), 4);
  EXPECT_EQ(lists.parked_count(), 3);
  EXPECT_EQ(lists.pool().semantics(), "sglang");
  ASSERT_OK_AND_ASSIGN(lists, GetDaemonFreeLists(Admin(), 2));
  EXPECT_THAT(lists.free_pages(), ElementsAre(5, 6));
  EXPECT_THAT(lists.parked_pages(), ElementsAre(1, 2));
  EXPECT_EQ(lists.parked_count(), 3);
  EXPECT_THAT(GetDaemonFreeLists(Admin(), -1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_pages (-1) is outside [0, 1048576]")));
  EXPECT_THAT(
      GetDaemonFreeLists(Admin(), (int64_t{1} << 20) + 1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_pages")));
}

// Under --semantics=sglang with the sorted policy a call merges on SGLang's
// over-estimate: an extend of 4 slots with 2 free pages merges (4 / 4 + 1 +
// 1 = 3 > 2) although it fits.
TEST_P(SemanticsServiceTest, SglangSortedPolicyMergesOnTheOverEstimate) {
  StartServer({.policy = FreePolicy::kSorted, .semantics = Semantics::kSglang});
  Client* client = Connect();
  ASSERT_OK_AND_ASSIGN(Allocation a, client->Alloc({24}));  // pages 1..6
  ASSERT_OK(client->FreePages({4, 2}).status());
  ASSERT_OK_AND_ASSIGN(Allocation b, client->AllocExtend({0}, {4}, {-1}));
  EXPECT_THAT(Slots(b[0]), ElementsAre(8, 9, 10, 11));
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, client->GetStats());
  EXPECT_EQ(stats.free_list_sorts_total(), 1);
  EXPECT_EQ(stats.parked_pages(), 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, SemanticsServiceTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "FastChannel" : "Grpc";
                         });

}  // namespace
}  // namespace pagealloc
