#include "client/page_free.h"

#include <iterator>
#include <limits>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

#if defined(PAGEALLOC_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "common/cuda_status.h"
#endif

namespace pagealloc {
namespace {

// The host copy of device slots, read once the caller's stream has run
// the work queued before the free.
absl::Status CopyToHost(const int64_t* slots, int64_t n, void* stream,
                        int64_t* staging) {
  RETURN_IF_ERROR(QueueCopyToHost(
      slots, static_cast<size_t>(n) * sizeof(*slots), staging, stream));
#if defined(PAGEALLOC_HAVE_CUDA)
  return CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
                    "waiting for the freed slots' copy");
#else
  return absl::OkStatus();  // not reached: QueueCopyToHost refuses
#endif
}

}  // namespace

absl::StatusOr<int64_t> FreeWholePages(PageReserve& reserve,
                                       const FreeSource& source,
                                       const int64_t* slots, int64_t n,
                                       int64_t* staging,
                                       absl::Span<int64_t> pages) {
  if (n < 0 || (n > 0 && slots == nullptr)) {
    return absl::InvalidArgumentError("slots is NULL or n is negative");
  }
  // Device slots are copied before anything is checked, so that the
  // caller has them on every refusal.
  const int64_t* host = slots;
  if (source.memory == ExpansionMemory::kDevice && n > 0) {
    if (staging == nullptr) {
      return absl::InvalidArgumentError("staging is NULL for device slots");
    }
    RETURN_IF_ERROR(CopyToHost(slots, n, source.stream, staging));
    host = staging;
  }
  const int64_t page_size = reserve.page_size();
  if (n % page_size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d slots are not whole pages of %d slots", n, page_size));
  }
  const int64_t num_pages = n / page_size;
  if (static_cast<int64_t>(pages.size()) < num_pages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pages holds %d ids; the slots name %d pages",
                        pages.size(), num_pages));
  }
  for (int64_t p = 0; p < num_pages; ++p) {
    const int64_t* block = host + p * page_size;
    const int64_t first = block[0];
    // A page's last slot must be an int64 too: first + i never overflows.
    bool whole = first >= 0 && first % page_size == 0 &&
                 first <= std::numeric_limits<int64_t>::max() - page_size + 1;
    for (int64_t i = 1; whole && i < page_size; ++i) {
      whole = block[i] == first + i;
    }
    if (!whole) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "slots[%d:%d] (from %d) is not one whole page of %d slots",
          p * page_size, (p + 1) * page_size, first, page_size));
    }
    pages[p] = first / page_size;
  }
  // The reserve is a stack: the first page named goes on last.
  const std::vector<int64_t> stacked(
      std::make_reverse_iterator(pages.begin() + num_pages), pages.rend());
  const absl::Span<const int64_t> put(stacked);
  if (source.memory == ExpansionMemory::kHost && source.fence) {
    RETURN_IF_ERROR(reserve.Put(put, source.stream));
  } else {
    RETURN_IF_ERROR(reserve.Put(put));
  }
  return num_pages;
}

absl::Status QueueCopyToHost(const void* device, size_t bytes, void* host,
                             void* stream) {
  if (bytes > 0 && (device == nullptr || host == nullptr)) {
    return absl::InvalidArgumentError(
        "a copy of device slots to the host names a NULL buffer");
  }
#if defined(PAGEALLOC_HAVE_CUDA)
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost,
                                    static_cast<cudaStream_t>(stream)),
                    "copying the freed slots to the host");
#else
  (void)stream;
  return absl::FailedPreconditionError(
      "a free of device slots needs a client library built with CUDA");
#endif
}

}  // namespace pagealloc
