// Hostile clients against the daemon's memory: Registers that ask for more
// ring and channel memory than the daemon may have. The real
// pagealloc-server, CPU backend. Past its budget (--session_memory, or the
// default derived from its memory cgroup's limit) Register answers
// RESOURCE_EXHAUSTED with the numbers; the daemon stays up, is never
// OOM-killed, and honest sessions keep working; the memory comes back when
// the sessions go. The cgroup tests run the daemon in a child memory cgroup
// of the test's own, and skip with the reason where none can be made.

#include <sys/wait.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/heap_return.h"
#include "tests/daemon_process.h"
#include "tests/daemon_stats.h"
#include "tests/hostile/hostile_daemon.h"
#include "tests/status_matchers.h"
#include "tests/subprocess.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(30);
constexpr int64_t kMiB = int64_t{1} << 20;

// Registers rings of `slots` over one connection until one is refused (at
// most `most`); returns the sessions and the refusal.
struct Flood {
  std::vector<v1::RegisterResponse> sessions;
  absl::Status refusal;
};
Flood RegisterUntilRefused(v1::PageAllocator::Stub& stub, int64_t slots,
                           int most) {
  Flood flood;
  for (int i = 0; i < most; ++i) {
    absl::StatusOr<v1::RegisterResponse> registered =
        RawRegister(stub, absl::StrCat("flood", i), slots);
    if (!registered.ok()) {
      flood.refusal = registered.status();
      break;
    }
    flood.sessions.push_back(*std::move(registered));
  }
  return flood;
}

TEST(HostileMemoryBudgetTest, RegistersPastTheBudgetAreRefusedWithTheNumbers) {
  // 64 MiB for rings and channels; rings of 8 MiB by default.
  ASSERT_OK_AND_ASSIGN(Daemon daemon,
                       StartDaemon("budget", {"--session_memory=64MiB",
                                              "--ring_capacity_slots=1048576",
                                              "--lease_ms=60000"}));
  int port = -1;
  ASSERT_TRUE(WaitFor([&] { return (port = MetricsPort(daemon)) > 0; }, kWait));
  std::unique_ptr<Client> honest = ConnectTo(daemon, "honest");
  ASSERT_NE(honest, nullptr);
  ASSERT_OK(RoundTrip(*honest));
  const double used_by_honest =
      MetricValue(port, "pagealloc_session_memory_used_bytes{memory=\"host\"}");
  EXPECT_GT(used_by_honest, 8 * kMiB);
  EXPECT_EQ(MetricValue(
                port, "pagealloc_session_memory_budget_bytes{memory=\"host\"}"),
            64 * kMiB);

  // A ring larger than the whole budget is out of range at once.
  std::unique_ptr<v1::PageAllocator::Stub> stub = RawStub(daemon);
  EXPECT_THAT(RawRegister(*stub, "huge", int64_t{1} << 26),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ring_capacity_slots (67108864) must be in "
                                 "[0, 8388608]")));
  // Default rings until the budget is spent: refused with what was asked,
  // what is in use and the budget.
  Flood flood = RegisterUntilRefused(*stub, 0, 64);
  EXPECT_GE(flood.sessions.size(), 4u);
  EXPECT_LE(flood.sessions.size(), 7u);
  EXPECT_THAT(flood.refusal,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("session memory budget exhausted: a "
                                       "ring of 1048576 slots needs 8.0 MiB "
                                       "(8388608 bytes) of host memory"),
                             HasSubstr("of a budget of 67108864"),
                             HasSubstr("--session_memory"))));
  EXPECT_GE(MetricValue(port,
                        "pagealloc_session_memory_refusals_total{memory="
                        "\"host\"}"),
            1);
  EXPECT_LE(
      MetricValue(port, "pagealloc_session_memory_used_bytes{memory=\"host\"}"),
      64 * kMiB);
  // The daemon is up and the honest session unharmed.
  EXPECT_TRUE(daemon.process.running());
  EXPECT_OK(RoundTrip(*honest));

  // The flood's sessions end (their client closes its connection; they
  // lose their leases): the memory comes back and Register works again.
  for (const v1::RegisterResponse& session : flood.sessions) {
    v1::KeepAliveRequest close;
    close.mutable_session()->set_session_id(session.session_id());
    close.mutable_session()->set_session_token(session.session_token());
    close.set_close(true);
    grpc::ClientContext context;
    auto stream = stub->KeepAlive(&context);
    ASSERT_TRUE(stream->Write(close));
    stream->WritesDone();
    v1::KeepAliveResponse ignored;
    while (stream->Read(&ignored)) {
    }
    (void)stream->Finish();
  }
  EXPECT_TRUE(WaitFor(
      [&] {
        return MetricValue(
                   port,
                   "pagealloc_session_memory_used_bytes{memory=\"host\"}") ==
               used_by_honest;
      },
      kWait));
  EXPECT_OK(RawRegister(*stub, "after").status());
  EXPECT_OK(RoundTrip(*honest));
}

