#include "bench/snapshot.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/cpu_time.h"
#include "common/status_macros.h"
#include "httplib.h"
#include "tests/daemon_stats.h"

namespace pagealloc::bench {

std::map<std::string, double> ParseMetrics(const std::string& text) {
  std::map<std::string, double> values;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space == absl::string_view::npos ||
        !absl::SimpleAtod(line.substr(space + 1), &value)) {
      continue;
    }
    values[std::string(line.substr(0, space))] = value;
  }
  return values;
}

std::map<std::string, double> ScrapeMetrics(const std::string& address) {
  if (address.empty()) return {};
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return {};
  }
  httplib::Client http(address.substr(0, colon), port);
  http.set_read_timeout(5, 0);
  httplib::Result response = http.Get("/metrics");
  if (!response || response->status != 200) return {};
  return ParseMetrics(response->body);
}

absl::StatusOr<Snapshot> TakeSnapshot(const std::string& target, int pid,
                                      const std::string& metrics_address) {
  Snapshot s;
  ASSIGN_OR_RETURN(s.stats, testing::DaemonStats(target));
  s.cpu_seconds = CpuSeconds(pid);
  s.metrics = ScrapeMetrics(metrics_address);
  return s;
}

double MetricMean(const Snapshot& before, const Snapshot& after,
                  const std::string& name, const std::string& labels) {
  const std::string sum = absl::StrCat(name, "_sum", labels);
  const std::string count = absl::StrCat(name, "_count", labels);
  if (!after.metrics.count(sum) || !after.metrics.count(count)) return -1;
  auto get = [](const Snapshot& s, const std::string& key) {
    auto it = s.metrics.find(key);
    return it == s.metrics.end() ? 0.0 : it->second;
  };
  const double n = get(after, count) - get(before, count);
  return n > 0 ? (get(after, sum) - get(before, sum)) / n : -1;
}

}  // namespace pagealloc::bench
