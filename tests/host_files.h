// What tests look at in this process's and this host's files: descriptors
// held, /dev/shm's names, and a file-size limit set for a while.

#ifndef PAGEALLOC_TESTS_HOST_FILES_H_
#define PAGEALLOC_TESTS_HOST_FILES_H_

#include <sys/resource.h>

#include <csignal>
#include <cstdint>
#include <string>
#include <vector>

namespace pagealloc::testing {

// How many descriptors this process holds whose link (/proc/self/fd) reads
// `target`, e.g. "/memfd:pagealloc-ring.3 (deleted)".
int DescriptorsTo(const std::string& target);

// The names of /dev/shm's files (none when it cannot be listed).
std::vector<std::string> DevShmNames();

// Sets this process's file-size limit (RLIMIT_FSIZE, inherited by the
// processes it starts) to `bytes`, with SIGXFSZ ignored so that a write past
// it fails with EFBIG, until destroyed: the way a full tmpfs or a memory
// cgroup at its limit makes a reservation fail, without mounting anything.
// ok() says whether it could be set.
class ScopedFileSizeLimit {
 public:
  explicit ScopedFileSizeLimit(int64_t bytes);
  ~ScopedFileSizeLimit();
  ScopedFileSizeLimit(const ScopedFileSizeLimit&) = delete;
  ScopedFileSizeLimit& operator=(const ScopedFileSizeLimit&) = delete;

  bool ok() const { return ok_; }

 private:
  struct rlimit saved_limit_ = {};
  struct sigaction saved_action_ = {};
  bool ok_ = false;
};

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_HOST_FILES_H_