// Makes a child memory cgroup of `limit` bytes, or skips the test saying
// why none can be made here.
#define MAKE_CGROUP_OR_SKIP(cgroup, name, limit)                          \
  std::string why_##cgroup;                                               \
  std::optional<ChildMemoryCgroup> cgroup =                               \
      ChildMemoryCgroup::Create(name, limit, &why_##cgroup);              \
  if (!cgroup.has_value()) {                                              \
    GTEST_SKIP() << "no memory cgroup can be made here (" << why_##cgroup \
                 << "); run as root where cgroup v2 (or v1's memory "     \
                    "hierarchy) is writable";                             \
  }

TEST(HostileMemoryBudgetTest, ARingFloodInASmallCgroupIsRefusedNotOomKilled) {
  // 256 MiB, the default budget derived from it (192 MiB), default flags
  // otherwise: without the budget, the 30th ring of 8 MiB took the daemon
  // past its limit, and the kernel answered with the OOM killer.
  if (!kGlibcMalloc) {
    GTEST_SKIP() << "a sanitizer's runtime in the daemon (its shadow memory "
                    "and the quarantine of freed memory) needs more than the "
                    "64 MiB the budget leaves for the daemon's own heap";
  }
  MAKE_CGROUP_OR_SKIP(cgroup, "flood", 256 * kMiB);
  {
    ASSERT_OK_AND_ASSIGN(
        Daemon daemon,
        StartDaemon("cgroup-flood", {"--lease_ms=60000"}, cgroup->Wrapper()));
    int port = -1;
    ASSERT_TRUE(
        WaitFor([&] { return (port = MetricsPort(daemon)) > 0; }, kWait));
    EXPECT_THAT(ReadLog(daemon.log_path),
                HasSubstr("the memory cgroup's limit"));
    const double budget = MetricValue(
        port, "pagealloc_session_memory_budget_bytes{memory=\"host\"}");
    EXPECT_EQ(budget, 192 * kMiB);
    std::unique_ptr<Client> honest = ConnectTo(daemon, "honest");
    ASSERT_NE(honest, nullptr);
    std::unique_ptr<v1::PageAllocator::Stub> stub = RawStub(daemon);
    // The largest ring a session may have, then default ones, each fully
    // reserved (fallocate) when granted.
    ASSERT_OK(RawRegister(*stub, "big", 16 * 1048576).status());
    Flood flood = RegisterUntilRefused(*stub, 0, 64);
    EXPECT_THAT(flood.refusal,
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("session memory budget exhausted")));
    EXPECT_TRUE(daemon.process.running()) << ReadLog(daemon.log_path);
    EXPECT_EQ(cgroup->OomKills(), 0);
    EXPECT_OK(RoundTrip(*honest));
  }
  EXPECT_EQ(cgroup->OomKills(), 0);
}

TEST(HostileMemoryBudgetTest, KvMemoryPastTheCgroupLimitStopsTheDaemonAtStart) {
  MAKE_CGROUP_OR_SKIP(cgroup, "kv", 128 * kMiB);
  std::vector<std::string> argv = cgroup->Wrapper();
  for (const std::string& arg :
       {RunfilePath("server/pagealloc-server"), std::string("--backend=cpu"),
        std::string("--listen=unix:///tmp/pagealloc-kv-cgroup.sock"),
        std::string("--metrics_port=-1"),
        std::string(
            "--kv_layout=mha:layers=2,kv_heads=2,head_dim=64,dtype=bf16"),
        std::string("--kv_memory=512MiB")}) {
    argv.push_back(arg);
  }
  const std::string log = std::string(std::getenv("TEST_TMPDIR")) + "/kv.log";
  ASSERT_OK_AND_ASSIGN(Subprocess process, Subprocess::Start(argv, log));
  ASSERT_OK_AND_ASSIGN(const int status, process.Wait(kWait));
  EXPECT_TRUE(WIFEXITED(status)) << DescribeWaitStatus(status);
  EXPECT_EQ(WEXITSTATUS(status), 2) << ReadLog(log);
  EXPECT_THAT(ReadLog(log),
              AllOf(HasSubstr("--kv_memory asks for 512.0 MiB (536870912 "
                              "bytes); only 128.0 MiB (134217728 bytes) is "
                              "the memory cgroup's limit")));
  EXPECT_EQ(cgroup->OomKills(), 0);
}

}  // namespace
}  // namespace pagealloc::testing
