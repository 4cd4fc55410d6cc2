#include "bench/slot_reader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#ifdef PAGEALLOC_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "bench/consume_kernel.h"
#include "common/cuda_status.h"
#endif

namespace pagealloc::bench {
namespace {

// The ring region holding `a`'s accepted slots: [*lo, *hi), both null when
// there are none in the ring (refused, empty or inline requests).
void RingRegion(const Allocation& a, const int64_t* ring, int64_t ring_slots,
                const int64_t** lo, const int64_t** hi) {
  *lo = nullptr;
  *hi = nullptr;
  for (size_t i = 0; i < a.size(); ++i) {
    const RequestSlots& r = a[i];
    if (!r.status.ok() || r.count == 0) continue;
    if (r.slots < ring || r.slots + r.count > ring + ring_slots) continue;
    if (*lo == nullptr || r.slots < *lo) *lo = r.slots;
    if (*hi == nullptr || r.slots + r.count > *hi) *hi = r.slots + r.count;
  }
}

}  // namespace

SlotReader::SlotReader(Client* client, bool gpu_ordered, bool async_completion,
                       absl::Duration spin)
    : client_(client),
      gpu_ordered_(gpu_ordered),
      async_completion_(async_completion),
      spin_(spin),
      ring_(client->ring_slots()),
      ring_slots_(client->ring_capacity_slots()) {}

absl::StatusOr<std::unique_ptr<SlotReader>> SlotReader::Create(
    Client* client, bool gpu_ordered, bool async_completion, int lanes,
    absl::Duration spin) {
  if (lanes < 1 || lanes > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("SlotReader: lanes (", lanes, ") must be 1..8"));
  }
  std::unique_ptr<SlotReader> reader(
      new SlotReader(client, gpu_ordered, async_completion, spin));
  if (client->ring_on_device()) {
    RETURN_IF_ERROR(reader->InitDevice(lanes));
  } else {
    reader->host_storage_.resize(reader->ring_slots_);
    reader->host_ = reader->host_storage_.data();
  }
  return reader;
}

#ifdef PAGEALLOC_HAVE_CUDA

absl::Status SlotReader::InitDevice(int lanes) {
  device_ = true;
  // Our stream, memory and events belong on the ring's GPU. Where CUDA
  // cannot tell it from the pointer, the client's import left that GPU
  // current.
  cudaPointerAttributes attributes;
  if (cudaPointerGetAttributes(&attributes, ring_) == cudaSuccess &&
      attributes.type == cudaMemoryTypeDevice && attributes.device >= 0) {
    RETURN_IF_ERROR(
        CudaStatus(cudaSetDevice(attributes.device), "cudaSetDevice"));
  } else {
    cudaGetLastError();  // clears the lookup's error
  }
  const size_t bytes = ring_slots_ * sizeof(int64_t);
  void* host = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&host, bytes), "cudaMallocHost"));
  host_ = static_cast<int64_t*>(host);
  if (!gpu_ordered_) return absl::OkStatus();
  cudaStream_t stream = nullptr;
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                 "cudaStreamCreateWithFlags"));
  stream_ = stream;
  void* consumed = nullptr;
  RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(&consumed, bytes), "cudaMalloc of the slots read"));
  consumed_ = static_cast<int64_t*>(consumed);
  for (int lane = 0; lane < lanes; ++lane) {
    cudaEvent_t event = nullptr;
    // Blocking sync: a Wait that outlasts its spin sleeps rather than
    // taking a core from the daemon.
    RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(
                       &event, cudaEventDisableTiming | cudaEventBlockingSync),
                   "cudaEventCreateWithFlags"));
    lane_events_.push_back(event);
  }
  return absl::OkStatus();
}

SlotReader::~SlotReader() {
  if (!device_) return;
  // Nothing may still write into what we free.
  if (stream_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  }
  for (void* event : lane_events_) {
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  if (consumed_ != nullptr) cudaFree(consumed_);
  if (stream_ != nullptr) {
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  if (host_ != nullptr) cudaFreeHost(host_);
}

#else  // !PAGEALLOC_HAVE_CUDA

absl::Status SlotReader::InitDevice(int) {
  return absl::FailedPreconditionError(
      "the ring is on a GPU and this benchmark was built without CUDA");
}

SlotReader::~SlotReader() = default;

#endif  // PAGEALLOC_HAVE_CUDA

absl::Status SlotReader::Order(const Allocation& a) {
  if (!gpu_ordered_ || stream_ == nullptr) return absl::OkStatus();
  return client_->OrderAfter(a, stream_);
}

absl::Status SlotReader::Read(const Allocation& a, int lane) {
  const int64_t* lo = nullptr;
  const int64_t* hi = nullptr;
  RingRegion(a, ring_, ring_slots_, &lo, &hi);
  if (lo == nullptr) return absl::OkStatus();
  const int64_t offset = lo - ring_;
  const int64_t count = hi - lo;
  if (!device_) {
    // Host memory: what a kernel would read is what is there now (sync and
    // async answers alike are complete on the CPU backend).
    std::copy(lo, hi, host_ + offset);
    return absl::OkStatus();
  }
#ifdef PAGEALLOC_HAVE_CUDA
  if (!gpu_ordered_) {
    if (async_completion_) {
      // The answer came right after the launch: order our copy (on the
      // default stream) after the daemon's completion.
      RETURN_IF_ERROR(client_->OrderAfterCompletion(nullptr));
    }
    return client_->CopyToHost(lo, count, host_ + offset);
  }
  if (lane < 0 || lane >= static_cast<int>(lane_events_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("lane ", lane));
  }
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  RETURN_IF_ERROR(
      CudaStatus(LaunchConsumeSlots(lo, consumed_ + offset, count, stream),
                 "the slot-reading kernel"));
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(host_ + offset, consumed_ + offset,
                      count * sizeof(int64_t), cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync of the slots read"));
  return CudaStatus(
      cudaEventRecord(static_cast<cudaEvent_t>(lane_events_[lane]), stream),
      "cudaEventRecord");
#else
  (void)lane;
  return absl::FailedPreconditionError("built without CUDA");
#endif
}

absl::Status SlotReader::Wait(int lane) {
#ifdef PAGEALLOC_HAVE_CUDA
  if (!device_ || !gpu_ordered_) return absl::OkStatus();
  if (lane < 0 || lane >= static_cast<int>(lane_events_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("lane ", lane));
  }
  cudaEvent_t event = static_cast<cudaEvent_t>(lane_events_[lane]);
  // Usually done already: the other lanes' calls ran meanwhile.
  const absl::Time spin_until = absl::Now() + spin_;
  do {
    const cudaError_t state = cudaEventQuery(event);
    if (state == cudaSuccess) return absl::OkStatus();
    if (state != cudaErrorNotReady) {
      return CudaStatus(state, "cudaEventQuery of the slots read");
    }
  } while (absl::Now() < spin_until);
  return CudaStatus(cudaEventSynchronize(event),
                    "cudaEventSynchronize of the slots read");
#else
  (void)lane;
  return absl::OkStatus();
#endif
}

absl::Span<const int64_t> SlotReader::Slots(const RequestSlots& r) const {
  if (r.count == 0) return {};
  if (r.slots < ring_ || r.slots + r.count > ring_ + ring_slots_) {
    // Inline results are host memory already.
    return absl::MakeConstSpan(r.slots, r.count);
  }
  return absl::MakeConstSpan(host_ + (r.slots - ring_), r.count);
}

}  // namespace pagealloc::bench
