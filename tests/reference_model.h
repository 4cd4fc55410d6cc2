// ReferenceModel: a deliberately simple, separately written model of the
// pool's semantics, for randomized tests. It walks every token: a token at a
// page boundary (position % page_size == 0) opens the next page from the
// front of the free list, any other token takes the slot after the previous
// one. No ring, no plan, no prefix sums: just a deque and a map. It follows
// the pool's semantics profile (pagealloc or sglang) where they differ:
// free order, where frees go with page_size 1, and when parked pages merge.
//
// This class is not thread-safe.

#ifndef PAGEALLOC_TESTS_REFERENCE_MODEL_H_
#define PAGEALLOC_TESTS_REFERENCE_MODEL_H_

#include <cstdint>
#include <deque>
#include <map>
#include <utility>
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
  // One call of a batch: its number of requests and whether it is admitted
  // whole or not at all.
  struct Call {
    int64_t num_requests = 0;
    bool all_or_nothing = false;
  };
  // A free's order: the profile's, ascending, or first appearance.
  enum class Order { kDefault, kAscending, kFirstAppearance };

  ReferenceModel(int64_t num_pages, int64_t page_size, bool sorted_policy,
                 bool sglang = false);

  void AddOwner(uint64_t owner, int64_t quota_pages);
  // Frees every page of `owner` (ascending page order) and forgets it.
  void RemoveOwner(uint64_t owner);
  // `calls` empty: the whole batch is one call.
  std::vector<Outcome> Allocate(const std::vector<Request>& batch,
                                const std::vector<Call>& calls = {});
  // Frees pages (or the pages of slots); returns the status code.
  absl::StatusCode Free(uint64_t owner, const std::vector<int64_t>& values,
                        bool values_are_slots, Order order = Order::kDefault);
  // Returns the checkpoint's id (0 for an unknown owner).
  uint64_t Checkpoint(uint64_t owner);
  // id 0: the latest, which ends.
  absl::StatusCode Rollback(uint64_t owner, uint64_t id = 0);
  absl::StatusCode ClearOwner(uint64_t owner);
  absl::StatusCode ClearPool(bool force);

  std::vector<int64_t> free_list() const {
    return {free_.begin(), free_.end()};
  }
  const std::vector<int64_t>& parked() const { return parked_; }
  // Owner of `page`, 0 when free.
  uint64_t owner_of(int64_t page) const;
  int64_t pages_owned(uint64_t owner) const;
  bool has_owner(uint64_t owner) const { return owners_.count(owner) > 0; }
  // Ids the owner has been given so far (its next id minus one).
  uint64_t last_checkpoint_id(uint64_t owner) const;
  int64_t checkpoints(uint64_t owner) const;

  static constexpr int kMaxCheckpoints = 64;

 private:
  struct Owner {
    int64_t quota = 0;
    // Active checkpoints, oldest first: each id with every page given to
    // the owner since it was taken, in order.
    std::vector<std::pair<uint64_t, std::vector<int64_t>>> checkpoints;
    uint64_t next_id = 1;
  };
  void ReturnPages(std::vector<int64_t> pages);
  void MergeParked(size_t keep);
  void ResetFreeList();

  const int64_t num_pages_;
  const int64_t page_size_;
  const bool sorted_;
  const bool sglang_;
  std::deque<int64_t> free_;
  std::vector<int64_t> parked_;
  std::map<int64_t, uint64_t> page_owner_;  // only owned pages
  std::map<uint64_t, Owner> owners_;
};

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_REFERENCE_MODEL_H_
