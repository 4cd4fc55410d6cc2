// The publisher's checks and its in-process followers, with the gRPC
// stream over an in-process channel. The ZMQ wire end to end, with a
// Python subscriber, is tests/kv_events_subscriber_test.

#include "kv_events/publisher.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kv_events/grpc_stream.h"
#include "proto/pagealloc.grpc.pb.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::pagealloc::testing::WaitFor;
using ::testing::HasSubstr;

// Bounds every wait for a message; never a measure of speed.
constexpr absl::Duration kPatience = absl::Seconds(60);

StoredBlocks Blocks(std::vector<std::string> keys, int64_t block_size) {
  StoredBlocks blocks;
  blocks.keys = std::move(keys);
  blocks.block_size = block_size;
  for (int64_t i = 0; i < block_size * static_cast<int64_t>(blocks.keys.size());
       ++i) {
    blocks.token_ids.push_back(100 + i);
  }
  return blocks;
}

TEST(KvEventPublisherTest, RefusesOptionsOutOfRange) {
  KvEventPublisherOptions options;
  options.queue_events = 0;
  EXPECT_THAT(KvEventPublisher::Create(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("queue_events (0) must be >= 1")));
  options = {};
  options.max_batch_events = -3;
  EXPECT_THAT(KvEventPublisher::Create(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_batch_events (-3) must be >= 1")));
  options = {};
  options.replay_batches = -1;
  EXPECT_THAT(KvEventPublisher::Create(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("replay_batches (-1) must be >= 0")));
}

TEST(KvEventPublisherTest, NamesAnEndpointItCannotBind) {
  KvEventPublisherOptions options;
  options.endpoint = "bogus://nowhere";
  EXPECT_THAT(KvEventPublisher::Create(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot bind a KV-event socket to "
                                 "bogus://nowhere")));
}

TEST(KvEventPublisherTest, ResolvesAWildcardPort) {
  KvEventPublisherOptions options;
  options.endpoint = "tcp://127.0.0.1:*";
  options.replay_endpoint = "tcp://127.0.0.1:*";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvEventPublisher> publisher,
                       KvEventPublisher::Create(options));
  EXPECT_THAT(publisher->pub_endpoint(), HasSubstr("tcp://127.0.0.1:"));
  EXPECT_NE(publisher->pub_endpoint(), "tcp://127.0.0.1:*");
  EXPECT_NE(publisher->pub_endpoint(), publisher->replay_endpoint());
}

TEST(KvEventPublisherTest, WindowStartsWithAllBlocksClearedAndKeepsOrder) {
  KvEventPublisherOptions options;
  options.replay_batches = 2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvEventPublisher> publisher,
                       KvEventPublisher::Create(options));
  publisher->Start();
  publisher->Flush();
  auto first = publisher->BatchesFrom(0, 10);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0]->batch.sequence, 0);
  ASSERT_EQ(first[0]->batch.events.size(), 1u);
  EXPECT_EQ(first[0]->batch.events[0].kind, KvEventKind::kAllBlocksCleared);

  publisher->BlocksStored(Blocks({"a"}, 1));
  publisher->Flush();
  const std::vector<std::string> removed = {"a"};
  publisher->BlocksRemoved(removed);
  publisher->Flush();
  auto window = publisher->BatchesFrom(0, 10);
  ASSERT_EQ(window.size(), 2u);  // the window's bound
  EXPECT_EQ(window[0]->batch.sequence, 1);
  EXPECT_EQ(window[1]->batch.sequence, 2);
  EXPECT_EQ(window[1]->batch.events[0].kind, KvEventKind::kBlockRemoved);
  EXPECT_EQ(publisher->BatchesFrom(2, 10).size(), 1u);
  EXPECT_EQ(publisher->BatchesFrom(0, 1).size(), 1u);
  const KvEventPublisherStats stats = publisher->stats();
  EXPECT_EQ(stats.events_published, 3);
  EXPECT_EQ(stats.batches_published, 3);
  EXPECT_EQ(stats.oldest_sequence, 1);
  EXPECT_EQ(stats.next_sequence, 3);
  EXPECT_EQ(stats.events_dropped, 0);
}

TEST(KvEventPublisherTest, AFullQueueDropsAndSkipsASequenceNumber) {
  KvEventPublisherOptions options;
  options.queue_events = 2;  // AllBlocksCleared and one more
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvEventPublisher> publisher,
                       KvEventPublisher::Create(options));
  publisher->BlocksStored(Blocks({"a"}, 1));
  publisher->BlocksStored(Blocks({"b"}, 1));  // dropped
  publisher->BlocksStored(Blocks({"c"}, 1));  // dropped
  EXPECT_EQ(publisher->stats().events_dropped, 2);
  publisher->Start();
  publisher->Flush();
  publisher->BlocksStored(Blocks({"d"}, 1));
  publisher->Flush();
  auto window = publisher->BatchesFrom(0, 10);
  ASSERT_EQ(window.size(), 2u);
  EXPECT_EQ(window[0]->batch.sequence, 0);
  EXPECT_EQ(window[0]->batch.events.size(), 2u);
  EXPECT_EQ(window[1]->batch.sequence, 2);
  EXPECT_EQ(window[1]->batch.events[0].stored.keys[0], "d");
  EXPECT_EQ(publisher->stats().sequence_gaps, 1);
}

class KvEventsServiceTest : public ::testing::Test {
 protected:
  void StartServer(KvEventPublisher* publisher) {
    service_ = std::make_unique<KvEventsService>(publisher);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::KvEvents::NewStub(
        server_->InProcessChannel(grpc::ChannelArguments()));
  }

  // Streams end before the publisher they follow.
  void TearDown() override {
    if (server_ != nullptr) {
      server_->Shutdown();
      server_->Wait();
    }
  }

