#include "common/command_line.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pagealloc {
namespace {

TEST(UnixSchemeHintTest, SuggestsTheSchemeForPathsOnly) {
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  const struct {
    const char* address;
    std::string hint;
  } cases[] = {
      {"/tmp/x.sock", "did you mean unix:///tmp/x.sock?"},
      {"x.sock", absl::StrCat("did you mean unix://", cwd, "/x.sock?")},
      {"run/x", absl::StrCat("did you mean unix://", cwd, "/run/x?")},
      {"unix://tmp/x.sock",
       absl::StrCat("did you mean unix://", cwd, "/tmp/x.sock?")},
      // Right already, or not a path.
      {"unix:///tmp/x.sock", ""},
      {"unix:x.sock", ""},
      {"127.0.0.1:50051", ""},
      {"[::1]:50051", ""},
      {"dns:///host:50051", ""},
      {"localhost", ""},
      {"", ""},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(UnixSchemeHint(c.address), c.hint) << c.address;
  }
}

}  // namespace
}  // namespace pagealloc
