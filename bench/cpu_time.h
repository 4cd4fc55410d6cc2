// CPU time as Linux's /proc counts it: a process's user + system time
// (/proc/<pid>/stat) and the whole host's busy time (/proc/stat), read
// before and after a timed window to say where the CPUs went.

#ifndef PAGEALLOC_BENCH_CPU_TIME_H_
#define PAGEALLOC_BENCH_CPU_TIME_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace pagealloc::bench {

// Parses the text of /proc/<pid>/stat: utime + stime (fields 14 and 15) in
// clock ticks, every thread of the process together; -1 when the text is
// not such a line.
int64_t ParseProcessCpuTicks(absl::string_view stat);

// utime + stime of `pid` in seconds; -1 when unknown (pid <= 0, no such
// process). A child that exited but is not reaped yet still reads its
// whole CPU time.
double CpuSeconds(int pid);

// The host's CPU time since boot, in clock ticks summed over its CPUs.
struct HostCpuTicks {
  // user + nice + system + idle + iowait + irq + softirq + steal (guest
  // time is already inside user and nice).
  int64_t total = 0;
  int64_t busy = 0;  // total - idle - iowait
  int cpus = 0;      // the CPUs /proc/stat lists ("cpuN"); 0: unknown
};

// Parses the text of /proc/stat: its aggregate "cpu" line and the count of
// "cpuN" lines. cpus is 0 when there is no well-formed "cpu" line.
HostCpuTicks ParseHostCpu(absl::string_view proc_stat);

// This host's /proc/stat, parsed; cpus 0 when it cannot be read.
HostCpuTicks ReadHostCpu();

// How many CPUs were busy on average between two readings: the busy share
// of the ticks that passed, times the CPUs. -1 when either reading is
// unknown or no tick passed.
double HostCpusBusy(const HostCpuTicks& before, const HostCpuTicks& after);

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_CPU_TIME_H_
