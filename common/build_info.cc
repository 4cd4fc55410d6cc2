#include "common/build_info.h"

#include "absl/strings/str_format.h"
#include "common/version.h"

namespace pagealloc {

// Defined in build_commit.cc, which //common:build_commit writes from
// Bazel's stable status: the only file a new commit changes.
extern const char kBuildCommit[];

absl::string_view BuildCommit() { return kBuildCommit; }

bool BuiltWithCuda() {
#ifdef PAGEALLOC_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::string VersionText(absl::string_view program) {
  return absl::StrFormat(
      "%s %s\ncommit   %s\nbackends %s\n", program, kPageallocVersion,
      BuildCommit(),
      BuiltWithCuda() ? "cpu, cuda"
                      : "cpu (built without CUDA: no toolkit at build time)");
}

}  // namespace pagealloc
