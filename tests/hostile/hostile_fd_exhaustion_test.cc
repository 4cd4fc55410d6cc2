// Hostile clients against the daemon's file descriptors. The real
// pagealloc-server under a small open-files limit (prlimit), CPU backend:
// --max_sessions that the limit cannot hold stops it at start (exit 2,
// naming both numbers and the descriptors a session takes; the default is
// lowered with a warning), and a daemon run short of descriptors by a
// connection flood answers Register with RESOURCE_EXHAUSTED
// "descriptors exhausted: N open of limit M" (never INTERNAL), says so on
// /healthz, keeps its sessions working, and registers again once the
// descriptors are back.

#include <sys/wait.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/hostile/hostile_daemon.h"
#include "tests/status_matchers.h"
#include "tests/subprocess.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(30);

TEST(HostileFdExhaustionTest,
     MaxSessionsPastTheOpenFilesLimitIsRefusedAtStart) {
  // 256 descriptors: 64 for the daemon, 32 kept by its acceptor, 4 a
  // session: 40 sessions.
  const std::string log =
      std::string(std::getenv("TEST_TMPDIR")) + "/max_sessions.log";
  ASSERT_OK_AND_ASSIGN(
      Subprocess process,
      Subprocess::Start(
          {"/usr/bin/prlimit", "--nofile=256:256", "--",
           RunfilePath("server/pagealloc-server"), "--backend=cpu",
           "--listen=unix:///tmp/pagealloc-fd-refused.sock",
           "--metrics_port=-1", "--max_sessions=100"},
          log));
  ASSERT_OK_AND_ASSIGN(const int status, process.Wait(kWait));
  ASSERT_TRUE(WIFEXITED(status)) << DescribeWaitStatus(status);
  EXPECT_EQ(WEXITSTATUS(status), 2) << ReadLog(log);
  EXPECT_THAT(ReadLog(log),
              HasSubstr("--max_sessions=100 does not fit: the open-files "
                        "limit (RLIMIT_NOFILE) is 256, which holds 40 "
                        "sessions at 4 descriptors a session"));

  // The default is lowered to what fits, and the daemon serves.
  ASSERT_OK_AND_ASSIGN(Daemon daemon, StartDaemon("fd-lowered", {},
                                                  {"/usr/bin/prlimit",
                                                   "--nofile=256:256", "--"}));
  EXPECT_THAT(ReadLog(daemon.log_path),
              HasSubstr("--max_sessions lowered from 256 to 40"));
  std::unique_ptr<Client> client = ConnectTo(daemon, "fits");
  ASSERT_NE(client, nullptr);
  EXPECT_OK(RoundTrip(*client));
}

TEST(HostileFdExhaustionTest, RegisterAndHealthzSayWhichDescriptorsRanOut) {
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon(
          "fd-exhausted",
          {"--max_sessions=20", "--max_connections=100000", "--lease_ms=60000"},
          {"/usr/bin/prlimit", "--nofile=200:200", "--"}));
  int port = -1;
  ASSERT_TRUE(WaitFor([&] { return (port = MetricsPort(daemon)) > 0; }, kWait));
  std::unique_ptr<Client> honest = ConnectTo(daemon, "honest");
  ASSERT_NE(honest, nullptr);
  ASSERT_OK(RoundTrip(*honest));
  // The attacker's connection, opened before the flood.
  std::unique_ptr<v1::PageAllocator::Stub> stub = RawStub(daemon);
  ASSERT_OK(RawRegister(*stub, "first").status());

  // Connections take every descriptor but those the acceptor keeps; then
  // Registers over the open connection take those, until Register refuses
  // for the descriptors it would need.
  ASSERT_OK_AND_ASSIGN(std::vector<UniqueFd> flood,
                       FloodUntilRefused(daemon, 400));
  absl::Status refusal;
  for (int i = 0; i < 20 && refusal.ok(); ++i) {
    refusal = RawRegister(*stub, absl::StrCat("taker", i)).status();
  }
  EXPECT_THAT(refusal, StatusIs(absl::StatusCode::kResourceExhausted,
                                AllOf(HasSubstr("descriptors exhausted: "),
                                      HasSubstr(" open of limit 200"))));
  const auto [code, body] = Get(port, "/healthz");
  EXPECT_EQ(code, 503);
  EXPECT_THAT(body, HasSubstr("descriptors"));
  EXPECT_OK(RoundTrip(*honest));
  EXPECT_TRUE(daemon.process.running());

  // The flood goes: healthy again, and Register works, without a restart.
  flood.clear();
  EXPECT_TRUE(
      WaitFor([&] { return Get(port, "/healthz").first == 200; }, kWait))
      << Get(port, "/healthz").second;
  EXPECT_OK(RawRegister(*stub, "after").status());
  EXPECT_OK(RoundTrip(*honest));
}

}  // namespace
}  // namespace pagealloc::testing
