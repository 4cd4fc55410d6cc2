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
// This class is thread-compatible.
class SharedRegion {
 public:
  enum class Access { kReadOnly, kReadWrite };

  // Creates `bytes` of anonymous shared memory, zero-filled, mapped
  // read-write here. fd() is the descriptor to hand over: read-write, or
  // with `handed_out` kReadOnly a read-only one (reopened through
  // /proc/self/fd), which cannot write, map writable, resize or punch
  // holes in the memory (fallocate answers EBADF); the writable one is
  // then closed once mapped. Its pages are reserved now (fallocate), so that a
  // full tmpfs or a memory limit refuses it here instead of killing the process
  // with SIGBUS when a page is first touched; and it is sealed against
  // growing and shrinking, so that no holder of the descriptor can make
  // another's mapping fault. `name` is shown in /proc/<pid>/fd and
  // /proc/<pid>/maps as "memfd:<name>" (debugging only). Returns
  // RESOURCE_EXHAUSTED when the memory cannot be reserved, INVALID_ARGUMENT
  // for 0 bytes, INTERNAL for other system errors.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Create(
      absl::string_view name, size_t bytes,
      Access handed_out = Access::kReadWrite);

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
  // The memory's descriptor, to hand to a client: valid on a region made
  // by Create until CloseFd; -1 on one made by FromFd.
  int fd() const { return fd_.get(); }
  // Closes the descriptor (the mapping and the memory stay): once it has
  // been handed over, the daemon need not hold it.
  void CloseFd() { fd_.reset(); }

  // Frees the memory's pages past the first `keep_bytes` (rounded up to a
  // page) now (MADV_REMOVE: they read as zeros afterwards, in every
  // mapping), even while another process still maps the memory or holds
  // its descriptor: memory that was charged to this process must not stay
  // charged after it is let go. Best effort; a region made by FromFd is
  // left as it is.
  void Discard(size_t keep_bytes = 0);

 private:
  SharedRegion(UniqueFd fd, void* base, size_t bytes, bool owner)
      : fd_(std::move(fd)), base_(base), bytes_(bytes), owner_(owner) {}

  UniqueFd fd_;
  void* const base_;
  const size_t bytes_;
  const bool owner_;  // made by Create: mapped writable here
};

}  // namespace pagealloc

#endif  // PAGEALLOC_MEMORY_SHARED_REGION_H_
