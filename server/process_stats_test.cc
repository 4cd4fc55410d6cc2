#include "server/process_stats.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

// Wall time at static initialization, soon after this process started.
const double kInitTime = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());

double ProcessCpuSeconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return now.tv_sec + now.tv_nsec * 1e-9;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every descriptor number below the limit that is open, counted one by one.
int CountOpenFdsWithFcntl() {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  int count = 0;
  for (int fd = 0; fd < static_cast<int>(limit.rlim_cur); ++fd) {
    if (fcntl(fd, F_GETFD) != -1) ++count;
  }
  return count;
}

// A line as proc(5) describes it, with a command name that holds spaces
// and parentheses: utime 250 and stime 50 ticks, starttime 1000 ticks,
// vsize 8 MiB, rss 300 pages.
constexpr char kStat[] =
    "4242 (a) (b c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 "
    "1000 8388608 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 "
    "0 0 0\n";

TEST(ParseProcStatTest, ReadsTheFieldsAfterTheCommandName) {
  ASSERT_OK_AND_ASSIGN(const ProcessStats stats,
                       ParseProcStat(kStat, /*clock_ticks_per_second=*/100,
                                     /*page_size_bytes=*/4096,
                                     /*boot_time_seconds=*/1.7e9));
  EXPECT_EQ(stats.cpu_seconds, 3.0);  // (250 + 50) / 100
  EXPECT_EQ(stats.virtual_memory_bytes, 8388608);
  EXPECT_EQ(stats.resident_memory_bytes, 300 * 4096);
  EXPECT_EQ(stats.start_time_seconds, 1.7e9 + 10);  // 1000 / 100
  EXPECT_EQ(stats.open_fds, 0);
  EXPECT_EQ(stats.max_fds, 0);
}

TEST(ParseProcStatTest, RefusesTruncatedOrMalformedLines) {
  EXPECT_THAT(ParseProcStat("4242 (x S 1 2 3", 100, 4096, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("')'")));
  // Cut after stime: starttime (field 22) is missing.
  const std::string cut(kStat, std::strstr(kStat, " 0 0 20") - kStat);
  EXPECT_THAT(ParseProcStat(cut, 100, 4096, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("field 22 missing")));
  EXPECT_THAT(
      ParseProcStat("1 (x) S 1 1 1 0 -1 0 0 0 0 0 ten 50", 100, 4096, 0),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field 14")));
}

TEST(ParseBootTimeTest, FindsBtime) {
  EXPECT_THAT(ParseBootTime("cpu  1 2 3\nintr 5\nbtime 1796035026\nctxt 9\n"),
              testing::IsOkAndHolds(1796035026.0));
  EXPECT_THAT(ParseBootTime("cpu  1 2 3\nctxt 9\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("btime")));
}

// The reader against the kernel's own figures, each from another source.
TEST(ReadProcessStatsTest, OpenFdsCountEveryOpenDescriptor) {
  ASSERT_OK_AND_ASSIGN(const ProcessStats before, ReadProcessStats());
  EXPECT_EQ(before.open_fds, CountOpenFdsWithFcntl());
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) fds.push_back(open("/dev/null", O_RDONLY));
  ASSERT_OK_AND_ASSIGN(const ProcessStats after, ReadProcessStats());
  EXPECT_EQ(after.open_fds, before.open_fds + 10);
  EXPECT_EQ(after.open_fds, CountOpenFdsWithFcntl());
  for (int fd : fds) close(fd);
}

TEST(ReadProcessStatsTest, MaxFdsFollowsTheSoftLimit) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit lower = saved;
  lower.rlim_cur = 200;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lower), 0);
  absl::StatusOr<ProcessStats> stats = ReadProcessStats();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_OK(stats.status());
  EXPECT_EQ(stats->max_fds, 200);
}

TEST(ReadProcessStatsTest, CpuSecondsMatchTheProcessCpuClock) {
  // Burn 0.3 s of CPU, so that the figure is well above a tick.
  const double start = ProcessCpuSeconds();
  volatile uint64_t sink = 0;
  while (ProcessCpuSeconds() - start < 0.3) {
    for (int i = 0; i < 100000; ++i) sink = sink + i;
  }
  const double clock_before = ProcessCpuSeconds();
  ASSERT_OK_AND_ASSIGN(const ProcessStats stats, ReadProcessStats());
  const double clock_after = ProcessCpuSeconds();
  // /proc counts in ticks (10 ms); the kernel scales them to the precise
  // runtime, so they agree within a few ticks.
  EXPECT_GT(stats.cpu_seconds, 0.3 - 0.05);
  EXPECT_GT(stats.cpu_seconds, clock_before - 0.05);
  EXPECT_LT(stats.cpu_seconds, clock_after + 0.05);
}

TEST(ReadProcessStatsTest, ResidentMemoryMatchesStatmAndGrowsWhenTouched) {
  const long page = sysconf(_SC_PAGESIZE);
  auto statm_resident = [page] {
    std::istringstream statm(Slurp("/proc/self/statm"));
    double size, resident;
    statm >> size >> resident;
    return resident * page;
  };
  ASSERT_OK_AND_ASSIGN(const ProcessStats before, ReadProcessStats());
  EXPECT_GT(before.resident_memory_bytes, 0);
  EXPECT_GE(before.virtual_memory_bytes, before.resident_memory_bytes);

  // Straight from the kernel: a sanitizer's allocator may serve a heap
  // block from memory it reserved or touched earlier.
  constexpr size_t kBytes = 64 << 20;
  void* const mapped = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  char* const block = static_cast<char*>(mapped);
  for (size_t i = 0; i < kBytes; i += page) block[i] = 1;
  ASSERT_OK_AND_ASSIGN(const ProcessStats after, ReadProcessStats());
  const double statm = statm_resident();
  EXPECT_GE(after.resident_memory_bytes - before.resident_memory_bytes,
            kBytes * 0.9);
  EXPECT_GE(after.virtual_memory_bytes - before.virtual_memory_bytes,
            kBytes * 0.9);
  // The same kernel figure read through another file. Between the two
  // reads the process still grows a little (reading a file allocates;
  // under ASan its shadow memory grows too): 1 MiB of slack, far below
  // what a wrong unit (pages, KiB) would be off by on 64 MiB.
  EXPECT_NEAR(after.resident_memory_bytes, statm, 1 << 20);
  EXPECT_EQ(block[page], 1);
  munmap(mapped, kBytes);
}

TEST(ReadProcessStatsTest, StartTimeIsWhenThisProcessStarted) {
  ASSERT_OK_AND_ASSIGN(const ProcessStats stats, ReadProcessStats());
  // The process started before its static initializers ran (give or take
  // the boot time's whole seconds and 10 ms ticks), and loading a test
  // binary takes well under a minute.
  EXPECT_LE(stats.start_time_seconds, kInitTime + 1);
  EXPECT_GT(stats.start_time_seconds, kInitTime - 60);
}

}  // namespace
}  // namespace pagealloc
