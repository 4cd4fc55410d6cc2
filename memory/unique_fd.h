// UniqueFd: owns one file descriptor and closes it on destruction, so that
// descriptors received from the kernel or another process (memfds, eventfds,
// sockets) cannot leak on an error path.

#ifndef PAGEALLOC_MEMORY_UNIQUE_FD_H_
#define PAGEALLOC_MEMORY_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace pagealloc {

// Move-only. -1 means "no descriptor". This class is thread-compatible.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives the descriptor up without closing it.
  int release() { return std::exchange(fd_, -1); }
  // Closes the descriptor held (if any) and holds `fd` instead.
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_MEMORY_UNIQUE_FD_H_
