// The CPU backend: the reference executor, and rings in POSIX shared memory
// that the client maps read-only.

#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cpu_executor.h"
#include "memory/shared_region.h"
#include "server/backend.h"

namespace pagealloc {
namespace {

// A ring in shared memory that the client maps read-only.
class ShmRing final : public RingMemory {
 public:
  static absl::StatusOr<std::unique_ptr<ShmRing>> Create(
      const std::string& name, int64_t capacity) {
    // 0660: the daemon's group (the schedulers') may map the ring.
    ASSIGN_OR_RETURN(
        std::unique_ptr<SharedRegion> region,
        SharedRegion::Create(name, capacity * sizeof(int64_t), 0660));
    return std::unique_ptr<ShmRing>(new ShmRing(std::move(region), capacity));
  }

  int64_t* slots() override { return static_cast<int64_t*>(region_->base()); }
  int64_t capacity_slots() const override { return capacity_; }
  RingDescription Describe() const override {
    RingDescription ring;
    ring.capacity_slots = capacity_;
    ring.shm_name = region_->name();
    return ring;
  }

 private:
  ShmRing(std::unique_ptr<SharedRegion> region, int64_t capacity)
      : region_(std::move(region)), capacity_(capacity) {}

  const std::unique_ptr<SharedRegion> region_;
  const int64_t capacity_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(std::string shm_prefix)
      : shm_prefix_(std::move(shm_prefix)) {}

  BackendKind kind() const override { return BackendKind::kCpu; }
  PlanExecutor* executor() override { return &executor_; }

  absl::StatusOr<std::unique_ptr<RingMemory>> CreateRing(
      uint64_t session_id, int64_t capacity_slots) override {
    // A random tag keeps a restarted daemon from colliding with rings a
    // crashed one left behind.
    std::random_device random;
    const std::string name =
        absl::StrFormat("%s.%d.%08x", shm_prefix_, session_id, random());
    return ShmRing::Create(name, capacity_slots);
  }

  absl::Status CopyToHost(const int64_t* src, int64_t count,
                          int64_t* dst) override {
    std::memcpy(dst, src, count * sizeof(int64_t));
    return absl::OkStatus();
  }

  absl::Status CompleteLaunch(bool) override { return absl::OkStatus(); }

  DeviceDescription DescribeDevice() const override {
    return {BackendKind::kCpu, -1, ""};
  }

  std::string Summary() const override {
    return "cpu (reference executor, rings in POSIX shared memory)";
  }

 private:
  const std::string shm_prefix_;
  CpuExecutor executor_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(std::string shm_prefix) {
  return std::make_unique<CpuBackend>(std::move(shm_prefix));
}

}  // namespace pagealloc
