// Backend: what the daemon needs from the device side, beyond the pool's
// executor: memory for each session's output ring that the client can map,
// copies out of it, and launch completion.
//
// Two implementations: the CPU backend (CpuExecutor, rings and the KV slab
// in anonymous shared memory) here, and the CUDA backend (CudaExecutor,
// rings and the KV slab in CUDA virtual-memory allocations, and a
// completion counter in device memory that the daemon's stream writes after
// each asynchronous launch) in cuda_backend.h. Either way the client gets
// its memory as file descriptors over the memory socket
// (memory/memory_socket.h), so a container needs only the daemon's socket.

#ifndef PAGEALLOC_SERVER_BACKEND_H_
#define PAGEALLOC_SERVER_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/executor.h"
#include "memory/kv_layout.h"
#include "memory/unique_fd.h"

namespace pagealloc {

enum class BackendKind { kCpu, kCuda };

// What a client needs to map a session's output ring (the memory socket
// hands its descriptors over; RegisterResponse carries the capacity).
struct RingDescription {
  // How the client maps `fd`.
  enum class Memory {
    kMemfd,    // CPU: a memfd, handed over read-only, mapped with mmap
    kCudaVmm,  // CUDA: a cuMemCreate allocation exported as a POSIX fd
  };
  int64_t capacity_slots = 0;
  Memory memory = Memory::kMemfd;
  // The ring's memory, owned by the RingMemory (valid while it lives), and
  // its size in bytes: capacity_slots * 8 for a memfd, that rounded up to
  // the device's allocation granularity for a CUDA allocation (the size a
  // client must map).
  int fd = -1;
  uint64_t bytes = 0;
  // CUDA: the pool's completion counter (a uint64 at offset 0 of a
  // cuMemCreate allocation of completion_bytes, exported as a POSIX fd;
  // owned by the backend). -1 on the CPU backend.
  int completion_fd = -1;
  uint64_t completion_bytes = 0;
};

// The device a pool lives on.
struct DeviceDescription {
  BackendKind kind = BackendKind::kCpu;
  int gpu = -1;             // CUDA device ordinal; -1 on the CPU backend
  std::string device_uuid;  // "GPU-..." on the CUDA backend
  // CUDA backend: contexts on the GPU are shared through MPS
  // (cudaDevAttrMpsEnabled), so clients' streams and the daemon's run
  // side by side instead of time-slicing.
  bool cuda_mps = false;
};

// The pool's KV memory (--kv_layout): one slab holding every buffer, made
// by the backend and handed to every session as one file descriptor over
// the memory socket. Immutable once made; it lives as long as the backend.
struct KvSlab {
  KvLayout layout;
  KvSlabGeometry geometry;
  // Pages are zeroed before they go to a session other than their last
  // owner (the executor does it, from the plan's scrub_pages).
  bool scrub = false;
  // The memory, owned by the backend: a memfd (CPU) or a CUDA VMM
  // allocation exported as a POSIX fd (CUDA). Another holder of a
  // duplicate keeps the memory alive: the service manager's fd store keeps
  // the slab across a daemon restart this way (fd_store/).
  int fd = -1;
  // True when the slab is memory an earlier run of the daemon made
  // (AdoptKvSlab): its KV is live and was not zeroed.
  bool adopted = false;
  // Drawn at random when the slab is made (NewKvSlabId; KvSlab.slab_id on
  // the wire): the same id means the same memory to a client.
  uint64_t slab_id = 0;
};

// A random, nonzero slab id (from the kernel's CSPRNG, so that two daemons'
// slabs never share one by chance).
uint64_t NewKvSlabId();

// One session's output ring memory. Destroying it releases it (the client's
// mapping, if any, stays valid).
class RingMemory {
 public:
  virtual ~RingMemory() = default;
  // The ring's first slot, in the executor's address space.
  virtual int64_t* slots() = 0;
  virtual int64_t capacity_slots() const = 0;
  // What a client needs to map the ring.
  virtual RingDescription Describe() const = 0;
  // Closes the daemon's descriptor of the ring's memory once the client
  // holds its own (Describe's fd is -1 afterwards); a backend whose ring
  // needs its descriptor keeps it.
  virtual void CloseDescriptor() {}
  // The daemon stops with the ring's session kept for a successor: its
  // destruction leaves the memory to the client's mapping, as a crash
  // leaves it (the slots handed out keep their values there), instead of
  // freeing it even where the client maps it. A backend whose rings are
  // never freed under the client does nothing.
  virtual void LeaveToClient() {}
};

// This class is thread-safe: CreateRing may be called from any handler
// thread; executor(), CopyToHost and CompleteLaunch from the batcher.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual BackendKind kind() const = 0;
  virtual PlanExecutor* executor() = 0;
  // Creates a ring of `capacity_slots` int64 slots for `session_id`, its
  // memory reserved. RESOURCE_EXHAUSTED when the memory cannot be had.
  virtual absl::StatusOr<std::unique_ptr<RingMemory>> CreateRing(
      uint64_t session_id, int64_t capacity_slots) = 0;
  // Copies `count` slots at `src` (executor address space) to host `dst`.
  virtual absl::Status CopyToHost(const int64_t* src, int64_t count,
                                  int64_t* dst) = 0;
  // Ends a launch. Sync: waits for it. Async: queues, behind it on the
  // executor's stream, the write of the next value of the pool's
  // completion counter, and returns at once. Returns the counter value a
  // client's stream waits for (>=) to run after the launch: the value just
  // queued (async) or the last one queued, which a finished stream has
  // written (sync). Called after every Allocate that launched, by the
  // thread driving the pool.
  virtual absl::StatusOr<uint64_t> CompleteLaunch(bool async) = 0;
  // The last value CompleteLaunch returned (0 before the first): what a
  // call whose launch wrote nothing carries.
  virtual uint64_t completion_value() const = 0;
  // The device the pool lives on.
  virtual DeviceDescription DescribeDevice() const = 0;

