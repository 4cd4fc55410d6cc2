// Server's first-run choices that need no running server: where it listens
// without --listen.

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

}  // namespace
}  // namespace pagealloc
