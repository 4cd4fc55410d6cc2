// The daemon's and the client library's version, as /metrics
// (pagealloc_build_info) and --version report it.

#ifndef PAGEALLOC_COMMON_VERSION_H_
#define PAGEALLOC_COMMON_VERSION_H_

namespace pagealloc {

inline constexpr char kPageallocVersion[] = "0.1.0";

}  // namespace pagealloc

#endif  // PAGEALLOC_COMMON_VERSION_H_
