// The session-less admin call's own failures; its answers against a real
// daemon are checked by the integration tests that use it (tests/).

#include "client/admin.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

TEST(AdminTest, WithoutATargetLooksWhereTheDaemonListensByDefault) {
  struct stat st;
  if (stat("/run/pagealloc/gpu0.sock", &st) == 0) {
    GTEST_SKIP() << "a daemon listens on /run/pagealloc/gpu0.sock here";
  }
  const std::string runtime = ::testing::TempDir() + "/admin-xdg";
  mkdir(runtime.c_str(), 0700);
  setenv("XDG_RUNTIME_DIR", runtime.c_str(), 1);
  EXPECT_THAT(GetDaemonStats(AdminOptions()),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("looked at /run/pagealloc/gpu0.sock (No such "
                                 "file or directory), " +
                                 runtime + "/pagealloc/gpu0.sock")));
}

TEST(AdminTest, NoDaemonIsUnavailable) {
  AdminOptions options;
  options.target = "unix:///nonexistent/pagealloc-admin-test.sock";
  EXPECT_THAT(GetDaemonStats(options),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

}  // namespace
}  // namespace pagealloc