  void MakePublisher() {
    auto publisher = KvEventPublisher::Create({});
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    publisher_ = *std::move(publisher);
    publisher_->Start();
  }

  std::unique_ptr<grpc::ClientReader<v1::KvEventBatch>> Subscribe(
      grpc::ClientContext* context, int64_t from) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + kPatience));
    v1::SubscribeKvEventsRequest request;
    request.set_from_sequence(from);
    return stub_->SubscribeKvEvents(context, request);
  }

  std::unique_ptr<KvEventPublisher> publisher_;
  std::unique_ptr<KvEventsService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::KvEvents::Stub> stub_;
};

TEST_F(KvEventsServiceTest, ReplaysTheWindowThenSendsLiveBatches) {
  MakePublisher();
  KvEventPublisher* publisher = publisher_.get();
  StoredBlocks chain = Blocks({"k1", "k2"}, 2);
  chain.parent_key = "k0";
  chain.lora_id = 4;
  publisher->BlocksStored(chain);
  publisher->Flush();
  StartServer(publisher);

  grpc::ClientContext context;
  auto reader = Subscribe(&context, 0);
  v1::KvEventBatch batch;
  // The window: AllBlocksCleared (batch 0), the chain (batch 1, or 0 with
  // it: batching is the publisher's choice).
  std::vector<v1::KvEvent> events;
  int64_t last_sequence = -1;
  while (events.size() < 2) {
    ASSERT_TRUE(reader->Read(&batch));
    EXPECT_EQ(batch.sequence(), last_sequence + 1);
    EXPECT_EQ(batch.schema_version(), kKvEventsSchemaVersion);
    last_sequence = batch.sequence();
    for (const v1::KvEvent& event : batch.events()) events.push_back(event);
  }
  EXPECT_TRUE(events[0].has_all_blocks_cleared());
  ASSERT_TRUE(events[1].has_block_stored());
  const v1::KvBlockStored& stored = events[1].block_stored();
  EXPECT_THAT(stored.block_hashes(), ::testing::ElementsAre("k1", "k2"));
  EXPECT_EQ(stored.parent_block_hash(), "k0");
  EXPECT_THAT(stored.token_ids(), ::testing::ElementsAre(100, 101, 102, 103));
  EXPECT_EQ(stored.block_size(), 2);
  EXPECT_EQ(stored.lora_id(), 4);
  EXPECT_EQ(stored.medium(), "GPU");
  EXPECT_EQ(publisher->stats().followers, 1);

  // Live: a batch published after the stream caught up.
  const std::vector<std::string> removed = {"k2"};
  publisher->BlocksRemoved(removed);
  ASSERT_TRUE(reader->Read(&batch));
  EXPECT_EQ(batch.sequence(), last_sequence + 1);
  ASSERT_EQ(batch.events_size(), 1);
  EXPECT_THAT(batch.events(0).block_removed().block_hashes(),
              ::testing::ElementsAre("k2"));

  context.TryCancel();
  while (reader->Read(&batch)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(
      WaitFor([&] { return publisher->stats().followers == 0; }, kPatience));
}

TEST_F(KvEventsServiceTest, StartsFromASequenceNumberOrLiveOnly) {
  MakePublisher();
  KvEventPublisher* publisher = publisher_.get();
  publisher->Flush();                        // batch 0
  for (const char* key : {"a", "b", "c"}) {  // batches 1, 2, 3
    publisher->BlocksStored(Blocks({key}, 1));
    publisher->Flush();
  }
  StartServer(publisher);

  grpc::ClientContext from_two;
  auto replaying = Subscribe(&from_two, 2);
  v1::KvEventBatch batch;
  ASSERT_TRUE(replaying->Read(&batch));
  EXPECT_EQ(batch.sequence(), 2);
  EXPECT_EQ(batch.events(0).block_stored().block_hashes(0), "b");

  grpc::ClientContext live;
  auto live_only = Subscribe(&live, -1);
  // Once the stream is open (it counts as a follower), publish.
  ASSERT_TRUE(
      WaitFor([&] { return publisher->stats().followers == 2; }, kPatience));
  publisher->BlocksStored(Blocks({"d"}, 1));
  ASSERT_TRUE(live_only->Read(&batch));
  EXPECT_EQ(batch.sequence(), 4);
  EXPECT_EQ(batch.events(0).block_stored().block_hashes(0), "d");
  from_two.TryCancel();
  live.TryCancel();
}

TEST_F(KvEventsServiceTest, RefusesASequenceNumberOutOfRange) {
  MakePublisher();
  KvEventPublisher* publisher = publisher_.get();
  publisher->Flush();  // the next sequence number is 1
  StartServer(publisher);
  v1::KvEventBatch batch;
  {
    grpc::ClientContext context;
    auto reader = Subscribe(&context, -2);
    EXPECT_FALSE(reader->Read(&batch));
    const grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("from_sequence (-2)"));
  }
  {
    grpc::ClientContext context;
    auto reader = Subscribe(&context, 7);
    EXPECT_FALSE(reader->Read(&batch));
    const grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
    EXPECT_THAT(status.error_message(),
                HasSubstr("from_sequence (7) is past the next sequence "
                          "number (1)"));
  }
  EXPECT_EQ(publisher->stats().followers, 0);
}

TEST_F(KvEventsServiceTest, WithoutAPublisherEveryCallIsRefused) {
  StartServer(nullptr);
  grpc::ClientContext context;
  auto reader = Subscribe(&context, 0);
  v1::KvEventBatch batch;
  EXPECT_FALSE(reader->Read(&batch));
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("--kv_events_endpoint"));
}

}  // namespace
}  // namespace pagealloc
