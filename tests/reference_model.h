// ReferenceModel: a deliberately simple, separately written model of the
// pool's semantics, for randomized tests. It walks every token: a token at a
// page boundary (position % page_size == 0) opens the next page from the
// front of the free list, any other token takes the slot after the previous
// one. No ring, no plan, no prefix sums: just a deque and a map.
//
// This class is not thread-safe.

#ifndef PAGEALLOC_TESTS_REFERENCE_MODEL_H_
#define PAGEALLOC_TESTS_REFERENCE_MODEL_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/status.h"

namespace pagealloc::testing {

class ReferenceModel {
 public:
  enum class Kind { kExtend, kDecode, kAlloc };
  struct Request {
    Kind kind = Kind::kExtend;
    uint64_t owner = 0;
    int64_t prefix_len = 0;  // extend only
    int64_t seq_len = 0;     // extend, decode; tokens for alloc
    int64_t last_loc = -1;   // extend, decode
  };
  struct Outcome {
    absl::StatusCode code = absl::StatusCode::kOk;
    std::vector<int64_t> slots;
  };

  ReferenceModel(int64_t num_pages, int64_t page_size, bool sorted_policy);

  void AddOwner(uint64_t owner, int64_t quota_pages);
  // Frees every page of `owner` (ascending page order) and forgets it.
  void RemoveOwner(uint64_t owner);
  std::vector<Outcome> Allocate(const std::vector<Request>& batch);
  // Frees pages (or the pages of slots); returns the status code.
  absl::StatusCode Free(uint64_t owner, const std::vector<int64_t>& values,
                        bool values_are_slots);
  absl::StatusCode Checkpoint(uint64_t owner);
  absl::StatusCode Rollback(uint64_t owner);

  std::vector<int64_t> free_list() const {
    return {free_.begin(), free_.end()};
  }
  const std::vector<int64_t>& parked() const { return parked_; }
  // Owner of `page`, 0 when free.
  uint64_t owner_of(int64_t page) const;
  int64_t pages_owned(uint64_t owner) const;
  bool has_owner(uint64_t owner) const { return owners_.count(owner) > 0; }

 private:
  struct Owner {
    int64_t quota = 0;
    std::optional<std::vector<int64_t>> given;
  };
  void ReturnPages(const std::vector<int64_t>& pages);

  const int64_t num_pages_;
  const int64_t page_size_;
  const bool sorted_;
  std::deque<int64_t> free_;
  std::vector<int64_t> parked_;
  std::map<int64_t, uint64_t> page_owner_;  // only owned pages
  std::map<uint64_t, Owner> owners_;
};

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_REFERENCE_MODEL_H_
