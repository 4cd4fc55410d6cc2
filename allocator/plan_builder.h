// PlanBuilder: builds one launch's BatchPlan as admission accepts requests,
// in admission order. Each accepted request takes the next pages at the
// front of the free list: its first new page is the count of pages planned
// before it, its output offset the count of slots.
//
// Two forms (executor.h):
//   - request plans: one PlannedRequest per accepted request;
//   - ring copies (page_size 1 only): a request's slots are its ring
//     entries, so requests whose destinations follow each other extend one
//     RingCopy, and requests of one owner in a row extend one OwnerRun (the
//     pool's commit walks runs, not requests).
// Beside the plan it lists the accepted requests' indices and, for the
// executor, the pages to scrub.
//
// A call can be taken back whole (all-or-nothing admission): BeginCall
// marks where the plan stands, TakeBackCall returns it there, restoring a
// run that grew across the call's start, in O(requests of the call).
//
// Every method is inline, on purpose: the pool keeps its builder on the
// stack for one launch, so the running totals live in registers. An
// out-of-line call would let the builder's address escape, and the totals
// would be reloaded after every store to a result (they may alias, to the
// compiler), which perf showed as a tenth of the admission loop.
//
// This class is thread-compatible.

#ifndef PAGEALLOC_ALLOCATOR_PLAN_BUILDER_H_
#define PAGEALLOC_ALLOCATOR_PLAN_BUILDER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "allocator/executor.h"
#include "allocator/requests.h"

namespace pagealloc {

// Ring pages going to one owner, consecutive in ring order.
struct OwnerRun {
  OwnerId owner = kNoOwner;
  int64_t pages = 0;
};

// Where a plan stood when its current call began (PlanBuilder::BeginCall).
struct PlanCallMark {
  size_t admitted = 0;
  int64_t planned_pages = 0;
  int64_t planned_slots = 0;
  size_t scrub_pages = 0;
  // Ring copies only: the last copy and run may grow across the call's
  // start, so their counts are kept too.
  size_t copies = 0;
  int64_t last_copy_count = 0;
  size_t owner_runs = 0;
  int64_t last_owner_run_pages = 0;
};

// What a PlanBuilder writes, kept by the pool between launches so that the
// vectors keep their storage and stay warm in cache.
struct PlanStorage {
  BatchPlan plan;
  // The accepted requests' indices in the batch, in admission order.
  std::vector<size_t> admitted;
  // Ring copies only: the accepted requests' pages as runs of one owner, in
  // ring order (empty for request plans).
  std::vector<OwnerRun> owner_runs;
  // The builder's mark of the current call. Kept here rather than in the
  // builder: it is read only to take a call back, and as eight more values
  // live in the admission loop it crowded the loop's own out of registers
  // (BM_Decode at page size 1 took about 5% longer).
  PlanCallMark call_mark;
};

class PlanBuilder {
 public:
  // Starts an empty plan in `storage` for a batch of up to `num_requests`
  // requests whose pages begin at ring position `free_ring_head` of a ring
  // of `free_ring_capacity`. `ring_copies` plans page_size 1 as ring copies.
  // `storage` must outlive the builder. REQUIRES: !ring_copies or
  // page_size == 1.
  PlanBuilder(PlanStorage* storage, int64_t page_size, int64_t free_ring_head,
              int64_t free_ring_capacity, bool ring_copies, size_t num_requests)
      : storage_(*storage), ring_copies_(ring_copies) {
    BatchPlan& plan = storage_.plan;
    plan.page_size = page_size;
    plan.free_ring_head = free_ring_head;
    plan.free_ring_capacity = free_ring_capacity;
    plan.num_new_pages = 0;
    plan.num_slots = 0;
    plan.requests.clear();
    plan.ring_copies.clear();
    plan.scrub_pages.clear();
    if (!ring_copies_) plan.requests.reserve(num_requests);
    storage_.admitted.clear();
    storage_.admitted.reserve(num_requests);
    storage_.owner_runs.clear();
  }

  PlanBuilder(const PlanBuilder&) = delete;
  PlanBuilder& operator=(const PlanBuilder&) = delete;

  bool ring_copies() const { return ring_copies_; }
  // Pages and slots of the requests accepted so far.
  int64_t planned_pages() const { return planned_pages_; }
  int64_t planned_slots() const { return planned_slots_; }
  // Whether no request has been accepted.
  bool empty() const { return storage_.admitted.empty(); }

