// The fast channel (fast_channel/layout.h) and the memory socket that hands
// it over (memory/memory_socket.h) against an in-process daemon on the CPU
// backend: the client library uses it and gets the answers gRPC gives; raw,
// malformed posts are refused with a message and change nothing; calls
// posted together share a launch; closing a session removes its channel;
// a client whose connection closes is reclaimed at once. Attacks on the
// channel and the memory socket are tests/hostile/'s.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "fast_channel/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/memory_socket.h"
#include "memory/shared_region.h"
#include "proto/pagealloc.grpc.pb.h"
#include "server/fast_channel_server.h"
#include "server/server.h"
#include "tests/host_files.h"
#include "tests/in_process_server.h"
#include "tests/raw_session.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::DescriptorsTo;
using ::pagealloc::testing::InProcessServer;
using ::pagealloc::testing::InProcessServerTest;
using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::OpenRawSession;
using ::pagealloc::testing::RawSession;
using ::pagealloc::testing::StatusIs;
using ::pagealloc::testing::WaitFor;
using ::testing::HasSubstr;
namespace fc = ::pagealloc::fast_channel;
namespace ms = ::pagealloc::memory_socket;

// Mappings of this process whose file is `target` (/proc/self/maps).
int MappingsOf(const std::string& target) {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (absl::EndsWith(line, " " + target)) ++count;
  }
  return count;
}

class FastChannelTest : public InProcessServerTest {
 protected:
  void StartServer(absl::Duration spin = absl::Microseconds(200),
                   int pollers = 2,
                   absl::Duration batcher_spin = absl::ZeroDuration()) {
    ServerOptions options;
    options.backend = "cpu";
    options.pool = {64, 4, FreePolicy::kLifo};
    options.sessions.lease = absl::Seconds(10);
    options.sessions.default_ring_capacity_slots = 1024;
    options.batcher.max_batch_requests = 64;
    options.batcher.max_batch_tokens = 4096;
    options.fast_channel_spin = spin;
    options.fast_channel_pollers = pollers;
    // Ended sessions' header pages go within a test's wait.
    options.fast_channel_ended_header_life = absl::Seconds(1);
    options.batcher.spin = batcher_spin;
    options.debug_checks = true;
    StartServer(options);
  }

  using InProcessServerTest::StartServer;

  std::unique_ptr<Client> Connect(bool fast) {
    ClientOptions options;
    options.client_name = fast ? "fast" : "grpc";
    options.fast_channel = fast;
    absl::StatusOr<std::unique_ptr<Client>> client = server_->Connect(options);
    EXPECT_OK(client.status());
    return client.ok() ? *std::move(client) : nullptr;
  }

  FastChannelServer* fast_channels() {
    return server_->server().fast_channels();
  }

  RawSession OpenRaw() { return OpenRawSession(*stub_); }
};

