#include "client/local_expansion.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "allocator/plan_expansion.h"
#include "common/status_macros.h"
#include "kernels/expand_plan.h"

#if defined(PAGEALLOC_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "common/cuda_status.h"
#include "kernels/alloc_kernels.h"
#include "kernels/plan_packing.h"
#endif

namespace pagealloc {
namespace {

// The first size of each staging buffer: a decode of 4096 requests with a
// page each (4096 page ids and a packed plan of 5 words a request) fits.
constexpr int64_t kInitialStagingBytes = int64_t{256} << 10;

}  // namespace

// One staging buffer: the batch's page ids then its packed plan, in pinned
// host memory, copied as one block into its device twin, which the kernel
// reads. `event` is recorded after the kernel: once it has completed, both
// halves may be written again.
struct LocalExpander::Staging {
  int64_t bytes = 0;
  int64_t* host = nullptr;
  int64_t* device = nullptr;
#if defined(PAGEALLOC_HAVE_CUDA)
  cudaEvent_t event = nullptr;
#endif
};

// An inline decode's kernel parameters, packed on the host and copied by
// the launch itself (so one is enough), and whether any launch used them.
struct LocalExpander::InlineDecode {
  MaxLocalDecodeParams params;
  bool launched = false;
};

absl::StatusOr<std::unique_ptr<LocalExpander>> LocalExpander::Create(
    const Client& client, PageReserve* reserve,
    const LocalExpanderOptions& options) {
  if (reserve == nullptr) {
    return absl::InvalidArgumentError("LocalExpander needs a page reserve");
  }
  const PoolGeometry geometry{client.pool().page_size(),
                              client.pool().num_pages()};
  if (reserve->page_size() != geometry.page_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the reserve's page size (%d) is not the client's pool's (%d): a "
        "reserve of another session",
        reserve->page_size(), geometry.page_size));
  }
  if (options.staging_buffers < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "staging_buffers (%d) must be >= 2", options.staging_buffers));
  }
  if (options.max_staging_buffers < options.staging_buffers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_staging_buffers (%d) must be >= staging_buffers (%d)",
        options.max_staging_buffers, options.staging_buffers));
  }
  if (options.inline_decode_requests < 0 ||
      options.inline_decode_requests > kMaxLocalDecodeRequests) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "inline_decode_requests (%d) must be in [0, %d]",
        options.inline_decode_requests, kMaxLocalDecodeRequests));
  }
  std::unique_ptr<LocalExpander> expander(
      new LocalExpander(reserve, geometry, options));
  if (options.memory == ExpansionMemory::kDevice) {
    RETURN_IF_ERROR(expander->InitDevice());
  }
  return expander;
}

LocalExpander::LocalExpander(PageReserve* reserve, const PoolGeometry& geometry,
                             const LocalExpanderOptions& options)
    : reserve_(reserve), geometry_(geometry), options_(options) {}

absl::StatusOr<int64_t> LocalExpander::AllocExtend(
    absl::Span<const int64_t> prefix_lens, absl::Span<const int64_t> seq_lens,
    const int64_t* last_loc, int64_t* out, void* stream) {
  if (prefix_lens.size() != seq_lens.size()) {
    ++stats_.refused;
    return absl::InvalidArgumentError(absl::StrFormat(
        "prefix_lens has %d entries and seq_lens %d: one each per request",
        prefix_lens.size(), seq_lens.size()));
  }
  return Expand(RequestKind::kExtend, prefix_lens, seq_lens, last_loc, out,
                stream);
}

absl::StatusOr<int64_t> LocalExpander::AllocDecode(
    absl::Span<const int64_t> seq_lens, const int64_t* last_loc, int64_t* out,
    void* stream) {
  return Expand(RequestKind::kDecode, {}, seq_lens, last_loc, out, stream);
}

