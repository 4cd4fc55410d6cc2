// The daemon in-process: every RPC through the client library and the raw
// stub, success and refusal paths, on the CPU backend.

#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/pagealloc.grpc.pb.h"
#include "server/server.h"
#include "tests/in_process_server.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::InProcessServer;
using ::pagealloc::testing::InProcessServerTest;
using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;
using ::pagealloc::testing::WaitFor;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

class ServiceTest : public InProcessServerTest {
 protected:
  void StartServer(int64_t num_pages = 64, int64_t page_size = 4,
                   absl::Duration lease = absl::Seconds(10),
                   absl::Duration window = absl::ZeroDuration()) {
    ServerOptions options;
    options.backend = "cpu";
    options.pool = {num_pages, page_size, FreePolicy::kLifo};
    options.sessions.lease = lease;
    options.sessions.default_ring_capacity_slots = 256;
    options.batcher.max_batch_requests = 64;
    options.batcher.max_batch_tokens = 4096;
    options.batcher.batch_window = window;
    // A window here is waited out whole: a test that gives one expects
    // every call made meanwhile in the launch, however few sessions called.
    options.batcher.min_batch_calls = 0;
    options.debug_checks = true;
    StartServer(options);
  }

  using InProcessServerTest::StartServer;

  std::unique_ptr<Client> Connect(const std::string& name = "test",
                                  int64_t ring = 0, int64_t quota = 0) {
    ClientOptions options;
    options.client_name = name;
    options.ring_capacity_slots = ring;
    options.quota_pages = quota;
    absl::StatusOr<std::unique_ptr<Client>> client = server_->Connect(options);
    EXPECT_OK(client.status());
    return client.ok() ? *std::move(client) : nullptr;
  }

  static std::vector<int64_t> Slots(const RequestSlots& r) {
    return std::vector<int64_t>(r.slots, r.slots + r.count);
  }

  // Pool state a refused call must leave unchanged.
  std::pair<std::vector<int64_t>, int64_t> PoolState() {
    return {server_->pool().FreeList(), server_->pool().Stats().used_pages};
  }
};

TEST_F(ServiceTest, RegisterDescribesThePoolAndTheRing) {
  StartServer(64, 4);
  v1::RegisterRequest request;
  request.set_client_name("sched-0");
  request.set_ring_capacity_slots(128);
  request.set_quota_pages(7);
  v1::RegisterResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->Register(&context, request, &response).ok());
  EXPECT_NE(response.session_id(), 0u);
  EXPECT_EQ(response.session_token().size(), 32u);
  EXPECT_EQ(response.pool().page_size(), 4);
  EXPECT_EQ(response.pool().num_pages(), 64);
  EXPECT_EQ(response.pool().backend(), v1::BACKEND_CPU);
  EXPECT_EQ(response.pool().free_policy(), "lifo");
  EXPECT_EQ(response.ring().capacity_slots(), 128);
  EXPECT_FALSE(response.memory_socket().empty());
  EXPECT_EQ(response.lease_ms(), 10000);
  EXPECT_EQ(response.quota_pages(), 7);
}

TEST_F(ServiceTest, ExtendDecodeAllocWriteTheSessionsRing) {
  StartServer(64, 4);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  // Prefill 6 tokens: pages 1, 2.
  ASSERT_OK_AND_ASSIGN(Allocation a, client->AllocExtend({0}, {6}, {-1}));
  ASSERT_OK(a.status());
  EXPECT_THAT(Slots(a[0]), ElementsAre(4, 5, 6, 7, 8, 9));
  EXPECT_EQ(a[0].new_pages, 2);
  EXPECT_FALSE(a.on_device());
  // Decode inside page 2, then chunked prefill continuing it.
  ASSERT_OK_AND_ASSIGN(Allocation d, client->AllocDecode({7}, {9}));
  EXPECT_THAT(Slots(d[0]), ElementsAre(10));
  ASSERT_OK_AND_ASSIGN(Allocation e, client->AllocExtend({7}, {13}, {10}));
  EXPECT_THAT(Slots(e[0]), ElementsAre(11, 12, 13, 14, 15, 16));
  // Whole pages.
  ASSERT_OK_AND_ASSIGN(Allocation p, client->Alloc({8, 4}));
  EXPECT_THAT(Slots(p[0]), ElementsAre(20, 21, 22, 23, 24, 25, 26, 27));
  EXPECT_THAT(Slots(p[1]), ElementsAre(28, 29, 30, 31));
  // Earlier results are still readable: the ring never overwrites them.
  EXPECT_THAT(Slots(a[0]), ElementsAre(4, 5, 6, 7, 8, 9));
  EXPECT_GT(p.ring_end(), e.ring_end());
  EXPECT_EQ(server_->pool().Stats().owners[client->session_id()].pages_owned,
            7);
}

