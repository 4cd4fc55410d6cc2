// Backend: what the daemon needs from the device side, beyond the pool's
// executor: memory for each session's output ring that the client can map,
// copies out of it, and launch completion.
//
// Two implementations: the CPU backend (CpuExecutor, rings and the KV slab
// in anonymous shared memory handed to the client as file descriptors over
// the memory socket, memory/memory_socket.h) here, and the CUDA backend
// (CudaExecutor, rings in device memory exported through CUDA IPC handles,
// which travel in RegisterResponse; the KV slab a CUDA VMM allocation
// exported as a file descriptor) in cuda_backend.h.

#ifndef PAGEALLOC_SERVER_BACKEND_H_
#define PAGEALLOC_SERVER_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/executor.h"
#include "memory/kv_layout.h"

namespace pagealloc {

enum class BackendKind { kCpu, kCuda };

// What a client needs to map a session's output ring (the transport turns
// it into its wire form, e.g. v1::OutputRing).
struct RingDescription {
  int64_t capacity_slots = 0;
  // CPU: the ring's memory (a memfd the client maps read-only), handed over
  // the memory socket; owned by the RingMemory (valid while it lives).
  // -1 on the CUDA backend.
  int fd = -1;
  std::string cuda_ipc_handle;        // CUDA: a cudaIpcMemHandle_t
  std::string cuda_ipc_event_handle;  // CUDA: a cudaIpcEventHandle_t
};

// The device a pool lives on.
struct DeviceDescription {
  BackendKind kind = BackendKind::kCpu;
  int gpu = -1;             // CUDA device ordinal; -1 on the CPU backend
  std::string device_uuid;  // "GPU-..." on the CUDA backend
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
  // duplicate keeps the memory alive (a later step may keep the slab
  // across a daemon restart this way).
  int fd = -1;
};

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
  // Ends a launch: waits for it (sync) or records the completion event that
  // clients wait on (async). Called after every Allocate that launched.
  virtual absl::Status CompleteLaunch(bool async) = 0;
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
  // The slab, or null when the daemon owns no KV memory.
  virtual const KvSlab* kv_slab() const = 0;
  // A line for the start-up log.
  virtual std::string Summary() const = 0;
};

// The CPU backend.
std::unique_ptr<Backend> MakeCpuBackend();

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_BACKEND_H_
