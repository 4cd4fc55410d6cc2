#include "server/ring_space.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace pagealloc {

absl::StatusOr<int64_t> RingSpace::Reserve(int64_t n) {
  if (n == 0) return end_;
  if (n > capacity_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "output ring full: the call needs %d slots, more than the ring's "
        "capacity of %d (register with a larger ring_capacity_slots or use "
        "smaller calls)",
        n, capacity_));
  }
  int64_t start = end_;
  const int64_t offset = start % capacity_;
  if (offset + n > capacity_) start += capacity_ - offset;  // skip to lap
  if (start + n - released_ > capacity_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "output ring full: the call needs %d slots, %d of %d are still "
        "reserved by earlier results; release them (ReleaseRing or "
        "AllocOptions.release_ring_up_to)",
        n, end_ - released_, capacity_));
  }
  end_before_last_reserve_ = end_;
  end_ = start + n;
  return start;
}

void RingSpace::Unreserve(int64_t position, int64_t n) {
  if (n > 0 && position + n == end_) {
    end_ = std::max(end_before_last_reserve_, released_);
  }
}

absl::Status RingSpace::Release(int64_t up_to) {
  if (up_to < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("up_to (%d) is negative", up_to));
  }
  if (up_to > end_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "up_to (%d) is past the ring's last reserved position (%d)", up_to,
        end_));
  }
  if (up_to > released_) released_ = up_to;
  return absl::OkStatus();
}

}  // namespace pagealloc
