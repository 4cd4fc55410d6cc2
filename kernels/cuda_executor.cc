#include "kernels/cuda_executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/alloc_kernels.h"
#include "kernels/expand_plan.h"
#include "kernels/plan_packing.h"
#include "kernels/scrub_kernels.h"

namespace pagealloc {
namespace {

bool DebugSyncFromEnvironment() {
  const char* value = std::getenv("PAGEALLOC_CUDA_DEBUG_SYNC");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

absl::Status ValidateOptions(const CudaExecutorOptions& options) {
  if (options.device_ordinal < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "device_ordinal (%d) must be >= 0", options.device_ordinal));
  }
  if (options.max_requests_per_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_requests_per_batch (%d) must be >= 1",
                        options.max_requests_per_batch));
  }
  if (options.max_slots_per_batch < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_slots_per_batch (%d) must be >= 1", options.max_slots_per_batch));
  }
  if (options.max_pages_per_ring_write < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_pages_per_ring_write (%d) must be >= 1",
                        options.max_pages_per_ring_write));
  }
  if (options.max_ring_memcpys < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_ring_memcpys (%d) must be >= 0", options.max_ring_memcpys));
  }
  if (options.num_staging_buffers < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "num_staging_buffers (%d) must be >= 2", options.num_staging_buffers));
  }
  return absl::OkStatus();
}

}  // namespace

CudaExecutor::CudaExecutor(const CudaExecutorOptions& options)
    : options_(options) {}

absl::StatusOr<std::unique_ptr<CudaExecutor>> CudaExecutor::Create(
    const CudaExecutorOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  int count = 0;
  const absl::Status counted =
      CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (!counted.ok()) {
    // Whatever stops the runtime from counting devices (no driver, a
    // driver too old, no device node) means the same here: no GPU to use.
    if (absl::IsFailedPrecondition(counted)) return counted;
    return absl::FailedPreconditionError(
        absl::StrFormat("no CUDA GPU: %s", counted.message()));
  }
  if (count == 0) {
    return absl::FailedPreconditionError(
        "no CUDA GPU: cudaGetDeviceCount found no device");
  }
  if (options.device_ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrFormat("device_ordinal (%d) >= the %d CUDA device(s)",
                        options.device_ordinal, count));
  }
  int major = 0;
  int minor = 0;
  RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                             options.device_ordinal),
      "cudaDeviceGetAttribute"));
  RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                             options.device_ordinal),
      "cudaDeviceGetAttribute"));
  if (major < 9) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "CUDA device %d is sm_%d%d; pagealloc's kernels are built for sm_90 "
        "and newer",
        options.device_ordinal, major, minor));
  }
  CudaExecutorOptions effective = options;
  effective.debug_sync = options.debug_sync || DebugSyncFromEnvironment();
  std::unique_ptr<CudaExecutor> executor(new CudaExecutor(effective));
  RETURN_IF_ERROR(executor->Init());
  return executor;
}

absl::Status CudaExecutor::Init() {
  RETURN_IF_ERROR(SelectDevice());
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                 "cudaStreamCreateWithFlags"));
  const int64_t plan_bytes = MaxPackedPlanBytes(options_.max_requests_per_batch,
                                                options_.max_slots_per_batch);
  plan_staging_words_ = plan_bytes / static_cast<int64_t>(sizeof(int64_t));
  const int64_t ring_bytes =
      options_.max_pages_per_ring_write * static_cast<int64_t>(sizeof(int64_t));
  // Members are filled as they are allocated, so the destructor frees
  // exactly what was allocated when a step fails.
  plan_staging_.resize(options_.num_staging_buffers);
  ring_staging_.resize(options_.num_staging_buffers);
  for (std::vector<Staging>* kind : {&plan_staging_, &ring_staging_}) {
    const int64_t bytes = kind == &plan_staging_ ? plan_bytes : ring_bytes;
    for (Staging& staging : *kind) {
      RETURN_IF_ERROR(
          CudaStatus(cudaHostAlloc(&staging.host, bytes, cudaHostAllocDefault),
                     "cudaHostAlloc (staging)"));
      RETURN_IF_ERROR(CudaStatus(
          cudaEventCreateWithFlags(&staging.copied, cudaEventDisableTiming),
          "cudaEventCreateWithFlags"));
    }
  }
  RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(&device_plan_, plan_bytes), "cudaMalloc (plan)"));
  inline_plan_ = std::make_unique<MaxInlineExpandParams>();
  copies_as_requests_.requests.reserve(options_.max_requests_per_batch);
  return absl::OkStatus();
}