  // ---- The KV slab (the daemon owning the KV memory).

  // Bytes each buffer of a slab is aligned to: the allocation granularity
  // (the host page; the device's VMM granularity).
  virtual absl::StatusOr<int64_t> KvAlignment() = 0;
  // Memory a slab may take now: the host's available memory (CPU), the
  // device's free memory (CUDA).
  virtual absl::StatusOr<int64_t> KvAvailableBytes() = 0;
  // Makes the slab `geometry` places (zeroed), and with `scrub` hands the
  // executor its buffers to zero pages in. RESOURCE_EXHAUSTED when the
  // memory cannot be had; FAILED_PRECONDITION when a slab exists.
  // REQUIRES: called before the pool runs a batch.
  virtual absl::Status CreateKvSlab(const KvLayout& layout,
                                    const KvSlabGeometry& geometry,
                                    bool scrub) = 0;
  // As CreateKvSlab, with the memory `fd` refers to (a slab an earlier run
  // of the daemon made, passed back by the service manager) instead of new
  // memory: nothing is zeroed, since its pages hold live KV. DATA_LOSS when
  // the memory is not a slab of `geometry`'s size (too small, or not the
  // backend's kind of memory); FAILED_PRECONDITION when a slab exists.
  // The slab keeps `slab_id`, the id it was made with.
  virtual absl::Status AdoptKvSlab(const KvLayout& layout,
                                   const KvSlabGeometry& geometry, bool scrub,
                                   UniqueFd fd, uint64_t slab_id) = 0;
  // The slab, or null when the daemon owns no KV memory.
  virtual const KvSlab* kv_slab() const = 0;
  // A line for the start-up log.
  virtual std::string Summary() const = 0;
};

// The CPU backend.
std::unique_ptr<Backend> MakeCpuBackend();

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_BACKEND_H_
