// Resumable sessions, Resume and the client's reconnect against a real
// daemon in this process (over its Unix socket and memory socket): a
// detached resumable session is taken back with its pages and checkpoints;
// every hostile Resume is refused with its code and changes nothing; a
// take-over tells the old client and its old channel answers no more; a
// client whose daemon severed its memory socket (as a daemon restarted with
// its state would) reconnects, keeps its KV slab and its old slots, and
// one without reconnect ends as today; a fenced free and a page reserve
// from before a reconnect carry on over the new link; a client that
// resumes onto another pool or another KV slab ends its session.

#include <poll.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/page_reserve.h"
#include "common/grpc_status.h"
#include "fast_channel/layout.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "memory/kv_layout.h"
#include "memory/memory_socket.h"
#include "memory/shared_region.h"
#include "proto/pagealloc.grpc.pb.h"
#include "server/server.h"
#include "tests/daemon_stats.h"
#include "tests/in_process_server.h"
#include "tests/raw_session.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kPageSize = 4;

// The session's line in the daemon's stats (a default one when absent).
v1::SessionStats StatsOf(const v1::GetStatsResponse& stats, uint64_t id) {
  for (const v1::SessionStats& session : stats.sessions()) {
    if (session.session_id() == id) return session;
  }
  return v1::SessionStats();
}

bool HasSession(const v1::GetStatsResponse& stats, uint64_t id) {
  return StatsOf(stats, id).session_id() == id;
}

// The distinct pages of an inline allocation's slots.
std::vector<int64_t> PagesOf(const Allocation& allocation) {
  std::vector<int64_t> pages;
  for (size_t i = 0; i < allocation.size(); ++i) {
    for (int64_t s = 0; s < allocation[i].count; s += kPageSize) {
      pages.push_back(allocation[i].slots[s] / kPageSize);
    }
  }
  return pages;
}

CallOptions Inline() {
  CallOptions options;
  options.return_inline = true;
  return options;
}

class ResumeTest : public ::testing::Test {
 protected:
  void StartServer(ServerOptions options = CpuTestOptions(32, kPageSize)) {
    absl::StatusOr<std::unique_ptr<InProcessServer>> started =
        InProcessServer::Start(std::move(options));
    ASSERT_OK(started.status());
    server_ = *std::move(started);
    stub_ = v1::PageAllocator::NewStub(grpc::CreateChannel(
        server_->target(), grpc::InsecureChannelCredentials()));
  }

  // Client options over the server's Unix socket (so that a Resume dials
  // it as a restarted scheduler would).
  ClientOptions Options(const std::string& name, bool resumable = false) {
    ClientOptions options;
    options.target = server_->target();
    options.client_name = name;
    options.resumable = resumable;
    options.call_timeout = absl::Seconds(20);
    return options;
  }

  std::unique_ptr<Client> Connect(const ClientOptions& options) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_OK(client.status());
    return client.ok() ? *std::move(client) : nullptr;
  }

  // A raw Resume over gRPC, and its answer.
  absl::Status RawResume(uint64_t id, const std::string& token,
                         bool take_over = false, int64_t ring_slots = 0,
                         const std::string& secret = "") {
    v1::ResumeRequest request;
    request.mutable_session()->set_session_id(id);
    request.mutable_session()->set_session_token(token);
    request.set_take_over(take_over);
    request.set_ring_capacity_slots(ring_slots);
    request.set_register_secret(secret);
    v1::RegisterResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return FromGrpcStatus(stub_->Resume(&context, request, &response));
  }

  v1::GetStatsResponse Stats() {
    absl::StatusOr<v1::GetStatsResponse> stats = DaemonStats(server_->target());
    EXPECT_OK(stats.status());
    return stats.ok() ? *stats : v1::GetStatsResponse();
  }

  // The reserve the session's client reports on its fast channel.
  int64_t ReservePagesReported(uint64_t session_id) {
    for (const auto& reserve :
         server_->server().fast_channels()->SessionReserves()) {
      if (reserve.session_id == session_id) return reserve.pages;
    }
    return -1;
  }

  int64_t Resumes(ResumeOutcome outcome) {
    return server_->server().core().counters().resumes[static_cast<int>(
        outcome)];
  }

  void TearDown() override {
    stub_.reset();
    server_.reset();
  }

  std::unique_ptr<InProcessServer> server_;
  std::unique_ptr<v1::PageAllocator::Stub> stub_;
};

