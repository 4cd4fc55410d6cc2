#include "server/scheduling_policy.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/batcher.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

SchedulingPolicy Make(const SchedulingPolicy::Settings& settings) {
  absl::StatusOr<SchedulingPolicy> policy = SchedulingPolicy::Create(settings);
  EXPECT_TRUE(policy.ok()) << policy.status();
  return *std::move(policy);
}

SchedulingPolicy FromFlags(const SchedulingPolicy::Flags& flags,
                           unsigned cpus) {
  return Make(SchedulingPolicy::SettingsFromFlags(flags, cpus));
}

TEST(SchedulingPolicyTest, LargeMachineSpinsGathersAndHandsAnswersOver) {
  const SchedulingPolicy policy =
      Make(SchedulingPolicy::DefaultsForMachine(16));
  const Batcher::Options& b = policy.settings().batcher;
  EXPECT_EQ(b.spin, absl::Microseconds(200));
  EXPECT_EQ(b.batch_window, absl::Microseconds(100));
  EXPECT_EQ(b.min_batch_calls, 4);
  EXPECT_EQ(policy.driver(), LaunchDriver::kBatcherThread);
  EXPECT_TRUE(policy.lone_client_drives());
  EXPECT_EQ(policy.grpc_answer_threads(), 1);
  EXPECT_EQ(policy.grpc_answer_spin(), absl::Microseconds(200));
  EXPECT_EQ(policy.settings().fast_channel_spin, absl::Microseconds(200));
  EXPECT_EQ(policy.settings().fast_channel_pollers, 1);
  EXPECT_THAT(policy.notes(), IsEmpty());
  EXPECT_EQ(policy.Summary(),
            "thread spinning 200 us, window 100 us for 4 calls");
}

TEST(SchedulingPolicyTest, SmallMachineLetsSubmittersDrive) {
  const SchedulingPolicy policy = Make(SchedulingPolicy::DefaultsForMachine(
      SchedulingPolicy::kMinCpusForSpinning - 1));
  const Batcher::Options& b = policy.settings().batcher;
  EXPECT_EQ(b.spin, absl::ZeroDuration());
  EXPECT_EQ(b.batch_window, absl::ZeroDuration());
  EXPECT_EQ(policy.driver(), LaunchDriver::kSubmitter);
  EXPECT_FALSE(policy.lone_client_drives());
  // The default answer thread has no spinning batcher thread to serve.
  EXPECT_EQ(policy.grpc_answer_threads(), 0);
  ASSERT_THAT(policy.notes(), SizeIs(1));
  EXPECT_THAT(policy.notes()[0], HasSubstr("--grpc_answer_threads=1"));
  EXPECT_EQ(policy.Summary(), "driven by submitters");
}

TEST(SchedulingPolicyTest, DefaultFlagsAreTheMachineDefaults) {
  for (unsigned cpus : {2u, 16u}) {
    const SchedulingPolicy::Settings from_flags =
        SchedulingPolicy::SettingsFromFlags({}, cpus);
    const SchedulingPolicy::Settings defaults =
        SchedulingPolicy::DefaultsForMachine(cpus);
    EXPECT_EQ(from_flags.batcher.spin, defaults.batcher.spin) << cpus;
    EXPECT_EQ(from_flags.batcher.batch_window, defaults.batcher.batch_window)
        << cpus;
    EXPECT_EQ(from_flags.batcher.min_batch_calls,
              defaults.batcher.min_batch_calls);
    EXPECT_EQ(from_flags.batcher.max_batch_requests,
              defaults.batcher.max_batch_requests);
    EXPECT_EQ(from_flags.batcher.max_batch_tokens,
              defaults.batcher.max_batch_tokens);
    EXPECT_EQ(from_flags.fast_channel_spin, defaults.fast_channel_spin);
    EXPECT_EQ(from_flags.grpc_answer_threads, defaults.grpc_answer_threads);
  }
}

