#include "memory/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"

namespace pagealloc {
namespace {

// Errors that mean "no memory for this now", which a caller may see go away
// (smaller request, fewer sessions), as opposed to a broken system.
bool OutOfMemory(int error) {
  return error == ENOSPC || error == ENOMEM || error == EFBIG ||
         error == EDQUOT || error == EMFILE || error == ENFILE;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Create(
    absl::string_view name, size_t bytes, Access handed_out) {
  const std::string text(name);
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("shared memory %s of 0 bytes", text));
  }
  UniqueFd fd(memfd_create(text.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) {
    const int error = errno;
    return absl::Status(OutOfMemory(error)
                            ? absl::StatusCode::kResourceExhausted
                            : absl::StatusCode::kInternal,
                        absl::StrFormat("memfd_create(%s) failed: %s", text,
                                        std::strerror(error)));
  }
  // One call sizes the memory and reserves every page of it. Without the
  // reservation the pages would be taken when first written, and a tmpfs
  // or cgroup with no room left then answers with SIGBUS in whichever
  // process touched the page (the daemon, writing a ring).
  int error;
  do {
    error = posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes));
  } while (error == EINTR);
  if (error != 0) {
    return absl::Status(
        OutOfMemory(error) ? absl::StatusCode::kResourceExhausted
                           : absl::StatusCode::kInternal,
        absl::StrFormat("cannot reserve %d bytes of shared memory for %s: %s",
                        bytes, text, std::strerror(error)));
  }
  // Nobody (the client included) may resize it under another's mapping.
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
      0) {
    return absl::InternalError(absl::StrFormat(
        "sealing shared memory %s failed: %s", text, std::strerror(errno)));
  }
  void* base =
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    const int error = errno;
    return absl::Status(OutOfMemory(error)
                            ? absl::StatusCode::kResourceExhausted
                            : absl::StatusCode::kInternal,
                        absl::StrFormat("mmap of shared memory %s failed: %s",
                                        text, std::strerror(error)));
  }
  if (handed_out == Access::kReadOnly) {
    // Reopening the memfd through /proc gives a new open file of the same
    // memory with the access we ask for; the kernel checks writes, writable
    // mappings, ftruncate and fallocate against that open file's mode.
    // (A process can still reopen a read-only memfd of its own read-write
    // through its /proc/self/fd; a seal would stop that, but F_SEAL_WRITE
    // refuses our writable mapping and F_SEAL_FUTURE_WRITE our own
    // Discard, so we take the mode's protection and the budget's bound.)
    const std::string path = absl::StrFormat("/proc/self/fd/%d", fd.get());
    UniqueFd read_only(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!read_only.valid()) {
      const int error = errno;
      munmap(base, bytes);
      return absl::Status(OutOfMemory(error)
                              ? absl::StatusCode::kResourceExhausted
                              : absl::StatusCode::kInternal,
                          absl::StrFormat("reopening shared memory %s "
                                          "read-only (%s) failed: %s",
                                          text, path, std::strerror(error)));
    }
    fd = std::move(read_only);
  }
  return std::unique_ptr<SharedRegion>(
      new SharedRegion(std::move(fd), base, bytes, /*owner=*/true));
}

void SharedRegion::Discard(size_t keep_bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t keep = (keep_bytes + page - 1) / page * page;
  if (!owner_ || keep >= bytes_) return;
  madvise(static_cast<char*>(base_) + keep, bytes_ - keep, MADV_REMOVE);
}

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::FromFd(
    UniqueFd fd, size_t min_bytes, Access access) {
  if (!fd.valid()) {
    return absl::FailedPreconditionError("no descriptor for shared memory");
  }
  // Memory that may shrink could fault under our mapping (SIGBUS): only
  // take memory whose size is sealed, as Create makes it.
  const int seals = fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::FailedPreconditionError(
        "the shared memory handed over is not sealed against shrinking");
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return absl::InternalError(absl::StrFormat(
        "fstat of shared memory failed: %s", std::strerror(errno)));
  }
  const size_t bytes = st.st_size;
  if (bytes < min_bytes || bytes == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the shared memory handed over is %d bytes, smaller than the %d "
        "bytes it should hold",
        bytes, min_bytes));
  }
  const bool writable = access == Access::kReadWrite;
  void* base =
      mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ,
           MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    return absl::InternalError(absl::StrFormat(
        "mmap of shared memory failed: %s", std::strerror(errno)));
  }
  // The mapping holds the memory; the descriptor is not needed any more.
  return std::unique_ptr<SharedRegion>(
      new SharedRegion(UniqueFd(), base, bytes, /*owner=*/false));
}

SharedRegion::~SharedRegion() { munmap(base_, bytes_); }

}  // namespace pagealloc
