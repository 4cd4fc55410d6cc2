// SharedRegion: memory shared between the daemon and one client. The daemon
// creates it as anonymous memory (memfd_create): it has no name in any file
// system, so only a process that is handed its descriptor can map it. The
// daemon hands descriptors to the session that authenticated for them over
// the memory socket (memory/memory_socket.h); the client maps what it
// received with FromFd. Used for the fast channel and the CPU backend's
// output rings, so that every mapping is made, sized and checked by one
// piece of code.

#ifndef PAGEALLOC_MEMORY_SHARED_REGION_H_
#define PAGEALLOC_MEMORY_SHARED_REGION_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "memory/unique_fd.h"

namespace pagealloc {

// A mapped memfd. The mapping stays valid until destruction; the memory
// lives as long as any process maps it or holds a descriptor to it, and
// nothing of it is left anywhere once the last one is gone.
//
// This class is thread-compatible (it is immutable once made).
class SharedRegion {
 public:
  enum class Access { kReadOnly, kReadWrite };

  // Creates `bytes` of anonymous shared memory, zero-filled, mapped
  // read-write. Its pages are reserved now (fallocate), so that a full
  // tmpfs or a memory limit refuses it here instead of killing the process
  // with SIGBUS when a page is first touched; and it is sealed against
  // growing and shrinking, so that no holder of the descriptor can make
  // another's mapping fault. `name` is shown in /proc/<pid>/fd and
  // /proc/<pid>/maps as "memfd:<name>" (debugging only). Returns
  // RESOURCE_EXHAUSTED when the memory cannot be reserved, INVALID_ARGUMENT
  // for 0 bytes, INTERNAL for other system errors.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Create(
      absl::string_view name, size_t bytes);

  // Maps the memory `fd` refers to (a descriptor another process handed
  // over), which must be at least `min_bytes` long and sealed against
  // shrinking, so that it can never fault under the mapping. The region is
  // as long as the memory (fstat). The descriptor is closed once mapped.
  // Returns FAILED_PRECONDITION when the memory is too short or not sealed
  // (not a memfd made by Create), INTERNAL when it cannot be mapped.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> FromFd(UniqueFd fd,
                                                              size_t min_bytes,
                                                              Access access);

  // Unmaps (and closes the descriptor, if held).
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  void* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  // The memory's descriptor, to hand to a client: valid for the region's
  // life on a region made by Create; -1 on one made by FromFd.
  int fd() const { return fd_.get(); }

 private:
  SharedRegion(UniqueFd fd, void* base, size_t bytes)
      : fd_(std::move(fd)), base_(base), bytes_(bytes) {}

  const UniqueFd fd_;
  void* const base_;
  const size_t bytes_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_MEMORY_SHARED_REGION_H_
