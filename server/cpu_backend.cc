// The CPU backend: the reference executor, and rings in anonymous shared
// memory that the client maps read-only once the memory socket handed it
// the descriptor; the KV slab in one memfd every session maps read-write.

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/host_memory.h"
#include "common/status_macros.h"
#include "kernels/cpu_executor.h"
#include "memory/shared_region.h"
#include "server/backend.h"
#include "server/memory_budget.h"

namespace pagealloc {
namespace {

// A ring in a memfd: reserved at creation (so a ring too large for the
// host's memory is refused at Register, not a SIGBUS when it fills). The
// client only reads its ring, so it gets a read-only descriptor: it cannot
// write the daemon's answers or punch holes in the reservation. The pages
// are freed when the ring goes, even if the client still maps them.
class MemfdRing final : public RingMemory {
 public:
  static absl::StatusOr<std::unique_ptr<MemfdRing>> Create(uint64_t session_id,
                                                           int64_t capacity) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<SharedRegion> region,
        SharedRegion::Create(absl::StrFormat("pagealloc-ring.%d", session_id),
                             capacity * sizeof(int64_t),
                             SharedRegion::Access::kReadOnly));
    return std::unique_ptr<MemfdRing>(
        new MemfdRing(std::move(region), capacity));
  }

  ~MemfdRing() override {
    if (!left_to_client_.load(std::memory_order_acquire)) region_->Discard();
  }
  void LeaveToClient() override {
    left_to_client_.store(true, std::memory_order_release);
  }

  int64_t* slots() override { return static_cast<int64_t*>(region_->base()); }
  int64_t capacity_slots() const override { return capacity_; }
  void CloseDescriptor() override { region_->CloseFd(); }
  RingDescription Describe() const override {
    RingDescription ring;
    ring.capacity_slots = capacity_;
    ring.memory = RingDescription::Memory::kMemfd;
    ring.fd = region_->fd();
    ring.bytes = static_cast<uint64_t>(capacity_) * sizeof(int64_t);
    return ring;
  }

 private:
  MemfdRing(std::unique_ptr<SharedRegion> region, int64_t capacity)
      : region_(std::move(region)), capacity_(capacity) {}

  const std::unique_ptr<SharedRegion> region_;
  const int64_t capacity_;
  std::atomic<bool> left_to_client_{false};
};

