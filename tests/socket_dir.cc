#include "tests/socket_dir.h"

#include <ftw.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/base/const_init.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace pagealloc::testing {
namespace {

ABSL_CONST_INIT absl::Mutex dirs_mu(absl::kConstInit);
// Never destroyed: RemoveDirs runs at exit, after static destructors may
// have begun.
std::vector<std::string>* dirs ABSL_GUARDED_BY(dirs_mu) = nullptr;

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  remove(path);
  return 0;
}

void RemoveDirs() {
  absl::MutexLock lock(&dirs_mu);
  for (const std::string& dir : *dirs) RemoveDirectoryTree(dir);
}

}  // namespace

void RemoveDirectoryTree(const std::string& dir) {
  nftw(dir.c_str(), RemoveEntry, 8, FTW_DEPTH | FTW_PHYS);
}

std::string MakeSocketDir(absl::string_view purpose) {
  std::string pattern = absl::StrCat("/tmp/pagealloc-", purpose, "-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    std::fprintf(stderr, "mkdtemp %s: %s\n", pattern.c_str(),
                 std::strerror(errno));
    std::abort();
  }
  absl::MutexLock lock(&dirs_mu);
  if (dirs == nullptr) {
    dirs = new std::vector<std::string>();
    std::atexit(RemoveDirs);
  }
  dirs->push_back(pattern);
  return pattern;
}

}  // namespace pagealloc::testing
