// What a pagealloc binary is: its version (common/version.h), the commit it
// was built from and the backends compiled into it. --version prints it.

#ifndef PAGEALLOC_COMMON_BUILD_INFO_H_
#define PAGEALLOC_COMMON_BUILD_INFO_H_

#include <string>

#include "absl/strings/string_view.h"

namespace pagealloc {

// The commit the build was stamped with (tools/workspace_status.sh): a
// 12-digit hash, followed by "-modified" when tracked files differed from
// it, or "unknown" for a build without a repository.
absl::string_view BuildCommit();

// Whether the CUDA backend (and the client's CUDA IPC mapping) is compiled
// in: true when the build found a CUDA toolkit.
bool BuiltWithCuda();

// The --version text of `program`, e.g.
//   pagealloc-server 0.1.0
//   commit   1e38ed4a1b2c
//   backends cpu, cuda
std::string VersionText(absl::string_view program);

}  // namespace pagealloc

#endif  // PAGEALLOC_COMMON_BUILD_INFO_H_
