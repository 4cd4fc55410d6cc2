#include "proto/fast_channel.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "absl/strings/str_format.h"

namespace pagealloc {
namespace fast_channel {

static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "the channel's words are shared between processes");

ChannelLayout::ChannelLayout(int32_t max_requests, int32_t message_bytes) {
  const size_t n = max_requests;
  size_t at = sizeof(ChannelHeader);
  auto take = [&at](size_t bytes) {
    const size_t start = at;
    at += (bytes + 63) / 64 * 64;  // each part on its own cache lines
    return start;
  };
  in0 = take(n * sizeof(int64_t));
  in1 = take(n * sizeof(int64_t));
  in2 = take(n * sizeof(int64_t));
  free_first = take(n * sizeof(int64_t));
  codes = take(n * sizeof(int32_t));
  ring_offsets = take(n * sizeof(int64_t));
  counts = take(n * sizeof(int64_t));
  new_pages = take(n * sizeof(int64_t));
  messages = take(message_bytes);
  total_bytes = at;
}

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Create(
    const std::string& name, size_t bytes, int mode) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, mode);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrFormat("shm_open(%s) failed: %s", name, std::strerror(errno)));
  }
  // shm_open applies the umask; the mode is what the operator asked for.
  fchmod(fd, mode);
  if (ftruncate(fd, bytes) != 0) {
    const int error = errno;
    close(fd);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrFormat("sizing shared memory %s to %d bytes failed: %s", name,
                        bytes, std::strerror(error)));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return absl::InternalError(
        absl::StrFormat("mmap of %s failed: %s", name, std::strerror(error)));
  }
  // ftruncate zero-fills: every counter starts at 0.
  return std::unique_ptr<SharedRegion>(
      new SharedRegion(name, base, bytes, /*owner=*/true));
}

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Open(
    const std::string& name, size_t min_bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrFormat("cannot open the fast channel's shared memory %s: %s",
                        name, std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < min_bytes) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "shared memory %s is smaller than the %d bytes it should hold", name,
        min_bytes));
  }
  const size_t bytes = st.st_size;
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (base == MAP_FAILED) {
    return absl::InternalError(
        absl::StrFormat("mmap of %s failed: %s", name, std::strerror(error)));
  }
  return std::unique_ptr<SharedRegion>(
      new SharedRegion(name, base, bytes, /*owner=*/false));
}

SharedRegion::~SharedRegion() {
  munmap(base_, bytes_);
  Unlink();
}

void SharedRegion::Unlink() {
  if (owner_ && linked_.exchange(false)) shm_unlink(name_.c_str());
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               absl::Duration timeout) {
  const timespec relative = absl::ToTimespec(timeout);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected,
          &relative, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX,
          nullptr, nullptr, 0);
}

}  // namespace fast_channel
}  // namespace pagealloc