absl::StatusOr<int64_t> LocalExpander::Expand(
    RequestKind kind, absl::Span<const int64_t> prefix_lens,
    absl::Span<const int64_t> seq_lens, const int64_t* last_loc, int64_t* out,
    void* stream) {
  const size_t n = seq_lens.size();
  const bool host = options_.memory == ExpansionMemory::kHost;
  const int64_t ps = geometry_.page_size;
  last_num_pages_ = 0;
  if (n > 0 && last_loc == nullptr) {
    ++stats_.refused;
    return absl::InvalidArgumentError(
        absl::StrFormat("last_loc is null for a batch of %d requests", n));
  }
  shapes_.resize(n);
  new_pages_.resize(n);
  prefix_pages_.clear();
  prefix_requests_.clear();
  int64_t total_pages = 0;
  int64_t total_slots = 0;
  for (size_t i = 0; i < n; ++i) {
    AllocRequest request;
    request.kind = kind;
    request.index = static_cast<int64_t>(i);
    request.seq_len = seq_lens[i];
    request.prefix_len = kind == RequestKind::kExtend ? prefix_lens[i] : 0;
    if (host) {
      request.last_loc = last_loc[i];
    } else {
      // The device's last_loc is the kernel's to check (LastLocPlan); the
      // lengths are checked here by the daemon's own checks, with a stand-in
      // that passes them exactly when the lengths are right: a slot of page
      // 1 at the offset where a prefix of this length ends.
      const int64_t prefix = kind == RequestKind::kDecode ? request.seq_len - 1
                                                          : request.prefix_len;
      request.last_loc = prefix <= 0 ? -1 : ps + ModNonNegative(prefix - 1, ps);
    }
    if (!IsValidShape(request, geometry_)) {
      ++stats_.refused;
      return ValidateShape(request, geometry_);
    }
    if (request.seq_len > geometry_.usable_slots()) {
      ++stats_.refused;
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s request %d: seq_lens[%d] (%d) exceeds the pool's %d usable "
          "slots (%d pages of %d): it can never fit",
          RequestKindName(kind), i, i, request.seq_len,
          geometry_.usable_slots(), geometry_.num_pages, ps));
    }
    const ExtendShape shape = ToExtendShape(request);
    shapes_[i] = shape;
    if (host && ModNonNegative(shape.prefix_len, ps) != 0 &&
        shape.num_slots() > 0) {
      // The request writes into the rest of last_loc's page: it must be one
      // this session was given.
      prefix_pages_.push_back(DivNonNegative(shape.last_loc, ps));
      prefix_requests_.push_back(static_cast<int64_t>(i));
    }
    new_pages_[i] = NewPagesNeeded(shape, ps);
    total_pages += new_pages_[i];
    total_slots += shape.num_slots();
  }
  if (!prefix_pages_.empty()) {
    const int64_t k = reserve_->FirstNotHandedOut(prefix_pages_);
    if (k >= 0) {
      ++stats_.refused;
      const int64_t i = prefix_requests_[k];
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s request %d: last_locs[%d] (%d) lies in page %d, which this "
          "session's reserve has not handed out",
          RequestKindName(kind), i, i, last_loc[i], prefix_pages_[k]));
    }
  }
  if (total_slots > 0 && out == nullptr) {
    ++stats_.refused;
    return absl::InvalidArgumentError(
        absl::StrFormat("out is null for a batch of %d slots", total_slots));
  }

  // All or nothing: Take leaves the reserve as it was when it refuses.
  pages_.resize(std::max<int64_t>(total_pages, 1));
  pages_[0] = 0;  // the ring's one entry when no page is taken (never read)
  const absl::Status taken = reserve_->Take(total_pages, pages_.data());
  if (!taken.ok()) {
    ++stats_.refused;
    return taken;
  }
  if (host) {
    BuildPlan(out);
    ExpandPlan(storage_.plan, pages_.data());
  } else {
    absl::StatusOr<bool> inlined = false;
    if (kind == RequestKind::kDecode && n > 0 &&
        static_cast<int64_t>(n) <= options_.inline_decode_requests) {
      inlined = LaunchDecodeInline(last_loc, out, total_pages, stream);
    }
    absl::Status launched = inlined.status();
    if (inlined.ok() && !*inlined) {
      BuildPlan(out);
      launched = LaunchOnStream(last_loc, stream);
    }
    if (!launched.ok()) {
      ++stats_.refused;
      // Nothing ran: the pages are the reserve's again.
      const absl::Status put = reserve_->Put(
          absl::MakeConstSpan(pages_.data(), static_cast<size_t>(total_pages)));
      if (!put.ok()) return put;
      return launched;
    }
  }
  ++stats_.calls;
  last_num_pages_ = static_cast<size_t>(total_pages);
  stats_.pages_taken += total_pages;
  stats_.slots += total_slots;
  return total_slots;
}

void LocalExpander::BuildPlan(int64_t* out) {
  const size_t n = shapes_.size();
  const bool host = options_.memory == ExpansionMemory::kHost;
  PlanBuilder builder(&storage_, geometry_.page_size, /*free_ring_head=*/0,
                      static_cast<int64_t>(pages_.size()),
                      /*ring_copies=*/false, n);
  int64_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    ExtendShape shape = shapes_[i];
    // On the device the plan carries the request's index where last_loc
    // goes; the kernel reads last_loc[index] (kernels/expand_plan.h,
    // LastLocPlan).
    if (!host) shape.last_loc = static_cast<int64_t>(i);
    offset += builder.AddRequest(i, shape, out + offset, new_pages_[i]);
  }
  builder.Finish();
}