TEST_F(ServiceTest, InlineResultsNeedNoRing) {
  StartServer(64, 4);
  auto client = Connect();
  CallOptions inline_results;
  inline_results.return_inline = true;
  ASSERT_OK_AND_ASSIGN(
      Allocation a,
      client->AllocExtend({0, 0}, {3, 5}, {-1, -1}, inline_results));
  EXPECT_THAT(Slots(a[0]), ElementsAre(4, 5, 6));
  EXPECT_THAT(Slots(a[1]), ElementsAre(8, 9, 10, 11, 12));
  EXPECT_EQ(a.ring_end(), 0);
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, client->GetStats(true));
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.sessions(0).ring_reserved_slots(), 0);
}

TEST_F(ServiceTest, FreeGroupCheckpointRollbackAndStats) {
  StartServer(64, 4);
  auto client = Connect("sched");
  ASSERT_OK_AND_ASSIGN(Allocation a, client->Alloc({16}));
  const std::vector<int64_t> slots = Slots(a[0]);
  Client::FreeGroup group = client->BeginFreeGroup();
  group.Add(absl::MakeSpan(slots).subspan(0, 4));  // page 1
  group.Add(absl::MakeSpan(slots).subspan(8, 2));  // page 3
  EXPECT_THAT(group.End(), IsOkAndHolds(2));
  EXPECT_THAT(client->FreePages({2}), IsOkAndHolds(1));
  // lifo: the group's pages (1, 3) went to the front, then page 2.
  const std::vector<int64_t> free_list = server_->pool().FreeList();
  EXPECT_THAT(std::vector<int64_t>(free_list.begin(), free_list.begin() + 4),
              ElementsAre(2, 1, 3, 5));
  const std::vector<int64_t> before = server_->pool().FreeList();
  ASSERT_OK(client->Checkpoint());
  ASSERT_OK_AND_ASSIGN(Allocation b, client->Alloc({12}));
  EXPECT_THAT(client->Rollback(), IsOkAndHolds(3));
  EXPECT_EQ(server_->pool().FreeList(), before);
  EXPECT_THAT(client->Rollback(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no checkpoint")));
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, client->GetStats(true));
  EXPECT_EQ(stats.used_pages(), 1);
  EXPECT_EQ(stats.free_pages(), 63);
  EXPECT_EQ(stats.sessions_active(), 1);
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.sessions(0).client_name(), "sched");
  EXPECT_EQ(stats.sessions(0).pages_owned(), 1);
  EXPECT_GE(stats.launches_total(), 2);
}

// GetStats lists, per session, its transport and how long ago it last
// renewed its lease.
TEST_F(ServiceTest, StatsNameEachSessionsTransportAndLeaseAge) {
  StartServer(64, 4, absl::Seconds(60));
  auto fast = Connect("fast");
  ASSERT_NE(fast, nullptr);
  ClientOptions grpc_only;
  grpc_only.client_name = "grpc-only";
  grpc_only.fast_channel = false;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> slow,
                       server_->Connect(grpc_only));
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, fast->GetStats(true));
  ASSERT_EQ(stats.sessions_size(), 2);
  for (const v1::SessionStats& session : stats.sessions()) {
    SCOPED_TRACE(session.client_name());
    EXPECT_EQ(session.fast_channel(), session.client_name() == "fast"
                                          ? fast->uses_fast_channel()
                                          : false);
    EXPECT_GE(session.lease_age_ms(), 0);
    EXPECT_LE(session.lease_age_ms(), 60000);
  }
  EXPECT_TRUE(fast->uses_fast_channel()) << "no fast channel in this test";
}

TEST_F(ServiceTest, RequestsThatDoNotFitAreRefusedAlone) {
  StartServer(4, 4);
  auto client = Connect();
  ASSERT_OK_AND_ASSIGN(Allocation a, client->Alloc({8, 12, 4}));
  EXPECT_OK(a[0].status);
  EXPECT_THAT(a[1].status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("alloc request 1: out of pages: needs 3 "
                                 "pages, 2 free")));
  EXPECT_OK(a[2].status);
  EXPECT_THAT(Slots(a[2]), ElementsAre(12, 13, 14, 15));
  EXPECT_THAT(a.status(), StatusIs(absl::StatusCode::kResourceExhausted,
                                   HasSubstr("out of pages")));
}

