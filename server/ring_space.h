// RingSpace: the bookkeeping of one session's output ring.
//
// Positions are logical (they only grow); a position's physical slot is
// position % capacity. Every reservation is contiguous in physical memory:
// when it would cross the end, the rest of the lap is skipped. The daemon
// never writes into a region the client has not released, so a client can
// read its slots at leisure.
//
// This class is thread-compatible.

#ifndef PAGEALLOC_SERVER_RING_SPACE_H_
#define PAGEALLOC_SERVER_RING_SPACE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pagealloc {

class RingSpace {
 public:
  // REQUIRES: capacity >= 1.
  explicit RingSpace(int64_t capacity) : capacity_(capacity) {}

  // Reserves `n` contiguous slots and returns the logical position of the
  // first (n == 0 reserves nothing and returns end()). Returns
  // RESOURCE_EXHAUSTED when the unreleased regions leave no room.
  absl::StatusOr<int64_t> Reserve(int64_t n);

  // Releases every region before logical position `up_to`. A position at or
  // before the last release is a no-op. Returns INVALID_ARGUMENT for a
  // negative position or one past end().
  absl::Status Release(int64_t up_to);

  // Undoes the most recent Reserve when it returned `position` for `n`
  // slots and nothing was reserved since (a call refused after reserving).
  void Unreserve(int64_t position, int64_t n);

  int64_t capacity() const { return capacity_; }
  // Logical position just past the last reservation.
  int64_t end() const { return end_; }
  // Slots between the last release and end(), padding included.
  int64_t reserved() const { return end_ - released_; }

 private:
  int64_t capacity_;
  int64_t end_ = 0;
  int64_t released_ = 0;
  int64_t end_before_last_reserve_ = 0;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_RING_SPACE_H_