#if defined(PAGEALLOC_HAVE_CUDA)

absl::Status LocalExpander::InitDevice() {
  RETURN_IF_ERROR(
      CudaStatus(cudaHostAlloc(reinterpret_cast<void**>(&error_),
                               2 * sizeof(*error_), cudaHostAllocMapped),
                 "allocating the local expansion's error word"));
  error_[0] = 0;
  error_[1] = 0;
  RETURN_IF_ERROR(
      CudaStatus(cudaHostGetDevicePointer(
                     reinterpret_cast<void**>(&device_error_), error_, 0),
                 "mapping the local expansion's error word"));
  inline_decode_ = std::make_unique<InlineDecode>();
  for (int k = 0; k < options_.staging_buffers; ++k) {
    // Allocated here, so that the first calls allocate nothing.
    RETURN_IF_ERROR(AddStaging(staging_.size(), kInitialStagingBytes).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<LocalExpander::Staging*> LocalExpander::AddStaging(
    size_t at, int64_t bytes) {
  auto staging = std::make_unique<Staging>();
  RETURN_IF_ERROR(CudaStatus(
      cudaEventCreateWithFlags(&staging->event, cudaEventDisableTiming),
      "creating a staging event"));
  Staging* const added = staging.get();
  // In the ring before its buffers exist, so that the destructor frees
  // whatever was allocated.
  staging_.insert(staging_.begin() + static_cast<std::ptrdiff_t>(at),
                  std::move(staging));
  RETURN_IF_ERROR(ResizeStaging(bytes, added));
  return added;
}

LocalExpander::~LocalExpander() {
  // The kernels write the error word and read the device buffers until
  // their events complete. An inline decode records no event: its kernel
  // may write the error word until the device is done with it.
  if (inline_decode_ != nullptr && inline_decode_->launched) {
    cudaDeviceSynchronize();
  }
  for (const std::unique_ptr<Staging>& staging : staging_) {
    cudaEventSynchronize(staging->event);
    cudaEventDestroy(staging->event);
    if (staging->host != nullptr) cudaFreeHost(staging->host);
    if (staging->device != nullptr) cudaFree(staging->device);
  }
  if (error_ != nullptr) cudaFreeHost(error_);
}

absl::StatusOr<LocalExpander::Staging*> LocalExpander::FreeStaging(
    int64_t bytes) {
  Staging* found = nullptr;
  for (size_t tries = 0; tries < staging_.size() && found == nullptr; ++tries) {
    Staging* candidate = staging_[next_staging_].get();
    next_staging_ = (next_staging_ + 1) % staging_.size();
    const cudaError_t state = cudaEventQuery(candidate->event);
    if (state == cudaSuccess) {
      found = candidate;
    } else if (state != cudaErrorNotReady) {
      return CudaStatus(state, "querying a staging event");
    }
  }
  if (found == nullptr &&
      staging_.size() < static_cast<size_t>(options_.max_staging_buffers)) {
    // Every buffer is queued behind the stream's work: the caller is that
    // many calls ahead of its GPU. One more, before the oldest in the ring
    // (which stays the next looked at), rather than a wait on the host.
    ASSIGN_OR_RETURN(found, AddStaging(next_staging_,
                                       std::max(bytes, kInitialStagingBytes)));
    next_staging_ = (next_staging_ + 1) % staging_.size();
    ++stats_.staging_adds;
  }
  if (found == nullptr) {
    // Every buffer is queued behind the stream's work: the caller is
    // max_staging_buffers calls ahead of its GPU. Wait for the oldest.
    found = staging_[next_staging_].get();
    next_staging_ = (next_staging_ + 1) % staging_.size();
    ++stats_.staging_waits;
    RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(found->event),
                               "waiting for a staging buffer"));
  }
  if (found->bytes < bytes) {
    // A batch larger than any before: its event has completed, so the old
    // buffers are unused. (Freeing them synchronizes the device: a price
    // paid once per doubling.)
    RETURN_IF_ERROR(ResizeStaging(std::max(bytes, 2 * found->bytes), found));
    ++stats_.staging_grows;
  }
  return found;
}

absl::Status LocalExpander::ResizeStaging(int64_t bytes, Staging* staging) {
  if (staging->host != nullptr) cudaFreeHost(staging->host);
  if (staging->device != nullptr) cudaFree(staging->device);
  staging->host = nullptr;
  staging->device = nullptr;
  staging->bytes = 0;
  RETURN_IF_ERROR(
      CudaStatus(cudaHostAlloc(reinterpret_cast<void**>(&staging->host), bytes,
                               cudaHostAllocDefault),
                 "allocating pinned staging"));
  RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(reinterpret_cast<void**>(&staging->device), bytes),
                 "allocating device staging"));
  staging->bytes = bytes;
  return absl::OkStatus();
}