// A resumable session whose client lets go (Detach: its memory socket
// connection closes, as at its process's death) keeps its pages and its
// checkpoint; Resume from another client takes them back, with a fresh ring.
TEST_F(ResumeTest, ADetachedResumableSessionIsTakenBackWithItsPages) {
  StartServer();
  std::unique_ptr<Client> first = Connect(Options("first", true));
  ASSERT_NE(first, nullptr);
  EXPECT_TRUE(first->resumable());
  ASSERT_OK_AND_ASSIGN(Allocation held, first->Alloc({12}, Inline()));
  ASSERT_OK(held.status());
  const std::vector<int64_t> pages = PagesOf(held);
  ASSERT_EQ(pages.size(), 3u);
  ASSERT_OK_AND_ASSIGN(const uint64_t checkpoint, first->CheckpointId());
  ASSERT_OK_AND_ASSIGN(Allocation speculated, first->Alloc({4}, Inline()));
  ASSERT_OK(speculated.status());
  const uint64_t id = first->session_id();
  const std::string token = first->session_token();

  ASSERT_OK(first->Detach());
  EXPECT_THAT(first->Alloc({4}), StatusIs(absl::StatusCode::kFailedPrecondition,
                                          HasSubstr("detached")));
  first.reset();  // leaves the session alone
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse kept,
                       WaitForStats(
                           server_->target(),
                           [&](const v1::GetStatsResponse& s) {
                             return HasSession(s, id) &&
                                    !StatsOf(s, id).connected();
                           },
                           absl::Seconds(10)));
  EXPECT_EQ(StatsOf(kept, id).pages_owned(), 4);
  EXPECT_EQ(StatsOf(kept, id).checkpoints(), 1);
  EXPECT_TRUE(StatsOf(kept, id).resumable());
  EXPECT_FALSE(StatsOf(kept, id).connected());
  EXPECT_EQ(server_->server().core().counters().sessions_detached, 1);
  // Its memory went to the connection that closed: a bare Hello (no
  // Resume) is refused and hands nothing over.
  EXPECT_THAT(
      memory_socket::ReceiveSessionMemory(
          server_->server().memory_socket_path(), id, token, absl::Seconds(10)),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("Resume the session")));

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> second,
                       Client::Resume(Options("second"), id, token));
  EXPECT_EQ(second->session_id(), id);
  EXPECT_TRUE(second->resumable());
  EXPECT_EQ(Resumes(ResumeOutcome::kResumed), 1);
  v1::SessionStats resumed = StatsOf(Stats(), id);
  EXPECT_TRUE(resumed.connected());
  EXPECT_EQ(resumed.pages_owned(), 4);
  EXPECT_EQ(resumed.client_name(), "first");  // the session's own
  // The checkpoint survived: rolling back returns the page given since.
  EXPECT_THAT(second->Rollback(checkpoint), IsOkAndHolds(1));
  EXPECT_THAT(second->FreePages(pages), IsOkAndHolds(3));
  EXPECT_EQ(Stats().used_pages(), 0);
  // The fresh ring serves ring results.
  ASSERT_OK_AND_ASSIGN(Allocation fresh, second->Alloc({8}));
  ASSERT_OK(fresh.status());
  std::vector<int64_t> slots(8);
  ASSERT_OK(second->CopyToHost(fresh[0].slots, 8, slots.data()));
  EXPECT_THAT(second->FreeSlots(slots), IsOkAndHolds(2));
  EXPECT_OK(second->Close());
  EXPECT_EQ(Stats().sessions_active(), 0);
}

