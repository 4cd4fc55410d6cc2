#include "client/ring_view.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "memory/shared_region.h"

#ifdef PAGEALLOC_HAVE_CUDA
#include "client/cuda_ring_view.h"
#endif

namespace pagealloc {
namespace {

// The CPU backend's ring: shared memory, mapped read-only.
class MemfdRingView final : public RingView {
 public:
  MemfdRingView(std::unique_ptr<SharedRegion> region, int64_t capacity)
      : region_(std::move(region)), capacity_(capacity) {}

  const int64_t* slots() const override {
    return static_cast<const int64_t*>(region_->base());
  }
  int64_t capacity_slots() const override { return capacity_; }
  bool on_device() const override { return false; }
  absl::Status CopyToHost(const int64_t* src, int64_t count,
                          int64_t* dst) const override {
    // Nothing to copy may come with null pointers (an empty request).
    if (count <= 0) return absl::OkStatus();
    std::memcpy(dst, src, count * sizeof(int64_t));
    return absl::OkStatus();
  }

 private:
  const std::unique_ptr<SharedRegion> region_;
  const int64_t capacity_;
};

absl::StatusOr<std::unique_ptr<RingView>> MapMemfdRing(
    const v1::OutputRing& ring, UniqueFd ring_fd, uint64_t ring_bytes) {
  if (ring_bytes < static_cast<uint64_t>(ring.capacity_slots()) * 8) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the daemon's memory socket sent a ring of %d bytes for %d slots",
        ring_bytes, ring.capacity_slots()));
  }
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::FromFd(
      std::move(ring_fd), ring.capacity_slots() * sizeof(int64_t),
      SharedRegion::Access::kReadOnly);
  if (!region.ok()) {
    return absl::Status(region.status().code(),
                        absl::StrFormat("cannot map the output ring: %s",
                                        region.status().message()));
  }
  return std::make_unique<MemfdRingView>(*std::move(region),
                                         ring.capacity_slots());
}

}  // namespace

absl::StatusOr<std::unique_ptr<RingView>> MapRing(const v1::PoolInfo& pool,
                                                  const v1::OutputRing& ring,
                                                  UniqueFd ring_fd,
                                                  uint64_t ring_bytes) {
  if (ring.capacity_slots() < 1 || ring.capacity_slots() > (int64_t{1} << 40)) {
    return absl::InternalError(absl::StrFormat(
        "the daemon described a ring of %d slots", ring.capacity_slots()));
  }
  if (!ring_fd.valid()) {
    return absl::FailedPreconditionError(
        "no output ring: the daemon's memory socket did not hand one over");
  }
  switch (pool.backend()) {
    case v1::BACKEND_CPU:
      return MapMemfdRing(ring, std::move(ring_fd), ring_bytes);
    case v1::BACKEND_CUDA:
#ifdef PAGEALLOC_HAVE_CUDA
      return MapCudaRing(ring, pool.device_uuid(), std::move(ring_fd),
                         ring_bytes);
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

absl::StatusOr<std::unique_ptr<CompletionCounter>> MapCompletionCounter(
    const v1::PoolInfo& pool, UniqueFd fd, uint64_t bytes) {
  if (pool.backend() != v1::BACKEND_CUDA) {
    return absl::FailedPreconditionError(
        "only a CUDA pool has a completion counter");
  }
#ifdef PAGEALLOC_HAVE_CUDA
  return MapCudaCompletionCounter(pool.device_uuid(), std::move(fd), bytes);
#else
  (void)fd;
  (void)bytes;
  return absl::FailedPreconditionError(
      "the daemon serves a CUDA pool but this client library was built "
      "without CUDA");
#endif
}

namespace {

// The CPU backend's: the daemon reads the word after the store, and the
// caller's work on the pages is done by then (program order).
class HostReleaseWord final : public ReleaseWordWriter {
 public:
  explicit HostReleaseWord(std::atomic<uint64_t>* word) : word_(word) {}
  absl::Status Write(uint64_t value, void* /*stream*/) const override {
    word_->store(value, std::memory_order_release);
    return absl::OkStatus();
  }
  uint64_t Read() const override {
    return word_->load(std::memory_order_acquire);
  }

 private:
  std::atomic<uint64_t>* const word_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ReleaseWordWriter>> MapReleaseWord(
    const v1::PoolInfo& pool, std::atomic<uint64_t>* word) {
  if (pool.backend() != v1::BACKEND_CUDA) {
    return std::make_unique<HostReleaseWord>(word);
  }
#ifdef PAGEALLOC_HAVE_CUDA
  return MapCudaReleaseWord(word);
#else
  return absl::FailedPreconditionError(
      "the daemon serves a CUDA pool but this client library was built "
      "without CUDA: frees cannot be fenced on a stream");
#endif
}

}  // namespace pagealloc
