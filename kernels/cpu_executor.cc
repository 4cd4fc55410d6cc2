#include "kernels/cpu_executor.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "allocator/requests.h"
#include "common/status_macros.h"
#include "kernels/plan_packing.h"

namespace pagealloc {

void ExpandRequest(const PlannedRequest& request, int64_t page_size,
                   const int64_t* ring, int64_t ring_capacity, int64_t head,
                   int64_t* out) {
  const int64_t num_slots = request.seq_len - request.prefix_len;
  // (1) the rest of the prefix's partial last page.
  const int64_t page_end =
      (request.prefix_len + page_size - 1) / page_size * page_size;
  const int64_t partial =
      std::min(request.seq_len, page_end) - request.prefix_len;
  for (int64_t t = 0; t < partial; ++t) out[t] = request.last_loc + 1 + t;
  // (2) + (3): new pages, each filled from its start; the last may be
  // partial. Page-aligned from here on, so token t sits at offset
  // (t - partial) % page_size of new page (t - partial) / page_size.
  int64_t position =
      ModNonNegative(head + request.first_new_page, ring_capacity);
  for (int64_t t = partial; t < num_slots; t += page_size) {
    const int64_t base = ring[position] * page_size;
    const int64_t n = std::min(page_size, num_slots - t);
    for (int64_t k = 0; k < n; ++k) out[t + k] = base + k;
    if (++position == ring_capacity) position = 0;
  }
}

void CopyRingEntries(const RingCopy& copy, const int64_t* ring,
                     int64_t ring_capacity, int64_t head) {
  const int64_t position =
      ModNonNegative(head + copy.ring_offset, ring_capacity);
  const int64_t first = std::min(copy.count, ring_capacity - position);
  std::memcpy(copy.destination, ring + position, first * sizeof(int64_t));
  std::memcpy(copy.destination + first, ring,
              (copy.count - first) * sizeof(int64_t));
}

void ScrubPage(const KvScrubTarget& target, int64_t page) {
  for (const KvScrubTarget::Buffer& buffer : target.buffers) {
    const int64_t page_bytes = target.page_size * buffer.stride_bytes;
    std::memset(buffer.base + page * page_bytes, 0, page_bytes);
  }
}

absl::Status CpuExecutor::InitFreeRing(int64_t capacity) {
  if (capacity < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("free ring capacity (%d) must be >= 1", capacity));
  }
  ring_.assign(capacity, 0);
  return absl::OkStatus();
}

absl::Status CpuExecutor::WriteFreeRing(int64_t position,
                                        absl::Span<const int64_t> pages) {
  if (position < 0 || position + static_cast<int64_t>(pages.size()) >
                          static_cast<int64_t>(ring_.size())) {
    return absl::OutOfRangeError(
        absl::StrFormat("free ring write [%d, %d) outside capacity %d",
                        position, position + pages.size(), ring_.size()));
  }
  std::copy(pages.begin(), pages.end(), ring_.begin() + position);
  return absl::OkStatus();
}

absl::Status CpuExecutor::Execute(const BatchPlan& plan) {
  if (plan.free_ring_capacity != static_cast<int64_t>(ring_.size())) {
    return absl::InternalError(
        absl::StrFormat("plan ring capacity %d differs from the executor's %d",
                        plan.free_ring_capacity, ring_.size()));
  }
  if (!plan.scrub_pages.empty() && scrub_target_.page_size != plan.page_size) {
    return absl::InternalError(absl::StrFormat(
        "the plan scrubs %d pages of %d slots; the executor's KV memory has "
        "pages of %d slots",
        plan.scrub_pages.size(), plan.page_size, scrub_target_.page_size));
  }
  RETURN_IF_ERROR(ValidateRingCopies(plan, ring_.size()));
  // Zeroed before the slots are written: the batch's answer, which hands
  // them out, follows this launch.
  for (int64_t page : plan.scrub_pages) ScrubPage(scrub_target_, page);
  for (const RingCopy& copy : plan.ring_copies) {
    CopyRingEntries(copy, ring_.data(), ring_.size(), plan.free_ring_head);
  }
  for (const PlannedRequest& request : plan.requests) {
    ExpandRequest(request, plan.page_size, ring_.data(), ring_.size(),
                  plan.free_ring_head, request.destination);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> CpuExecutor::ReadFreeRing() {
  return ring_;
}

}  // namespace pagealloc
