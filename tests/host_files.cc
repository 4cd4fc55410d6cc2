#include "tests/host_files.h"

#include <dirent.h>
#include <limits.h>
#include <unistd.h>

namespace pagealloc::testing {

int DescriptorsTo(const std::string& target) {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  while (const dirent* entry = readdir(dir)) {
    char link[PATH_MAX] = {};
    const std::string path = std::string("/proc/self/fd/") + entry->d_name;
    if (readlink(path.c_str(), link, sizeof(link) - 1) > 0 && link == target) {
      ++count;
    }
  }
  closedir(dir);
  return count;
}

std::vector<std::string> DevShmNames() {
  std::vector<std::string> names;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (const dirent* entry = readdir(dir)) names.push_back(entry->d_name);
  closedir(dir);
  return names;
}

ScopedFileSizeLimit::ScopedFileSizeLimit(int64_t bytes) {
  if (getrlimit(RLIMIT_FSIZE, &saved_limit_) != 0) return;
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  if (sigaction(SIGXFSZ, &ignore, &saved_action_) != 0) return;
  struct rlimit limited = saved_limit_;
  limited.rlim_cur = static_cast<rlim_t>(bytes);
  if (setrlimit(RLIMIT_FSIZE, &limited) != 0) {
    sigaction(SIGXFSZ, &saved_action_, nullptr);
    return;
  }
  ok_ = true;
}

ScopedFileSizeLimit::~ScopedFileSizeLimit() {
  if (!ok_) return;
  setrlimit(RLIMIT_FSIZE, &saved_limit_);
  sigaction(SIGXFSZ, &saved_action_, nullptr);
}

}  // namespace pagealloc::testing
