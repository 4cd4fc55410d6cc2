// The client's end of the fast channel against a daemon's end played by
// this test through the same codec, over real shared memory and a real
// eventfd doorbell.

#include "client/fast_channel_client.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include "fast_channel/codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/shared_region.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr fast_channel::Capacity kCapacity{/*max_requests=*/16,
                                           /*message_bytes=*/256};

class FastChannelClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const fast_channel::ChannelLayout layout(kCapacity.max_requests,
                                             kCapacity.message_bytes);
    ASSERT_OK_AND_ASSIGN(
        channel_, SharedRegion::Create("fcc-test-channel", layout.total_bytes));
    doorbell_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    ASSERT_TRUE(doorbell_.valid());
    daemon_.emplace(channel_->base(), kCapacity);
    daemon_->Initialize();
    description_.set_max_requests(kCapacity.max_requests);
    description_.set_message_bytes(kCapacity.message_bytes);
  }

  // The client's own descriptors, as the memory socket hands them over.
  UniqueFd ChannelFd() {
    return UniqueFd(fcntl(channel_->fd(), F_DUPFD_CLOEXEC, 0));
  }
  UniqueFd DoorbellFd() {
    return UniqueFd(fcntl(doorbell_.get(), F_DUPFD_CLOEXEC, 0));
  }
  absl::StatusOr<std::unique_ptr<FastChannelClient>> Map(
      const v1::FastChannel& description) {
    return FastChannelClient::Map(description, ChannelFd(), DoorbellFd());
  }
  // How often the doorbell was rung since the last look.
  uint64_t Rings() {
    uint64_t count = 0;
    return read(doorbell_.get(), &count, sizeof(count)) == 8 ? count : 0;
  }

  // Plays the daemon for one call: waits for it, takes it, answers with
  // `answer` (run on the taken call), publishes.
  template <typename Answer>
  std::thread AnswerOneCall(Answer answer) {
    return std::thread([this, answer] {
      while (daemon_->PostedSeq() == answered_) std::this_thread::yield();
      const uint32_t seq = daemon_->PostedSeq();
      fast_channel::TakenCall call;
      const absl::Status taken = daemon_->TakeCall(&call);
      if (taken.ok()) {
        answer(call, *daemon_);
      } else {
        daemon_->WriteRefusal(taken);
      }
      answered_ = seq;
      daemon_->Publish(seq);
    });
  }

  std::unique_ptr<SharedRegion> channel_;
  UniqueFd doorbell_;
  std::optional<fast_channel::ChannelCodec> daemon_;
  uint32_t answered_ = 0;
  v1::FastChannel description_;
};

