#include "server/descriptors.h"

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "server/connection_acceptor.h"

namespace pagealloc {

absl::StatusOr<DescriptorCount> CountDescriptors() {
  DescriptorCount count;
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0) {
    return absl::UnavailableError(absl::StrFormat(
        "getrlimit(RLIMIT_NOFILE) failed: %s", std::strerror(errno)));
  }
  count.limit = files.rlim_cur == RLIM_INFINITY
                    ? int64_t{1} << 30
                    : static_cast<int64_t>(files.rlim_cur);
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) {
    if (errno == EMFILE || errno == ENFILE) {
      count.open = count.limit;
      return count;
    }
    return absl::UnavailableError(
        absl::StrFormat("cannot list /proc/self/fd: %s", std::strerror(errno)));
  }
  const std::string own = std::to_string(dirfd(dir));
  while (const dirent* entry = readdir(dir)) {
    const absl::string_view name = entry->d_name;
    if (name == "." || name == ".." || name == own) continue;
    ++count.open;
  }
  closedir(dir);
  return count;
}

absl::Status CheckDescriptorsFree(int64_t more) {
  absl::StatusOr<DescriptorCount> count = CountDescriptors();
  if (!count.ok()) return absl::OkStatus();
  if (count->open + more + kDescriptorsKept <= count->limit) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "descriptors exhausted: %d open of limit %d (RLIMIT_NOFILE); a session "
      "needs %d and %d are kept free for the daemon",
      count->open, count->limit, more, kDescriptorsKept));
}

int64_t SessionsWithin(int64_t limit) {
  const int64_t left = limit - kDaemonDescriptors -
                       ConnectionAcceptor::ReservedDescriptors(limit);
  return std::max<int64_t>(0, left / kDescriptorsPerSession);
}

}  // namespace pagealloc