TEST(SchedulingPolicyTest, DefaultWindowFollowsTheSpinNotTheMachine) {
  SchedulingPolicy::Flags no_spin;
  no_spin.batcher_spin_us = 0;
  EXPECT_EQ(FromFlags(no_spin, 16).settings().batcher.batch_window,
            absl::ZeroDuration());
  EXPECT_EQ(FromFlags(no_spin, 16).driver(), LaunchDriver::kSubmitter);
  SchedulingPolicy::Flags spin;
  spin.batcher_spin_us = 50;
  const SchedulingPolicy spinning = FromFlags(spin, 2);
  EXPECT_EQ(spinning.settings().batcher.spin, absl::Microseconds(50));
  EXPECT_EQ(spinning.settings().batcher.batch_window,
            SchedulingPolicy::kDefaultBatchWindow);
  EXPECT_TRUE(spinning.lone_client_drives());
  EXPECT_EQ(spinning.grpc_answer_spin(), absl::Microseconds(50));
}

TEST(SchedulingPolicyTest, WindowWithoutSpinWakesTheBatcherThread) {
  SchedulingPolicy::Flags flags;
  flags.batcher_spin_us = 0;
  flags.batch_window_us = 30;
  const SchedulingPolicy policy = FromFlags(flags, 16);
  EXPECT_EQ(policy.driver(), LaunchDriver::kBatcherThread);
  EXPECT_FALSE(policy.lone_client_drives());
  EXPECT_EQ(policy.grpc_answer_threads(), 0);
  EXPECT_EQ(policy.Summary(), "thread woken, window 30 us for 4 calls");
  for (const SchedulingRow& row : policy.Rows()) {
    EXPECT_THAT(row.drives, HasSubstr("the batcher thread (woken)"))
        << row.situation;
    EXPECT_EQ(row.answers, "the batcher thread") << row.situation;
  }
}

TEST(SchedulingPolicyTest, LoneClientRuleNeedsWindowAndMinCalls) {
  for (auto [window_us, min_calls] :
       {std::pair<int64_t, int>{0, 4}, std::pair<int64_t, int>{100, 0}}) {
    SchedulingPolicy::Flags flags;
    flags.batch_window_us = window_us;
    flags.batch_min_calls = min_calls;
    const SchedulingPolicy policy = FromFlags(flags, 16);
    EXPECT_FALSE(policy.lone_client_drives());
    EXPECT_FALSE(policy.settings().batcher.lone_client_drives);
    EXPECT_FALSE(policy.BatcherOptions(false).lone_client_drives);
    ASSERT_THAT(policy.notes(), SizeIs(1));
    EXPECT_THAT(policy.notes()[0],
                HasSubstr(absl::StrFormat("--batch_window_us > 0 (is %d) and "
                                          "--batch_min_calls > 0 (is %d)",
                                          window_us, min_calls)));
    EXPECT_EQ(policy.Rows()[0].drives,
              policy.settings().batcher.batch_window > absl::ZeroDuration()
                  ? "the batcher thread, gathering for up to 100 us"
                  : "the batcher thread");
  }
}

TEST(SchedulingPolicyTest, LoneClientRowNamesItsPoller) {
  const SchedulingPolicy policy =
      Make(SchedulingPolicy::DefaultsForMachine(16));
  const std::vector<SchedulingRow> rows = policy.Rows();
  ASSERT_THAT(rows, SizeIs(3));
  EXPECT_THAT(rows[0].drives, HasSubstr("its poller, inline"));
  EXPECT_EQ(rows[0].answers, "its poller");
  EXPECT_THAT(rows[1].drives, HasSubstr("the batcher thread, gathering"));
  EXPECT_THAT(rows[2].answers, HasSubstr("the answer threads, in turn"));
  EXPECT_THAT(rows[2].flags, HasSubstr("--grpc_answer_threads"));
}

TEST(SchedulingPolicyTest, NoAnswerThreadsLeavesAnswersToTheBatcherThread) {
  SchedulingPolicy::Flags flags;
  flags.grpc_answer_threads = 0;
  const SchedulingPolicy policy = FromFlags(flags, 16);
  EXPECT_EQ(policy.grpc_answer_threads(), 0);
  EXPECT_THAT(policy.notes(), IsEmpty());
  EXPECT_EQ(policy.Rows()[2].answers, "the batcher thread");
}

