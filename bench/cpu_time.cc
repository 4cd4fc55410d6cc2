#include "bench/cpu_time.h"

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pagealloc::bench {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

}  // namespace

int64_t ParseProcessCpuTicks(absl::string_view stat) {
  // The command name (field 2) may hold spaces and parentheses; count the
  // fields after its last ')'.
  const size_t close_paren = stat.rfind(')');
  if (close_paren == absl::string_view::npos) return -1;
  std::vector<absl::string_view> fields =
      absl::StrSplit(stat.substr(close_paren + 1), ' ', absl::SkipWhitespace());
  int64_t utime = 0, stime = 0;
  // fields[0] is field 3 (state), so field 14 is fields[11].
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime)) {
    return -1;
  }
  return utime + stime;
}

double CpuSeconds(int pid) {
  if (pid <= 0) return -1;
  const int64_t ticks =
      ParseProcessCpuTicks(ReadFile(absl::StrCat("/proc/", pid, "/stat")));
  if (ticks < 0) return -1;
  return static_cast<double>(ticks) / sysconf(_SC_CLK_TCK);
}

HostCpuTicks ParseHostCpu(absl::string_view proc_stat) {
  HostCpuTicks host;
  bool aggregate = false;
  int cpus = 0;
  for (absl::string_view line : absl::StrSplit(proc_stat, '\n')) {
    if (!absl::StartsWith(line, "cpu")) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (fields[0] != "cpu") {
      // "cpuN": one CPU.
      if (fields[0].size() > 3 && absl::ascii_isdigit(fields[0][3])) ++cpus;
      continue;
    }
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    int64_t ticks[8] = {};
    if (fields.size() < 9) return HostCpuTicks();
    for (int i = 0; i < 8; ++i) {
      if (!absl::SimpleAtoi(fields[i + 1], &ticks[i])) return HostCpuTicks();
      host.total += ticks[i];
    }
    host.busy = host.total - ticks[3] - ticks[4];
    aggregate = true;
  }
  if (aggregate) host.cpus = cpus;
  return host;
}

HostCpuTicks ReadHostCpu() { return ParseHostCpu(ReadFile("/proc/stat")); }

double HostCpusBusy(const HostCpuTicks& before, const HostCpuTicks& after) {
  const int64_t total = after.total - before.total;
  if (before.cpus <= 0 || after.cpus <= 0 || total <= 0) return -1;
  return static_cast<double>(after.busy - before.busy) / total * after.cpus;
}

}  // namespace pagealloc::bench