class CpuBackend final : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::kCpu; }
  PlanExecutor* executor() override { return &executor_; }

  absl::StatusOr<std::unique_ptr<RingMemory>> CreateRing(
      uint64_t session_id, int64_t capacity_slots) override {
    return MemfdRing::Create(session_id, capacity_slots);
  }

  absl::Status CopyToHost(const int64_t* src, int64_t count,
                          int64_t* dst) override {
    std::memcpy(dst, src, count * sizeof(int64_t));
    return absl::OkStatus();
  }

  // The executor has finished when Execute returns: the counter only
  // numbers the launches, so that the answers carry a value on every
  // backend.
  absl::StatusOr<uint64_t> CompleteLaunch(bool) override {
    return completion_.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  uint64_t completion_value() const override {
    return completion_.load(std::memory_order_relaxed);
  }

  DeviceDescription DescribeDevice() const override {
    return {BackendKind::kCpu, -1, ""};
  }

  absl::StatusOr<int64_t> KvAlignment() override {
    return static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  }

  // MemAvailable, or the memory cgroup's limit where smaller: a memfd is
  // charged to the daemon's cgroup, whose limit is met with the OOM killer.
  absl::StatusOr<int64_t> KvAvailableBytes() override {
    const HostMemory memory = AvailableHostMemory();
    if (memory.bytes < 0) {
      return absl::InternalError(
          "/proc/meminfo has no MemAvailable and no memory cgroup limit is "
          "readable");
    }
    return memory.bytes;
  }

  absl::Status CreateKvSlab(const KvLayout& layout,
                            const KvSlabGeometry& geometry,
                            bool scrub) override {
    if (slab_region_ != nullptr) {
      return absl::FailedPreconditionError("the KV slab exists already");
    }
    // Reserved whole (fallocate): a slab the host cannot hold is refused
    // here, at start, never a SIGBUS in whichever process writes a slot.
    ASSIGN_OR_RETURN(slab_region_, SharedRegion::Create("pagealloc-kv-slab",
                                                        geometry.total_bytes));
    UseSlab(layout, geometry, scrub, slab_region_->fd());
    return absl::OkStatus();
  }

  absl::Status AdoptKvSlab(const KvLayout& layout,
                           const KvSlabGeometry& geometry, bool scrub,
                           UniqueFd fd, uint64_t slab_id) override {
    if (slab_region_ != nullptr) {
      return absl::FailedPreconditionError("the KV slab exists already");
    }
    // FromFd closes the descriptor it maps; the daemon keeps one to hand
    // to sessions.
    UniqueFd kept(fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!kept.valid()) {
      return absl::InternalError(
          absl::StrFormat("dup of the kept KV slab: %s", strerror(errno)));
    }
    struct stat st {};
    if (fstat(fd.get(), &st) != 0 ||
        st.st_size != static_cast<off_t>(geometry.total_bytes)) {
      return absl::DataLossError(absl::StrFormat(
          "the kept KV slab holds %d bytes; this pool's slab takes %d",
          static_cast<int64_t>(st.st_size), geometry.total_bytes));
    }
    auto region = SharedRegion::FromFd(std::move(fd), geometry.total_bytes,
                                       SharedRegion::Access::kReadWrite);
    if (!region.ok()) {
      return absl::DataLossError(
          absl::StrCat("the kept KV slab: ", region.status().message()));
    }
    slab_region_ = std::move(*region);
    adopted_fd_ = std::move(kept);
    UseSlab(layout, geometry, scrub, adopted_fd_.get());
    slab_.adopted = true;
    slab_.slab_id = slab_id;
    return absl::OkStatus();
  }

  // Describes the slab in slab_region_ (whose descriptor is `fd`) and
  // hands the executor its buffers when scrubbing.
  void UseSlab(const KvLayout& layout, const KvSlabGeometry& geometry,
               bool scrub, int fd) {
    slab_.layout = layout;
    slab_.geometry = geometry;
    slab_.scrub = scrub;
    slab_.fd = fd;
    slab_.slab_id = NewKvSlabId();
    if (scrub) {
      KvScrubTarget target;
      target.page_size = geometry.page_size;
      for (const KvBufferPlacement& placement : geometry.placements) {
        target.buffers.push_back(
            {static_cast<char*>(slab_region_->base()) + placement.offset,
             placement.stride_bytes});
      }
      executor_.SetKvScrubTarget(std::move(target));
    }
  }

  const KvSlab* kv_slab() const override {
    return slab_region_ != nullptr ? &slab_ : nullptr;
  }

  std::string Summary() const override {
    if (slab_region_ != nullptr) {
      return absl::StrFormat(
          "cpu (reference executor, rings and a %s KV slab in memfd shared "
          "memory%s)",
          FormatBytes(slab_.geometry.total_bytes),
          slab_.adopted ? ", the slab kept from the last run" : "");
    }
    return "cpu (reference executor, rings in memfd shared memory)";
  }

 private:
  CpuExecutor executor_;
  std::atomic<uint64_t> completion_{0};
  // The KV slab: mapped here too, for scrubbing.
  std::unique_ptr<SharedRegion> slab_region_;
  // An adopted slab's descriptor (a region made by FromFd holds none).
  UniqueFd adopted_fd_;
  KvSlab slab_;
};

}  // namespace

uint64_t NewKvSlabId() {
  uint64_t id = 0;
  while (id == 0) {
    // getrandom of 8 bytes from an initialized pool does not fail short;
    // std::random_device is the fallback for a kernel without it.
    if (getrandom(&id, sizeof(id), 0) != static_cast<ssize_t>(sizeof(id))) {
      std::random_device random;
      id = (static_cast<uint64_t>(random()) << 32) | random();
    }
  }
  return id;
}

std::unique_ptr<Backend> MakeCpuBackend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace pagealloc
