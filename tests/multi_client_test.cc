// Several real client processes allocate and free concurrently against one
// real daemon: no page is ever held by two clients at once (a shared claim
// table checks it), every result follows the semantics (each client checks
// its own), and when they finish every page is free again. Every other
// client asks for async completion: with PAGEALLOC_TEST_BACKEND=cuda it
// reads its slots (through its mapped ring) ordered only by the pool's
// completion counter; on the CPU backend that is the same as sync.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/daemon_stats.h"
#include "tests/status_matchers.h"

namespace pagealloc::testing {
namespace {

struct Params {
  int clients;
  int64_t page_size;
  const char* policy;
};

class MultiClientTest : public ::testing::TestWithParam<Params> {};

TEST_P(MultiClientTest, ClientsNeverShareAPageAndEverythingComesBack) {
  const Params p = GetParam();
  constexpr int64_t kPages = 256;  // small: clients compete for pages
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon(
          absl::StrFormat("multi%d_%d_%s", p.clients, p.page_size, p.policy),
          {absl::StrFormat("--num_pages=%d", kPages),
           absl::StrFormat("--page_size=%d", p.page_size),
           absl::StrFormat("--free_policy=%s", p.policy), "--debug_checks",
           "--lease_ms=2000"}));
  const std::string claims =
      absl::StrFormat("/pagealloc-test-claims-%d-%d", getpid(), p.page_size);
  const int fd = shm_open(claims.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  const size_t bytes = (kPages + 1) * sizeof(std::atomic<uint32_t>);
  ASSERT_EQ(ftruncate(fd, bytes), 0);  // zero-filled: every page unclaimed
  close(fd);

  std::vector<Subprocess> clients;
  for (int i = 1; i <= p.clients; ++i) {
    ASSERT_OK_AND_ASSIGN(
        Subprocess client,
        Subprocess::Start(
            {RunfilePath("tests/load_client"), "--target=" + daemon.target,
             "--claims_shm=" + claims, absl::StrFormat("--client_index=%d", i),
             absl::StrFormat("--async_completion=%s",
                             i % 2 == 0 ? "true" : "false"),
             "--duration_ms=3000"},
            daemon.log_path + ".clients"));
    clients.push_back(std::move(client));
  }
  for (Subprocess& client : clients) {
    ASSERT_OK_AND_ASSIGN(int status, client.Wait(absl::Seconds(60)));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << DescribeWaitStatus(status) << "\n"
        << ReadLog(daemon.log_path + ".clients");
  }
  shm_unlink(claims.c_str());
  // Each client closed its session on exit; wait for the batcher.
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats,
                       WaitUntilEmpty(daemon.target, absl::Seconds(5)));
  EXPECT_EQ(stats.used_pages(), 0);
  EXPECT_EQ(stats.sessions_active(), 0);
  EXPECT_EQ(stats.free_pages() + stats.parked_pages(), kPages);
  EXPECT_GT(stats.pages_allocated_total(), 1000);
  EXPECT_TRUE(daemon.process.running()) << ReadLog(daemon.log_path);
  const std::string log = ReadLog(daemon.log_path + ".clients");
  std::printf("%s", log.c_str());
}

INSTANTIATE_TEST_SUITE_P(ClientsAndPolicies, MultiClientTest,
                         ::testing::Values(Params{4, 16, "lifo"},
                                           Params{6, 1, "sorted"},
                                           Params{4, 64, "sorted"}),
                         [](const ::testing::TestParamInfo<Params>& info) {
                           return absl::StrFormat(
                               "Clients%dPageSize%d%s", info.param.clients,
                               info.param.page_size, info.param.policy);
                         });

}  // namespace
}  // namespace pagealloc::testing
