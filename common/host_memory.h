// What the host's kernel says about its memory (/proc/meminfo).

#ifndef PAGEALLOC_COMMON_HOST_MEMORY_H_
#define PAGEALLOC_COMMON_HOST_MEMORY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pagealloc {

// Returns MemAvailable, in bytes, from /proc/meminfo's text ("MemAvailable:
// 123456 kB" lines). INVALID_ARGUMENT when it has no such line, or its
// value is not a non-negative number of kB.
absl::StatusOr<int64_t> ParseMemAvailable(absl::string_view meminfo);

// Memory the kernel can give without swapping (/proc/meminfo MemAvailable).
// UNAVAILABLE when /proc/meminfo cannot be read; ParseMemAvailable's errors.
absl::StatusOr<int64_t> AvailableHostBytes();

}  // namespace pagealloc

#endif  // PAGEALLOC_COMMON_HOST_MEMORY_H_