TEST_F(FastChannelTest, ClientCallsGoThroughItWithTheSameAnswersAsGrpc) {
  // The same calls on two fresh daemons: through the fast channel, then
  // through gRPC. Slots, counts, new pages, refusals and their messages
  // must agree.
  struct Answer {
    std::vector<std::vector<int64_t>> slots;
    std::vector<std::string> statuses;
    std::vector<int64_t> new_pages;
  };
  Answer answers[2];
  for (bool fast : {true, false}) {
    StartServer();
    auto client = Connect(fast);
    ASSERT_NE(client, nullptr);
    EXPECT_EQ(client->uses_fast_channel(), fast);
    Answer& answer = answers[fast ? 0 : 1];
    auto record = [&](const absl::StatusOr<Allocation>& a) {
      ASSERT_OK(a.status());
      for (size_t i = 0; i < a->size(); ++i) {
        const RequestSlots& r = (*a)[i];
        answer.statuses.push_back(r.status.ToString());
        answer.slots.emplace_back(r.slots, r.slots + r.count);
        answer.new_pages.push_back(r.new_pages);
      }
    };
    absl::StatusOr<Allocation> extended =
        client->AllocExtend({0, 0, 0}, {6, 252, 3}, {-1, -1, -1});
    record(extended);
    const int64_t last_a = (*extended)[0].slots[5];
    const int64_t last_c = (*extended)[2].slots[2];
    record(client->AllocDecode({7, 4}, {last_a, last_c}));
    record(client->Alloc({8}));
    // The whole-call refusal comes back the same way too.
    absl::StatusOr<Allocation> malformed = client->AllocDecode({7}, {12345});
    answer.statuses.push_back(malformed.status().ToString());
    if (fast) {
      EXPECT_EQ(fast_channels()->calls(), 4);
    } else {
      EXPECT_EQ(fast_channels()->calls(), 0);
    }
    EXPECT_OK(server_->pool().CheckInvariants());
    client.reset();
    StopServer();
  }
  EXPECT_EQ(answers[0].slots, answers[1].slots);
  EXPECT_EQ(answers[0].statuses, answers[1].statuses);
  EXPECT_EQ(answers[0].new_pages, answers[1].new_pages);
  EXPECT_THAT(answers[0].statuses[1], HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_THAT(answers[0].statuses.back(), HasSubstr("last_loc"));
}

TEST_F(FastChannelTest, FreeCheckpointAndRollbackGoThroughItToo) {
  StartServer();
  auto client = Connect(true);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->uses_fast_channel());
  ASSERT_OK_AND_ASSIGN(Allocation a, client->Alloc({8, 4}));
  std::vector<int64_t> first(1);
  ASSERT_OK(client->CopyToHost(a[0].slots, 1, first.data()));
  ASSERT_OK(client->Checkpoint());
  ASSERT_OK(client->Alloc({4, 4, 4}).status());
  EXPECT_THAT(client->Rollback(), IsOkAndHolds(3));
  // Refusals carry the daemon's status and message, as over gRPC.
  EXPECT_THAT(
      client->Rollback(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("checkpoint")));
  EXPECT_THAT(client->FreePages({999}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("999")));
  EXPECT_THAT(client->FreeSlots(first), IsOkAndHolds(1));
  EXPECT_THAT(client->FreeSlots(first),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  EXPECT_EQ(server_->pool().Stats().used_pages, 2);  // 3 taken, 1 freed
  // 2 allocations, checkpoint, 2 rollbacks, 3 frees: all on the channel.
  EXPECT_EQ(fast_channels()->calls(), 8);
  EXPECT_OK(server_->pool().CheckInvariants());
}

// CallOptions.free_pages_first / checkpoint_first, through the fast channel
// and through gRPC: the pages are freed before the allocation (so under the
// lifo policy the allocation takes one of them back), the checkpoint is taken
// before it (so Rollback returns what the call took), and a refused free
// fails the whole call and changes nothing.
TEST_F(FastChannelTest, OperationsFirstRunBeforeTheAllocationOnBothPaths) {
  for (bool fast : {true, false}) {
    SCOPED_TRACE(fast ? "fast channel" : "gRPC");
    StartServer();
    auto client = Connect(fast);
    ASSERT_NE(client, nullptr);
    ASSERT_EQ(client->uses_fast_channel(), fast);
    const int64_t ps = client->pool().page_size();
    ASSERT_OK_AND_ASSIGN(Allocation held, client->Alloc({2 * ps, ps}));
    std::vector<int64_t> slots(3 * ps);
    ASSERT_OK(client->CopyToHost(held[0].slots, 2 * ps, slots.data()));
    ASSERT_OK(client->CopyToHost(held[1].slots, ps, slots.data() + 2 * ps));
    const std::vector<int64_t> two_pages = {slots[0] / ps, slots[ps] / ps};
    client->Release(held);
    const int64_t used_before = server_->pool().Stats().used_pages;
    ASSERT_EQ(used_before, 3);

    // Free two pages first, checkpoint, then allocate one page: freed pages
    // go to the front of the free list in order (lifo), so it is the first
    // of them, and Rollback gives back exactly that page.
    CallOptions options;
    options.free_pages_first = two_pages;
    options.checkpoint_first = true;
    ASSERT_OK_AND_ASSIGN(Allocation a, client->Alloc({ps}, options));
    EXPECT_EQ(a.pages_freed_first(), 2);
    ASSERT_OK(a.status());
    int64_t first_slot = -1;
    ASSERT_OK(client->CopyToHost(a[0].slots, 1, &first_slot));
    EXPECT_EQ(first_slot / ps, two_pages[0]);
    client->Release(a);
    EXPECT_EQ(server_->pool().Stats().used_pages, used_before - 2 + 1);
    EXPECT_THAT(client->Rollback(), IsOkAndHolds(1));
    EXPECT_EQ(server_->pool().Stats().used_pages, used_before - 2);

    // A refused free (page already free) fails the call as a whole, names
    // the field, and changes nothing: no allocation, no checkpoint.
    const PoolStats before = server_->pool().Stats();
    CallOptions bad;
    bad.free_pages_first = two_pages;
    bad.checkpoint_first = true;
    EXPECT_THAT(client->Alloc({ps}, bad),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("options.free_pages_first")));
    const PoolStats after = server_->pool().Stats();
    EXPECT_EQ(after.used_pages, before.used_pages);
    EXPECT_EQ(after.free_pages, before.free_pages);
    EXPECT_EQ(after.pages_allocated, before.pages_allocated);
    EXPECT_THAT(client->Rollback(),
                StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
    // The session goes on: the next call is served normally.
    EXPECT_OK(client->Alloc({ps}).status());
    EXPECT_OK(server_->pool().CheckInvariants());
    client.reset();
    StopServer();
  }
}

// MatchPrefix on a session with a fast channel goes through it (the
// daemon's per-transport counters say so), and a gRPC session matching the
// same chain on the same pool gets the same pages and the same refusals. A
// chain the channel cannot carry (a key of another size) goes over gRPC.
TEST_F(FastChannelTest, MatchPrefixGoesThroughItWithTheSameAnswersAsGrpc) {
  StartServer();
  auto writer = Connect(true);
  auto fast = Connect(true);
  auto grpc = Connect(false);
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(fast, nullptr);
  ASSERT_NE(grpc, nullptr);
  ASSERT_TRUE(fast->uses_fast_channel());
  ASSERT_FALSE(grpc->uses_fast_channel());
  const int64_t ps = writer->pool().page_size();
  CallOptions inline_slots;
  inline_slots.return_inline = true;
  ASSERT_OK_AND_ASSIGN(Allocation written,
                       writer->Alloc({5 * ps}, inline_slots));
  ASSERT_OK(written[0].status);
  std::vector<int64_t> pages;
  std::vector<std::string> keys;
  for (int i = 0; i < 5; ++i) {
    pages.push_back(written[0].slots[i * ps] / ps);
    keys.emplace_back(fc::kKeyBytes, static_cast<char>('a' + i));
  }
  ASSERT_OK(writer->Publish(pages, keys).status());

  const RpcMetrics& rpc = server_->server().core().rpc_metrics();
  auto matches = [&](Transport transport, absl::StatusCode code) {
    return rpc.count(Method::kMatchPrefix, transport, code);
  };
  const int64_t fast_calls = fast_channels()->calls();
  const int64_t grpc_matches = matches(Transport::kGrpc, absl::StatusCode::kOk);
  // The chain, one key longer than what was published: the longest prefix.
  std::vector<std::string> longer = keys;
  longer.emplace_back(fc::kKeyBytes, 'z');
  for (bool adopt : {false, true}) {
    SCOPED_TRACE(adopt ? "adopt" : "peek");
    ASSERT_OK_AND_ASSIGN(std::vector<int64_t> by_fast,
                         fast->MatchPrefix(longer, adopt));
    ASSERT_OK_AND_ASSIGN(std::vector<int64_t> by_grpc,
                         grpc->MatchPrefix(longer, adopt));
    EXPECT_EQ(by_fast, pages);
    EXPECT_EQ(by_grpc, by_fast);
  }
  EXPECT_EQ(fast_channels()->calls() - fast_calls, 2);
  EXPECT_EQ(matches(Transport::kFastChannel, absl::StatusCode::kOk), 2);
  EXPECT_EQ(matches(Transport::kGrpc, absl::StatusCode::kOk) - grpc_matches, 2);
  // Both adopted: each holds a reference on every page.
  const PoolStats stats = server_->pool().Stats();
  EXPECT_EQ(stats.owners.at(fast->session_id()).shared_pages, 5);
  EXPECT_EQ(stats.owners.at(grpc->session_id()).shared_pages, 5);

  // Refusals: a repeated key is the pool's, over either transport, with one
  // message; a short key stays off the channel (its wire has 32-byte keys)
  // and gets the daemon's refusal over gRPC.
  std::vector<std::string> repeated = {keys[0], keys[1], keys[0]};
  std::vector<std::string> short_key = {keys[0], keys[1].substr(0, 31)};
  for (const auto& chain : {repeated, short_key}) {
    const absl::Status by_fast = fast->MatchPrefix(chain, true).status();
    EXPECT_EQ(by_fast.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(by_fast, grpc->MatchPrefix(chain, true).status());
  }
  EXPECT_EQ(
      matches(Transport::kFastChannel, absl::StatusCode::kInvalidArgument), 1);
  EXPECT_EQ(matches(Transport::kGrpc, absl::StatusCode::kInvalidArgument), 3);
  EXPECT_EQ(fast_channels()->calls() - fast_calls, 3);
  // The keys back to back (the C ABI's and Python's form) match alike, on
  // the channel and over gRPC; bytes that are not whole keys stay home.
  const std::string packed = absl::StrJoin(longer, "");
  EXPECT_THAT(fast->MatchPrefixPacked(packed, false), IsOkAndHolds(pages));
  EXPECT_THAT(grpc->MatchPrefixPacked(packed, false), IsOkAndHolds(pages));
  EXPECT_EQ(fast_channels()->calls() - fast_calls, 4);
  for (Client* client : {fast.get(), grpc.get()}) {
    EXPECT_THAT(client->MatchPrefixPacked(packed.substr(1), false),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("not a whole number of 32-byte keys")));
  }
  EXPECT_EQ(fast_channels()->calls() - fast_calls, 4);

  // The references drop as any shared page's do, on either transport.
  EXPECT_THAT(fast->FreePages(pages), IsOkAndHolds(5));
  EXPECT_THAT(grpc->FreePages(pages), IsOkAndHolds(5));
  EXPECT_EQ(server_->pool().Stats().owners.at(fast->session_id()).shared_pages,
            0);
  EXPECT_OK(server_->pool().CheckInvariants());
}

TEST_F(FastChannelTest, MalformedPostsAreRefusedAndChangeNothing) {
  StartServer();
  RawSession raw = OpenRaw();
  ASSERT_NE(raw.header, nullptr);
  const std::vector<int64_t> free_before = server_->pool().FreeList();

  raw.header->kind = static_cast<uint32_t>(fc::CallKind::kDecode);
  raw.header->num_requests = raw.header->max_requests + 1;
  raw.Post();
  ASSERT_TRUE(raw.Await()) << "no answer";
  EXPECT_EQ(raw.header->call_code,
            static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(raw.CallMessage(), HasSubstr("num_requests (65)"));

  raw.header->kind = 99;
  raw.header->num_requests = 1;
  raw.Post();
  ASSERT_TRUE(raw.Await()) << "no answer";
  EXPECT_EQ(raw.header->call_code,
            static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(raw.CallMessage(), HasSubstr("unknown call kind 99"));

  // A well-formed call whose request the daemon's decoder refuses: the
  // message names the field and the request index, as over gRPC.
  raw.header->kind = static_cast<uint32_t>(fc::CallKind::kDecode);
  raw.header->num_requests = 2;
  raw.array(raw.layout->in1)[0] = 1;
  raw.array(raw.layout->in2)[0] = -1;
  raw.array(raw.layout->in1)[1] = 0;  // seq_len must be >= 1
  raw.array(raw.layout->in2)[1] = -1;
  raw.Post();
  ASSERT_TRUE(raw.Await()) << "no answer";
  EXPECT_EQ(raw.header->call_code,
            static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(raw.CallMessage(), HasSubstr("seq_lens[1]"));

  EXPECT_EQ(server_->pool().FreeList(), free_before);
  EXPECT_EQ(server_->pool().Stats().used_pages, 0);

  // And the channel still works.
  raw.array(raw.layout->in1)[1] = 1;
  raw.Post();
  ASSERT_TRUE(raw.Await()) << "no answer";
  EXPECT_EQ(raw.header->call_code, 0);
  EXPECT_EQ(raw.header->num_results, 2);
  EXPECT_EQ(server_->pool().Stats().used_pages, 2);
}

TEST_F(FastChannelTest, CallsPostedTogetherShareALaunch) {
  // One poller, not spinning: it sleeps, both calls are posted, then one
  // ring wakes it to find both.
  StartServer(absl::ZeroDuration(), /*pollers=*/1);
  RawSession a = OpenRaw();
  RawSession b = OpenRaw();
  ASSERT_NE(a.header, nullptr);
  ASSERT_NE(b.header, nullptr);
  absl::SleepFor(absl::Milliseconds(20));  // let the poller fall asleep
  for (RawSession* raw : {&a, &b}) {
    raw->header->kind = static_cast<uint32_t>(fc::CallKind::kAlloc);
    raw->header->num_requests = 2;
    raw->array(raw->layout->in1)[0] = 4;
    raw->array(raw->layout->in1)[1] = 8;
    raw->Post(/*ring=*/false);
  }
  a.Ring();
  ASSERT_TRUE(a.Await()) << "no answer";
  ASSERT_TRUE(b.Await()) << "no answer";
  EXPECT_EQ(a.header->call_code, 0);
  EXPECT_EQ(b.header->call_code, 0);
  EXPECT_EQ(a.header->launch_id, b.header->launch_id);
  EXPECT_EQ(a.header->batch_requests, 4);
  EXPECT_GE(fast_channels()->sleeps(), 1);
}

// Six clients allocate and free concurrently; no page may end up held by
// two of them, and the pool must agree with what they hold. Returns how
// many allocation calls shared their launch with another call.
int RunConcurrentClients(
    Server* server, const std::function<std::unique_ptr<Client>()>& connect,
    bool fast = true) {
  constexpr int kClients = 6;
  constexpr int kSteps = 150;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(connect());
  std::vector<std::set<int64_t>> held(kClients);
  std::atomic<int> frees{0};
  std::atomic<int> shared{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      Client& client = *clients[i];
      std::vector<int64_t> mine;
      for (int step = 0; step < kSteps; ++step) {
        absl::StatusOr<Allocation> a = client.Alloc({4, 4});
        ASSERT_OK(a.status());
        if (a->batch_requests() > static_cast<int32_t>(a->size())) ++shared;
        for (size_t r = 0; r < a->size(); ++r) {
          if (!(*a)[r].status.ok()) {
            EXPECT_EQ((*a)[r].status.code(),
                      absl::StatusCode::kResourceExhausted);
            continue;
          }
          std::vector<int64_t> slots(4);
          ASSERT_OK(client.CopyToHost((*a)[r].slots, 4, slots.data()));
          mine.push_back(slots[0]);
        }
        client.Release(*a);
        if (mine.size() > 4) {
          ASSERT_OK(client.FreeSlots(mine).status());
          frees.fetch_add(1);
          mine.clear();
        }
      }
      for (int64_t slot : mine) held[i].insert(slot / 4);
    });
  }
  for (std::thread& thread : threads) thread.join();
  // No page is held by two clients, and the pool agrees on the count.
  std::set<int64_t> all;
  size_t total = 0;
  for (const std::set<int64_t>& pages : held) {
    total += pages.size();
    all.insert(pages.begin(), pages.end());
  }
  EXPECT_EQ(all.size(), total);
  EXPECT_EQ(server->pool().Stats().used_pages, static_cast<int64_t>(total));
  EXPECT_OK(server->pool().CheckInvariants());
  // Every allocation and every Free went through the fast channel, or none.
  EXPECT_EQ(server->fast_channels()->calls(),
            fast ? kClients * kSteps + frees : 0);
  return shared;
}

TEST_F(FastChannelTest, ConcurrentClientsOnSeveralPollers) {
  StartServer(absl::Microseconds(50), /*pollers=*/3);
  RunConcurrentClients(&server_->server(), [this] { return Connect(true); });
}

TEST_F(FastChannelTest, ConcurrentClientsWithASpinningBatcher) {
  // The batcher thread drives every launch; pollers only queue.
  StartServer(absl::Microseconds(50), /*pollers=*/1, absl::Microseconds(100));
  RunConcurrentClients(&server_->server(), [this] { return Connect(true); });
}

// Over gRPC with a spinning batcher thread, which takes every call from
// gRPC's threads and hands the answers of shared launches to threads of
// their own, taken in turn (server/grpc_service.h), or sends them itself
// (`answer_threads` 0): every call is answered, correctly. The window holds
// each launch for company (up to 50 ms) so that launches are shared however
// the machine schedules the clients.
class GrpcAnswerThreadsTest : public FastChannelTest,
                              public ::testing::WithParamInterface<int> {};

TEST_P(GrpcAnswerThreadsTest, ConcurrentGrpcClientsWithASpinningBatcher) {
  ServerOptions options;
  options.backend = "cpu";
  options.pool = {64, 4, FreePolicy::kLifo};
  options.sessions.default_ring_capacity_slots = 1024;
  options.batcher.spin = absl::Microseconds(100);
  options.batcher.batch_window = absl::Milliseconds(50);
  options.batcher.min_batch_calls = 3;
  options.grpc_answer_threads = GetParam();
  options.debug_checks = true;
  StartServer(options);
  const int shared = RunConcurrentClients(
      &server_->server(), [this] { return Connect(false); }, /*fast=*/false);
  EXPECT_GT(shared, 0) << "no launch carried two calls";
}

INSTANTIATE_TEST_SUITE_P(AnswerThreads, GrpcAnswerThreadsTest,
                         ::testing::Values(0, 1, 3));

// An idle daemon with sessions open spins nowhere: once calls stop, every
// poller, the batcher thread and the gRPC answer threads sleep (the
// daemon's own report of its threads, /metrics' pagealloc_thread_asleep),
// with the spins of a machine with many CPUs, two fast-channel clients and
// a gRPC one still connected (their KeepAlive streams running).
TEST_F(FastChannelTest, AnIdleDaemonWithSessionsOpenSleeps) {
  ServerOptions options;
  options.backend = "cpu";
  options.pool = {64, 4, FreePolicy::kLifo};
  options.sessions.lease = absl::Seconds(10);
  options.sessions.default_ring_capacity_slots = 1024;
  options.fast_channel_spin = absl::Microseconds(200);
  options.fast_channel_pollers = 2;
  options.batcher = SchedulingPolicy::DefaultsForMachine(16).batcher;
  options.grpc_answer_threads = 2;
  StartServer(options);
  std::vector<std::unique_ptr<Client>> clients;
  clients.push_back(Connect(true));
  clients.push_back(Connect(true));
  clients.push_back(Connect(false));
  for (int round = 0; round < 20; ++round) {
    for (const std::unique_ptr<Client>& client : clients) {
      ASSERT_NE(client, nullptr);
      ASSERT_OK(client->Checkpoint());
      ASSERT_OK(client->Alloc({4}).status());
      ASSERT_THAT(client->Rollback(), IsOkAndHolds(1));
    }
  }
  const std::string batcher = "pagealloc_thread_asleep{thread=\"batcher\"} 1";
  const std::string poller0 = "pagealloc_thread_asleep{thread=\"poller0\"} 1";
  const std::string poller1 = "pagealloc_thread_asleep{thread=\"poller1\"} 1";
  const std::string answers0 =
      "pagealloc_thread_asleep{thread=\"grpc_answers0\"} 1";
  const std::string answers1 =
      "pagealloc_thread_asleep{thread=\"grpc_answers1\"} 1";
  std::string metrics;
  EXPECT_TRUE(WaitFor(
      [&] {
        metrics = server_->server().metrics().Render();
        return absl::StrContains(metrics, batcher) &&
               absl::StrContains(metrics, poller0) &&
               absl::StrContains(metrics, poller1) &&
               absl::StrContains(metrics, answers0) &&
               absl::StrContains(metrics, answers1);
      },
      absl::Seconds(30)))
      << metrics;
  EXPECT_EQ(fast_channels()->pollers_asleep(), 2);
}

TEST_F(FastChannelTest, ClosingTheSessionRemovesItsChannel) {
  StartServer();
  auto client = Connect(true);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->uses_fast_channel());
  ASSERT_OK(client->Alloc({4}).status());
  RawSession raw = OpenRaw();
  ASSERT_NE(raw.header, nullptr);
  const uint64_t id = raw.registered.session_id();
  const std::string channel_memory =
      absl::StrFormat("/memfd:pagealloc-channel.%d (deleted)", id);
  // Handed over, the daemon keeps its mapping but no descriptor; the raw
  // client maps it too.
  EXPECT_TRUE(WaitFor([&] { return DescriptorsTo(channel_memory) == 0; },
                      absl::Seconds(10)));
  EXPECT_EQ(MappingsOf(channel_memory), 2);
  v1::KeepAliveRequest close;
  close.mutable_session()->set_session_id(id);
  close.mutable_session()->set_session_token(raw.registered.session_token());
  close.set_close(true);
  grpc::ClientContext context;
  auto stream = stub_->KeepAlive(&context);
  ASSERT_TRUE(stream->Write(close));
  stream->WritesDone();
  v1::KeepAliveResponse ignored;
  while (stream->Read(&ignored)) {
  }
  (void)stream->Finish();
  // The memory socket says why, then closes; the daemon frees the
  // channel's memory but its header page, which the raw client still reads
  // (the session ended, and why), and then lets go of that too (the raw
  // client's mapping stays valid, and reads zeros: an ended session).
  EXPECT_THAT(
      ms::ReadSessionEnd(raw.memory.connection.get()),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("closed by client")));
  EXPECT_EQ(raw.header->session_ended.load(), 1u);
  EXPECT_TRUE(WaitFor([&] { return MappingsOf(channel_memory) == 1; },
                      absl::Seconds(10)));
  EXPECT_EQ(raw.header->magic, 0u);
  // The other session is untouched.
  EXPECT_OK(client->Alloc({4}).status());
  EXPECT_EQ(server_->server().memory_socket()->connected_sessions(), 1);
}