TEST_F(FastChannelClientTest, MapRefusesMalformedDescriptions) {
  v1::FastChannel bad = description_;
  bad.set_max_requests(0);
  EXPECT_THAT(Map(bad),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("malformed")));
  EXPECT_THAT(FastChannelClient::Map(description_, UniqueFd(), DoorbellFd()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no descriptor")));
  EXPECT_THAT(FastChannelClient::Map(description_, ChannelFd(), UniqueFd()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no doorbell")));
  // A channel bigger than the memory handed over cannot be mapped.
  bad = description_;
  bad.set_max_requests(kCapacity.max_requests * 4);
  EXPECT_THAT(Map(bad), StatusIs(absl::StatusCode::kFailedPrecondition,
                                 HasSubstr("smaller than")));
}

TEST_F(FastChannelClientTest, MapRefusesAnotherVersion) {
  daemon_->header()->version = fast_channel::kVersion + 1;
  EXPECT_THAT(Map(description_), StatusIs(absl::StatusCode::kFailedPrecondition,
                                          HasSubstr("does not match")));
}

TEST_F(FastChannelClientTest, CallPostsRingsAndReadsTheAnswer) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FastChannelClient> client,
                       Map(description_));
  EXPECT_EQ(client->max_requests(), kCapacity.max_requests);
  std::thread daemon = AnswerOneCall(
      [](const fast_channel::TakenCall& call, fast_channel::ChannelCodec& c) {
        c.BeginResults();
        for (int32_t i = 0; i < call.num_requests; ++i) {
          c.Accepted(i, /*ring_offset=*/i * 10, /*count=*/call.in1[i],
                     /*new_pages=*/1);
        }
        c.FinishResults(call.num_requests, 99, 0, call.num_requests, 5, 0);
      });
  const std::vector<int64_t> seq_lens = {3, 4}, last = {1, 2};
  fast_channel::CallView call;
  call.kind = fast_channel::CallKind::kDecode;
  call.in1 = seq_lens;
  call.in2 = last;
  // A new channel's poller may sleep: the call rings its doorbell.
  ASSERT_OK(client->Call(call, absl::ZeroDuration(),
                         absl::Now() + absl::Seconds(30),
                         [] { return absl::OkStatus(); }));
  daemon.join();
  EXPECT_EQ(Rings(), 1u);
  EXPECT_OK(client->codec().CallStatus());
  fast_channel::AllocAnswerView answer;
  ASSERT_OK(client->codec().ReadAllocAnswer(2, &answer));
  EXPECT_THAT(answer.counts, ElementsAre(3, 4));
  EXPECT_THAT(answer.ring_offsets, ElementsAre(0, 10));
  EXPECT_EQ(answer.ring_end, 99);
  EXPECT_EQ(answer.launch_id, 5u);

  // A poller that is awake (spinning) is not rung.
  daemon_->SetPollerSleeping(false);
  daemon =
      AnswerOneCall([](const fast_channel::TakenCall&,
                       fast_channel::ChannelCodec& c) { c.WriteOpValue(0); });
  call.kind = fast_channel::CallKind::kCheckpoint;
  ASSERT_OK(client->Call(call, absl::ZeroDuration(),
                         absl::Now() + absl::Seconds(30),
                         [] { return absl::OkStatus(); }));
  daemon.join();
  EXPECT_EQ(Rings(), 0u);
}

TEST_F(FastChannelClientTest, AnUnansweredCallEndsAtItsDeadlineOrWhenDead) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FastChannelClient> client,
                       Map(description_));
  fast_channel::CallView call;
  call.kind = fast_channel::CallKind::kCheckpoint;
  EXPECT_THAT(client->Call(call, absl::ZeroDuration(), absl::Now(),
                           [] { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("later calls go through gRPC")));
  EXPECT_THAT(
      client->Call(call, absl::ZeroDuration(), absl::Now() + absl::Hours(1),
                   [] { return absl::NotFoundError("session gone"); }),
      StatusIs(absl::StatusCode::kNotFound, "session gone"));
}

TEST_F(FastChannelClientTest, OversizedCallsAreRefusedBeforePosting) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FastChannelClient> client,
                       Map(description_));
  const std::vector<int64_t> too_many(kCapacity.max_requests + 1, 1);
  fast_channel::CallView call;
  call.kind = fast_channel::CallKind::kAlloc;
  call.in1 = too_many;
  EXPECT_THAT(
      client->Call(call, absl::ZeroDuration(), absl::Now() + absl::Seconds(1),
                   [] { return absl::OkStatus(); }),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("at most 16 requests")));
  EXPECT_EQ(daemon_->PostedSeq(), 0u);
}

// The stale-answer fence as the client library sees it: OK while the
// daemon has not ended the session, NOT_FOUND naming it and why after,
// whatever the answer waiting in the channel says.
TEST_F(FastChannelClientTest, SessionLiveTurnsNotFoundOnceTheDaemonEndsIt) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FastChannelClient> client,
                       Map(description_));
  std::thread daemon =
      AnswerOneCall([](const fast_channel::TakenCall&,
                       fast_channel::ChannelCodec& c) { c.WriteOpValue(2); });
  fast_channel::CallView call;
  call.kind = fast_channel::CallKind::kRollback;
  ASSERT_OK(client->Call(call, absl::Microseconds(10),
                         absl::Now() + absl::Seconds(30),
                         [] { return absl::OkStatus(); }));
  daemon.join();
  EXPECT_OK(client->SessionLive(7));
  daemon_->EndSession("lost its lease");
  EXPECT_OK(client->codec().CallStatus());
  EXPECT_EQ(client->codec().OpValue(), 2);
  EXPECT_THAT(client->SessionLive(7),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("session 7 ended (lost its lease)")));
}

}  // namespace
}  // namespace pagealloc
