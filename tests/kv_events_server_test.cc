// The daemon's KV events: the publisher Server wires behind
// --kv_events_endpoint, its first batch (AllBlocksCleared) on the replay
// socket, SubscribeKvEvents over the daemon's Unix socket, and the metrics.
// The producer (the pool's prefix cache) is driven here through
// Server::kv_event_sink().

#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/pagealloc.grpc.pb.h"
#include "tests/in_process_server.h"
#include "tests/kv_event_replay.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc {
namespace {

using ::testing::HasSubstr;

// Bounds every wait; never a measure of speed.
constexpr absl::Duration kPatience = absl::Seconds(60);

ServerOptions CpuOptions() {
  ServerOptions options;
  options.backend = "cpu";
  options.pool.num_pages = 64;
  options.pool.page_size = 4;
  return options;
}

class KvEventsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/pagealloc-kv-events-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    std::remove((dir_ + "/pub").c_str());
    std::remove((dir_ + "/replay").c_str());
    rmdir(dir_.c_str());
  }

  std::unique_ptr<v1::KvEvents::Stub> KvEventsStub(
      const testing::InProcessServer& server) {
    return v1::KvEvents::NewStub(grpc::CreateChannel(
        server.target(), grpc::InsecureChannelCredentials()));
  }

  std::string dir_;
};

TEST_F(KvEventsServerTest, PublishesFromTheSinkOnEveryWire) {
  ServerOptions options = CpuOptions();
  options.kv_events.endpoint = "ipc://" + dir_ + "/pub";
  options.kv_events.replay_endpoint = "ipc://" + dir_ + "/replay";
  ASSERT_OK_AND_ASSIGN(auto server, testing::InProcessServer::Start(options));
  KvEventSink* sink = server->server().kv_event_sink();
  ASSERT_NE(sink, nullptr);

  StoredBlocks blocks;
  blocks.keys = {"key-one"};
  blocks.block_size = 4;
  sink->BlocksStored(blocks);

  // SubscribeKvEvents over the daemon's socket: AllBlocksCleared first.
  auto stub = KvEventsStub(*server);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kPatience));
  v1::SubscribeKvEventsRequest request;
  request.set_from_sequence(0);
  auto reader = stub->SubscribeKvEvents(&context, request);
  std::vector<v1::KvEvent> events;
  v1::KvEventBatch batch;
  while (events.size() < 2 && reader->Read(&batch)) {
    for (const v1::KvEvent& event : batch.events()) events.push_back(event);
  }
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[0].has_all_blocks_cleared());
  EXPECT_EQ(events[1].block_stored().block_hashes(0), "key-one");

  const std::string metrics = server->server().metrics().Render();
  EXPECT_THAT(metrics, HasSubstr("pagealloc_kv_events_published_total 2"));
  EXPECT_THAT(metrics, HasSubstr("pagealloc_kv_event_subscribers 1"));
  EXPECT_THAT(metrics, HasSubstr("pagealloc_kv_events_dropped_total 0"));

  // vLLM's replay request on the ROUTER socket, from sequence 0.
  ASSERT_OK_AND_ASSIGN(auto replayed, testing::RequestKvEventReplay(
                                          options.kv_events.replay_endpoint,
                                          std::string(8, '\0')));
  ASSERT_FALSE(replayed.empty());
  EXPECT_EQ(replayed[0].first, std::string(8, '\0'));  // batch 0
  EXPECT_THAT(replayed[0].second, HasSubstr("AllBlocksCleared"));

  context.TryCancel();
  while (reader->Read(&batch)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(KvEventsServerTest, WithoutAnEndpointThereIsNoSinkAndNoStream) {
  ASSERT_OK_AND_ASSIGN(auto server,
                       testing::InProcessServer::Start(CpuOptions()));
  EXPECT_EQ(server->server().kv_event_sink(), nullptr);
  auto stub = KvEventsStub(*server);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kPatience));
  auto reader = stub->SubscribeKvEvents(&context, {});
  v1::KvEventBatch batch;
  EXPECT_FALSE(reader->Read(&batch));
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("--kv_events_endpoint"));
  EXPECT_THAT(server->server().metrics().Render(),
              HasSubstr("pagealloc_kv_events_published_total 0"));
}

TEST_F(KvEventsServerTest, AReplayEndpointNeedsAnEndpoint) {
  ServerOptions options = CpuOptions();
  options.kv_events.replay_endpoint = "ipc://" + dir_ + "/replay";
  EXPECT_THAT(Server::Create(options).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("--kv_events_replay_endpoint needs "
                                          "--kv_events_endpoint")));
}

}  // namespace
}  // namespace pagealloc