TEST_F(FastChannelTest, DaemonWithoutFastChannelsServesOverGrpc) {
  ServerOptions options;
  options.backend = "cpu";
  options.pool = {64, 4, FreePolicy::kLifo};
  options.fast_channel = false;
  StartServer(options);
  auto client = Connect(true);
  ASSERT_NE(client, nullptr);
  EXPECT_FALSE(client->uses_fast_channel());
  EXPECT_EQ(fast_channels(), nullptr);
  EXPECT_OK(client->Alloc({4}).status());
}

// A client that dies has its sockets closed by the kernel: its session is
// reclaimed then, long before its lease (an hour here) could run out.
TEST_F(FastChannelTest, ASessionWhoseConnectionClosesIsReclaimedAtOnce) {
  ServerOptions options;
  options.backend = "cpu";
  options.pool = {64, 4, FreePolicy::kLifo};
  options.sessions.lease = absl::Hours(1);
  options.sessions.default_ring_capacity_slots = 1024;
  StartServer(options);
  auto survivor = Connect(true);
  ASSERT_NE(survivor, nullptr);
  ASSERT_OK(survivor->Alloc({4}).status());
  RawSession raw = OpenRaw();
  ASSERT_NE(raw.header, nullptr);
  raw.WriteAlloc(3);
  raw.Post();
  ASSERT_TRUE(raw.Await()) << "no answer";
  ASSERT_EQ(server_->pool().Stats().used_pages, 4);

  raw.memory.connection.reset();
  const SessionCounters& counters = server_->server().core().counters();
  // The counter moves after the pool's pages do (the reclaim frees them,
  // then counts them): wait for both.
  EXPECT_TRUE(WaitFor(
      [&] {
        return server_->pool().Stats().used_pages == 1 &&
               counters.pages_reclaimed.load() == 3;
      },
      absl::Seconds(30)))
      << server_->pool().Stats().used_pages << " pages used, "
      << counters.pages_reclaimed.load() << " reclaimed";
  EXPECT_EQ(counters.sessions_reclaimed.load(), 1);
  EXPECT_EQ(server_->server().core().Sessions().size(), 1u);
  EXPECT_OK(survivor->session_status());
  EXPECT_OK(survivor->Alloc({4}).status());
  EXPECT_OK(server_->pool().CheckInvariants());
}

// A session the daemon ends is told so on its memory socket: the client
// library knows at once, without waiting for its next KeepAlive.
TEST_F(FastChannelTest, TheClientLearnsAtOnceThatTheDaemonEndedItsSession) {
  ServerOptions options;
  options.backend = "cpu";
  options.pool = {64, 4, FreePolicy::kLifo};
  options.sessions.lease = absl::Hours(1);
  StartServer(options);
  auto client = Connect(true);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Alloc({4}).status());
  ASSERT_TRUE(server_->server().core().CloseSession(client->session_id(),
                                                    "closed by the operator"));
  absl::Status status;
  EXPECT_TRUE(WaitFor(
      [&] {
        status = client->session_status();
        return !status.ok();
      },
      absl::Seconds(30)));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kNotFound,
                               HasSubstr("closed by the operator")));
  EXPECT_THAT(client->Alloc({4}), StatusIs(absl::StatusCode::kNotFound,
                                           HasSubstr("register again")));
}

}  // namespace
}  // namespace pagealloc
