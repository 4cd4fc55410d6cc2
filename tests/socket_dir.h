// A short directory for a test's Unix sockets. Bazel's TEST_TMPDIR is too
// long a path for a socket (107 bytes at most), so sockets live under /tmp,
// which nothing cleans between runs: the directory goes, with whatever the
// test's daemons left in it (a SIGKILLed daemon's socket files), when the
// test process exits.

#ifndef PAGEALLOC_TESTS_SOCKET_DIR_H_
#define PAGEALLOC_TESTS_SOCKET_DIR_H_

#include <string>

#include "absl/strings/string_view.h"

namespace pagealloc::testing {

// A new directory /tmp/pagealloc-<purpose>-XXXXXX (mode 0700), removed
// with its contents at the process's exit (std::atexit). Aborts the test
// process when /tmp cannot take one. Thread-safe.
std::string MakeSocketDir(absl::string_view purpose);

// Removes `dir` and everything under it (symbolic links not followed);
// what cannot be removed stays.
void RemoveDirectoryTree(const std::string& dir);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_SOCKET_DIR_H_
