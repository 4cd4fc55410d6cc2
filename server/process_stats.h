// ProcessStats: the figures behind the standard process_* metrics that
// Prometheus' client libraries export (CPU time, memory, file descriptors,
// start time), read from /proc/self. Debian's prometheus-cpp has no process
// collector, so we read them ourselves, the way client_golang does.

#ifndef PAGEALLOC_SERVER_PROCESS_STATS_H_
#define PAGEALLOC_SERVER_PROCESS_STATS_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pagealloc {

// A snapshot of this process's resource use. Doubles, as Prometheus
// exports them.
struct ProcessStats {
  double cpu_seconds = 0;            // user + system CPU time
  double resident_memory_bytes = 0;  // resident set size
  double virtual_memory_bytes = 0;   // virtual memory size
  double open_fds = 0;               // open file descriptors
  double max_fds = 0;                // soft RLIMIT_NOFILE
  double start_time_seconds = 0;     // since the Unix epoch
};

// Parses /proc/<pid>/stat: CPU time (utime + stime), virtual and resident
// memory, and the start time. `clock_ticks_per_second` is
// sysconf(_SC_CLK_TCK), `page_size_bytes` sysconf(_SC_PAGESIZE) and
// `boot_time_seconds` /proc/stat's btime. The command name may hold spaces
// and parentheses; fields are counted from its last ')'. Leaves open_fds and
// max_fds at 0. Returns INVALID_ARGUMENT naming what is missing or
// malformed.
absl::StatusOr<ProcessStats> ParseProcStat(absl::string_view stat,
                                           double clock_ticks_per_second,
                                           double page_size_bytes,
                                           double boot_time_seconds);

// Returns /proc/stat's "btime" (boot time, seconds since the Unix epoch),
// or INVALID_ARGUMENT when it has none.
absl::StatusOr<double> ParseBootTime(absl::string_view proc_stat);

// Reads this process's figures: /proc/self/stat, /proc/stat, the entries
// of /proc/self/fd (the descriptor that lists them not counted) and
// getrlimit(RLIMIT_NOFILE). Returns UNAVAILABLE when /proc cannot be read
// (not Linux, or no procfs mounted) and INVALID_ARGUMENT when its content
// cannot be parsed.
absl::StatusOr<ProcessStats> ReadProcessStats();

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_PROCESS_STATS_H_
