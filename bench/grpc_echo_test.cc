#include "bench/grpc_echo.h"

#include <sys/stat.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/pagealloc.grpc.pb.h"
#include "tests/status_matchers.h"

namespace pagealloc::bench {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class EchoServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EchoServer::Options options;
    options.handoff_spin = absl::Microseconds(50);
    options.page_size = 16;
    ASSERT_OK_AND_ASSIGN(server_, EchoServer::Start(options));
    channel_ = grpc::CreateCustomChannel(server_->target(),
                                         grpc::InsecureChannelCredentials(),
                                         ClientChannelArguments());
    stub_ = v1::PageAllocator::NewStub(channel_);
  }

  // A small workload: the measurements only need its batch and lengths.
  static Workload SmallWorkload(int batch) {
    Workload w;
    w.batch = batch;
    w.max_seq_len = 64;
    return w;
  }

  std::unique_ptr<EchoServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::PageAllocator::Stub> stub_;
};

// seq_len 1 and 17 put the new token at the start of a page (16 tokens);
// 5 and 16 do not.
constexpr int64_t kSeqLens[] = {1, 5, 16, 17, 2048, 33};
constexpr int64_t kNewPages[] = {1, 0, 0, 1, 0, 1};

void ExpectDaemonShapedAnswer(const v1::AllocResponse& response,
                              int64_t previous_ring_end) {
  const v1::PackedResults& packed = response.packed();
  const int n = std::size(kSeqLens);
  ASSERT_EQ(packed.codes_size(), n);
  ASSERT_EQ(packed.ring_offsets_size(), n);
  ASSERT_EQ(packed.counts_size(), n);
  ASSERT_EQ(packed.new_pages_size(), n);
  EXPECT_EQ(response.results_size(), 0);
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(packed.codes(k), 0) << k;
    EXPECT_EQ(packed.ring_offsets(k), previous_ring_end + k) << k;
    EXPECT_EQ(packed.counts(k), 1) << k;
    EXPECT_EQ(packed.new_pages(k), kNewPages[k]) << k;
  }
  EXPECT_EQ(response.ring_end(), previous_ring_end + n);
  EXPECT_EQ(response.batch_requests(), n);
  EXPECT_GT(response.launch_id(), 0u);
  EXPECT_EQ(response.completion_value(), response.launch_id());
}