  // Marks the start of a call, for TakeBackCall.
  void BeginCall() {
    const BatchPlan& plan = storage_.plan;
    PlanCallMark& mark = storage_.call_mark;
    mark.admitted = storage_.admitted.size();
    mark.planned_pages = planned_pages_;
    mark.planned_slots = planned_slots_;
    mark.scrub_pages = plan.scrub_pages.size();
    if (ring_copies_) {
      mark.copies = plan.ring_copies.size();
      mark.last_copy_count =
          plan.ring_copies.empty() ? 0 : plan.ring_copies.back().count;
      mark.owner_runs = storage_.owner_runs.size();
      mark.last_owner_run_pages =
          storage_.owner_runs.empty() ? 0 : storage_.owner_runs.back().pages;
    }
  }

  // Accepts request `index` of `owner` into a ring-copy plan: its `pages`
  // new pages (its slots, at page_size 1) go to `destination`. Returns its
  // slots. REQUIRES: ring_copies().
  int64_t AddRingCopy(size_t index, OwnerId owner, int64_t* destination,
                      int64_t pages) {
    if (pages > 0) {
      // A request whose destination follows the last copy's end extends
      // the copy (a call's requests write one contiguous range), as one of
      // the last run's owner extends the run.
      std::vector<RingCopy>& copies = storage_.plan.ring_copies;
      if (!copies.empty() &&
          copies.back().destination + copies.back().count == destination) {
        copies.back().count += pages;
      } else {
        copies.push_back(RingCopy{planned_pages_, pages, destination});
      }
      std::vector<OwnerRun>& runs = storage_.owner_runs;
      if (!runs.empty() && runs.back().owner == owner) {
        runs.back().pages += pages;
      } else {
        runs.push_back({owner, pages});
      }
    }
    Accept(index, pages, pages);
    return pages;
  }

  // Accepts request `index` of shape `shape`, taking `new_pages` pages,
  // into a request plan; its slots go to `destination`. Returns its slots.
  // REQUIRES: !ring_copies().
  int64_t AddRequest(size_t index, const ExtendShape& shape,
                     int64_t* destination, int64_t new_pages) {
    // Fields written in place: building a temporary and copying it cost a
    // store-forwarding stall per request (a third of the admission loop,
    // by perf).
    PlannedRequest& planned = storage_.plan.requests.emplace_back();
    planned.prefix_len = shape.prefix_len;
    planned.seq_len = shape.seq_len;
    planned.last_loc = shape.last_loc;
    planned.first_new_page = planned_pages_;
    planned.output_offset = planned_slots_;
    planned.destination = destination;
    const int64_t num_slots = shape.num_slots();
    Accept(index, new_pages, num_slots);
    return num_slots;
  }

  // Lists `page`, one of the batch's, for the executor to scrub.
  void AddScrubPage(int64_t page) { storage_.plan.scrub_pages.push_back(page); }

  // The indices of the requests accepted since BeginCall, in order.
  absl::Span<const size_t> call_admitted() const {
    return absl::MakeConstSpan(storage_.admitted)
        .subspan(storage_.call_mark.admitted);
  }

  // Takes back every request accepted since BeginCall (call_admitted()),
  // returning the plan to where it stood at BeginCall.
  void TakeBackCall() {
    BatchPlan& plan = storage_.plan;
    const PlanCallMark& mark = storage_.call_mark;
    storage_.admitted.resize(mark.admitted);
    if (!ring_copies_) plan.requests.resize(mark.admitted);
    planned_pages_ = mark.planned_pages;
    planned_slots_ = mark.planned_slots;
    plan.scrub_pages.resize(mark.scrub_pages);
    if (ring_copies_) {
      plan.ring_copies.resize(mark.copies);
      if (!plan.ring_copies.empty()) {
        plan.ring_copies.back().count = mark.last_copy_count;
      }
      storage_.owner_runs.resize(mark.owner_runs);
      if (!storage_.owner_runs.empty()) {
        storage_.owner_runs.back().pages = mark.last_owner_run_pages;
      }
    }
  }

  // Writes the totals into the plan and returns it. The builder may go on
  // accepting requests afterwards (Finish again then).
  const BatchPlan& Finish() {
    storage_.plan.num_new_pages = planned_pages_;
    storage_.plan.num_slots = planned_slots_;
    return storage_.plan;
  }

 private:
  void Accept(size_t index, int64_t pages, int64_t slots) {
    planned_pages_ += pages;
    planned_slots_ += slots;
    storage_.admitted.push_back(index);
  }

  PlanStorage& storage_;
  const bool ring_copies_;
  int64_t planned_pages_ = 0;
  int64_t planned_slots_ = 0;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_ALLOCATOR_PLAN_BUILDER_H_