TEST(SchedulingPolicyTest, RefusesSettingsThatCannotWork) {
  struct Case {
    const char* what;
    void (*change)(SchedulingPolicy::Settings*);
    const char* message;
  };
  const Case cases[] = {
      {"no requests",
       [](SchedulingPolicy::Settings* s) { s->batcher.max_batch_requests = 0; },
       "--max_batch_requests=0: a launch needs room for one request"},
      {"no tokens",
       [](SchedulingPolicy::Settings* s) { s->batcher.max_batch_tokens = -3; },
       "--max_batch_tokens=-3: a launch needs room for one slot"},
      {"negative min calls",
       [](SchedulingPolicy::Settings* s) { s->batcher.min_batch_calls = -1; },
       "--batch_min_calls=-1"},
      {"negative spin",
       [](SchedulingPolicy::Settings* s) {
         s->batcher.spin = absl::Microseconds(-5);
       },
       "--batcher_spin_us=-5: a duration cannot be negative"},
      {"negative window",
       [](SchedulingPolicy::Settings* s) {
         s->batcher.batch_window = absl::Microseconds(-7);
       },
       "--batch_window_us=-7"},
      {"negative poller spin",
       [](SchedulingPolicy::Settings* s) {
         s->fast_channel_spin = absl::Microseconds(-1);
       },
       "--fast_channel_spin_us=-1"},
      {"no poller",
       [](SchedulingPolicy::Settings* s) { s->fast_channel_pollers = 0; },
       "--fast_channel_pollers=0: the fast channel needs a poller"},
      {"negative answer threads",
       [](SchedulingPolicy::Settings* s) { s->grpc_answer_threads = -2; },
       "--grpc_answer_threads=-2"},
  };
  for (const Case& c : cases) {
    SchedulingPolicy::Settings settings =
        SchedulingPolicy::DefaultsForMachine(16);
    c.change(&settings);
    EXPECT_THAT(
        SchedulingPolicy::Create(settings).status(),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.what;
  }
}

TEST(SchedulingPolicyTest, NoPollerIsFineWithoutTheFastChannel) {
  SchedulingPolicy::Settings settings =
      SchedulingPolicy::DefaultsForMachine(16);
  settings.fast_channel = false;
  settings.fast_channel_pollers = 0;
  EXPECT_TRUE(SchedulingPolicy::Create(settings).ok());
}

TEST(SchedulingPolicyTest, BatcherOptionsCarryTheSettingsAndDebugChecks) {
  SchedulingPolicy::Settings settings =
      SchedulingPolicy::DefaultsForMachine(16);
  settings.batcher.max_batch_requests = 64;
  settings.batcher.max_batch_tokens = 4096;
  const SchedulingPolicy policy = Make(settings);
  const Batcher::Options plain = policy.BatcherOptions(false);
  EXPECT_EQ(plain.max_batch_requests, 64);
  EXPECT_EQ(plain.max_batch_tokens, 4096);
  EXPECT_EQ(plain.spin, absl::Microseconds(200));
  EXPECT_EQ(plain.batch_window, absl::Microseconds(100));
  EXPECT_FALSE(plain.debug_checks);
  EXPECT_TRUE(policy.BatcherOptions(true).debug_checks);
}

TEST(SchedulingPolicyTest, DescribeIsAMarkdownTableOfTheRows) {
  const SchedulingPolicy policy = Make(SchedulingPolicy::DefaultsForMachine(2));
  const std::string table = policy.Describe();
  const std::vector<std::string> lines = absl::StrSplit(table, '\n');
  ASSERT_THAT(lines, SizeIs(2 + policy.Rows().size()));
  EXPECT_TRUE(absl::StartsWith(lines[0], "| situation | drives the launch"));
  for (size_t i = 0; i < policy.Rows().size(); ++i) {
    EXPECT_THAT(lines[2 + i], HasSubstr(policy.Rows()[i].drives));
    EXPECT_THAT(lines[2 + i], HasSubstr(policy.Rows()[i].flags));
  }
}

}  // namespace
}  // namespace pagealloc