absl::Status LocalExpander::LaunchOnStream(const int64_t* last_loc,
                                           void* stream) {
  const BatchPlan& plan = storage_.plan;
  const int64_t ring_words = plan.free_ring_capacity;
  const int64_t block_bytes = MaxPackedPlanBytes(
      static_cast<int64_t>(plan.requests.size()), plan.num_slots);
  const int64_t ring_bytes = ring_words * static_cast<int64_t>(sizeof(int64_t));
  ASSIGN_OR_RETURN(Staging * staging, FreeStaging(ring_bytes + block_bytes));
  std::memcpy(staging->host, pages_.data(), ring_bytes);
  int64_t* const host_block = staging->host + ring_words;
  ASSIGN_OR_RETURN(
      const PackedPlan packed,
      PackPlan(plan, ring_words,
               absl::MakeSpan(host_block, static_cast<size_t>(
                                              block_bytes / sizeof(int64_t)))));
  if (packed.num_requests == 0) return absl::OkStatus();  // no slots
  const ExpandParams params =
      MakeExpandParams(packed, staging->device + ring_words, staging->device,
                       ring_words, plan.page_size);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(staging->device, staging->host, ring_bytes + packed.bytes,
                      cudaMemcpyHostToDevice, cuda_stream),
      "copying the local expansion's pages and plan"));
  const cudaError_t launched = LaunchExpandPlanLastLoc(
      params, DeviceLastLoc{last_loc, geometry_.slot_limit(), device_error_},
      cuda_stream);
  // Recorded whether or not the launch went: the copy was queued, and the
  // buffer must not be written before it has run.
  const cudaError_t recorded = cudaEventRecord(staging->event, cuda_stream);
  RETURN_IF_ERROR(CudaStatus(launched, "launching the local expansion"));
  return CudaStatus(recorded, "recording a staging event");
}

absl::StatusOr<bool> LocalExpander::LaunchDecodeInline(const int64_t* last_loc,
                                                       int64_t* out,
                                                       int64_t num_pages,
                                                       void* stream) {
  LocalDecodeHeader header;
  header.last_loc =
      DeviceLastLoc{last_loc, geometry_.slot_limit(), device_error_};
  header.out = out;
  header.page_size = geometry_.page_size;
  MaxLocalDecodeParams& params = inline_decode_->params;
  ASSIGN_OR_RETURN(
      const bool packed,
      PackLocalDecode(
          new_pages_,
          absl::MakeConstSpan(pages_.data(), static_cast<size_t>(num_pages)),
          header, &params));
  if (!packed) return false;
  inline_decode_->launched = true;
  RETURN_IF_ERROR(CudaStatus(
      LaunchExpandLocalDecode(params, static_cast<cudaStream_t>(stream)),
      "launching the local decode"));
  ++stats_.inline_decodes;
  return true;
}

absl::Status LocalExpander::TakeDeviceError() {
  if (error_ == nullptr) return absl::OkStatus();
  volatile unsigned long long* word = error_;  // NOLINT(runtime/int)
  const int64_t index = static_cast<int64_t>(word[0]) - 1;
  if (index < 0) return absl::OkStatus();
  const auto value = static_cast<int64_t>(word[1]);
  word[0] = 0;
  word[1] = 0;
  return absl::InvalidArgumentError(absl::StrFormat(
      "request %d: last_locs[%d] (%d) is not a slot of the slab (%d slots) "
      "above page 0 with room in its page (%d slots) for the request's "
      "prefix-page slots; they were written into page 0",
      index, index, value, geometry_.slot_limit(), geometry_.page_size));
}

#else  // !PAGEALLOC_HAVE_CUDA

absl::Status LocalExpander::InitDevice() {
  return absl::FailedPreconditionError(
      "expansion on the device needs a client library built with CUDA");
}

LocalExpander::~LocalExpander() = default;

absl::StatusOr<LocalExpander::Staging*> LocalExpander::FreeStaging(int64_t) {
  return absl::FailedPreconditionError("built without CUDA");
}

absl::Status LocalExpander::LaunchOnStream(const int64_t*, void*) {
  return absl::FailedPreconditionError("built without CUDA");
}

absl::Status LocalExpander::ResizeStaging(int64_t, Staging*) {
  return absl::FailedPreconditionError("built without CUDA");
}

absl::StatusOr<bool> LocalExpander::LaunchDecodeInline(const int64_t*, int64_t*,
                                                       int64_t, void*) {
  return absl::FailedPreconditionError("built without CUDA");
}

absl::Status LocalExpander::TakeDeviceError() { return absl::OkStatus(); }

#endif  // PAGEALLOC_HAVE_CUDA

}  // namespace pagealloc
