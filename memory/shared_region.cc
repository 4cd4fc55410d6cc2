#include "memory/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace pagealloc {

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
    const std::string& name, size_t min_bytes, Access access) {
  const bool writable = access == Access::kReadWrite;
  const int fd = shm_open(name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot open shared memory %s: %s", name, std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < min_bytes) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "shared memory %s is smaller than the %d bytes it should hold", name,
        min_bytes));
  }
  const size_t bytes = st.st_size;
  void* base =
      mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ,
           MAP_SHARED, fd, 0);
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

}  // namespace pagealloc
