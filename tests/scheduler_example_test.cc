// Runs client/examples/scheduler_example (docs/integration.md's example)
// against a real pagealloc-server on a private Unix socket and checks that
// every step it documents happened, and that it left the pool empty.

#include <cstdlib>
#include <string>
#include <vector>

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
using ::testing::Not;

struct ExampleRun {
  std::string output;
  v1::GetStatsResponse after;  // the daemon's, once the example is done
};

// Runs the example against a fresh daemon started with `flags` and waits
// until the daemon's pool is empty again.
void RunExample(const std::string& name, const std::vector<std::string>& flags,
                ExampleRun* run,
                const std::string& binary = "client/scheduler_example") {
  ASSERT_OK_AND_ASSIGN(Daemon daemon, StartDaemon(name, flags));
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string log_path =
      absl::StrFormat("%s/%s.example.log", tmp != nullptr ? tmp : "/tmp", name);
  ASSERT_OK_AND_ASSIGN(
      Subprocess example,
      Subprocess::Start({RunfilePath(binary), "--target=" + daemon.target},
                        log_path));
  ASSERT_OK_AND_ASSIGN(int status, example.Wait(absl::Seconds(120)));
  run->output = ReadLog(log_path);
  ASSERT_EQ(DescribeWaitStatus(status), "exited 0") << run->output;
  ASSERT_OK_AND_ASSIGN(run->after,
                       WaitUntilEmpty(daemon.target, absl::Seconds(5)));
}

TEST(SchedulerExampleTest, RunsEveryStepAgainstARealDaemon) {
  // 64 pages of 16 tokens: prefill and decode fit, and the oversized
  // request of step 6 needs evictions of the running requests.
  ExampleRun run;
  ASSERT_NO_FATAL_FAILURE(
      RunExample("example", {"--num_pages=64", "--page_size=16"}, &run));
  const std::string& output = run.output;
  EXPECT_THAT(output, HasSubstr("registered: session"));
  EXPECT_THAT(output, HasSubstr("prefill: 100, 200, 37 tokens"));
  EXPECT_THAT(output, HasSubstr("decode: 20 steps, request a at 120 tokens"));
  EXPECT_THAT(output, HasSubstr("kept 2 tokens each"));
  EXPECT_THAT(output, HasSubstr("finished c: 4 pages freed"));
  // A small pool needs no other requests to be under pressure.
  EXPECT_THAT(output, Not(HasSubstr("busy:")));
  // The first admission attempt is refused for lack of pages, by the
  // daemon's own message, before any eviction.
  EXPECT_THAT(output, HasSubstr("admit d ("));
  EXPECT_THAT(output, HasSubstr("out of pages: needs"));
  EXPECT_THAT(output, HasSubstr("evicted b:"));
  EXPECT_THAT(output, HasSubstr("admitted d after"));
  EXPECT_THAT(output, HasSubstr("pool empty"));

  EXPECT_EQ(run.after.used_pages(), 0);
  EXPECT_EQ(run.after.sessions_active(), 0);
  EXPECT_GT(run.after.out_of_pages_total(), 0) << "step 6 was never refused";
}

// A pool far larger than one call (1M pages of 16 tokens, 16M slots, with
// the daemon's default --max_batch_tokens of 2M): the oversized request
// must still be a shortage (RESOURCE_EXHAUSTED), which it can only be once
// other requests hold most of the pool.
TEST(SchedulerExampleTest, WorksAgainstALargePool) {
  ExampleRun run;
  ASSERT_NO_FATAL_FAILURE(
      RunExample("large", {"--num_pages=1048576", "--page_size=16"}, &run));
  const std::string& output = run.output;
  EXPECT_THAT(output, HasSubstr("busy: "));
  EXPECT_THAT(output, HasSubstr("out of pages: needs"));
  EXPECT_THAT(output, Not(HasSubstr("INVALID_ARGUMENT")));
  EXPECT_THAT(output, HasSubstr("evicted e"));
  EXPECT_THAT(output, HasSubstr("admitted d after 1 eviction(s)"));
  EXPECT_THAT(output, HasSubstr("pool empty"));
  EXPECT_EQ(run.after.used_pages(), 0);
  EXPECT_GT(run.after.out_of_pages_total(), 0) << "step 6 was never refused";
}

// docs/integration.md's KV example: it writes every token's K and V for
// every layer at its slots through the daemon's slab and reads them back.
TEST(SchedulerExampleTest, KvExampleWritesAndReadsKvThroughTheSlab) {
  ExampleRun run;
  ASSERT_NO_FATAL_FAILURE(
      RunExample("kv-example",
                 {"--kv_layout=mha:layers=4,kv_heads=2,head_dim=64,dtype=bf16",
                  "--kv_memory=16MiB", "--page_size=16"},
                 &run, "client/kv_example"));
  const std::string& output = run.output;
  EXPECT_THAT(output,
              HasSubstr("layout mha:layers=4,kv_heads=2,head_dim=64,dtype="
                        "bf16, 8 buffers of"));
  EXPECT_THAT(output, HasSubstr("buffer k.0: bf16 [")) << output;
  EXPECT_THAT(output, HasSubstr("wrote 45 tokens x 8 buffers"));
  EXPECT_THAT(output, HasSubstr("read back 45 tokens x 8 buffers: 0 "
                                "mismatches"));
  EXPECT_THAT(output, HasSubstr("freed 3 pages"));
  EXPECT_EQ(run.after.used_pages(), 0);
}

}  // namespace
}  // namespace pagealloc::testing