CudaExecutor::~CudaExecutor() {
  // Errors here have nowhere to go; a failed call leaves nothing to undo.
  if (cudaSetDevice(options_.device_ordinal) != cudaSuccess) return;
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (std::vector<Staging>* kind : {&plan_staging_, &ring_staging_}) {
    for (Staging& staging : *kind) {
      if (staging.copied != nullptr) cudaEventDestroy(staging.copied);
      if (staging.host != nullptr) cudaFreeHost(staging.host);
    }
  }
  if (device_plan_ != nullptr) cudaFree(device_plan_);
  if (device_ring_ != nullptr) cudaFree(device_ring_);
  if (scrub_buffers_ != nullptr) cudaFree(scrub_buffers_);
  if (scrub_pages_device_ != nullptr) cudaFree(scrub_pages_device_);
  if (scrub_pages_host_ != nullptr) cudaFreeHost(scrub_pages_host_);
  if (scrub_copied_ != nullptr) cudaEventDestroy(scrub_copied_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaExecutor::SelectDevice() const {
  return CudaStatus(cudaSetDevice(options_.device_ordinal), "cudaSetDevice");
}

absl::Status CudaExecutor::MaybeDebugSync(const char* what) {
  if (!options_.debug_sync) return absl::OkStatus();
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), what));
  return CudaStatus(cudaGetLastError(), what);
}

absl::StatusOr<CudaExecutor::Staging*> CudaExecutor::AcquireStaging(
    std::vector<Staging>& ring, size_t& next) {
  Staging* staging = &ring[next];
  next = (next + 1) % ring.size();
  // Returns at once unless the copy out of this buffer (queued
  // num_staging_buffers uses ago) is still in flight.
  RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(staging->copied),
                             "cudaEventSynchronize (staging)"));
  return staging;
}

absl::Status CudaExecutor::ReleaseStaging(Staging& staging) {
  return CudaStatus(cudaEventRecord(staging.copied, stream_),
                    "cudaEventRecord (staging)");
}

absl::Status CudaExecutor::InitFreeRing(int64_t capacity) {
  if (capacity < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("free ring capacity (%d) must be >= 1", capacity));
  }
  if (device_ring_ != nullptr) {
    if (capacity == ring_capacity_) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrFormat(
        "free ring already has capacity %d; cannot resize it to %d",
        ring_capacity_, capacity));
  }
  RETURN_IF_ERROR(SelectDevice());
  RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(reinterpret_cast<void**>(&device_ring_),
                            capacity * static_cast<int64_t>(sizeof(int64_t))),
                 "cudaMalloc (free ring)"));
  ring_capacity_ = capacity;
  return absl::OkStatus();
}