TEST_F(ServiceTest, QuotaIsEnforced) {
  StartServer(64, 4);
  auto client = Connect("q", 0, /*quota=*/2);
  ASSERT_OK_AND_ASSIGN(Allocation a, client->Alloc({12}));
  EXPECT_THAT(a[0].status, StatusIs(absl::StatusCode::kResourceExhausted,
                                    HasSubstr("over quota")));
}

TEST_F(ServiceTest, QuotasAreCappedByTheServer) {
  ServerOptions options;
  options.backend = "cpu";
  options.pool = {64, 4, FreePolicy::kLifo};
  options.sessions.max_quota_pages = 3;
  StartServer(options);
  for (const auto& [asked, given] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {10, 3}, {2, 2}}) {
    v1::RegisterRequest request;
    request.set_quota_pages(asked);
    v1::RegisterResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->Register(&context, request, &response).ok());
    EXPECT_EQ(response.quota_pages(), given) << "asked " << asked;
  }
  auto client = Connect("capped");
  ASSERT_OK_AND_ASSIGN(Allocation a, client->Alloc({16}));
  EXPECT_THAT(a[0].status, StatusIs(absl::StatusCode::kResourceExhausted,
                                    HasSubstr("over quota: needs 4 pages")));
  client.reset();
}

TEST_F(ServiceTest, RingFullUntilReleased) {
  StartServer(64, 4);
  auto client = Connect("ring", /*ring=*/16);
  ASSERT_OK_AND_ASSIGN(Allocation a, client->Alloc({12}));
  const auto before = PoolState();
  EXPECT_THAT(client->Alloc({8}), StatusIs(absl::StatusCode::kResourceExhausted,
                                           HasSubstr("output ring full")));
  EXPECT_EQ(PoolState(), before);
  client->Release(a);  // piggybacked on the next call
  ASSERT_OK_AND_ASSIGN(Allocation b, client->Alloc({8}));
  EXPECT_OK(b.status());
  client->Release(b);
  EXPECT_OK(client->FlushRelease());
}

// Raw-stub refusals: the code, a message naming the field, and a pool
// exactly as it was.
TEST_F(ServiceTest, MalformedCallsAreRefusedWhole) {
  StartServer(64, 4);
  auto client = Connect();
  ASSERT_OK_AND_ASSIGN(Allocation a, client->AllocExtend({0}, {6}, {-1}));
  v1::SessionRef ref;
  ref.set_session_id(client->session_id());
  ref.set_session_token(client->session_token());
  const auto before = PoolState();

  auto extend = [&](std::vector<int64_t> prefix, std::vector<int64_t> seq,
                    std::vector<int64_t> last, v1::SessionRef session) {
    v1::AllocExtendRequest request;
    *request.mutable_session() = session;
    request.mutable_prefix_lens()->Add(prefix.begin(), prefix.end());
    request.mutable_seq_lens()->Add(seq.begin(), seq.end());
    request.mutable_last_locs()->Add(last.begin(), last.end());
    v1::AllocResponse response;
    grpc::ClientContext context;
    return FromGrpcStatus(stub_->AllocExtend(&context, request, &response));
  };
  EXPECT_THAT(extend({0, 0}, {4}, {-1, -1}, ref),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prefix_lens has 2, seq_lens has 1, "
                                 "last_locs has 2")));
  EXPECT_THAT(extend({0, 8}, {4, 6}, {-1, 9}, ref),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("seq_lens[1] (6) < prefix_lens[1] (8)")));
  EXPECT_THAT(extend({6}, {8}, {10}, ref),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("last_locs[0] (10) is misaligned")));
  v1::SessionRef wrong_token = ref;
  wrong_token.set_session_token(std::string(32, 'x'));
  EXPECT_THAT(extend({0}, {4}, {-1}, wrong_token),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("wrong session_token")));
  v1::SessionRef unknown = ref;
  unknown.set_session_id(ref.session_id() + 1000);
  EXPECT_THAT(extend({0}, {4}, {-1}, unknown),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown")));
  std::vector<int64_t> many(65, 0), lens(65, 1), lasts(65, -1);
  EXPECT_THAT(extend(many, lens, lasts, ref),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("65 requests; at most 64")));
  // Longer than the pool is refused per request; more slots than one
  // launch takes, for the whole call.
  EXPECT_THAT(extend({0}, {5000}, {-1}, ref),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the call asks for 5000 slots; at most "
                                 "4096")));

  v1::FreeRequest both;
  *both.mutable_session() = ref;
  both.add_slots(4);
  both.add_pages(1);
  v1::FreeResponse freed;
  grpc::ClientContext free_context;
  EXPECT_THAT(FromGrpcStatus(stub_->Free(&free_context, both, &freed)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("either slots (1 given) or pages (1 given)")));
  EXPECT_THAT(client->FreePages({1, 3}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("pages[1] (3): page 3 was never "
                                 "allocated")));
  EXPECT_THAT(client->FreeSlots({0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("page 0 is reserved")));

  v1::ReleaseRingRequest release;
  *release.mutable_session() = ref;
  release.set_up_to(1 << 20);
  v1::ReleaseRingResponse released;
  grpc::ClientContext release_context;
  EXPECT_THAT(
      FromGrpcStatus(stub_->ReleaseRing(&release_context, release, &released)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("up_to: up_to (1048576) is past")));
  EXPECT_EQ(PoolState(), before);
  EXPECT_OK(server_->pool().CheckInvariants());
}