// Every hostile Resume is refused with its code and message, and changes
// nothing: the session it named still holds its connection and pages, and
// other sessions are untouched.
TEST_F(ResumeTest, HostileResumesAreRefusedAndChangeNothing) {
  StartServer();
  std::unique_ptr<Client> owner = Connect(Options("owner", true));
  std::unique_ptr<Client> bystander = Connect(Options("bystander"));
  ASSERT_NE(owner, nullptr);
  ASSERT_NE(bystander, nullptr);
  ASSERT_OK(owner->Alloc({8}, Inline()).status());
  ASSERT_OK(bystander->Alloc({4}, Inline()).status());
  const uint64_t id = owner->session_id();
  std::string wrong = owner->session_token();
  wrong[0] ^= 1;
  // A session that was not resumable goes with its connection.
  RawSession raw = OpenRawSession(*stub_, "raw");
  ASSERT_NE(raw.region, nullptr);
  const uint64_t raw_id = raw.id();
  raw.memory.connection.reset();
  ASSERT_OK_AND_ASSIGN(
      v1::GetStatsResponse reclaimed,
      WaitForStats(
          server_->target(),
          [&](const v1::GetStatsResponse& s) { return !HasSession(s, raw_id); },
          absl::Seconds(10)));
  ASSERT_FALSE(HasSession(reclaimed, raw_id));

  struct Case {
    std::string name;
    uint64_t id;
    std::string token;
    bool take_over;
    int64_t ring_slots;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"unknown id", id + 7777, owner->session_token(), false, 0,
       absl::StatusCode::kNotFound, "is unknown or has expired"},
      {"reclaimed, not resumable", raw_id, raw.registered.session_token(), true,
       0, absl::StatusCode::kNotFound, "is unknown or has expired"},
      {"wrong token", id, wrong, true, 0, absl::StatusCode::kUnauthenticated,
       absl::StrFormat("wrong session_token for session %d", id)},
      {"no token", id, "", true, 0, absl::StatusCode::kUnauthenticated,
       "wrong session_token"},
      {"still connected", id, owner->session_token(), false, 0,
       absl::StatusCode::kFailedPrecondition,
       absl::StrFormat("session %d is still connected", id)},
      {"ring too large", id, owner->session_token(), true, int64_t{1} << 40,
       absl::StatusCode::kInvalidArgument, "ring_capacity_slots"},
      {"negative ring", id, owner->session_token(), true, -1,
       absl::StatusCode::kInvalidArgument, "ring_capacity_slots (-1)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(RawResume(c.id, c.token, c.take_over, c.ring_slots),
                StatusIs(c.code, HasSubstr(c.message)));
    const v1::GetStatsResponse stats = Stats();
    EXPECT_EQ(stats.sessions_active(), 2);
    EXPECT_EQ(stats.used_pages(), 3);
    EXPECT_TRUE(StatsOf(stats, id).connected());
    EXPECT_EQ(StatsOf(stats, id).pages_owned(), 2);
    EXPECT_OK(owner->session_status());
  }
  // Both clients work on as before.
  ASSERT_OK_AND_ASSIGN(Allocation more, owner->Alloc({4}));
  EXPECT_OK(more.status());
  EXPECT_OK(bystander->Alloc({4}, Inline()).status());
  EXPECT_EQ(Resumes(ResumeOutcome::kNotFound), 2);
  EXPECT_EQ(Resumes(ResumeOutcome::kUnauthenticated), 2);
  EXPECT_EQ(Resumes(ResumeOutcome::kStillConnected), 1);
  EXPECT_EQ(Resumes(ResumeOutcome::kRefused), 2);
  EXPECT_EQ(Resumes(ResumeOutcome::kResumed), 0);
  EXPECT_EQ(Resumes(ResumeOutcome::kTakenOver), 0);
  EXPECT_EQ(server_->server().core().rpc_metrics().count(
                Method::kResume, Transport::kGrpc,
                absl::StatusCode::kFailedPrecondition),
            1);
}

// A pool with a Register secret asks it of Resume too.
TEST_F(ResumeTest, ResumeNeedsThePoolsRegisterSecret) {
  ServerOptions options = CpuTestOptions(32, kPageSize);
  options.register_secret = "pool-secret";
  StartServer(options);
  ClientOptions with_secret = Options("kept", true);
  with_secret.register_secret = "pool-secret";
  std::unique_ptr<Client> first = Connect(with_secret);
  ASSERT_NE(first, nullptr);
  const uint64_t id = first->session_id();
  const std::string token = first->session_token();
  ASSERT_OK(first->Detach());
  ClientOptions without = Options("thief");
  EXPECT_THAT(Client::Resume(without, id, token),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("wrong or missing register_secret")));
  EXPECT_THAT(Client::Resume(with_secret, id, token), IsOk());
}

