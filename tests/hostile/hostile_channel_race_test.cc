// Attack: change a call while the daemon reads it. A second thread posts
// calls and, without waiting, scribbles random bytes over the whole channel
// (header, arrays, answer area), so that counts, kinds and arrays change
// between, and during, the daemon's reads. The daemon copies a call out
// once and bounds every count before it copies (fast_channel/codec.h), so
// whatever it takes is a call some client could have written: refused, or
// run for the attacker's own session within its quota. Meanwhile a victim's
// calls on the same daemon are answered correctly, and once the attacker's
// session is closed the pool is whole again.

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "fast_channel/layout.h"
#include "gtest/gtest.h"
#include "tests/hostile/hostile_channel_fixture.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

namespace fc = ::pagealloc::fast_channel;

TEST_F(HostileChannelTest, BytesFlippedWhileTheDaemonReadsHarmNoOneElse) {
  ServerOptions options = DefaultOptions();
  // Abuse policing off: the attack goes on for the whole test (its strikes
  // are hostile_channel_flood_test's subject).
  options.fast_channel_throttle_strikes = 0;
  options.fast_channel_drop_strikes = 0;
  StartServer(options);
  auto victim = Connect("victim");
  ASSERT_NE(victim, nullptr);
  // The attacker may hold 8 pages: what its scribbled calls allocate can
  // never starve the victim.
  RawSession attacker = OpenRaw("attacker", /*quota_pages=*/8);
  ASSERT_NE(attacker.header, nullptr);
  const size_t bytes = attacker.layout->total_bytes;
  const int32_t max_requests =
      attacker.registered.fast_channel().max_requests();

  std::atomic<bool> stop{false};
  std::atomic<int64_t> posts{0};
  std::thread attack([&] {
    std::mt19937_64 random(20240613);
    char* base = attacker.base();
    while (!stop.load(std::memory_order_relaxed)) {
      // A well-formed call of a random kind and size...
      const uint32_t kind = 1 + random() % 7;
      const int32_t n = 1 + random() % max_requests;
      for (int32_t i = 0; i < n; ++i) {
        attacker.array(attacker.layout->in0)[i] = random() % 8;
        attacker.array(attacker.layout->in1)[i] = 1 + random() % 8;
        attacker.array(attacker.layout->in2)[i] = -1;
      }
      attacker.header->kind = kind;
      attacker.header->num_requests = n;
      attacker.header->num_free_first = random() % 2;
      attacker.header->options = random() % 4;
      attacker.header->release_ring_up_to = 0;
      attacker.header->request_seq.fetch_add(1);
      const uint64_t one = 1;
      (void)!write(attacker.memory.doorbell.get(), &one, sizeof(one));
      posts.fetch_add(1, std::memory_order_relaxed);
      // ...then, at once, random words anywhere in the channel, header
      // fields (request_seq included) as much as arrays.
      for (int k = 0; k < 64; ++k) {
        const size_t at = (random() % (bytes / 8)) * 8;
        const uint64_t word = random();
        std::memcpy(base + at, &word, sizeof(word));
      }
    }
  });

  // The victim goes on until it has made kRounds round trips and the
  // attacker has posted kMinPosts calls: on a machine with two cores the
  // attack thread may not run at all during the first few hundred round
  // trips. The deadline only bounds a scheduler that starves it outright.
  constexpr int kRounds = 300;
  constexpr int64_t kMinPosts = 200;
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  int rounds = 0;
  for (int i = 0; (i < kRounds || posts.load() < kMinPosts) &&
                  absl::Now() < deadline && !HasFailure();
       ++i) {
    ++rounds;
    HonestRoundTrip(*victim);
    if (i % 50 == 0) {
      // What the victim's checkpoint covers is its own alone.
      ASSERT_OK(victim->Checkpoint());
      ASSERT_OK_AND_ASSIGN(Allocation held, victim->Alloc({8}));
      ASSERT_OK(held.status());
      victim->Release(held);
      EXPECT_THAT(victim->Rollback(), IsOkAndHolds(2));
    }
  }
  stop = true;
  attack.join();
  std::printf("victim: %d round trips while the attacker posted %lld calls\n",
              rounds, static_cast<long long>(posts.load()));
  EXPECT_GE(posts.load(), kMinPosts);
  EXPECT_OK(victim->session_status());
  EXPECT_OK(pool().CheckInvariants());
  // The attacker held no more than its quota.
  EXPECT_LE(pool().Stats().used_pages, 8 + 2);

  // Once the attacker's session is closed, the pool is whole again.
  ASSERT_TRUE(server().server().core().CloseSession(attacker.id(),
                                                    "closed by the test"));
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, victim->GetStats());
  EXPECT_EQ(stats.sessions_active(), 1);
  victim.reset();
  EXPECT_TRUE(WaitFor([&] { return pool().Stats().used_pages == 0; },
                      absl::Seconds(30)));
  const PoolSnapshot after = PoolSnapshot::Of(pool());
  EXPECT_EQ(after.free_list.size() + after.parked.size(), 64u);
  EXPECT_OK(pool().CheckInvariants());
}

}  // namespace
}  // namespace pagealloc::testing