TEST_F(ServiceTest, AnotherSessionsPagesAreOffLimits) {
  StartServer(64, 4);
  auto alice = Connect("alice");
  auto bob = Connect("bob");
  ASSERT_OK_AND_ASSIGN(Allocation a, alice->AllocExtend({0}, {6}, {-1}));
  const auto before = PoolState();
  EXPECT_THAT(bob->FreeSlots({4}),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("slots[0] (4): page 1 belongs to another "
                                 "session")));
  ASSERT_OK_AND_ASSIGN(Allocation b, bob->AllocDecode({7}, {9}));
  EXPECT_THAT(b[0].status,
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("last_locs[0] (9): page 2 belongs to another "
                                 "session")));
  EXPECT_EQ(PoolState(), before);
}

TEST_F(ServiceTest, ClosingASessionFreesItsPages) {
  StartServer(64, 4);
  auto client = Connect();
  ASSERT_OK_AND_ASSIGN(Allocation a, client->Alloc({40}));
  EXPECT_EQ(server_->pool().Stats().used_pages, 10);
  // Close returns once the daemon has freed the pages.
  ASSERT_OK(client->Close());
  EXPECT_EQ(server_->pool().Stats().used_pages, 0);
  EXPECT_THAT(
      client->Alloc({4}),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("closed")));
}

// The pages of a closed session are freed in order with the work queued
// before the close, which can wait: here another session's call waits out
// a batch window of a second. Close still returns only once they are free.
TEST_F(ServiceTest, CloseReturnsOnceThePagesAreFreeEvenBehindQueuedWork) {
  StartServer(64, 4, absl::Seconds(10), /*window=*/absl::Seconds(1));
  auto closing = Connect("closing");
  auto other = Connect("other");
  ASSERT_OK(closing->Alloc({40}).status());  // waits out the window alone
  EXPECT_EQ(server_->pool().Stats().used_pages, 10);
  std::thread waiting([&] { EXPECT_OK(other->Alloc({4}).status()); });
  // Usually the other call is queued by now, and the close's free waits
  // behind it for the window; either way Close returns after the free.
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_OK(closing->Close());
  const int64_t used = server_->pool().Stats().used_pages;
  waiting.join();
  EXPECT_TRUE(used == 0 || used == 1) << used << " pages in use";
  EXPECT_EQ(server_->pool().Stats().used_pages, 1);
}