absl::Status CudaExecutor::WriteFreeRing(int64_t position,
                                         absl::Span<const int64_t> pages) {
  const int64_t size = pages.size();
  if (position < 0 || position + size > ring_capacity_) {
    return absl::OutOfRangeError(
        absl::StrFormat("free ring write [%d, %d) outside capacity %d",
                        position, position + size, ring_capacity_));
  }
  if (pages.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(SelectDevice());
  while (!pages.empty()) {
    const int64_t n =
        std::min<int64_t>(pages.size(), options_.max_pages_per_ring_write);
    ASSIGN_OR_RETURN(Staging * staging,
                     AcquireStaging(ring_staging_, next_ring_staging_));
    std::memcpy(staging->host, pages.data(), n * sizeof(int64_t));
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(device_ring_ + position, staging->host,
                        n * sizeof(int64_t), cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync (free ring)"));
    RETURN_IF_ERROR(ReleaseStaging(*staging));
    pages.remove_prefix(n);
    position += n;
  }
  return MaybeDebugSync("free ring write (debug sync)");
}

absl::Status CudaExecutor::Execute(const BatchPlan& plan) {
  if (device_ring_ == nullptr) {
    return absl::FailedPreconditionError(
        "Execute before InitFreeRing: no free ring mirror");
  }
  // A ring copy runs as one request when it takes the expand kernel.
  if (static_cast<int64_t>(plan.requests.size() + plan.ring_copies.size()) >
      options_.max_requests_per_batch) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "plan has %d requests%s; max_requests_per_batch is %d",
        plan.requests.size(),
        plan.ring_copies.empty()
            ? ""
            : absl::StrFormat(" and %d ring copies", plan.ring_copies.size()),
        options_.max_requests_per_batch));
  }
  if (plan.num_slots > options_.max_slots_per_batch) {
    return absl::InvalidArgumentError(
        absl::StrFormat("plan has %d slots; max_slots_per_batch is %d",
                        plan.num_slots, options_.max_slots_per_batch));
  }
  if (plan.num_slots == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateRingCopies(plan, ring_capacity_));
  RETURN_IF_ERROR(SelectDevice());
  // Pages changing owner are zeroed first, on the same stream.
  RETURN_IF_ERROR(Scrub(plan));
  if (plan.ring_copies.empty()) return LaunchExpand(plan);
  if (plan.requests.empty()) {
    int64_t memcpys = 0;
    for (const RingCopy& copy : plan.ring_copies) {
      const int64_t position =
          (plan.free_ring_head + copy.ring_offset) % ring_capacity_;
      memcpys += position + copy.count > ring_capacity_ ? 2 : 1;
    }
    if (memcpys <= options_.max_ring_memcpys) return CopyRing(plan);
  }
  // Many copies (a batch of many calls) or a mixed plan: one launch of
  // the expand kernel, which runs a copy as a request of page_size 1.
  RingCopiesAsRequests(plan, &copies_as_requests_);
  return LaunchExpand(copies_as_requests_);
}

absl::Status CudaExecutor::CopyRing(const BatchPlan& plan) {
  constexpr int64_t kWord = sizeof(int64_t);
  for (const RingCopy& copy : plan.ring_copies) {
    const int64_t position =
        (plan.free_ring_head + copy.ring_offset) % ring_capacity_;
    const int64_t first = std::min(copy.count, ring_capacity_ - position);
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(copy.destination, device_ring_ + position,
                        first * kWord, cudaMemcpyDeviceToDevice, stream_),
        "cudaMemcpyAsync (ring copy)"));
    if (first < copy.count) {
      RETURN_IF_ERROR(
          CudaStatus(cudaMemcpyAsync(copy.destination + first, device_ring_,
                                     (copy.count - first) * kWord,
                                     cudaMemcpyDeviceToDevice, stream_),
                     "cudaMemcpyAsync (ring copy, wrapped)"));
    }
  }
  return MaybeDebugSync("ring copy (debug sync)");
}

absl::Status CudaExecutor::LaunchExpand(const BatchPlan& plan) {
  if (options_.inline_plans) {
    // Small plans travel in the launch itself: no staging buffer to wait
    // for, no copy, and the kernel reads them through the constant cache.
    ASSIGN_OR_RETURN(
        const bool packed_inline,
        PackInlinePlan(plan, ring_capacity_, device_ring_, inline_plan_.get()));
    if (packed_inline) {
      RETURN_IF_ERROR(CudaStatus(LaunchExpandInlinePlan(*inline_plan_, stream_),
                                 "LaunchExpandInlinePlan"));
      return MaybeDebugSync("expand kernel (debug sync)");
    }
  }
  ASSIGN_OR_RETURN(Staging * staging,
                   AcquireStaging(plan_staging_, next_plan_staging_));
  ASSIGN_OR_RETURN(const PackedPlan packed,
                   PackPlan(plan, ring_capacity_,
                            absl::MakeSpan(static_cast<int64_t*>(staging->host),
                                           plan_staging_words_)));
  if (packed.num_requests == 0) return absl::OkStatus();
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(device_plan_, staging->host, packed.bytes,
                                 cudaMemcpyHostToDevice, stream_),
                 "cudaMemcpyAsync (plan)"));
  RETURN_IF_ERROR(ReleaseStaging(*staging));
  const ExpandParams params = MakeExpandParams(
      packed, device_plan_, device_ring_, ring_capacity_, plan.page_size);
  RETURN_IF_ERROR(
      CudaStatus(LaunchExpandPlan(params, stream_), "LaunchExpandPlan"));
  return MaybeDebugSync("expand kernel (debug sync)");
}

