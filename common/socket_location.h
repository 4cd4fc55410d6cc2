// Where a pagealloc daemon's socket is when nobody names it: the
// directories pagealloc-server tries for its default --listen and the ones
// clients look in for a daemon (pagealloc-cli, the C++ client, the C ABI
// and the Python package with no target), one list in one order.

#ifndef PAGEALLOC_COMMON_SOCKET_LOCATION_H_
#define PAGEALLOC_COMMON_SOCKET_LOCATION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pagealloc {

// The system's socket directory, first in the list.
inline constexpr char kSystemSocketDir[] = "/run/pagealloc";

// The default socket directories, in order: `system_dir`, then
// `runtime_dir`/pagealloc when `runtime_dir` ($XDG_RUNTIME_DIR) is not
// empty.
std::vector<std::string> SocketDirectories(const std::string& system_dir,
                                           const std::string& runtime_dir);

// SocketDirectories(kSystemSocketDir, $XDG_RUNTIME_DIR or "").
std::vector<std::string> DefaultSocketDirectories();

// The socket of GPU `gpu` in `dir`: "<dir>/gpu<gpu>.sock".
std::string SocketPathIn(const std::string& dir, int gpu);

// The target a client dials when it is given none: "unix://<path>" of the
// first of `dirs` (DefaultSocketDirectories()) that holds GPU `gpu`'s
// socket. UNAVAILABLE when none does, naming every path looked at and why
// it was passed over (errno's text, or "not a socket").
absl::StatusOr<std::string> FindDaemonTarget(
    int gpu, const std::vector<std::string>& dirs = DefaultSocketDirectories());

}  // namespace pagealloc

#endif  // PAGEALLOC_COMMON_SOCKET_LOCATION_H_