// take_over takes a session from the client that holds it: that client is
// told (ABORTED), fails its calls, and its end (its connection's close, its
// destructor) ends nothing of the session now held by the other.
TEST_F(ResumeTest, TakeOverTellsTheOldClientAndLeavesTheNewOneTheSession) {
  StartServer();
  std::unique_ptr<Client> old_client = Connect(Options("old"));
  ASSERT_NE(old_client, nullptr);
  ASSERT_OK_AND_ASSIGN(Allocation held, old_client->Alloc({8}, Inline()));
  const std::vector<int64_t> pages = PagesOf(held);
  const uint64_t id = old_client->session_id();
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Client> new_client,
      Client::Resume(Options("new"), id, old_client->session_token(),
                     /*take_over=*/true));
  EXPECT_FALSE(new_client->resumable());
  ASSERT_TRUE(WaitFor([&] { return !old_client->session_status().ok(); },
                      absl::Seconds(10)));
  EXPECT_THAT(
      old_client->session_status(),
      StatusIs(absl::StatusCode::kAborted,
               HasSubstr(absl::StrFormat(
                   "session %d was taken over by another process", id))));
  EXPECT_THAT(old_client->Alloc({4}),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("taken over")));
  old_client.reset();
  EXPECT_THAT(new_client->FreePages(pages), IsOkAndHolds(2));
  ASSERT_OK_AND_ASSIGN(Allocation fresh, new_client->Alloc({4}));
  EXPECT_OK(fresh.status());
  const v1::GetStatsResponse stats = Stats();
  EXPECT_EQ(stats.sessions_active(), 1);
  EXPECT_TRUE(StatsOf(stats, id).connected());
  EXPECT_EQ(StatsOf(stats, id).pages_owned(), 1);
  EXPECT_EQ(Resumes(ResumeOutcome::kTakenOver), 1);
}

// The old process of a take-over may go on writing its old fast channel:
// the channel is retired (its session_ended word set) and nothing it posts
// is taken.
TEST_F(ResumeTest, ATakenOverFastChannelAnswersNoMore) {
  StartServer();
  RawSession raw = OpenRawSession(*stub_, "raw");
  ASSERT_NE(raw.region, nullptr);
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Client> taker,
      Client::Resume(Options("taker"), raw.id(), raw.registered.session_token(),
                     /*take_over=*/true));
  ASSERT_TRUE(WaitFor([&] { return raw.header->session_ended.load() != 0; },
                      absl::Seconds(10)));
  raw.WriteAlloc(2, 4);
  raw.Post();
  // Nothing answers a retired channel: the wait ends at its bound.
  EXPECT_FALSE(raw.Await(absl::Milliseconds(300)));
  EXPECT_EQ(Stats().used_pages(), 0);
  EXPECT_TRUE(taker->uses_fast_channel());
  ASSERT_OK_AND_ASSIGN(Allocation allocation, taker->Alloc({8}));
  EXPECT_OK(allocation.status());
  EXPECT_EQ(Stats().used_pages(), 2);
}

