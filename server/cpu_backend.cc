// The CPU backend: the reference executor, and rings in POSIX shared memory
// that the client maps read-only.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_format.h"
#include "kernels/cpu_executor.h"
#include "server/backend.h"

namespace pagealloc {
namespace {

class ShmRing final : public RingMemory {
 public:
  static absl::StatusOr<std::unique_ptr<ShmRing>> Create(std::string name,
                                                         int64_t capacity) {
    // 0660: the daemon's group (the schedulers') may map the ring.
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0660);
    if (fd < 0) {
      return absl::InternalError(absl::StrFormat("shm_open(%s) failed: %s",
                                                 name, std::strerror(errno)));
    }
    const size_t bytes = capacity * sizeof(int64_t);
    if (ftruncate(fd, bytes) != 0) {
      const int error = errno;
      close(fd);
      shm_unlink(name.c_str());
      return absl::ResourceExhaustedError(
          absl::StrFormat("sizing shared memory %s to %d bytes failed: %s",
                          name, bytes, std::strerror(error)));
    }
    void* base =
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int error = errno;
    close(fd);
    if (base == MAP_FAILED) {
      shm_unlink(name.c_str());
      return absl::InternalError(
          absl::StrFormat("mmap of %s failed: %s", name, std::strerror(error)));
    }
    return std::unique_ptr<ShmRing>(
        new ShmRing(std::move(name), static_cast<int64_t*>(base), capacity));
  }

  ~ShmRing() override {
    munmap(base_, capacity_ * sizeof(int64_t));
    shm_unlink(name_.c_str());
  }

  int64_t* slots() override { return base_; }
  int64_t capacity_slots() const override { return capacity_; }
  void Describe(v1::OutputRing* ring) const override {
    ring->set_capacity_slots(capacity_);
    ring->set_shm_name(name_);
  }

 private:
  ShmRing(std::string name, int64_t* base, int64_t capacity)
      : name_(std::move(name)), base_(base), capacity_(capacity) {}

  const std::string name_;
  int64_t* const base_;
  const int64_t capacity_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(std::string shm_prefix)
      : shm_prefix_(std::move(shm_prefix)) {}

  v1::Backend kind() const override { return v1::BACKEND_CPU; }
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

  void DescribeDevice(v1::PoolInfo* pool) const override {
    pool->set_backend(v1::BACKEND_CPU);
    pool->set_gpu(-1);
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
