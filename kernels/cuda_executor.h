// CudaExecutor: runs batch plans on one GPU. It keeps a device-resident
// mirror of the pool's free ring, updated on its one stream in the order the
// pool writes it, so a kernel never waits for the host's list; Execute packs
// a small plan into the kernel's parameters, or a larger one into pinned
// staging uploaded with one async copy, and expands it with one kernel launch
// (kernels/alloc_kernels.h) into each request's own destination (device
// pointers).
//
// Everything is issued on one CUDA stream, in call order, and is
// asynchronous: slots are in their destinations once Synchronize() returns
// (or a later event on the stream completes). Pinned staging and device
// buffers are allocated once by Create, sized by the options; nothing is
// allocated afterwards. A staging buffer is reused only after the copy out
// of it has completed (each has an event).
//
// This class is thread-compatible: the pool serializes calls (any thread
// may make them; each call selects the executor's device first).

#ifndef PAGEALLOC_KERNELS_CUDA_EXECUTOR_H_
#define PAGEALLOC_KERNELS_CUDA_EXECUTOR_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "allocator/executor.h"
#include "kernels/expand_plan.h"

namespace pagealloc {

struct CudaExecutorOptions {
  // The GPU to run on.
  int device_ordinal = 0;
  // Largest batch Execute accepts, in requests and in slots (the sizes of
  // the plan staging and its device copy).
  int64_t max_requests_per_batch = 8192;
  int64_t max_slots_per_batch = int64_t{1} << 22;
  // Staging for free-ring writes, in pages per buffer; larger writes are
  // split into chunks of this size.
  int64_t max_pages_per_ring_write = int64_t{1} << 16;
  // Staging buffers of each kind (plans, ring writes), >= 2: the host packs
  // the next one while the copy out of the last is still in flight.
  int num_staging_buffers = 2;
  // Passes small plans (up to 122 decodes, ~69 small requests, ~288 large
  // ones: kernels/expand_plan.h, InlineWordsLimit) in the kernel's
  // parameters instead of uploading them: no copy and one or two dependent
  // reads less per launch. Off: every plan is uploaded (tests use
  // this to cover both paths).
  bool inline_plans = true;
  // Serves a plan of ring copies only (page_size 1, BatchPlan.ring_copies)
  // with cudaMemcpyAsync, device to device from the mirror, when it takes at
  // most this many copies (a copy that wraps around the ring's end takes
  // two); more, or a plan with requests too, runs the copies as requests of
  // the expand kernel (one launch). 0: always the kernel.
  int max_ring_memcpys = 2;
  // Synchronizes the stream after every copy and launch and reports its
  // errors there (slow; for debugging). Also turned on by the environment
  // variable PAGEALLOC_CUDA_DEBUG_SYNC=1.
  bool debug_sync = false;
};

class CudaExecutor final : public PlanExecutor {
 public:
  // Selects the device, checks it can run our sm_90 kernels, and allocates
  // the stream, events, pinned staging and device buffers. Returns
  // INVALID_ARGUMENT for bad options, FAILED_PRECONDITION "no CUDA GPU: ..."
  // when the machine has no usable GPU or driver, FAILED_PRECONDITION for a
  // GPU older than sm_90, and INTERNAL for other CUDA failures.
  static absl::StatusOr<std::unique_ptr<CudaExecutor>> Create(
      const CudaExecutorOptions& options);

  // Waits for outstanding work and frees everything Create allocated.
  ~CudaExecutor() override;

  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  // Allocates the device mirror (once; a second call with another capacity
  // is FAILED_PRECONDITION). Returns INVALID_ARGUMENT for capacity < 1.
  absl::Status InitFreeRing(int64_t capacity) override;

  // Queues the copy of `pages` to mirror positions [position, ...), through
  // pinned staging, in chunks of max_pages_per_ring_write. Returns
  // OUT_OF_RANGE outside the ring, INTERNAL on CUDA failure.
  absl::Status WriteFreeRing(int64_t position,
                             absl::Span<const int64_t> pages) override;

