// Runs client/examples/scheduler_example (docs/integration.md's example)
// against a real pagealloc-server on a private Unix socket and checks that
// every step it documents happened, and that it left the pool empty.

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/daemon_stats.h"
#include "tests/status_matchers.h"
#include "tests/subprocess.h"

namespace pagealloc::testing {
namespace {

using ::testing::HasSubstr;

TEST(SchedulerExampleTest, RunsEveryStepAgainstARealDaemon) {
  // 64 pages of 16 tokens: prefill and decode fit, and the oversized
  // request of step 6 needs evictions.
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon("example", {"--num_pages=64", "--page_size=16"}));
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string log_path =
      absl::StrFormat("%s/example.log", tmp != nullptr ? tmp : "/tmp");
  ASSERT_OK_AND_ASSIGN(
      Subprocess example,
      Subprocess::Start({RunfilePath("client/scheduler_example"),
                         "--target=" + daemon.target},
                        log_path));
  ASSERT_OK_AND_ASSIGN(int status, example.Wait(absl::Seconds(60)));
  const std::string output = ReadLog(log_path);
  ASSERT_EQ(DescribeWaitStatus(status), "exited 0") << output;

  EXPECT_THAT(output, HasSubstr("registered: session"));
  EXPECT_THAT(output, HasSubstr("prefill: 100, 200, 37 tokens"));
  EXPECT_THAT(output, HasSubstr("decode: 20 steps, request a at 120 tokens"));
  EXPECT_THAT(output, HasSubstr("kept 2 tokens each"));
  EXPECT_THAT(output, HasSubstr("finished c: 4 pages freed"));
  // The first admission attempt is refused for lack of pages, by the
  // daemon's own message, before any eviction.
  EXPECT_THAT(output, HasSubstr("admit d ("));
  EXPECT_THAT(output, HasSubstr("out of pages: needs"));
  EXPECT_THAT(output, HasSubstr("evicted b:"));
  EXPECT_THAT(output, HasSubstr("admitted d after"));
  EXPECT_THAT(output, HasSubstr("pool empty"));

  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats,
                       WaitUntilEmpty(daemon.target, absl::Seconds(5)));
  EXPECT_EQ(stats.used_pages(), 0);
  EXPECT_EQ(stats.sessions_active(), 0);
  EXPECT_GT(stats.out_of_pages_total(), 0) << "step 6 was never refused";
}

}  // namespace
}  // namespace pagealloc::testing
