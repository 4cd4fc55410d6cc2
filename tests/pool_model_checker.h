// PoolModelChecker: drives a PagePool (on the CPU executor) and the
// separately written ReferenceModel through the same operations, chosen by a
// ChoiceSource, and reports the first disagreement. Shared by the randomized
// model test (choices from a PRNG) and the model fuzzer (choices from the
// fuzzer's bytes).
//
// Operations: batches mixing new and continued extends, decodes, page allocs
// and deliberately bad requests (a stranger's last_loc, misaligned ones,
// unaligned allocs, seq < prefix, requests longer than the pool, unknown
// owners), split into calls of which some are all-or-nothing; frees of a
// sequence by slots or pages in each order (sometimes by a stranger, with
// page 0, or twice); nested checkpoints and rollbacks to the latest or to
// an id (active, ended or never taken); clearing an owner or the pool;
// reclaiming an owner. After each: same slots, same codes, same free list
// and parked pages, same owner for every page, same checkpoint depths,
// stats that add up, and PagePool::CheckInvariants (executor mirror
// included). The model follows the pool's semantics profile.
//
// This class is not thread-safe.

#ifndef PAGEALLOC_TESTS_POOL_MODEL_CHECKER_H_
#define PAGEALLOC_TESTS_POOL_MODEL_CHECKER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "allocator/page_pool.h"
#include "kernels/cpu_executor.h"
#include "tests/reference_model.h"
#include "tests/workload.h"

namespace pagealloc::testing {

// Where the checker's choices come from.
class ChoiceSource {
 public:
  virtual ~ChoiceSource() = default;
  // A value in [lo, hi]. REQUIRES: lo <= hi.
  virtual int64_t Uniform(int64_t lo, int64_t hi) = 0;
};

class PoolModelChecker {
 public:
  static constexpr int kOwners = 3;

  // Builds a pool of `num_pages` pages (owner kOwners has a quota of a third
  // of them) and the model beside it.
  static absl::StatusOr<std::unique_ptr<PoolModelChecker>> Create(
      int64_t num_pages, int64_t page_size, FreePolicy policy,
      ChoiceSource* choices, Semantics semantics = Semantics::kPagealloc);

  // Does one operation chosen by the source. Returns INTERNAL describing the
  // first disagreement with the model.
  absl::Status Step();

  // Compares everything observable; INTERNAL on a difference.
  absl::Status CheckSameState();

  // How often each (kind, code) came up, and pages rolled back: to check that
  // a generator reaches the interesting paths.
  const std::map<std::pair<RequestKind, absl::StatusCode>, int64_t>& outcomes()
      const {
    return outcomes_;
  }
  int64_t pages_rolled_back() const { return pages_rolled_back_; }
  // All-or-nothing calls refused whole, and rollbacks to an id.
  int64_t calls_refused_whole() const { return calls_refused_whole_; }
  int64_t rollbacks_to_an_id() const { return rollbacks_to_an_id_; }
  int64_t page_size() const { return page_size_; }

 private:
  PoolModelChecker(int64_t num_pages, int64_t page_size, FreePolicy policy,
                   ChoiceSource* choices, Semantics semantics);
  absl::Status Init();
  int64_t Quota(OwnerId owner) const {
    return owner == kOwners ? num_pages_ / 3 : 0;
  }
  OwnerId RandomOwner() { return choices_->Uniform(1, kOwners); }
  absl::Status StepAllocate();
  absl::Status StepFree();
  absl::Status StepCheckpointOrRollback();
  absl::Status StepReclaim();
  absl::Status StepClear();
  // Drops sequences that lost a page (rolled back or reclaimed).
  void ForgetDeadSequences();

  const int64_t num_pages_;
  const int64_t page_size_;
  const FreePolicy policy_;
  const Semantics semantics_;
  ChoiceSource* const choices_;
  CpuExecutor executor_;
  std::unique_ptr<PagePool> pool_;
  ReferenceModel model_;
  // The sequences the owners are growing (LiveSequence::owner); each
  // answer is checked against the semantics as it is recorded.
  SequenceSet live_;
  std::map<std::pair<RequestKind, absl::StatusCode>, int64_t> outcomes_;
  int64_t pages_rolled_back_ = 0;
  int64_t calls_refused_whole_ = 0;
  int64_t rollbacks_to_an_id_ = 0;
};

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_POOL_MODEL_CHECKER_H_
