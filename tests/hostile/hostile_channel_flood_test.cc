// Attack: flood the daemon through one's own fast channel: ring the
// doorbell without posting calls, post calls without waiting for (or
// reading) their answers. A poller takes at most one call per session per
// round, so a victim's call waits at most one batch; and each sign of abuse
// is a strike (server/fast_channel_server.h): enough of them throttle the
// session (its doorbell wakes nobody, its calls are taken at most once per
// 10 ms), more drop it (its pages reclaimed, its client told why, counted
// in pagealloc_sessions_dropped_total by reason). An honest client, at full
// speed, never earns a strike. Thresholds are counts, so nothing here
// depends on timing; the waits are bounds.

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "fast_channel/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/memory_socket.h"
#include "server/fast_channel_server.h"
#include "tests/hostile/hostile_channel_fixture.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

namespace fc = ::pagealloc::fast_channel;
namespace ms = ::pagealloc::memory_socket;
using Abuse = FastChannelServer::Abuse;
using ::testing::HasSubstr;

// One poller that sleeps as soon as it has nothing to take (so every ring
// wakes it), a throttle at 5 strikes and a drop at 50; a throttle never
// lifts during a test.
ServerOptions FloodOptions() {
  ServerOptions options = HostileChannelTest::DefaultOptions();
  options.fast_channel_pollers = 1;
  options.fast_channel_spin = absl::ZeroDuration();
  options.fast_channel_throttle_strikes = 5;
  options.fast_channel_drop_strikes = 50;
  options.fast_channel_throttle_time = absl::Hours(1);
  return options;
}

// What the daemon's memory socket said when it ended `raw`'s session.
absl::Status EndOnTheMemorySocket(const RawSession& raw) {
  pollfd readable = {raw.memory.connection.get(), POLLIN, 0};
  if (poll(&readable, 1, 30000) != 1) {
    return absl::DeadlineExceededError("the memory socket said nothing");
  }
  return ms::ReadSessionEnd(raw.memory.connection.get());
}

class HostileFloodTest : public HostileChannelTest {
 protected:
  // Runs the victim's honest round trips until `abuse` has dropped a
  // session (bounded at 60 s), while `attack` runs on a thread of its own;
  // returns the round trips made.
  int RunUntilDropped(
      Client& victim, Abuse abuse,
      const std::function<void(const std::atomic<bool>&)>& attack) {
    std::atomic<bool> stop{false};
    std::thread attacker([&] { attack(stop); });
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    int rounds = 0;
    while (fast_channels().dropped(abuse) == 0 && absl::Now() < deadline &&
           !HasFailure()) {
      HonestRoundTrip(victim);
      ++rounds;
    }
    stop = true;
    attacker.join();
    return rounds;
  }

  std::string Metrics() { return server().server().metrics().Render(); }
};

