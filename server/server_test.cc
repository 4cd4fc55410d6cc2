// Server's first-run choices: where it listens without --listen, and which
// TCP addresses it refuses without TLS.

#include "server/server.h"

#include <sys/stat.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A directory that cannot hold sockets for anyone, root included: its
// parent is a file.
constexpr char kUnusable[] = "/dev/null/pagealloc";

TEST(DefaultListenAddressTest, UsesTheSystemDirectoryWhenItCan) {
  const std::string dir = ::testing::TempDir() + "/run-pagealloc";
  EXPECT_THAT(DefaultListenAddress(3, dir, ::testing::TempDir()),
              IsOkAndHolds("unix://" + dir + "/gpu3.sock"));
  struct stat st;
  ASSERT_EQ(stat(dir.c_str(), &st), 0) << "the directory was not created";
  EXPECT_TRUE(S_ISDIR(st.st_mode));
}

TEST(DefaultListenAddressTest, FallsBackToTheUsersRuntimeDirectory) {
  const std::string runtime = ::testing::TempDir() + "/xdg";
  ASSERT_EQ(mkdir(runtime.c_str(), 0700), 0);
  EXPECT_THAT(DefaultListenAddress(0, kUnusable, runtime),
              IsOkAndHolds("unix://" + runtime + "/pagealloc/gpu0.sock"));
  struct stat st;
  ASSERT_EQ(stat((runtime + "/pagealloc").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700) << "the fallback is this user's alone";
}

TEST(DefaultListenAddressTest, SaysWhyAndWhatToDoWhenNeitherWorks) {
  EXPECT_THAT(
      DefaultListenAddress(1, kUnusable, ""),
      StatusIs(absl::StatusCode::kPermissionDenied,
               AllOf(HasSubstr("cannot create the socket directory "
                               "/dev/null/pagealloc: Not a directory"),
                     HasSubstr("$XDG_RUNTIME_DIR is not set"),
                     HasSubstr("sudo install -d -o"),
                     HasSubstr("--listen=unix:///tmp/pagealloc-gpu1.sock"))));
  EXPECT_THAT(DefaultListenAddress(1, kUnusable, "/dev/null"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("/dev/null/pagealloc: Not a directory; and "
                                 "cannot create the socket directory "
                                 "/dev/null/pagealloc")));
}

TEST(IsLoopbackAddressTest, TellsLoopbackFromEveryOtherAddress) {
  for (const char* loopback :
       {"127.0.0.1:50051", "127.1.2.3:0", "localhost:50051", "[::1]:50051",
        "ipv4:127.0.0.1:50051", "ipv6:[::1]:50051",
        "[::ffff:127.0.0.1]:50051"}) {
    EXPECT_TRUE(IsLoopbackAddress(loopback)) << loopback;
  }
  for (const char* other :
       {"0.0.0.0:50051", "[::]:50051", ":50051", "10.0.0.7:50051",
        "[fe80::1]:50051", "example.com:50051", "128.0.0.1:50051",
        "localhost.example.com:50051", "[::ffff:10.0.0.1]:50051"}) {
    EXPECT_FALSE(IsLoopbackAddress(other)) << other;
  }
}

ServerOptions TcpOnly(const std::string& address) {
  ServerOptions options;
  options.backend = "cpu";
  options.pool = {64, 4, FreePolicy::kLifo};
  options.listen = {address};
  return options;
}

TEST(ServerTcpTest, RefusesPlainTcpBeyondLoopbackAndSaysWhatToDo) {
  absl::StatusOr<std::unique_ptr<Server>> server =
      Server::Create(TcpOnly("0.0.0.0:0"));
  ASSERT_OK(server.status());
  EXPECT_THAT((*server)->Start(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("refusing to listen on 0.0.0.0:0 "
                                       "without TLS"),
                             HasSubstr("--tls_cert_file"),
                             HasSubstr("--allow_insecure_tcp"))));
}

TEST(ServerTcpTest, StartsOnPlainTcpBeyondLoopbackWhenAllowed) {
  ServerOptions options = TcpOnly("0.0.0.0:0");
  options.allow_insecure_tcp = true;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
  ASSERT_OK(server.status());
  ASSERT_OK((*server)->Start());
  EXPECT_THAT((*server)->bound_addresses(),
              ::testing::ElementsAre(::testing::StartsWith("0.0.0.0:")));
  (*server)->Shutdown();
}

TEST(ServerTcpTest, StartsOnLoopbackTcpWithoutTheFlag) {
  absl::StatusOr<std::unique_ptr<Server>> server =
      Server::Create(TcpOnly("127.0.0.1:0"));
  ASSERT_OK(server.status());
  EXPECT_OK((*server)->Start());
  EXPECT_OK((*server)->Health());
  (*server)->Shutdown();
  EXPECT_THAT((*server)->Health(),
              StatusIs(absl::StatusCode::kUnavailable, "draining"));
}

}  // namespace
}  // namespace pagealloc
