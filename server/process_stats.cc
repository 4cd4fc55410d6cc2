#include "server/process_stats.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "server/descriptors.h"

namespace pagealloc {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::UnavailableError(
        absl::StrFormat("cannot read %s: %s", path, std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<ProcessStats> ParseProcStat(absl::string_view stat,
                                           double clock_ticks_per_second,
                                           double page_size_bytes,
                                           double boot_time_seconds) {
  // "pid (comm) state ppid ...": the fields after comm, from field 3 on
  // (proc(5) numbers them from 1).
  const size_t comm_end = stat.rfind(')');
  if (comm_end == absl::string_view::npos) {
    return absl::InvalidArgumentError("/proc/self/stat: no ')' after comm");
  }
  const std::vector<absl::string_view> fields =
      absl::StrSplit(stat.substr(comm_end + 1), ' ', absl::SkipWhitespace());
  auto field = [&fields](int number, double* value) -> absl::Status {
    const size_t at = number - 3;
    if (at >= fields.size() || !absl::SimpleAtod(fields[at], value)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "/proc/self/stat: field %d missing or not a number", number));
    }
    return absl::OkStatus();
  };
  double utime, stime, starttime, vsize, rss;
  RETURN_IF_ERROR(field(14, &utime));
  RETURN_IF_ERROR(field(15, &stime));
  RETURN_IF_ERROR(field(22, &starttime));
  RETURN_IF_ERROR(field(23, &vsize));
  RETURN_IF_ERROR(field(24, &rss));
  ProcessStats stats;
  stats.cpu_seconds = (utime + stime) / clock_ticks_per_second;
  stats.virtual_memory_bytes = vsize;
  stats.resident_memory_bytes = rss * page_size_bytes;
  stats.start_time_seconds =
      boot_time_seconds + starttime / clock_ticks_per_second;
  return stats;
}

absl::StatusOr<double> ParseBootTime(absl::string_view proc_stat) {
  for (absl::string_view line : absl::StrSplit(proc_stat, '\n')) {
    double btime;
    if (absl::ConsumePrefix(&line, "btime ") &&
        absl::SimpleAtod(line, &btime)) {
      return btime;
    }
  }
  return absl::InvalidArgumentError("/proc/stat: no btime line");
}

absl::StatusOr<ProcessStats> ReadProcessStats() {
  ASSIGN_OR_RETURN(const std::string stat, ReadFile("/proc/self/stat"));
  ASSIGN_OR_RETURN(const std::string system, ReadFile("/proc/stat"));
  ASSIGN_OR_RETURN(const double boot_time, ParseBootTime(system));
  ASSIGN_OR_RETURN(ProcessStats stats,
                   ParseProcStat(stat, sysconf(_SC_CLK_TCK),
                                 sysconf(_SC_PAGESIZE), boot_time));
  ASSIGN_OR_RETURN(const DescriptorCount descriptors, CountDescriptors());
  stats.open_fds = static_cast<double>(descriptors.open);
  stats.max_fds = static_cast<double>(descriptors.limit);
  return stats;
}

}  // namespace pagealloc