// A daemon restarted with its state would drop every memory socket
// connection and keep the sessions; SeverConnections does just that. A
// client with a reconnect timeout Resumes, maps a new ring and fast
// channel, and keeps its KV slab (the same slab_id) and its old ring's
// mapping.
TEST_F(ResumeTest, AReconnectKeepsTheSessionItsSlabAndItsSlots) {
  ServerOptions options = CpuTestOptions(32, kPageSize);
  options.kv.layout = *ParseKvLayout(
      "mha:layers=1,kv_heads=1,head_dim=8,"
      "dtype=bf16");
  StartServer(options);
  ClientOptions reconnecting = Options("reconnects");
  reconnecting.reconnect_timeout = absl::Seconds(20);
  reconnecting.reconnect_initial_backoff = absl::Milliseconds(5);
  reconnecting.reconnect_max_backoff = absl::Milliseconds(100);
  std::unique_ptr<Client> client = Connect(reconnecting);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->reconnect_timeout(), absl::Seconds(20));
  ASSERT_TRUE(client->uses_fast_channel());
  const KvSlabView* slab = client->kv_slab();
  ASSERT_NE(slab, nullptr);
  EXPECT_NE(client->pool().kv_slab().slab_id(), 0u);
  ASSERT_OK_AND_ASSIGN(Allocation before, client->Alloc({8}));
  ASSERT_OK(before.status());
  std::vector<int64_t> slots(8);
  ASSERT_OK(client->CopyToHost(before[0].slots, 8, slots.data()));
  const int64_t* old_ring = client->ring_slots();

  server_->server().memory_socket()->SeverConnections();
  ASSERT_TRUE(
      WaitFor([&] { return client->link_epoch() == 1; }, absl::Seconds(20)))
      << client->session_status();
  EXPECT_OK(client->session_status());
  EXPECT_FALSE(client->reconnecting());
  EXPECT_EQ(client->kv_slab(), slab);
  EXPECT_NE(client->ring_slots(), old_ring);
  EXPECT_TRUE(client->uses_fast_channel());
  EXPECT_EQ(Resumes(ResumeOutcome::kResumed), 1);
  // The slots from before stay mapped in the old ring, which has nothing
  // left to release. This daemon is alive: at the Resume it let the old
  // ring go (as at a session's end, MADV_REMOVE), so they read zeros now;
  // a daemon that died cannot, and they keep what it wrote
  // (resume_process_test).
  EXPECT_EQ(before.link_epoch(), 0u);
  std::vector<int64_t> again(8, -1);
  ASSERT_OK(client->CopyToHost(before[0].slots, 8, again.data()));
  EXPECT_EQ(again, std::vector<int64_t>(8, 0));
  client->Release(before);
  ASSERT_OK_AND_ASSIGN(Allocation after, client->Alloc({4}));
  ASSERT_OK(after.status());
  EXPECT_EQ(after.link_epoch(), 1u);
  std::vector<int64_t> new_slots(4);
  ASSERT_OK(client->CopyToHost(after[0].slots, 4, new_slots.data()));
  EXPECT_THAT(client->FreeSlots(slots), IsOkAndHolds(2));
  EXPECT_THAT(client->FreeSlots(new_slots), IsOkAndHolds(1));
  EXPECT_EQ(Stats().used_pages(), 0);
  EXPECT_TRUE(StatsOf(Stats(), client->session_id()).connected());
}

// An allocation's status, whether the call or the allocation carries it.
absl::Status AllocStatus(Client& client, int64_t tokens) {
  absl::StatusOr<Allocation> allocation = client.Alloc({tokens}, Inline());
  return allocation.ok() ? allocation->status() : allocation.status();
}

// A client that reconnects after its daemon severed its memory socket.
ClientOptions Reconnecting(ClientOptions options) {
  options.reconnect_timeout = absl::Seconds(20);
  options.reconnect_initial_backoff = absl::Milliseconds(5);
  options.reconnect_max_backoff = absl::Milliseconds(100);
  return options;
}

// A release value handed out before a reconnect fences a free sent after
// it: the new link's word starts where the old one had passed, so the
// free is released (not held back until the new word counts up to it),
// and values go on counting.
TEST_F(ResumeTest, AFencedFreeFromBeforeAReconnectIsReleasedOnTheNewLink) {
  StartServer();
  std::unique_ptr<Client> client = Connect(Reconnecting(Options("fenced")));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->uses_fast_channel());
  ASSERT_OK_AND_ASSIGN(Allocation allocated,
                       client->Alloc({3 * kPageSize}, Inline()));
  ASSERT_OK(allocated.status());
  const std::vector<int64_t> pages = PagesOf(allocated);
  ASSERT_EQ(pages.size(), 3u);
  // Several values, so that the old word is well past the new one's start.
  uint64_t value = 0;
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK_AND_ASSIGN(value, client->QueueRelease(nullptr));
  }
  EXPECT_EQ(value, 5u);

  server_->server().memory_socket()->SeverConnections();
  ASSERT_TRUE(
      WaitFor([&] { return client->link_epoch() == 1; }, absl::Seconds(20)))
      << client->session_status();
  EXPECT_THAT(client->FreePagesAfter(pages, value), IsOkAndHolds(3));
  // Released by the daemon's next look at the word, with no later value.
  EXPECT_TRUE(
      WaitFor([&] { return Stats().used_pages() == 0; }, absl::Seconds(20)))
      << Stats().used_pages() << " pages still held";
  EXPECT_THAT(client->QueueRelease(nullptr), IsOkAndHolds(6u));
}

