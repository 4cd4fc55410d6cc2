#include "common/socket_location.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace pagealloc {

std::vector<std::string> SocketDirectories(const std::string& system_dir,
                                           const std::string& runtime_dir) {
  std::vector<std::string> dirs = {system_dir};
  if (!runtime_dir.empty()) dirs.push_back(runtime_dir + "/pagealloc");
  return dirs;
}

std::vector<std::string> DefaultSocketDirectories() {
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  return SocketDirectories(kSystemSocketDir,
                           runtime_dir != nullptr ? runtime_dir : "");
}

std::string SocketPathIn(const std::string& dir, int gpu) {
  return absl::StrFormat("%s/gpu%d.sock", dir, gpu);
}

absl::StatusOr<std::string> FindDaemonTarget(
    int gpu, const std::vector<std::string>& dirs) {
  std::vector<std::string> looked;
  for (const std::string& dir : dirs) {
    const std::string path = SocketPathIn(dir, gpu);
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      looked.push_back(absl::StrCat(path, " (", std::strerror(errno), ")"));
    } else if (!S_ISSOCK(st.st_mode)) {
      looked.push_back(absl::StrCat(path, " (not a socket)"));
    } else {
      return absl::StrCat("unix://", path);
    }
  }
  return absl::UnavailableError(absl::StrFormat(
      "no pagealloc daemon socket for GPU %d: looked at %s; start "
      "pagealloc-server, or give the daemon's address as the target "
      "(unix:///path.sock or host:port)",
      gpu, absl::StrJoin(looked, ", ")));
}

}  // namespace pagealloc
