// Memory comes back: after a thousand sessions (each with its KeepAlive
// stream, its memory socket connection, its fast channel and ring), and
// after 5,000 KeepAlive streams open at once (about 80 MiB of gRPC's
// per-call state), have come and gone, the real pagealloc-server's
// resident memory returns within 16 MiB of its idle level. The streams
// are what glibc's malloc used to keep (server/heap_return.h).

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/pagealloc.grpc.pb.h"
#include "server/heap_return.h"
#include "tests/daemon_process.h"
#include "tests/daemon_stats.h"
#include "tests/hostile/hostile_daemon.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

// How far above its idle level the daemon's resident memory may stay.
constexpr int64_t kBoundKib = 16 * 1024;

struct Rss {
  int64_t anon_kib = 0;   // RssAnon: the heap, thread stacks
  int64_t shmem_kib = 0;  // RssShmem: memfds mapped (rings, channels)
  int64_t total_kib() const { return anon_kib + shmem_kib; }
};

// The resident memory of process `pid`, from /proc/PID/status.
Rss RssOf(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  Rss rss;
  for (std::string line; std::getline(status, line);) {
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() < 2) continue;
    int64_t kib = 0;
    if (!absl::SimpleAtoi(fields[1], &kib)) continue;
    if (fields[0] == "RssAnon:") rss.anon_kib = kib;
    if (fields[0] == "RssShmem:") rss.shmem_kib = kib;
  }
  return rss;
}

// `rounds` rounds of `at_once` sessions open together (each allocates and
// frees a page), then all closed.
void Churn(const Daemon& daemon, int rounds, int at_once) {
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::unique_ptr<Client>> clients;
    for (int i = 0; i < at_once; ++i) {
      clients.push_back(ConnectTo(daemon, absl::StrCat("churn-", i)));
      ASSERT_NE(clients.back(), nullptr);
      ASSERT_OK(RoundTrip(*clients.back()));
    }
    for (auto& client : clients) ASSERT_OK(client->Close());
  }
}

TEST(RssReturnTest, MemoryComesBackAfterAThousandSessions) {
  if (!kGlibcMalloc) {
    GTEST_SKIP() << "a sanitizer's allocator replaces glibc's malloc in the "
                    "daemon: its freed memory is the runtime's to keep";
  }
  ASSERT_OK_AND_ASSIGN(Daemon daemon,
                       StartDaemon("rss", {"--ring_capacity_slots=4096"}));
  const pid_t pid = daemon.process.pid();
  // Warm: the first sessions make what the daemon keeps for its life
  // (threads, gRPC's pools, the logger's buffers).
  Churn(daemon, 2, 100);
  ASSERT_OK(WaitUntilEmpty(daemon.target, kHostileWait).status());
  const Rss idle = RssOf(pid);
  ASSERT_GT(idle.anon_kib, 0) << "no RssAnon in /proc/" << pid << "/status";

  constexpr int kRounds = 10, kAtOnce = 100;  // 1,000 sessions
  Churn(daemon, kRounds, kAtOnce);
  ASSERT_OK(WaitUntilEmpty(daemon.target, kHostileWait).status());
  const Rss after = RssOf(pid);
  std::printf(
      "daemon RSS: idle %lld KiB (anon %lld, shmem %lld); after %d "
      "sessions %lld KiB (anon %lld, shmem %lld)\n",
      (long long)idle.total_kib(), (long long)idle.anon_kib,
      (long long)idle.shmem_kib, kRounds * kAtOnce,
      (long long)after.total_kib(), (long long)after.anon_kib,
      (long long)after.shmem_kib);
  EXPECT_LE(after.total_kib(), idle.total_kib() + kBoundKib);
}

// 5,000 KeepAlive streams open at once (silent: no session behind them),
// then all cancelled.
TEST(RssReturnTest, MemoryComesBackAfterFiveThousandKeepAliveStreams) {
  if (!kGlibcMalloc) {
    GTEST_SKIP() << "a sanitizer's allocator replaces glibc's malloc in the "
                    "daemon: its freed memory is the runtime's to keep";
  }
  ASSERT_OK_AND_ASSIGN(Daemon daemon, StartDaemon("rss-streams", {}));
  const pid_t pid = daemon.process.pid();
  constexpr int kChannels = 10, kPerChannel = 500;
  auto open_streams = [&](int per_channel) {
    struct Stream {
      std::unique_ptr<grpc::ClientContext> context;
      std::unique_ptr<
          grpc::ClientReaderWriter<v1::KeepAliveRequest, v1::KeepAliveResponse>>
          stream;
    };
    std::vector<std::unique_ptr<v1::PageAllocator::Stub>> stubs;
    std::vector<Stream> streams;
    for (int c = 0; c < kChannels; ++c) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      stubs.push_back(v1::PageAllocator::NewStub(grpc::CreateCustomChannel(
          daemon.target, grpc::InsecureChannelCredentials(), args)));
      for (int i = 0; i < per_channel; ++i) {
        Stream s;
        s.context = std::make_unique<grpc::ClientContext>();
        s.stream = stubs.back()->KeepAlive(s.context.get());
        streams.push_back(std::move(s));
      }
    }
    return std::make_pair(std::move(stubs), std::move(streams));
  };
  {
    auto warm = open_streams(10);
    for (auto& s : warm.second) s.context->TryCancel();
  }
  const Rss idle = RssOf(pid);
  Rss peak;
  {
    auto open = open_streams(kPerChannel);
    // The daemon takes the streams in as they arrive: wait (bounded) until
    // they cost more than the bound, or the test would show nothing.
    WaitFor(
        [&] {
          peak = RssOf(pid);
          return peak.total_kib() >= idle.total_kib() + 4 * kBoundKib;
        },
        kHostileWait, absl::Milliseconds(200));
    for (auto& s : open.second) s.context->TryCancel();
  }
  // The daemon returns free heap memory every 5 s: wait (bounded) for it.
  Rss after;
  WaitFor(
      [&] {
        after = RssOf(pid);
        return after.total_kib() <= idle.total_kib() + kBoundKib;
      },
      kHostileWait, absl::Milliseconds(500));
  std::printf(
      "daemon RSS: idle %lld KiB, with %d streams %lld KiB, after %lld KiB\n",
      (long long)idle.total_kib(), kChannels * kPerChannel,
      (long long)peak.total_kib(), (long long)after.total_kib());
  EXPECT_GE(peak.total_kib(), idle.total_kib() + 4 * kBoundKib)
      << "the streams took less than the bound: the test shows nothing";
  EXPECT_LE(after.total_kib(), idle.total_kib() + kBoundKib);
}

}  // namespace
}  // namespace pagealloc::testing