// A page reserve lives across its client's reconnect: its pages are still
// the session's, it reports itself on the new channel, and it answers the
// daemon's asks there, which count from 0 again (an ask whose number the
// reserve answered on the old channel is a new ask).
TEST_F(ResumeTest, APageReserveAnswersAsksOnTheNewLink) {
  StartServer();
  std::unique_ptr<Client> rich = Connect(Reconnecting(Options("rich")));
  ASSERT_NE(rich, nullptr);
  ASSERT_TRUE(rich->uses_fast_channel());
  PageReserveOptions options;
  options.initial_batch = 8;
  options.max_pages = 8;
  options.background = false;
  options.starved_wait = absl::ZeroDuration();
  ASSERT_OK_AND_ASSIGN(auto reserve, PageReserve::Create(rich.get(), options));
  ASSERT_OK(reserve->Maintain());
  ASSERT_EQ(reserve->stats().pages, 8);

  // Another session starves: the daemon asks, the reserve answers (ask 1).
  std::unique_ptr<Client> poor = Connect(Options("poor"));
  ASSERT_NE(poor, nullptr);
  EXPECT_EQ(AllocStatus(*poor, 26 * kPageSize).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_OK(reserve->Maintain());
  EXPECT_EQ(reserve->stats().reclaims, 1);
  const int64_t kept = reserve->stats().pages;
  ASSERT_GT(kept, 0);
  poor.reset();

  server_->server().memory_socket()->SeverConnections();
  ASSERT_TRUE(
      WaitFor([&] { return rich->link_epoch() == 1; }, absl::Seconds(20)))
      << rich->session_status();
  ASSERT_OK(reserve->Maintain());
  EXPECT_EQ(reserve->stats().pages, kept);
  EXPECT_EQ(StatsOf(Stats(), rich->session_id()).pages_owned(), kept);
  EXPECT_EQ(ReservePagesReported(rich->session_id()), kept);

  // Ask 1 of the new channel.
  std::unique_ptr<Client> starving = Connect(Options("starving"));
  ASSERT_NE(starving, nullptr);
  EXPECT_EQ(AllocStatus(*starving, (32 - kept + 1) * kPageSize).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_OK(reserve->Maintain());
  EXPECT_EQ(reserve->stats().reclaims, 2);
  EXPECT_LT(reserve->stats().pages, kept);

  std::vector<int64_t> taken;
  ASSERT_OK(reserve->Take(1, &taken));
  reserve.reset();  // returns the rest
  EXPECT_EQ(StatsOf(Stats(), rich->session_id()).pages_owned(), 1);
  EXPECT_THAT(rich->FreePages(taken, nullptr), IsOkAndHolds(1));
  EXPECT_TRUE(
      WaitFor([&] { return Stats().used_pages() == 0; }, absl::Seconds(20)));
}

// A daemon on the client's socket that takes its Resume but describes
// another pool than the one the client mapped: a misconfigured or lying
// successor, which no daemon of ours is (a kept state either comes with
// its slab or is dropped with every session). It answers with `pool` and
// records the session a KeepAlive closes.
class ForeignPoolService final : public v1::PageAllocator::Service {
 public:
  explicit ForeignPoolService(v1::PoolInfo pool) : pool_(std::move(pool)) {}

  grpc::Status Resume(grpc::ServerContext* context,
                      const v1::ResumeRequest* request,
                      v1::RegisterResponse* response) override {
    response->set_session_id(request->session().session_id());
    response->set_session_token(request->session().session_token());
    *response->mutable_pool() = pool_;
    response->set_resumed(true);
    response->set_lease_ms(30000);
    return grpc::Status::OK;
  }

  grpc::Status KeepAlive(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::KeepAliveResponse, v1::KeepAliveRequest>*
          stream) override {
    v1::KeepAliveRequest request;
    while (stream->Read(&request)) {
      if (request.close()) {
        absl::MutexLock lock(&mu_);
        closed_.push_back(request.session());
      }
    }
    return grpc::Status::OK;
  }

  std::vector<v1::SessionRef> closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  const v1::PoolInfo pool_;
  absl::Mutex mu_;
  std::vector<v1::SessionRef> closed_ ABSL_GUARDED_BY(mu_);
};

// What the foreign daemon's pool differs in, and what the client says.
struct ForeignPool {
  const char* name;
  void (*change)(v1::PoolInfo&);
  const char* says;
};

void PrintTo(const ForeignPool& pool, std::ostream* os) { *os << pool.name; }

class ForeignPoolTest : public ResumeTest,
                        public ::testing::WithParamInterface<ForeignPool> {};

// A client that resumes its session on a daemon whose pool or KV slab is
// not the one it mapped holds slots that mean nothing there: the session
// ends with DATA_LOSS saying what differs, the client closes it on that
// daemon (so that its pages go back), and later calls fail with the same
// status rather than write KV into memory nobody else reads.
TEST_P(ForeignPoolTest, AResumeOntoAnotherPoolEndsTheSession) {
  ServerOptions options = CpuTestOptions(32, kPageSize);
  options.kv.layout = *ParseKvLayout(
      "mha:layers=1,kv_heads=1,head_dim=8,"
      "dtype=bf16");
  // A kept state makes a stop a restart to the sessions: their memory
  // socket closes without a word and their clients reconnect.
  options.keep_state.enabled = true;
  StartServer(options);
  std::unique_ptr<Client> client = Connect(Reconnecting(Options("foreign")));
  ASSERT_NE(client, nullptr);
  ASSERT_NE(client->kv_slab(), nullptr);
  ASSERT_OK_AND_ASSIGN(Allocation allocated, client->Alloc({8}, Inline()));
  ASSERT_OK(allocated.status());
  const uint64_t session_id = client->session_id();
  v1::PoolInfo foreign = client->pool();
  GetParam().change(foreign);

  const std::string target = server_->target();
  stub_.reset();
  server_->Stop();
  // The successor listens where the daemon did; the client's Resumes
  // reach it once it does.
  ForeignPoolService service(foreign);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(target, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> successor = builder.BuildAndStart();
  ASSERT_NE(successor, nullptr);

  ASSERT_TRUE(WaitFor([&] { return !client->session_status().ok(); },
                      absl::Seconds(20)));
  EXPECT_THAT(client->session_status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(GetParam().says),
                             HasSubstr("the client closed it"))));
  EXPECT_FALSE(client->reconnecting());
  EXPECT_EQ(client->link_epoch(), 0u);
  ASSERT_TRUE(
      WaitFor([&] { return !service.closed().empty(); }, absl::Seconds(10)));
  const std::vector<v1::SessionRef> closed = service.closed();
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].session_id(), session_id);
  EXPECT_EQ(closed[0].session_token(), client->session_token());
  EXPECT_THAT(client->Alloc({4}), StatusIs(absl::StatusCode::kDataLoss,
                                           HasSubstr(GetParam().says)));
  client.reset();
  successor->Shutdown();
}