TEST_F(EchoServerTest, AnswersOnePackedResultPerRequestInBothModes) {
  v1::AllocDecodeRequest request;
  for (int64_t seq_len : kSeqLens) {
    request.add_seq_lens(seq_len);
    request.add_last_locs(seq_len == 1 ? -1 : 1000 + seq_len);
  }
  request.mutable_options()->set_packed_results(true);
  int64_t ring_end = 0;
  uint64_t launch_id = 0;
  for (EchoAnswer answer :
       {EchoAnswer::kInline, EchoAnswer::kHandedOff, EchoAnswer::kInline}) {
    server_->set_answer(answer);
    grpc::ClientContext context;
    v1::AllocResponse response;
    grpc::Status status = stub_->AllocDecode(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ExpectDaemonShapedAnswer(response, ring_end);
    EXPECT_GT(response.launch_id(), launch_id);
    ring_end = response.ring_end();
    launch_id = response.launch_id();
  }
  EXPECT_EQ(server_->answered(), 3);
}

TEST_F(EchoServerTest, ServesHealthAndNoOtherMethod) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext health_context;
  grpc::health::v1::HealthCheckRequest health_request;
  grpc::health::v1::HealthCheckResponse health_response;
  ASSERT_TRUE(
      health->Check(&health_context, health_request, &health_response).ok());
  EXPECT_EQ(health_response.status(),
            grpc::health::v1::HealthCheckResponse::SERVING);

  grpc::ClientContext context;
  v1::FreeRequest request;
  v1::FreeResponse response;
  EXPECT_EQ(stub_->Free(&context, request, &response).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(server_->answered(), 0);
}

TEST_F(EchoServerTest, MeasuresEveryCallInBothModes) {
  const Workload w = SmallWorkload(8);
  for (EchoAnswer answer : {EchoAnswer::kInline, EchoAnswer::kHandedOff}) {
    server_->set_answer(answer);
    const int64_t before = server_->answered();
    ASSERT_OK_AND_ASSIGN(
        EchoCalls calls,
        MeasureEchoCalls(server_->target(), EchoCall::kAllocDecode, w,
                         /*clients=*/1, /*seconds=*/0.05, /*seed=*/1));
    // Every call reached the server; all but the 100 untimed ones are in
    // the histogram.
    EXPECT_EQ(server_->answered() - before, calls.calls);
    EXPECT_EQ(calls.histogram.count(), calls.calls - 100);
    EXPECT_GT(calls.histogram.count(), 0);
    EXPECT_GT(calls.seconds, 0);
  }
}

TEST_F(EchoServerTest, MeasuresTwoClientsOnTheirOwnConnections) {
  server_->set_answer(EchoAnswer::kHandedOff);
  ASSERT_OK_AND_ASSIGN(
      EchoCalls calls,
      MeasureEchoCalls(server_->target(), EchoCall::kAllocDecode,
                       SmallWorkload(16), /*clients=*/2, /*seconds=*/0.05,
                       /*seed=*/7));
  EXPECT_EQ(server_->answered(), calls.calls);
  EXPECT_EQ(calls.histogram.count(), calls.calls - 2 * 100);
  // Each client times at least one call.
  EXPECT_GE(calls.histogram.count(), 2);
  EXPECT_GT(calls.seconds, 0);
}

TEST_F(EchoServerTest, CallsTheHooksAtTheTimedWindowsEnds) {
  server_->set_answer(EchoAnswer::kHandedOff);
  std::vector<int64_t> answered_at_start, answered_at_end;
  EchoWindowHooks hooks;
  hooks.at_start = [&] { answered_at_start.push_back(server_->answered()); };
  hooks.at_end = [&] { answered_at_end.push_back(server_->answered()); };
  ASSERT_OK_AND_ASSIGN(
      EchoCalls calls,
      MeasureEchoCalls(server_->target(), EchoCall::kAllocDecode,
                       SmallWorkload(16), /*clients=*/2, /*seconds=*/0.05,
                       /*seed=*/7, hooks));
  // Once each: at the start only the untimed calls were answered, at the
  // end every call.
  EXPECT_THAT(answered_at_start, ElementsAre(2 * 100));
  EXPECT_THAT(answered_at_end, ElementsAre(calls.calls));
}

TEST_F(EchoServerTest, MeasuresTheEmptyCall) {
  ASSERT_OK_AND_ASSIGN(
      EchoCalls calls,
      MeasureEchoCalls(server_->target(), EchoCall::kHealthCheck,
                       SmallWorkload(8), /*clients=*/1, /*seconds=*/0.05,
                       /*seed=*/1));
  EXPECT_EQ(calls.histogram.count(), calls.calls - 100);
  EXPECT_GT(calls.histogram.count(), 0);
  EXPECT_EQ(server_->answered(), 0);
}

TEST_F(EchoServerTest, RemovesItsSocketDirectory) {
  const std::string target = server_->target();
  ASSERT_TRUE(absl::StartsWith(target, "unix:///tmp/pagealloc-echo-"));
  const std::string path = target.substr(std::string("unix://").size());
  const std::string dir = path.substr(0, path.rfind('/'));
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  server_.reset();
  EXPECT_NE(stat(path.c_str(), &st), 0);
  EXPECT_NE(stat(dir.c_str(), &st), 0);
}

TEST(MeasureEchoCallsTest, RefusesNoClients) {
  EXPECT_THAT(
      MeasureEchoCalls("unix:///nonexistent", EchoCall::kHealthCheck,
                       Workload(), /*clients=*/0, 0.01, 1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("client")));
}

TEST(MeasureEchoCallsTest, AnUnreachableServerIsUnavailable) {
  EXPECT_THAT(
      MeasureEchoCalls("unix:///tmp/pagealloc-echo-nonexistent/echo.sock",
                       EchoCall::kAllocDecode, Workload(), /*clients=*/2, 0.01,
                       1),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("AllocDecode")));
}

}  // namespace
}  // namespace pagealloc::bench
