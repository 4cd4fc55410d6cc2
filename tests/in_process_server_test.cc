#include "tests/in_process_server.h"

#include <sys/stat.h>

#include <string>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_stats.h"
#include "tests/status_matchers.h"

namespace pagealloc::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

ServerOptions SmallCpuServer() {
  ServerOptions options;
  options.backend = "cpu";
  options.pool = {16, 4, FreePolicy::kLifo};
  return options;
}

std::string SocketPath(const InProcessServer& server) {
  EXPECT_TRUE(absl::StartsWith(server.target(), "unix://"));
  return server.target().substr(std::string("unix://").size());
}

TEST(InProcessServerTest, ServesTheInProcessChannelAndItsSocket) {
  ASSERT_OK_AND_ASSIGN(auto server, InProcessServer::Start(SmallCpuServer()));
  struct stat st;
  ASSERT_EQ(stat(SocketPath(*server).c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));

  // One client on the in-process channel (the default), one on the socket:
  // the same server sees both.
  ASSERT_OK_AND_ASSIGN(auto in_process, server->Connect());
  ClientOptions over_socket;
  over_socket.target = server->target();
  over_socket.client_name = "socket";
  ASSERT_OK_AND_ASSIGN(auto socket_client, server->Connect(over_socket));
  ASSERT_OK(in_process->Alloc({8}).status());
  ASSERT_OK(socket_client->Alloc({4}).status());
  EXPECT_EQ(server->pool().Stats().used_pages, 3);
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats,
                       DaemonStats(server->target()));
  EXPECT_EQ(stats.used_pages(), 3);
  std::vector<std::string> names;
  for (const v1::SessionStats& s : stats.sessions()) {
    names.push_back(s.client_name());
  }
  EXPECT_THAT(names, UnorderedElementsAre("test", "socket"));

  // A raw stub on the in-process channel reaches it too.
  v1::GetStatsRequest request;
  v1::GetStatsResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(server->NewStub()->GetStats(&context, request, &response).ok());
  EXPECT_EQ(response.sessions_active(), 2);
}

TEST(InProcessServerTest, StopDrainsAndRemovesTheSocket) {
  ASSERT_OK_AND_ASSIGN(auto server, InProcessServer::Start(SmallCpuServer()));
  const std::string path = SocketPath(*server);
  const std::string dir = path.substr(0, path.rfind('/'));
  ASSERT_OK(DaemonStats(server->target()).status());
  server->Stop();
  struct stat st;
  EXPECT_NE(stat(path.c_str(), &st), 0);
  EXPECT_THAT(DaemonStats(server->target()).status(),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  server->Stop();  // idempotent
  server.reset();
  EXPECT_NE(stat(dir.c_str(), &st), 0) << dir << " was left behind";
}

TEST(InProcessServerTest, KeepsTheCallersListenAddressesFirst) {
  ServerOptions options = SmallCpuServer();
  options.listen = {"127.0.0.1:0"};
  ASSERT_OK_AND_ASSIGN(auto server, InProcessServer::Start(options));
  const std::vector<std::string> bound = server->server().bound_addresses();
  ASSERT_EQ(bound.size(), 2u);
  EXPECT_THAT(bound[0], HasSubstr("127.0.0.1:"));
  EXPECT_NE(bound[0], "127.0.0.1:0");
  EXPECT_EQ(bound[1], server->target());
}

TEST(InProcessServerTest, ReturnsTheServersStartError) {
  ServerOptions options = SmallCpuServer();
  options.listen = {"127.0.0.1:0"};
  options.tls.cert_file = "/nonexistent/server.pem";
  EXPECT_THAT(
      InProcessServer::Start(options).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("needs both --tls_cert_file and --tls_key_file")));
}

}  // namespace
}  // namespace pagealloc::testing