INSTANTIATE_TEST_SUITE_P(
    WhatDiffers, ForeignPoolTest,
    ::testing::Values(ForeignPool{"AnotherSlab",
                                  [](v1::PoolInfo& pool) {
                                    pool.mutable_kv_slab()->set_slab_id(
                                        pool.kv_slab().slab_id() ^ 1);
                                  },
                                  "is not the memory this client mapped"},
                      ForeignPool{"AnotherPool",
                                  [](v1::PoolInfo& pool) {
                                    pool.set_num_pages(pool.num_pages() * 2);
                                  },
                                  "serves another pool"}),
    [](const ::testing::TestParamInfo<ForeignPool>& info) {
      return std::string(info.param.name);
    });

// A stop that keeps the sessions waits (--stop_release_wait_ms) for the
// frees pending on their release fence: pages whose fence passes while the
// daemon stops are freed before it exits, so the kept state has them free;
// pages whose fence never passes stay their session's.
class StopReleaseWaitTest : public ResumeTest,
                            public ::testing::WithParamInterface<bool> {};

TEST_P(StopReleaseWaitTest, AStopFreesThePagesWhoseFencePassesMeanwhile) {
  const bool fence_passes = GetParam();
  ServerOptions options = CpuTestOptions(32, kPageSize);
  options.keep_state.enabled = true;
  // Long enough that the fence passes within it however slow the host; a
  // fence that never passes is waited for only briefly.
  options.keep_state.release_wait =
      fence_passes ? absl::Seconds(60) : absl::Milliseconds(50);
  StartServer(options);
  RawSession raw = OpenRawSession(*stub_, "fenced");
  ASSERT_NE(raw.header, nullptr);
  const std::vector<int64_t> pages = RawAllocPages(*stub_, raw, 3, kPageSize);
  ASSERT_EQ(pages.size(), 3u);
  ASSERT_OK(FencedFree(*stub_, raw, pages, 1));
  CallCore& core = server_->server().core();
  EXPECT_EQ(core.release_pending_pages(), 3);

  std::thread stopper([this] { server_->Stop(); });
  // The stop severs the session's connection, then waits for its fence.
  pollfd severed = {raw.memory.connection.get(), POLLIN, 0};
  ASSERT_EQ(poll(&severed, 1, 60000), 1);
  if (fence_passes) {
    // What the session's stream writes once its work on the pages is done.
    raw.header->release_word.store(1, std::memory_order_release);
  }
  stopper.join();

  absl::StatusOr<PagePool::OwnedPages> held =
      server_->pool().PagesOwnedBy(raw.id());
  ASSERT_OK(held.status());
  EXPECT_EQ(held->owned.size(), fence_passes ? 0u : 3u);
  EXPECT_EQ(core.release_pending_pages(), fence_passes ? 0 : 3);
  EXPECT_EQ(core.pages_released(), fence_passes ? 3 : 0);
}

