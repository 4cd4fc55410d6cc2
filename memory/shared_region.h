// SharedRegion: memory shared between the daemon and one client, as a
// POSIX shared-memory object the daemon creates and the client opens by
// name. Used for the fast channel, its doorbell and the CPU backend's
// output rings, so that every mapping is made, sized and checked by one
// piece of code.

#ifndef PAGEALLOC_MEMORY_SHARED_REGION_H_
#define PAGEALLOC_MEMORY_SHARED_REGION_H_

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace pagealloc {

// A mapped shared-memory object. The creator owns the name and removes it
// (Unlink, or at destruction); the mapping stays valid until destruction.
//
// This class is thread-compatible (Unlink is thread-safe).
class SharedRegion {
 public:
  enum class Access { kReadOnly, kReadWrite };

  // Creates `name` (which must not exist) with file mode `mode` (exactly:
  // the umask does not apply), `bytes` long and zero-filled, mapped
  // read-write. RESOURCE_EXHAUSTED when it cannot be sized; INTERNAL for
  // other system errors.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Create(
      const std::string& name, size_t bytes, int mode);
  // Maps an existing `name`, which must be at least `min_bytes` long
  // (FAILED_PRECONDITION otherwise; UNAVAILABLE when it cannot be opened).
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Open(
      const std::string& name, size_t min_bytes,
      Access access = Access::kReadWrite);
  // Unmaps; the creator also removes the name (unless Unlink did).
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  // Creator only: removes the name now; the mapping stays valid.
  void Unlink();

  void* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  SharedRegion(std::string name, void* base, size_t bytes, bool owner)
      : name_(std::move(name)), base_(base), bytes_(bytes), owner_(owner) {}

  const std::string name_;
  void* const base_;
  const size_t bytes_;
  const bool owner_;
  std::atomic<bool> linked_{true};
};

}  // namespace pagealloc

#endif  // PAGEALLOC_MEMORY_SHARED_REGION_H_