TEST_F(HostileFloodTest, DoorbellSpamIsThrottledThenDropped) {
  StartServer(FloodOptions());
  auto victim = Connect("victim");
  ASSERT_NE(victim, nullptr);
  RawSession spammer = OpenRaw("spammer");
  ASSERT_NE(spammer.header, nullptr);
  spammer.WriteAlloc(2);
  spammer.Post();
  ASSERT_TRUE(spammer.Await());
  ASSERT_EQ(spammer.header->call_code, 0);
  ASSERT_EQ(pool().Stats().used_pages, 2);

  const int rounds =
      RunUntilDropped(*victim, Abuse::kDoorbell, [&](const auto& stop) {
        const uint64_t one = 1;
        while (!stop.load()) {
          (void)!write(spammer.memory.doorbell.get(), &one, sizeof(one));
        }
      });
  std::printf("victim: %d round trips while the spammer was dropped\n", rounds);
  ASSERT_EQ(fast_channels().dropped(Abuse::kDoorbell), 1);
  EXPECT_EQ(fast_channels().throttled(Abuse::kDoorbell), 1);
  EXPECT_EQ(fast_channels().throttled(Abuse::kFlood), 0);
  EXPECT_EQ(fast_channels().dropped(Abuse::kFlood), 0);

  // The spammer is told why, on its memory socket and in its channel.
  EXPECT_THAT(EndOnTheMemorySocket(spammer),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("dropped: rang its doorbell without calls")));
  EXPECT_EQ(spammer.header->session_ended.load(), 1u);
  EXPECT_THAT(
      std::string(spammer.header->end_reason, spammer.header->end_reason_bytes),
      HasSubstr("dropped"));
  // Its pages are reclaimed; the victim's calls go on, correct.
  const SessionCounters& counters = server().server().core().counters();
  EXPECT_TRUE(WaitFor([&] { return pool().Stats().used_pages == 0; },
                      absl::Seconds(30)));
  EXPECT_EQ(counters.sessions_reclaimed.load(), 1);
  EXPECT_EQ(counters.pages_reclaimed.load(), 2);
  for (int i = 0; i < 20; ++i) HonestRoundTrip(*victim);
  EXPECT_OK(victim->session_status());
  EXPECT_OK(pool().CheckInvariants());
  const std::string metrics = Metrics();
  EXPECT_THAT(metrics, HasSubstr("pagealloc_sessions_dropped_total{reason="
                                 "\"doorbell\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("pagealloc_sessions_throttled_total{reason="
                                 "\"doorbell\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("pagealloc_sessions_dropped_total{reason="
                                 "\"flood\"} 0"));
}

TEST_F(HostileFloodTest, PostingBeforeTheAnswersIsThrottledThenDropped) {
  StartServer(FloodOptions());
  auto victim = Connect("victim");
  ASSERT_NE(victim, nullptr);
  RawSession flooder = OpenRaw("flooder");
  ASSERT_NE(flooder.header, nullptr);
  flooder.WriteAlloc(1);
  flooder.Post();
  ASSERT_TRUE(flooder.Await());
  ASSERT_EQ(pool().Stats().used_pages, 1);

  // Checkpoint after Checkpoint, posted without waiting for an answer; it
  // never rings (the victim's calls wake the poller), so the strikes are
  // the posts.
  flooder.header->kind = static_cast<uint32_t>(fc::CallKind::kCheckpoint);
  const int rounds =
      RunUntilDropped(*victim, Abuse::kFlood, [&](const auto& stop) {
        while (!stop.load()) flooder.Post(/*ring=*/false);
      });
  std::printf("victim: %d round trips while the flooder was dropped\n", rounds);
  ASSERT_EQ(fast_channels().dropped(Abuse::kFlood), 1);
  EXPECT_EQ(fast_channels().throttled(Abuse::kFlood), 1);
  EXPECT_EQ(fast_channels().dropped(Abuse::kDoorbell), 0);
  EXPECT_THAT(EndOnTheMemorySocket(flooder),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("posted calls before their answers")));
  EXPECT_TRUE(WaitFor([&] { return pool().Stats().used_pages == 0; },
                      absl::Seconds(30)));
  for (int i = 0; i < 20; ++i) HonestRoundTrip(*victim);
  EXPECT_OK(victim->session_status());
  EXPECT_OK(pool().CheckInvariants());
  EXPECT_THAT(Metrics(), HasSubstr("pagealloc_sessions_dropped_total{reason="
                                   "\"flood\"} 1"));
}