  // Packs the plan (into the launch's parameters when it fits and
  // inline_plans is on, else into staging, uploaded) and launches its
  // kernel, or queues its ring copies as device-to-device copies
  // (max_ring_memcpys); returns without waiting. Does nothing for a plan
  // with no slots. Returns INVALID_ARGUMENT for a plan larger than the
  // options allow or inconsistent with the mirror, INTERNAL on CUDA
  // failure.
  absl::Status Execute(const BatchPlan& plan) override;

  // Waits for everything queued on the stream. Returns INTERNAL with the
  // first asynchronous error.
  absl::Status Synchronize() override;

  // Copies the whole mirror back (waiting for the stream).
  absl::StatusOr<std::vector<int64_t>> ReadFreeRing() override;

  const char* name() const override { return "cuda"; }

  const CudaExecutorOptions& options() const { return options_; }

  // The stream everything runs on, for callers that record their own
  // events after Execute.
  cudaStream_t stream() const { return stream_; }

  // Sets the KV memory that plans' scrub_pages are zeroed in (device
  // pointers: the daemon's mapping of the slab) and allocates what the
  // scrub needs (the buffer table, the page list's staging and device
  // copy, up to max_slots_per_batch pages a launch). The scrub is its own
  // kernel, queued on the stream right before the plan's expand kernel, so
  // the pages are zero before any client can see their slots. Until it is
  // set, a plan that lists pages to scrub is refused (INTERNAL).
  // INVALID_ARGUMENT for a target without buffers, FAILED_PRECONDITION
  // when one is set already, INTERNAL on CUDA failure.
  absl::Status SetKvScrubTarget(const KvScrubTarget& target);

 private:
  // A pinned host buffer and the event recorded after the last copy out of
  // it.
  struct Staging {
    void* host = nullptr;
    cudaEvent_t copied = nullptr;
  };

  explicit CudaExecutor(const CudaExecutorOptions& options);
  absl::Status Init();
  // Returns the next staging buffer of `ring` once its last copy has
  // completed.
  absl::StatusOr<Staging*> AcquireStaging(std::vector<Staging>& ring,
                                          size_t& next);
  // Records that a copy out of `staging` was just queued.
  absl::Status ReleaseStaging(Staging& staging);
  absl::Status SelectDevice() const;
  absl::Status MaybeDebugSync(const char* what);
  // Packs `plan`'s requests and launches the expand kernel (the tail of
  // Execute).
  absl::Status LaunchExpand(const BatchPlan& plan);
  // Queues plan.ring_copies as device-to-device copies from the mirror.
  absl::Status CopyRing(const BatchPlan& plan);
  // Queues the zeroing of plan.scrub_pages (nothing when empty). INTERNAL
  // when the plan lists pages and no matching target is set.
  absl::Status Scrub(const BatchPlan& plan);

  const CudaExecutorOptions options_;
  cudaStream_t stream_ = nullptr;
  std::vector<Staging> plan_staging_;
  size_t next_plan_staging_ = 0;
  std::vector<Staging> ring_staging_;
  size_t next_ring_staging_ = 0;
  int64_t plan_staging_words_ = 0;
  // The device copy of the current plan. One is enough: the upload of a
  // plan is queued on the stream after the kernel that read the last one.
  void* device_plan_ = nullptr;
  // Host-side packing space for inline plans (8 KB); the launch copies it,
  // so one is enough.
  std::unique_ptr<MaxInlineExpandParams> inline_plan_;
  // A plan's ring copies rewritten as requests (RingCopiesAsRequests),
  // reserved for max_requests_per_batch requests by Create.
  BatchPlan copies_as_requests_;
  int64_t* device_ring_ = nullptr;
  int64_t ring_capacity_ = 0;
  // Scrubbing (SetKvScrubTarget): the buffer table on the device, the
  // page list's pinned staging and device copy, the event recorded after
  // the last upload out of the staging.
  void* scrub_buffers_ = nullptr;
  int32_t scrub_num_buffers_ = 0;
  int64_t scrub_page_size_ = 0;
  int64_t* scrub_pages_host_ = nullptr;
  int64_t* scrub_pages_device_ = nullptr;
  cudaEvent_t scrub_copied_ = nullptr;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_KERNELS_CUDA_EXECUTOR_H_
