#include "client/ring_view.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

#ifdef PAGEALLOC_HAVE_CUDA
#include "client/cuda_ring_view.h"
#endif

namespace pagealloc {
namespace {

// The CPU backend's ring: POSIX shared memory, mapped read-only.
class ShmRingView final : public RingView {
 public:
  ShmRingView(const int64_t* base, int64_t capacity)
      : base_(base), capacity_(capacity) {}
  ~ShmRingView() override {
    munmap(const_cast<int64_t*>(base_), capacity_ * sizeof(int64_t));
  }

  const int64_t* slots() const override { return base_; }
  int64_t capacity_slots() const override { return capacity_; }
  bool on_device() const override { return false; }
  absl::Status CopyToHost(const int64_t* src, int64_t count,
                          int64_t* dst) const override {
    std::memcpy(dst, src, count * sizeof(int64_t));
    return absl::OkStatus();
  }

 private:
  const int64_t* const base_;
  const int64_t capacity_;
};

absl::StatusOr<std::unique_ptr<RingView>> MapShmRing(
    const v1::OutputRing& ring) {
  const int fd = shm_open(ring.shm_name().c_str(), O_RDONLY, 0);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot open the output ring %s: %s (the client must run on the "
        "daemon's host, in a group that may read its shared memory)",
        ring.shm_name(), std::strerror(errno)));
  }
  struct stat st;
  const size_t bytes = ring.capacity_slots() * sizeof(int64_t);
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrFormat("output ring %s is smaller than its %d slots",
                        ring.shm_name(), ring.capacity_slots()));
  }
  void* base = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (base == MAP_FAILED) {
    return absl::InternalError(absl::StrFormat(
        "mmap of %s failed: %s", ring.shm_name(), std::strerror(error)));
  }
  return std::make_unique<ShmRingView>(static_cast<const int64_t*>(base),
                                       ring.capacity_slots());
}

}  // namespace

absl::StatusOr<std::unique_ptr<RingView>> MapRing(const v1::PoolInfo& pool,
                                                  const v1::OutputRing& ring) {
  switch (pool.backend()) {
    case v1::BACKEND_CPU:
      return MapShmRing(ring);
    case v1::BACKEND_CUDA:
#ifdef PAGEALLOC_HAVE_CUDA
      return MapCudaIpcRing(ring, pool.device_uuid());
#else
      return absl::FailedPreconditionError(
          "the daemon serves a CUDA pool but this client library was built "
          "without CUDA");
#endif
    default:
      return absl::InvalidArgumentError(absl::StrFormat(
          "unknown backend %d", static_cast<int>(pool.backend())));
  }
}

}  // namespace pagealloc
