// The client's end of the fast channel against a daemon's end played by
// this test through the same codec, over real shared memory.

#include "client/fast_channel_client.h"

#include <unistd.h>

#include <atomic>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
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
    std::random_device random;
    const std::string prefix =
        absl::StrFormat("/pagealloc-fcc-test.%d.%08x", getpid(), random());
    const fast_channel::ChannelLayout layout(kCapacity.max_requests,
                                             kCapacity.message_bytes);
    ASSERT_OK_AND_ASSIGN(
        channel_,
        SharedRegion::Create(prefix + ".channel", layout.total_bytes, 0600));
    ASSERT_OK_AND_ASSIGN(
        doorbell_, SharedRegion::Create(prefix + ".doorbell",
                                        sizeof(fast_channel::Doorbell), 0600));
    daemon_.emplace(channel_->base(), kCapacity);
    daemon_->Initialize();
    description_.set_shm_name(channel_->name());
    description_.set_doorbell_shm_name(doorbell_->name());
    description_.set_max_requests(kCapacity.max_requests);
    description_.set_message_bytes(kCapacity.message_bytes);
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
  std::unique_ptr<SharedRegion> doorbell_;
  std::optional<fast_channel::ChannelCodec> daemon_;
  uint32_t answered_ = 0;
  v1::FastChannel description_;
};

TEST_F(FastChannelClientTest, MapRefusesMalformedDescriptions) {
  v1::FastChannel bad = description_;
  bad.set_max_requests(0);
  EXPECT_THAT(FastChannelClient::Map(bad),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("malformed")));
  bad = description_;
  bad.set_shm_name("/pagealloc-fcc-test-missing");
  EXPECT_THAT(FastChannelClient::Map(bad),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("missing")));
  // A channel bigger than the one created cannot be mapped.
  bad = description_;
  bad.set_max_requests(kCapacity.max_requests * 4);
  EXPECT_THAT(FastChannelClient::Map(bad),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("smaller than")));
}

TEST_F(FastChannelClientTest, MapRefusesAnotherVersion) {
  daemon_->header()->version = fast_channel::kVersion + 1;
  EXPECT_THAT(FastChannelClient::Map(description_),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("does not match")));
}

TEST_F(FastChannelClientTest, CallPostsRingsAndReadsTheAnswer) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FastChannelClient> client,
                       FastChannelClient::Map(description_));
  EXPECT_EQ(client->max_requests(), kCapacity.max_requests);
  std::thread daemon = AnswerOneCall(
      [](const fast_channel::TakenCall& call, fast_channel::ChannelCodec& c) {
        c.BeginResults();
        for (int32_t i = 0; i < call.num_requests; ++i) {
          c.Accepted(i, /*ring_offset=*/i * 10, /*count=*/call.in1[i],
                     /*new_pages=*/1);
        }
        c.FinishResults(call.num_requests, 99, 0, call.num_requests, 5);
      });
  const std::vector<int64_t> seq_lens = {3, 4}, last = {1, 2};
  fast_channel::CallView call;
  call.kind = fast_channel::CallKind::kDecode;
  call.in1 = seq_lens;
  call.in2 = last;
  const uint32_t bell_before =
      static_cast<fast_channel::Doorbell*>(doorbell_->base())->seq.load();
  ASSERT_OK(client->Call(call, absl::ZeroDuration(),
                         absl::Now() + absl::Seconds(30),
                         [] { return absl::OkStatus(); }));
  daemon.join();
  EXPECT_EQ(static_cast<fast_channel::Doorbell*>(doorbell_->base())->seq.load(),
            bell_before + 1);
  EXPECT_OK(client->codec().CallStatus());
  fast_channel::AllocAnswerView answer;
  ASSERT_OK(client->codec().ReadAllocAnswer(2, &answer));
  EXPECT_THAT(answer.counts, ElementsAre(3, 4));
  EXPECT_THAT(answer.ring_offsets, ElementsAre(0, 10));
  EXPECT_EQ(answer.ring_end, 99);
  EXPECT_EQ(answer.launch_id, 5u);
}

TEST_F(FastChannelClientTest, AnUnansweredCallEndsAtItsDeadlineOrWhenDead) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FastChannelClient> client,
                       FastChannelClient::Map(description_));
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
                       FastChannelClient::Map(description_));
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

}  // namespace
}  // namespace pagealloc