TEST_F(ServiceTest, ExpiredLeaseReclaimsPagesAndTheClientSeesIt) {
  StartServer(64, 4, /*lease=*/absl::Milliseconds(200));
  // A raw session that never sends KeepAlive.
  v1::RegisterRequest request;
  request.set_client_name("silent");
  v1::RegisterResponse registered;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->Register(&context, request, &registered).ok());
  v1::AllocRequest alloc;
  alloc.mutable_session()->set_session_id(registered.session_id());
  alloc.mutable_session()->set_session_token(registered.session_token());
  alloc.add_num_tokens(8);
  alloc.mutable_options()->set_return_inline(true);
  v1::AllocResponse allocated;
  grpc::ClientContext alloc_context;
  ASSERT_TRUE(stub_->Alloc(&alloc_context, alloc, &allocated).ok());
  // A client with KeepAlive outlives the lease many times over.
  auto kept = Connect("kept");
  ASSERT_OK_AND_ASSIGN(Allocation k, kept->Alloc({4}));
  EXPECT_EQ(server_->pool().Stats().used_pages, 3);
  const absl::Time start = absl::Now();
  WaitFor([&] { return server_->pool().Stats().used_pages == 1; },
          absl::Seconds(10));
  EXPECT_EQ(server_->pool().Stats().used_pages, 1);
  // Four leases at least, so that "kept" has had to renew its own.
  absl::SleepFor(start + absl::Milliseconds(800) - absl::Now());
  EXPECT_EQ(server_->server().core().counters().pages_reclaimed, 2);
  grpc::ClientContext late_context;
  EXPECT_THAT(FromGrpcStatus(stub_->Alloc(&late_context, alloc, &allocated)),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("unknown or has expired")));
  EXPECT_OK(kept->session_status());
  EXPECT_OK(kept->Alloc({4}).status());
}

// One request's answer, from either form of AllocResponse.
struct FlatResult {
  int code = 0;
  std::string message;
  int64_t ring_offset = 0;
  int64_t count = 0;
  int64_t new_pages = 0;
  std::vector<int64_t> slots;
  bool operator==(const FlatResult& o) const {
    return std::tie(code, message, ring_offset, count, new_pages, slots) ==
           std::tie(o.code, o.message, o.ring_offset, o.count, o.new_pages,
                    o.slots);
  }
};

std::vector<FlatResult> Flatten(const v1::AllocResponse& response) {
  std::vector<FlatResult> flat;
  for (const v1::RequestResult& r : response.results()) {
    flat.push_back({r.code(),
                    r.message(),
                    r.ring_offset(),
                    r.count(),
                    r.new_pages(),
                    {r.slots().begin(), r.slots().end()}});
  }
  const v1::PackedResults& p = response.packed();
  int message = 0;
  int64_t slot = 0;
  for (int i = 0; i < p.codes_size(); ++i) {
    FlatResult r{p.codes(i),     "", p.ring_offsets(i), p.counts(i),
                 p.new_pages(i), {}};
    if (r.code != 0) r.message = p.messages(message++);
    if (r.code == 0 && p.slots_size() > 0) {
      r.slots.assign(p.slots().begin() + slot,
                     p.slots().begin() + slot + r.count);
      slot += r.count;
    }
    flat.push_back(r);
  }
  EXPECT_EQ(message, p.messages_size());
  EXPECT_EQ(slot, p.slots_size());
  return flat;
}

TEST_F(ServiceTest, PackedResultsCarryTheSameAnswers) {
  // The same calls on two fresh daemons, one form each: a ring call and an
  // inline call, each with a request refused in the middle.
  std::vector<std::vector<FlatResult>> answers[2];
  for (bool packed : {false, true}) {
    StartServer(16, 4);
    v1::RegisterRequest registration;
    v1::RegisterResponse registered;
    grpc::ClientContext register_context;
    ASSERT_TRUE(
        stub_->Register(&register_context, registration, &registered).ok());
    for (bool return_inline : {false, true}) {
      v1::AllocExtendRequest request;
      request.mutable_session()->set_session_id(registered.session_id());
      request.mutable_session()->set_session_token(registered.session_token());
      for (int64_t seq_len : {6, 60, 3}) {
        request.add_prefix_lens(0);
        request.add_seq_lens(seq_len);
        request.add_last_locs(-1);
      }
      request.mutable_options()->set_return_inline(return_inline);
      request.mutable_options()->set_packed_results(packed);
      v1::AllocResponse response;
      grpc::ClientContext context;
      ASSERT_OK(
          FromGrpcStatus(stub_->AllocExtend(&context, request, &response)));
      EXPECT_EQ(response.results_size(), packed ? 0 : 3);
      EXPECT_EQ(response.packed().codes_size(), packed ? 3 : 0);
      answers[packed].push_back(Flatten(response));
    }
    StopServer();
  }
  ASSERT_EQ(answers[0].size(), 2u);
  EXPECT_EQ(answers[0], answers[1]);
  for (const std::vector<FlatResult>& call : answers[1]) {
    ASSERT_EQ(call.size(), 3u);
    EXPECT_EQ(call[0].code, 0);
    EXPECT_EQ(call[0].count, 6);
    EXPECT_EQ(call[1].code,
              static_cast<int>(absl::StatusCode::kResourceExhausted));
    EXPECT_THAT(call[1].message, HasSubstr("request 1"));
    EXPECT_EQ(call[1].count, 0);
    EXPECT_EQ(call[2].code, 0);
    EXPECT_EQ(call[2].count, 3);
  }
  // Ring offsets are the requests' places in the ring (the refused one
  // keeps its place); inline slots are the pages' token slots.
  EXPECT_EQ(answers[1][0][0].ring_offset, 0);
  EXPECT_EQ(answers[1][0][2].ring_offset, 6 + 60);
  EXPECT_EQ(answers[1][1][0].slots.size(), 6u);
  EXPECT_EQ(answers[1][1][2].slots.size(), 3u);
}

