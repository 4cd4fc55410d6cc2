#include "common/host_memory.h"

#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pagealloc {

absl::StatusOr<int64_t> ParseMemAvailable(absl::string_view meminfo) {
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    line = absl::StripAsciiWhitespace(line);
    const bool in_kib = absl::ConsumeSuffix(&line, "kB");
    line = absl::StripAsciiWhitespace(line);
    int64_t kib = 0;
    if (!in_kib || !absl::SimpleAtoi(line, &kib) || kib < 0 ||
        kib > std::numeric_limits<int64_t>::max() / 1024) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "/proc/meminfo's MemAvailable (\"%s\") is not a number of kB", line));
    }
    return kib * 1024;
  }
  return absl::InvalidArgumentError("/proc/meminfo has no MemAvailable");
}

absl::StatusOr<int64_t> AvailableHostBytes() {
  std::ifstream file("/proc/meminfo");
  std::stringstream text;
  text << file.rdbuf();
  if (!file) {
    return absl::UnavailableError("cannot read /proc/meminfo");
  }
  return ParseMemAvailable(text.str());
}

}  // namespace pagealloc