absl::Status CudaExecutor::SetKvScrubTarget(const KvScrubTarget& target) {
  if (scrub_buffers_ != nullptr) {
    return absl::FailedPreconditionError("the KV scrub target is set already");
  }
  if (target.buffers.empty() || target.page_size < 1 ||
      target.buffers.size() > (size_t{1} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a KV scrub target of %d buffers, pages of %d slots",
                        target.buffers.size(), target.page_size));
  }
  RETURN_IF_ERROR(SelectDevice());
  std::vector<ScrubBuffer> table;
  for (const KvScrubTarget::Buffer& buffer : target.buffers) {
    table.push_back({buffer.base, buffer.stride_bytes * target.page_size});
  }
  const size_t table_bytes = table.size() * sizeof(ScrubBuffer);
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&scrub_buffers_, table_bytes),
                             "cudaMalloc (scrub buffers)"));
  RETURN_IF_ERROR(CudaStatus(cudaMemcpy(scrub_buffers_, table.data(),
                                        table_bytes, cudaMemcpyHostToDevice),
                             "cudaMemcpy (scrub buffers)"));
  // A launch takes at most one new page per slot it writes.
  const size_t pages_bytes = options_.max_slots_per_batch * sizeof(int64_t);
  RETURN_IF_ERROR(
      CudaStatus(cudaHostAlloc(reinterpret_cast<void**>(&scrub_pages_host_),
                               pages_bytes, cudaHostAllocDefault),
                 "cudaHostAlloc (scrub pages)"));
  RETURN_IF_ERROR(CudaStatus(
      cudaMalloc(reinterpret_cast<void**>(&scrub_pages_device_), pages_bytes),
      "cudaMalloc (scrub pages)"));
  RETURN_IF_ERROR(CudaStatus(
      cudaEventCreateWithFlags(&scrub_copied_, cudaEventDisableTiming),
      "cudaEventCreateWithFlags (scrub)"));
  scrub_num_buffers_ = static_cast<int32_t>(table.size());
  scrub_page_size_ = target.page_size;
  return absl::OkStatus();
}

absl::Status CudaExecutor::Scrub(const BatchPlan& plan) {
  if (plan.scrub_pages.empty()) return absl::OkStatus();
  const int64_t n = plan.scrub_pages.size();
  if (scrub_buffers_ == nullptr || scrub_page_size_ != plan.page_size ||
      n > options_.max_slots_per_batch) {
    return absl::InternalError(absl::StrFormat(
        "the plan scrubs %d pages of %d slots; the executor's KV scrub "
        "target has pages of %d slots (and takes %d pages a launch)",
        n, plan.page_size, scrub_page_size_, options_.max_slots_per_batch));
  }
  // The staging is reused once the last upload out of it has completed.
  RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(scrub_copied_),
                             "cudaEventSynchronize (scrub)"));
  std::memcpy(scrub_pages_host_, plan.scrub_pages.data(), n * sizeof(int64_t));
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(scrub_pages_device_, scrub_pages_host_,
                      n * sizeof(int64_t), cudaMemcpyHostToDevice, stream_),
      "cudaMemcpyAsync (scrub pages)"));
  RETURN_IF_ERROR(CudaStatus(cudaEventRecord(scrub_copied_, stream_),
                             "cudaEventRecord (scrub)"));
  ScrubParams params;
  params.buffers = static_cast<const ScrubBuffer*>(scrub_buffers_);
  params.num_buffers = scrub_num_buffers_;
  params.pages = scrub_pages_device_;
  params.num_pages = n;
  RETURN_IF_ERROR(
      CudaStatus(LaunchScrubPages(params, stream_), "LaunchScrubPages"));
  return MaybeDebugSync("scrub kernel (debug sync)");
}

absl::Status CudaExecutor::Synchronize() {
  RETURN_IF_ERROR(SelectDevice());
  return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

absl::StatusOr<std::vector<int64_t>> CudaExecutor::ReadFreeRing() {
  RETURN_IF_ERROR(SelectDevice());
  std::vector<int64_t> ring(ring_capacity_);
  if (ring_capacity_ == 0) return ring;
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(ring.data(), device_ring_,
                                             ring_capacity_ * sizeof(int64_t),
                                             cudaMemcpyDeviceToHost, stream_),
                             "cudaMemcpyAsync (read free ring)"));
  RETURN_IF_ERROR(Synchronize());
  return ring;
}

}  // namespace pagealloc