INSTANTIATE_TEST_SUITE_P(FencePassesOrNot, StopReleaseWaitTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Passes" : "NeverPasses";
                         });

// A daemon that stops with its sessions kept for a successor leaves their
// channels and rings as they were, even once it is gone, as a crash would:
// a client still reading its channel (a call in flight when the daemon
// went) must learn of a restart from its memory socket, not read zeros
// that say its session ended, and the slots it was given keep their values.
TEST_F(ResumeTest, AStopThatKeepsTheSessionsLeavesTheirChannelsAndRings) {
  ServerOptions options = CpuTestOptions(32, kPageSize);
  options.keep_state.enabled = true;
  StartServer(options);
  RawSession raw = OpenRawSession(*stub_, "kept");
  ASSERT_NE(raw.header, nullptr);
  const v1::AllocResponse allocated =
      RawAlloc(*stub_, raw, 2 * kPageSize, /*return_inline=*/false);
  ASSERT_EQ(allocated.results_size(), 1);
  const int64_t offset = allocated.results(0).ring_offset();
  const int64_t count = allocated.results(0).count();
  ASSERT_EQ(count, 2 * kPageSize);
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<SharedRegion> ring,
      SharedRegion::FromFd(std::move(raw.memory.ring), raw.memory.ring_bytes,
                           SharedRegion::Access::kReadOnly));
  const int64_t* slots = static_cast<const int64_t*>(ring->base()) + offset;
  const std::vector<int64_t> given(slots, slots + count);
  EXPECT_NE(given[0], 0);

  stub_.reset();
  server_.reset();  // stopped, and every object of the daemon destroyed
  EXPECT_EQ(*static_cast<const volatile uint32_t*>(&raw.header->magic),
            fast_channel::kMagic);
  EXPECT_EQ(raw.header->session_ended.load(), 0u);
  EXPECT_EQ(std::vector<int64_t>(slots, slots + count), given);
  pollfd severed = {raw.memory.connection.get(), POLLIN, 0};
  EXPECT_EQ(poll(&severed, 1, 0), 1);
}

// Without a reconnect timeout (the default where the daemon does not keep
// its state) the close of the memory socket ends the session as before.
TEST_F(ResumeTest, WithoutReconnectTheSessionEndsWhenTheLinkGoes) {
  StartServer();
  std::unique_ptr<Client> client = Connect(Options("plain"));
  ASSERT_NE(client, nullptr);
  EXPECT_FALSE(client->pool().state_kept());
  EXPECT_EQ(client->reconnect_timeout(), absl::ZeroDuration());
  server_->server().memory_socket()->SeverConnections();
  ASSERT_TRUE(WaitFor([&] { return !client->session_status().ok(); },
                      absl::Seconds(10)));
  EXPECT_THAT(client->session_status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("the daemon went away")));
  EXPECT_EQ(client->link_epoch(), 0u);
  EXPECT_FALSE(client->reconnecting());
  EXPECT_THAT(client->Alloc({4}), StatusIs(absl::StatusCode::kUnavailable,
                                           HasSubstr("the daemon went away")));
}

}  // namespace
}  // namespace pagealloc::testing