// The other side of the thresholds: honest clients of the client library,
// several at once and as fast as they can, against a hair trigger (one
// strike throttles, two drop), on one poller that sleeps between calls so
// that every call rings.
TEST_F(HostileFloodTest, HonestClientsAtFullSpeedEarnNoStrike) {
  ServerOptions options = FloodOptions();
  options.fast_channel_throttle_strikes = 1;
  options.fast_channel_drop_strikes = 2;
  StartServer(options);
  constexpr int kClients = 4;
  constexpr int kRounds = 400;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(Connect(absl::StrFormat("honest%d", i)));
    ASSERT_NE(clients.back(), nullptr);
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      Client& client = *clients[i];
      for (int r = 0; r < kRounds && !HasFailure(); ++r) {
        HonestRoundTrip(client);
        EXPECT_OK(client.Checkpoint());
        ASSERT_OK_AND_ASSIGN(Allocation a, client.Alloc({8}));
        EXPECT_OK(a.status());
        client.Release(a);
        EXPECT_THAT(client.Rollback(), IsOkAndHolds(2));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const Abuse abuse : {Abuse::kDoorbell, Abuse::kFlood}) {
    EXPECT_EQ(fast_channels().throttled(abuse), 0);
    EXPECT_EQ(fast_channels().dropped(abuse), 0);
  }
  for (const auto& client : clients) {
    EXPECT_OK(client->session_status());
    EXPECT_TRUE(client->uses_fast_channel());
  }
  EXPECT_EQ(server().server().core().counters().sessions_reclaimed.load(), 0);
  EXPECT_OK(pool().CheckInvariants());
}

// Round-robin alone, with throttling and dropping off: one session rings
// its doorbell without pause, keeps clearing its own poller_sleeping flag,
// and posts call after call without reading a single answer, on the same
// poller as a victim. Every one of the victim's calls is still answered,
// within the victim's deadline, on the fast channel.
TEST_F(HostileFloodTest, AnAbuserOnTheSamePollerDoesNotHoldUpAVictim) {
  ServerOptions options = DefaultOptions();
  options.fast_channel_pollers = 1;
  options.fast_channel_throttle_strikes = 0;
  options.fast_channel_drop_strikes = 0;
  StartServer(options);
  RawSession spammer = OpenRaw("spammer");
  ASSERT_NE(spammer.header, nullptr);
  ClientOptions victim_options;
  // A call not answered in time fails the test (DEADLINE_EXCEEDED).
  victim_options.call_timeout = absl::Seconds(5);
  auto victim = Connect("victim", victim_options);
  ASSERT_NE(victim, nullptr);

  std::atomic<bool> stop{false};
  std::atomic<int64_t> rings{0};
  std::thread abuse([&] {
    const uint64_t one = 1;
    for (int64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      // Alternately a call the daemon refuses (unknown kind) and a
      // Checkpoint; never a look at the answers.
      spammer.header->kind =
          i % 2 == 0 ? 99u : static_cast<uint32_t>(fc::CallKind::kCheckpoint);
      spammer.header->request_seq.store(++spammer.seq);
      spammer.header->poller_sleeping.store(0);
      if (write(spammer.memory.doorbell.get(), &one, sizeof(one)) == 8) {
        rings.fetch_add(1, std::memory_order_relaxed);
      }
    }
  });
  constexpr int kCalls = 200;
  absl::Duration slowest;
  int64_t rings_seen = 0;
  uint32_t answered = spammer.header->response_seq.load();
  uint32_t answers_seen = 0;
  for (int i = 0; i < kCalls && !HasFailure(); ++i) {
    // Between any two of the victim's calls the abuser rings at least ten
    // times and has at least one more post answered (counts, not timing:
    // on 2 busy cores either thread may stall for a while).
    const int64_t rings_before = rings.load();
    ASSERT_TRUE(WaitFor(
        [&] {
          return rings.load() >= rings_before + 10 &&
                 spammer.header->response_seq.load() != answered;
        },
        absl::Seconds(30), absl::Microseconds(50)));
    rings_seen += rings.load() - rings_before;
    const uint32_t now_answered = spammer.header->response_seq.load();
    answers_seen += now_answered - answered;
    answered = now_answered;
    const absl::Time start = absl::Now();
    HonestRoundTrip(*victim);
    slowest = std::max(slowest, absl::Now() - start);
  }
  stop = true;
  abuse.join();
  EXPECT_TRUE(victim->uses_fast_channel());
  EXPECT_OK(pool().CheckInvariants());
  std::printf(
      "victim: %d Alloc+Free pairs, slowest pair %s, while the abuser rang "
      "%lld times and its answered posts advanced %u\n",
      kCalls, absl::FormatDuration(slowest).c_str(),
      static_cast<long long>(rings_seen), answers_seen);
}

}  // namespace
}  // namespace pagealloc::testing
