// The session-less admin call's own failures; its answers against a real
// daemon are checked by the integration tests that use it (tests/).

#include "client/admin.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

TEST(AdminTest, NeedsATargetOrAChannel) {
  EXPECT_THAT(GetDaemonStats(AdminOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("target is empty")));
}

TEST(AdminTest, NoDaemonIsUnavailable) {
  AdminOptions options;
  options.target = "unix:///nonexistent/pagealloc-admin-test.sock";
  EXPECT_THAT(GetDaemonStats(options),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

}  // namespace
}  // namespace pagealloc
