#include "bench/cpu_time.h"

#include <unistd.h>

#include <cmath>

#include "gtest/gtest.h"

namespace pagealloc::bench {
namespace {

TEST(CpuTimeTest, ParsesUserAndSystemTicksOfAStatLine) {
  // A command name with spaces and a ')' of its own; utime 250, stime 31.
  EXPECT_EQ(ParseProcessCpuTicks(
                "6403 (a) b (c) R 6400 6400 5718 0 -1 4194304 100 0 0 0 "
                "250 31 7 9 20 0 1 0 3615744 3133440 416\n"),
            281);
  EXPECT_EQ(ParseProcessCpuTicks("6403 (cat) R 6400 6400 5718 0 -1 4194304 "
                                 "100 0 0 0 0 0 0 0 20 0 1 0 3615744"),
            0);
}

TEST(CpuTimeTest, RejectsWhatIsNoStatLine) {
  EXPECT_EQ(ParseProcessCpuTicks(""), -1);
  EXPECT_EQ(ParseProcessCpuTicks("6403 cat R 6400 6400 5718 0 -1 4194304 "
                                 "100 0 0 0 250 31"),
            -1);
  // Too few fields after the name.
  EXPECT_EQ(ParseProcessCpuTicks("6403 (cat) R 6400 6400 5718 0 -1 4194304 "
                                 "100 0 0 0 250"),
            -1);
  EXPECT_EQ(ParseProcessCpuTicks("6403 (cat) R 6400 6400 5718 0 -1 4194304 "
                                 "100 0 0 0 x 31 7"),
            -1);
}

TEST(CpuTimeTest, ThisProcessesCpuGrowsWhileItBurnsCpu) {
  const double start = CpuSeconds(getpid());
  ASSERT_GE(start, 0);
  // Burn until the clock-tick counter moves; the loop ends however slow
  // the machine is.
  volatile double sink = 0;
  while (CpuSeconds(getpid()) <= start) {
    for (int i = 0; i < 1000000; ++i) sink = sink + std::sqrt(i);
  }
  EXPECT_GT(CpuSeconds(getpid()), start);
}

TEST(CpuTimeTest, CpuSecondsOfNobodyIsUnknown) {
  EXPECT_EQ(CpuSeconds(0), -1);
  EXPECT_EQ(CpuSeconds(-5), -1);
}

constexpr char kProcStat[] =
    "cpu  4739124 8307 615481 1826973 11009 0 3033 1100 7 0\n"
    "cpu0 2335687 5936 301044 955751 2780 0 339 573 0 0\n"
    "cpu1 2403436 2370 314437 871221 8228 0 2694 526 0 0\n"
    "intr 38536795 0 0 0\n"
    "ctxt 130721512\n"
    "btime 1796035026\n";

TEST(CpuTimeTest, ParsesTheHostsCpuLine) {
  const HostCpuTicks host = ParseHostCpu(kProcStat);
  EXPECT_EQ(host.cpus, 2);
  // The first eight fields; guest time is inside user already.
  EXPECT_EQ(host.total,
            4739124 + 8307 + 615481 + 1826973 + 11009 + 0 + 3033 + 1100);
  EXPECT_EQ(host.busy, host.total - 1826973 - 11009);
}

TEST(CpuTimeTest, UnknownWithoutAWellFormedCpuLine) {
  EXPECT_EQ(ParseHostCpu("").cpus, 0);
  EXPECT_EQ(ParseHostCpu("cpu0 1 2 3 4 5 6 7 8\n").cpus, 0);
  EXPECT_EQ(ParseHostCpu("cpu  1 2 3\ncpu0 1 2 3 4 5 6 7 8\n").cpus, 0);
  EXPECT_EQ(ParseHostCpu("cpu  1 2 x 4 5 6 7 8\ncpu0 1 2 3 4 5 6 7 8\n").cpus,
            0);
}

TEST(CpuTimeTest, HostCpusBusyIsTheBusyShareTimesTheCpus) {
  HostCpuTicks before{/*total=*/1000, /*busy=*/400, /*cpus=*/16};
  HostCpuTicks after{/*total=*/1800, /*busy=*/700, /*cpus=*/16};
  // 300 of 800 ticks busy on 16 CPUs.
  EXPECT_DOUBLE_EQ(HostCpusBusy(before, after), 6);
  EXPECT_EQ(HostCpusBusy(after, after), -1);
  EXPECT_EQ(HostCpusBusy(HostCpuTicks(), after), -1);
}

TEST(CpuTimeTest, ReadsThisHost) {
  const HostCpuTicks host = ReadHostCpu();
  EXPECT_GT(host.cpus, 0);
  EXPECT_GT(host.total, 0);
  EXPECT_GE(host.busy, 0);
  EXPECT_LE(host.busy, host.total);
}

}  // namespace
}  // namespace pagealloc::bench
