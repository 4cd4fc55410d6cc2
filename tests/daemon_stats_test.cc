#include "tests/daemon_stats.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/in_process_server.h"
#include "tests/status_matchers.h"

namespace pagealloc::testing {
namespace {

class DaemonStatsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.backend = "cpu";
    options.pool = {32, 4, FreePolicy::kLifo};
    ASSERT_OK_AND_ASSIGN(server_, InProcessServer::Start(options));
  }

  std::unique_ptr<InProcessServer> server_;
};

TEST_F(DaemonStatsTest, ReadsThePoolAndTheSessionsWithoutOpeningOne) {
  ClientOptions options;
  options.client_name = "watched";
  ASSERT_OK_AND_ASSIGN(auto client, server_->Connect(options));
  ASSERT_OK(client->Alloc({12}).status());
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats,
                       DaemonStats(server_->target()));
  EXPECT_EQ(stats.used_pages(), 3);
  EXPECT_EQ(stats.free_pages(), 29);
  EXPECT_EQ(stats.sessions_active(), 1);  // the reader opened none
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.sessions(0).client_name(), "watched");
  EXPECT_EQ(stats.sessions(0).pages_owned(), 3);
}

TEST_F(DaemonStatsTest, NobodyThereIsUnavailable) {
  EXPECT_THAT(DaemonStats("unix:///nonexistent/pagealloc.sock").status(),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST_F(DaemonStatsTest, WaitForStatsReturnsTheLastStatsEitherWay) {
  ASSERT_OK_AND_ASSIGN(auto client, server_->Connect());
  ASSERT_OK(client->Alloc({4}).status());
  // Never true: one check with a zero timeout, the stats come back.
  ASSERT_OK_AND_ASSIGN(
      v1::GetStatsResponse stats,
      WaitForStats(
          server_->target(),
          [](const v1::GetStatsResponse& s) { return s.used_pages() == 0; },
          absl::ZeroDuration()));
  EXPECT_EQ(stats.used_pages(), 1);
  EXPECT_THAT(
      WaitForStats(
          "unix:///nonexistent/pagealloc.sock",
          [](const v1::GetStatsResponse&) { return true; }, absl::Seconds(10))
          .status(),
      StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST_F(DaemonStatsTest, WaitUntilEmptySeesAClosedSessionsPagesComeBack) {
  ASSERT_OK_AND_ASSIGN(auto client, server_->Connect());
  ASSERT_OK(client->Alloc({16}).status());
  ASSERT_OK(client->Close());
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats,
                       WaitUntilEmpty(server_->target(), absl::Seconds(10)));
  EXPECT_EQ(stats.used_pages(), 0);
  EXPECT_EQ(stats.sessions_active(), 0);
  EXPECT_EQ(stats.free_pages(), 32);
}

}  // namespace
}  // namespace pagealloc::testing
