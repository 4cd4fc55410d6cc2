// Attack (or accident): a client paused past its lease (stopped, swapped
// out, descheduled) while an answer waits in its fast channel. By the time
// it reads the answer the daemon has reclaimed the session's pages and may
// have handed them to another session; the answer itself still says OK.
// The stale-answer fence (fast_channel/layout.h): the daemon sets the
// channel's session_ended word before it frees any page of the session,
// and the client library loads it after reading an answer, so the call
// fails with NOT_FOUND naming the session and why, never OK. Both tests
// wait for counts (the reclaim, the call taken), never for time to pass.

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "client/fast_channel_client.h"
#include "fast_channel/codec.h"
#include "fast_channel/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/memory_socket.h"
#include "memory/shared_region.h"
#include "server/call_core.h"
#include "tests/hostile/hostile_channel_fixture.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

namespace fc = ::pagealloc::fast_channel;
namespace ms = ::pagealloc::memory_socket;
using ::testing::HasSubstr;

ServerOptions ShortLease() {
  ServerOptions options = HostileChannelTest::DefaultOptions();
  options.sessions.lease = absl::Seconds(3);
  return options;
}

// The client library's own end of the channel (FastChannelClient), driven
// by hand so that the test decides when the client reads: it posts an
// Alloc, has its answer, then is "paused" (it never renews its lease; it
// opened no KeepAlive stream). The daemon reclaims the session and another
// session takes every page, the paused one's included. Then the paused
// client reads: the answer says OK, the fence says NOT_FOUND.
TEST_F(HostileChannelTest, APausedClientReadsNotFoundForPagesItLost) {
  StartServer(ShortLease());
  auto other = Connect("other");  // keeps its lease
  ASSERT_NE(other, nullptr);

  v1::RegisterRequest request;
  request.set_client_name("paused");
  request.set_fast_channel(true);
  v1::RegisterResponse registered;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->Register(&context, request, &registered).ok());
  const uint64_t id = registered.session_id();
  ASSERT_OK_AND_ASSIGN(
      ms::SessionMemory memory,
      ms::ReceiveSessionMemory(registered.memory_socket(), id,
                               registered.session_token(), absl::Seconds(30)));
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<SharedRegion> ring,
      SharedRegion::FromFd(std::move(memory.ring),
                           registered.ring().capacity_slots() * 8,
                           SharedRegion::Access::kReadOnly));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FastChannelClient> fast,
                       FastChannelClient::Map(registered.fast_channel(),
                                              std::move(memory.channel),
                                              std::move(memory.doorbell)));

  const std::vector<int64_t> tokens = {4, 4};
  fc::CallView call;
  call.kind = fc::CallKind::kAlloc;
  call.in1 = tokens;
  ASSERT_OK(fast->Call(call, absl::Microseconds(100),
                       absl::Now() + absl::Seconds(30),
                       [] { return absl::OkStatus(); }));
  ASSERT_OK(fast->codec().CallStatus());
  fc::AllocAnswerView answer;
  ASSERT_OK(fast->codec().ReadAllocAnswer(2, &answer));
  const int64_t* slots = static_cast<const int64_t*>(ring->base());
  std::vector<int64_t> pages;
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(answer.codes[i], 0);
    pages.push_back(slots[answer.ring_offsets[i]] / 4);
    ASSERT_EQ(pool().OwnerOf(pages.back()), id);
  }
  ASSERT_OK(fast->SessionLive(id));

  // Paused past its lease: the daemon reclaims the session...
  const SessionCounters& counters = server().server().core().counters();
  ASSERT_TRUE(WaitFor([&] { return counters.sessions_reclaimed.load() == 1; },
                      absl::Seconds(60)));
  ASSERT_TRUE(WaitFor([&] { return pool().Stats().used_pages == 0; },
                      absl::Seconds(30)));
  // ...and another session is handed every page, the paused one's too.
  ASSERT_OK_AND_ASSIGN(Allocation all, other->Alloc({64 * 4}));
  ASSERT_OK(all.status());
  for (const int64_t page : pages) {
    EXPECT_EQ(pool().OwnerOf(page), other->session_id()) << "page " << page;
  }

  // The paused client wakes and reads its answer. The answer still says
  // OK: on its own it would be believed...
  EXPECT_OK(fast->codec().CallStatus());
  EXPECT_EQ(answer.codes[0], 0);
  // ...but the fence says the session is gone, and why.
  EXPECT_THAT(fast->SessionLive(id),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("ended (lost its lease)")));
  EXPECT_OK(other->session_status());
  EXPECT_OK(pool().CheckInvariants());
}

// A reply that holds the batcher: the thread driving it waits inside
// Complete until released, so work queued meanwhile waits too.
class HoldingReply final : public Reply {
 public:
  void Complete(const absl::Status& status) override {
    status_ = status;
    entered_.Notify();
    release_.WaitForNotification();
  }
  absl::Notification entered_;
  absl::Notification release_;
  absl::Status status_;
};

// The client library end to end. A client whose KeepAlive never comes
// again posts an Alloc; the batcher is held, so the call is taken but not
// run; the session's lease runs out and the daemon reclaims it; then the
// batcher runs the call (it was queued before the reclaim, so it runs, and
// answers OK) and frees the pages right after. The client, spinning on its
// answer the whole time (it never looks at the memory socket's news
// meanwhile), reads that OK answer: the call must still fail, NOT_FOUND.
TEST_F(HostileChannelTest, TheClientLibraryFailsAnAnswerOfAnEndedSession) {
  ServerOptions options = ShortLease();
  options.fast_channel_pollers = 1;
  StartServer(options);
  auto holder = Connect("holder");
  ASSERT_NE(holder, nullptr);
  ClientOptions paused_options;
  paused_options.keepalive_interval = absl::Hours(1);
  paused_options.fast_channel_spin = absl::Minutes(10);
  paused_options.call_timeout = absl::Minutes(5);
  auto paused = Connect("paused", paused_options);
  ASSERT_NE(paused, nullptr);

  HoldingReply hold;
  std::thread holding([&] {
    server().server().core().SubmitCheckpoint(
        holder->session_id(), holder->session_token(), Transport::kGrpc, &hold);
  });
  hold.entered_.WaitForNotification();
  const int64_t taken = fast_channels().calls();
  absl::StatusOr<Allocation> result;
  std::thread calling([&] { result = paused->Alloc({4}); });
  // The call is taken (and queued behind the held batcher)...
  EXPECT_TRUE(WaitFor([&] { return fast_channels().calls() > taken; },
                      absl::Seconds(60)));
  // ...and the session's lease runs out meanwhile.
  const SessionCounters& counters = server().server().core().counters();
  EXPECT_TRUE(WaitFor([&] { return counters.sessions_reclaimed.load() == 1; },
                      absl::Seconds(60)));
  hold.release_.Notify();
  holding.join();
  calling.join();
  EXPECT_OK(hold.status_);

  EXPECT_THAT(result, StatusIs(absl::StatusCode::kNotFound,
                               HasSubstr("ended (lost its lease)")));
  EXPECT_THAT(paused->session_status(), StatusIs(absl::StatusCode::kNotFound,
                                                 HasSubstr("lost its lease")));
  EXPECT_THAT(paused->Alloc({4}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
  // The pages that answer named were freed right after it.
  EXPECT_TRUE(WaitFor([&] { return pool().Stats().used_pages == 0; },
                      absl::Seconds(30)));
  EXPECT_OK(holder->session_status());
  HonestRoundTrip(*holder);
  EXPECT_OK(pool().CheckInvariants());
}

}  // namespace
}  // namespace pagealloc::testing