TEST_F(ServiceTest, ConcurrentSessionsShareOneLaunch) {
  // A long batch window, waited out whole, makes the batcher wait for both
  // calls (min_batch_calls would stop it at the first: one active session).
  StartServer(64, 4, absl::Seconds(10), absl::Seconds(1));
  auto alice = Connect("alice");
  auto bob = Connect("bob");
  absl::StatusOr<Allocation> a, b;
  std::thread ta([&] { a = alice->Alloc({4, 4}); });
  std::thread tb([&] { b = bob->Alloc({4}); });
  ta.join();
  tb.join();
  ASSERT_OK(a.status());
  ASSERT_OK(b.status());
  EXPECT_EQ(a->batch_requests(), 3);
  EXPECT_EQ(b->batch_requests(), 3);
  // One launch, one completion value for both.
  EXPECT_EQ(a->completion_value(), b->completion_value());
  EXPECT_NE(a->completion_value(), 0u);
}

// Every answer carries the pool's completion counter after its launch,
// through gRPC and through the fast channel alike: each launch that wrote
// slots takes the next value, and a call that launched nothing carries the
// last one. (On the CPU backend nothing waits on it; OrderAfter is a
// no-op. The CUDA backend's counter is checked on the GPU by
// //tests/gpu:completion_counter_test.)
TEST_F(ServiceTest, AnswersCarryTheCompletionValueOfTheirLaunch) {
  StartServer(64, 4);
  for (const bool fast : {false, true}) {
    SCOPED_TRACE(fast ? "fast channel" : "gRPC");
    ClientOptions options;
    options.client_name = "counter";
    options.ring_capacity_slots = 1024;
    options.fast_channel = fast;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                         server_->Connect(options));
    ASSERT_EQ(client->uses_fast_channel(), fast);
    ASSERT_OK_AND_ASSIGN(Allocation first, client->Alloc({4}));
    ASSERT_OK(first.status());
    const uint64_t base = first.completion_value();
    EXPECT_GE(base, 1u);
    CallOptions async;
    async.async_completion = true;
    ASSERT_OK_AND_ASSIGN(Allocation second, client->Alloc({8}, async));
    ASSERT_OK(second.status());
    EXPECT_EQ(second.completion_value(), base + 1);
    ASSERT_OK_AND_ASSIGN(Allocation decode,
                         client->AllocDecode({5}, {first[0].slots[3]}));
    ASSERT_OK(decode.status());
    EXPECT_EQ(decode.completion_value(), base + 2);
    // Refused (62 pages; 4 of the 64 are taken): nothing launched.
    ASSERT_OK_AND_ASSIGN(Allocation refused, client->Alloc({4 * 62}));
    EXPECT_THAT(refused.status(), StatusIs(absl::StatusCode::kResourceExhausted,
                                           HasSubstr("out of pages")));
    EXPECT_EQ(refused.completion_value(), base + 2);
    EXPECT_OK(client->OrderAfter(second, nullptr));
    EXPECT_OK(client->OrderAfterCompletion(nullptr));
    ASSERT_OK(client->Close());
  }
}

TEST_F(ServiceTest, DrainingRefusesNewCalls) {
  StartServer(64, 4);
  auto client = Connect();
  server_->server().core().StartDraining();
  EXPECT_THAT(client->Alloc({4}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("draining")));
  v1::RegisterRequest request;
  v1::RegisterResponse response;
  grpc::ClientContext context;
  EXPECT_THAT(FromGrpcStatus(stub_->Register(&context, request, &response)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("draining")));
}

}  // namespace
}  // namespace pagealloc
