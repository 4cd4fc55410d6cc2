#include "allocator/page_pool.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace pagealloc {

absl::StatusOr<FreePolicy> ParseFreePolicy(absl::string_view name) {
  if (name == "lifo") return FreePolicy::kLifo;
  if (name == "sorted") return FreePolicy::kSorted;
  return absl::InvalidArgumentError(absl::StrFormat(
      "free_policy \"%s\" is not one of \"lifo\", \"sorted\"", name));
}

absl::string_view FreePolicyName(FreePolicy policy) {
  return policy == FreePolicy::kLifo ? "lifo" : "sorted";
}

absl::StatusOr<Semantics> ParseSemantics(absl::string_view name) {
  if (name == "pagealloc") return Semantics::kPagealloc;
  if (name == "sglang") return Semantics::kSglang;
  return absl::InvalidArgumentError(absl::StrFormat(
      "semantics \"%s\" is not one of \"pagealloc\", \"sglang\"", name));
}

absl::string_view SemanticsName(Semantics semantics) {
  return semantics == Semantics::kPagealloc ? "pagealloc" : "sglang";
}

PagePool::PagePool(const PoolOptions& options, PlanExecutor* executor)
    : geometry_{options.page_size, options.num_pages},
      policy_(options.free_policy),
      semantics_(options.semantics),
      scrub_(options.scrub),
      ring_copies_(options.page_size == 1 && options.ring_copy_plans),
      capacity_(options.num_pages),
      executor_(executor) {}

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::Create(
    const PoolOptions& options, PlanExecutor* executor) {
  if (options.page_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("page_size (%d) must be >= 1", options.page_size));
  }
  if (options.num_pages < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("num_pages (%d) must be >= 1", options.num_pages));
  }
  // Slots are int64; keep (num_pages + 1) * page_size far from overflow.
  if (options.num_pages > (int64_t{1} << 40) / options.page_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("num_pages (%d) * page_size (%d) exceeds 2^40 slots",
                        options.num_pages, options.page_size));
  }
  if (executor == nullptr) {
    return absl::InvalidArgumentError("executor is null");
  }
  std::unique_ptr<PagePool> pool(new PagePool(options, executor));
  absl::MutexLock lock(&pool->mu_);
  pool->allocated_once_.assign(options.num_pages + 1, false);
  pool->log_index_.assign(options.num_pages + 1, 0);
  if (options.scrub) pool->last_owner_.assign(options.num_pages + 1, kNoOwner);
  RETURN_IF_ERROR(executor->InitFreeRing(pool->capacity_));
  RETURN_IF_ERROR(pool->InitFreeList());
  return pool;
}

absl::Status PagePool::InitFreeList() {
  ring_.assign(capacity_, 0);
  owner_of_.assign(geometry_.num_pages + 1, kNoOwner);
  parked_.clear();
  std::vector<int64_t> all(capacity_);
  for (int64_t i = 0; i < capacity_; ++i) all[i] = i + 1;
  head_ = 0;
  free_count_ = capacity_;
  return WriteRing(0, all);
}

absl::Status PagePool::WriteRing(int64_t position,
                                 absl::Span<const int64_t> pages) {
  position %= capacity_;
  while (!pages.empty()) {
    const int64_t n = std::min<int64_t>(pages.size(), capacity_ - position);
    std::copy(pages.begin(), pages.begin() + n, ring_.begin() + position);
    RETURN_IF_ERROR(executor_->WriteFreeRing(position, pages.subspan(0, n)));
    pages.remove_prefix(n);
    position = 0;
  }
  return absl::OkStatus();
}

absl::Status PagePool::PushFront(absl::Span<const int64_t> pages) {
  const int64_t n = pages.size();
  // free_count_ + n <= capacity_ holds: these pages were owned, not free.
  head_ = ((head_ - n) % capacity_ + capacity_) % capacity_;
  free_count_ += n;
  return WriteRing(head_, pages);
}

absl::Status PagePool::PushBack(absl::Span<const int64_t> pages) {
  // free_count_ + pages.size() <= capacity_ holds: these pages were owned.
  const int64_t position = (head_ + free_count_) % capacity_;
  free_count_ += pages.size();
  return WriteRing(position, pages);
}

absl::Status PagePool::MergeParkedAndSort(int64_t keep) {
  std::vector<int64_t> merged;
  merged.reserve(free_count_ - keep + parked_.size());
  for (int64_t i = keep; i < free_count_; ++i) merged.push_back(RingAt(i));
  merged.insert(merged.end(), parked_.begin(), parked_.end());
  std::sort(merged.begin(), merged.end());
  parked_.clear();
  free_count_ = keep + merged.size();
  ++counters_.free_list_sorts;
  return WriteRing(head_ + keep, merged);
}

absl::Status PagePool::AddOwner(OwnerId owner, int64_t quota_pages) {
  if (owner == kNoOwner) {
    return absl::InvalidArgumentError("owner id 0 is reserved for free pages");
  }
  if (quota_pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("quota_pages (%d) is negative", quota_pages));
  }
  absl::MutexLock lock(&mu_);
  OwnerState state;
  state.quota_pages = quota_pages;
  if (!owners_.try_emplace(owner, std::move(state)).second) {
    return absl::AlreadyExistsError(
        absl::StrFormat("owner %d is already registered", owner));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PagePool::RemoveOwner(OwnerId owner) {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  const std::vector<int64_t> pages = PagesOf(owner, it->second.pages_owned);
  RETURN_IF_ERROR(ReleasePages(it->second, pages));
  owners_.erase(it);
  return static_cast<int64_t>(pages.size());
}

std::vector<int64_t> PagePool::PagesOf(OwnerId owner, int64_t count) const {
  std::vector<int64_t> pages;
  pages.reserve(count);
  if (count > 0) {
    // Reclaim and clear are rare (a session closing, losing its lease or
    // clearing): a scan of the owner table keeps the hot path free of
    // per-owner page sets.
    for (int64_t p = 1; p <= geometry_.num_pages; ++p) {
      if (owner_of_[p] == owner) pages.push_back(p);
    }
  }
  return pages;
}

std::vector<AllocResult> PagePool::Allocate(
    absl::Span<const AllocRequest> requests, absl::Span<const CallSpan> calls) {
  std::vector<AllocResult> results;
  Allocate(requests, calls, &results);
  return results;
}

void PagePool::Allocate(absl::Span<const AllocRequest> requests,
                        absl::Span<const CallSpan> calls,
                        std::vector<AllocResult>* results_out) {
  std::vector<AllocResult>& results = *results_out;
  results.clear();
  results.resize(requests.size());
  const absl::Span<AllocResult> result_span = absl::MakeSpan(results);

  const CallSpan whole_batch{static_cast<int64_t>(requests.size()), false};
  if (calls.empty()) {
    calls = absl::MakeConstSpan(&whole_batch, 1);
  } else {
    int64_t total = 0;
    for (const CallSpan& call : calls) {
      total += call.num_requests < 0 ? static_cast<int64_t>(requests.size()) + 1
                                     : call.num_requests;
    }
    if (total != static_cast<int64_t>(requests.size())) {
      // A caller's bug: refuse rather than guess where its calls begin.
      for (AllocResult& result : results) {
        result.status = absl::InternalError(absl::StrFormat(
            "the batch's calls cover %d requests, the batch has %d", total,
            requests.size()));
      }
      return;
    }
  }

  absl::MutexLock lock(&mu_);
  const int64_t batch_pages = ValidateRequests(requests, result_span);
  const absl::Status room = MakeRoomForBatch(batch_pages);
  if (!room.ok()) {
    for (AllocResult& result : results) {
      if (result.status.ok()) result.status = room;
    }
    return;
  }
  if (!AdmitAndPlan(requests, calls, result_span)) return;
  if (!ExecutePlan(result_span)) return;
  CommitPlan(requests);
}

int64_t PagePool::ValidateRequests(absl::Span<const AllocRequest> requests,
                                   absl::Span<AllocResult> results) {
  return geometry_.page_size == 1
             ? ValidateRequestsOf</*kUnitPages=*/true>(requests, results)
             : ValidateRequestsOf</*kUnitPages=*/false>(requests, results);
}

template <bool kUnitPages>
int64_t PagePool::ValidateRequestsOf(absl::Span<const AllocRequest> requests,
                                     absl::Span<AllocResult> results) {
  // With page_size 1 as a constant the shape checks and the page arithmetic
  // fold away (no prefix ends inside a page, pages are slots).
  const PoolGeometry geometry{kUnitPages ? 1 : geometry_.page_size,
                              geometry_.num_pages};
  // Ring-copy plans read no shapes: only pages_needed (= slots).
  const bool keep_shapes = !(kUnitPages && ring_copies_);
  std::vector<ExtendShape>& shapes = scratch_.shapes;
  std::vector<int64_t>& pages_needed = scratch_.pages_needed;
  if (keep_shapes) shapes.resize(requests.size());
  pages_needed.assign(requests.size(), 0);
  int64_t batch_pages = 0;
  // A call's requests share an owner: look it up once per run of requests.
  OwnerId known_owner = kNoOwner;
  for (size_t i = 0; i < requests.size(); ++i) {
    const AllocRequest& request = requests[i];
    AllocResult& result = results[i];
    if (!IsValidShape(request, geometry)) {
      result.status = ValidateShape(request, geometry_);  // never OK here
      continue;
    }
    if (request.owner != known_owner && !owners_.contains(request.owner)) {
      result.status = absl::NotFoundError(absl::StrFormat(
          "%s request %d: unknown owner %d", RequestKindName(request.kind),
          request.index, request.owner));
      continue;
    }
    known_owner = request.owner;
    if (request.seq_len > geometry.usable_slots()) {
      // Per request, as SGLang answers None: such a request can never fit.
      ++counters_.out_of_pages_refusals;
      result.status = absl::ResourceExhaustedError(absl::StrFormat(
          "%s request %d: %s[%d] (%d) exceeds the pool's %d usable slots "
          "(%d pages of %d): it can never fit",
          RequestKindName(request.kind), request.index,
          request.kind == RequestKind::kAlloc ? "num_tokens" : "seq_lens",
          request.index, request.seq_len, geometry_.usable_slots(),
          geometry_.num_pages, geometry_.page_size));
      continue;
    }
    const ExtendShape shape = ToExtendShape(request);
    if (keep_shapes) shapes[i] = shape;
    if (shape.num_slots() > 0 && request.destination == nullptr) {
      result.status = absl::InvalidArgumentError(absl::StrFormat(
          "%s request %d: no destination for its %d slots",
          RequestKindName(request.kind), request.index, shape.num_slots()));
      continue;
    }
    if (!kUnitPages &&
        ModNonNegative(shape.prefix_len, geometry.page_size) != 0 &&
        shape.num_slots() > 0) {
      // The request writes into the rest of last_loc's page: it must be the
      // caller's.
      result.status = CheckLastLocOwned(request, shape.last_loc);
      if (!result.status.ok()) continue;
    }
    pages_needed[i] = kUnitPages ? shape.num_slots()
                                 : NewPagesNeeded(shape, geometry.page_size);
    batch_pages += pages_needed[i];
  }
  return batch_pages;
}

absl::Status PagePool::MakeRoomForBatch(int64_t batch_pages) {
  // Once per launch, and only when the launch cannot fit otherwise: a merge
  // costs a sort of the free list. (Semantics::kSglang decides per call, in
  // AdmitAndPlan.)
  if (semantics_ == Semantics::kPagealloc && policy_ == FreePolicy::kSorted &&
      batch_pages > free_count_ && !parked_.empty()) {
    return MergeParkedAndSort(/*keep=*/0);
  }
  return absl::OkStatus();
}

absl::Status PagePool::MakeRoomForCall(
    absl::Span<const AllocRequest> requests) {
  if (semantics_ != Semantics::kSglang || policy_ != FreePolicy::kSorted ||
      parked_.empty() || requests.empty()) {
    return absl::OkStatus();
  }
  const int64_t ps = geometry_.page_size;
  const int64_t available = free_count_ - scratch_.plan.num_new_pages;
  // SGLang's figures count every request of its batch. Lengths are clamped
  // to the pool's slot range, which keeps the sums from overflowing and
  // leaves every comparison below as it was: a clamped request alone
  // exceeds the free pages.
  int64_t num_requests = requests.size();
  int64_t slots = 0;
  int64_t pages = 0;
  for (const AllocRequest& r : requests) {
    if (!IsValidShape(r, geometry_)) continue;
    ExtendShape shape = ToExtendShape(r);
    shape.seq_len = std::min(shape.seq_len, geometry_.slot_limit());
    shape.prefix_len = std::min(shape.prefix_len, shape.seq_len);
    slots += shape.num_slots();
    pages += NewPagesNeeded(shape, ps);
  }
  int64_t estimate = pages;  // alloc, and the token allocator (page_size 1)
  if (ps > 1 && requests.front().kind == RequestKind::kExtend) {
    estimate = slots / ps + num_requests + 1;
  } else if (ps > 1 && requests.front().kind == RequestKind::kDecode) {
    estimate = num_requests;
  }
  if (estimate <= available) return absl::OkStatus();
  return MergeParkedAndSort(/*keep=*/scratch_.plan.num_new_pages);
}

void PagePool::RefuseRestOfCall(absl::Span<const AllocRequest> requests,
                                absl::Span<AllocResult> results, size_t begin,
                                size_t end, size_t decider) {
  const absl::Status& why = results[decider].status;
  const absl::StatusCode code =
      why.code() == absl::StatusCode::kResourceExhausted
          ? absl::StatusCode::kResourceExhausted
          : absl::StatusCode::kAborted;
  for (size_t i = begin; i < end; ++i) {
    if (i == decider || !results[i].status.ok()) continue;
    results[i] = AllocResult{
        absl::Status(
            code, absl::StrFormat(
                      "%s request %d: refused with its all-or-nothing call: %s",
                      RequestKindName(requests[i].kind), requests[i].index,
                      why.message())),
        0, 0};
  }
}

bool PagePool::AdmitAndPlan(absl::Span<const AllocRequest> requests,
                            absl::Span<const CallSpan> calls,
                            absl::Span<AllocResult> results) {
  const std::vector<ExtendShape>& shapes = scratch_.shapes;
  const std::vector<int64_t>& pages_needed = scratch_.pages_needed;
  BatchPlan& plan = scratch_.plan;
  plan.page_size = geometry_.page_size;
  plan.free_ring_head = head_;
  plan.free_ring_capacity = capacity_;
  plan.num_new_pages = 0;
  plan.num_slots = 0;
  plan.requests.clear();
  plan.ring_copies.clear();
  plan.scrub_pages.clear();
  if (!ring_copies_) plan.requests.reserve(requests.size());
  std::vector<size_t>& admitted = scratch_.admitted;
  admitted.clear();
  admitted.reserve(requests.size());
  std::vector<BatchScratch::OwnerRun>& owner_runs = scratch_.owner_runs;
  owner_runs.clear();
  // With ring copies, where the plan stood when the current call began, so
  // that an all-or-nothing refusal can take the call's part back in O(1)
  // (a run may have grown across the call's start).
  struct RunMark {
    size_t copies = 0;
    int64_t last_copy_count = 0;
    size_t owner_runs = 0;
    int64_t last_owner_run_pages = 0;
  };
  RunMark call_mark;
  // The plan's running totals, kept in locals: stores through the plan's
  // fields were reloaded after every store to a result (they may alias, to
  // the compiler), a tenth of this loop by perf. MakeRoomForCall reads
  // plan.num_new_pages, so it is written back before each call.
  int64_t planned_pages = 0;
  int64_t planned_slots = 0;
  // With page_size 1 a request's slots are its new pages.
  const bool unit_pages = geometry_.page_size == 1;
  absl::flat_hash_map<OwnerId, int64_t>& batch_pages_by_owner =
      scratch_.pages_by_owner;
  batch_pages_by_owner.clear();
  // The current run's owner and its batch count (entries are only added
  // when the owner changes, so the pointers stay valid within a run).
  OwnerId run_owner = kNoOwner;
  const OwnerState* owner_state = nullptr;
  int64_t* owner_batch_pages_ptr = nullptr;
  size_t call_end = 0;
  size_t call_begin = 0;
  bool all_or_nothing = false;
  // Where the current call's pages to scrub begin in plan.scrub_pages.
  size_t call_scrub_begin = 0;
  size_t next_call = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    while (i == call_end) {
      // The next call begins (an empty call begins and ends here).
      call_begin = i;
      call_end = i + calls[next_call].num_requests;
      all_or_nothing = calls[next_call].all_or_nothing;
      call_scrub_begin = plan.scrub_pages.size();
      if (ring_copies_) {
        call_mark.copies = plan.ring_copies.size();
        call_mark.last_copy_count =
            plan.ring_copies.empty() ? 0 : plan.ring_copies.back().count;
        call_mark.owner_runs = owner_runs.size();
        call_mark.last_owner_run_pages =
            owner_runs.empty() ? 0 : owner_runs.back().pages;
      }
      ++next_call;
      plan.num_new_pages = planned_pages;
      const absl::Status room =
          MakeRoomForCall(requests.subspan(call_begin, call_end - call_begin));
      if (!room.ok()) {
        // The free list's mirror is broken: launch nothing.
        for (AllocResult& result : results) {
          if (result.status.ok()) result = AllocResult{room, 0, 0};
        }
        return false;
      }
      if (all_or_nothing) {
        // A request refused by validation decides for the whole call.
        for (size_t k = call_begin; k < call_end; ++k) {
          if (results[k].status.ok()) continue;
          RefuseRestOfCall(requests, results, call_begin, call_end, k);
          break;
        }
      }
    }
    AllocResult& result = results[i];
    if (!result.status.ok()) continue;
    const AllocRequest& request = requests[i];
    const int64_t available = free_count_ - planned_pages;
    if (request.owner != run_owner) {
      run_owner = request.owner;
      owner_state = &owners_.at(request.owner);
      owner_batch_pages_ptr = &batch_pages_by_owner[request.owner];
    }
    const OwnerState& owner = *owner_state;
    int64_t& owner_batch_pages = *owner_batch_pages_ptr;
    if (pages_needed[i] > available) {
      ++counters_.out_of_pages_refusals;
      result.status = absl::ResourceExhaustedError(absl::StrFormat(
          "%s request %d: out of pages: needs %d pages, %d free",
          RequestKindName(request.kind), request.index, pages_needed[i],
          available));
    } else if (owner.quota_pages > 0 &&
               owner.pages_owned + owner_batch_pages + pages_needed[i] >
                   owner.quota_pages) {
      ++counters_.quota_refusals;
      result.status = absl::ResourceExhaustedError(absl::StrFormat(
          "%s request %d: over quota: needs %d pages, owner %d holds %d of "
          "its %d",
          RequestKindName(request.kind), request.index, pages_needed[i],
          request.owner, owner.pages_owned + owner_batch_pages,
          owner.quota_pages));
    }
    if (!result.status.ok()) {
      if (all_or_nothing) {
        // Take back what the call's earlier requests were planned to get
        // (they are the plan's last entries), then refuse them all.
        while (!admitted.empty() && admitted.back() >= call_begin) {
          const size_t k = admitted.back();
          admitted.pop_back();
          if (!ring_copies_) plan.requests.pop_back();
          planned_pages -= pages_needed[k];
          planned_slots -= results[k].num_slots;
          batch_pages_by_owner[requests[k].owner] -= pages_needed[k];
          results[k].num_slots = 0;
          results[k].num_new_pages = 0;
        }
        plan.scrub_pages.resize(call_scrub_begin);
        if (ring_copies_) {
          plan.ring_copies.resize(call_mark.copies);
          if (!plan.ring_copies.empty()) {
            plan.ring_copies.back().count = call_mark.last_copy_count;
          }
          owner_runs.resize(call_mark.owner_runs);
          if (!owner_runs.empty()) {
            owner_runs.back().pages = call_mark.last_owner_run_pages;
          }
        }
        RefuseRestOfCall(requests, results, call_begin, call_end, i);
        i = call_end - 1;  // the loop's ++i starts the next call
        // The owner's running count may have changed: look it up again.
        run_owner = kNoOwner;
      }
      continue;
    }
    owner_batch_pages += pages_needed[i];
    if (ring_copies_) {
      // page_size 1: the request's slots are its pages, the next
      // pages_needed[i] ring entries. A request whose destination follows
      // the last run's end extends the run (a call's requests write one
      // contiguous range), as does its owner's run.
      const int64_t n = pages_needed[i];
      if (n > 0) {
        if (!plan.ring_copies.empty() &&
            plan.ring_copies.back().destination +
                    plan.ring_copies.back().count ==
                request.destination) {
          plan.ring_copies.back().count += n;
        } else {
          plan.ring_copies.push_back(
              RingCopy{planned_pages, n, request.destination});
        }
        if (!owner_runs.empty() && owner_runs.back().owner == request.owner) {
          owner_runs.back().pages += n;
        } else {
          owner_runs.push_back({request.owner, n});
        }
      }
    } else {
      // Fields written in place: building a temporary and copying it cost
      // a store-forwarding stall per request (a third of this loop, by
      // perf).
      PlannedRequest& planned = plan.requests.emplace_back();
      planned.prefix_len = shapes[i].prefix_len;
      planned.seq_len = shapes[i].seq_len;
      planned.last_loc = shapes[i].last_loc;
      planned.first_new_page = planned_pages;
      planned.output_offset = planned_slots;
      planned.destination = request.destination;
    }
    if (scrub_) {
      // The request's pages are the next ones at the free list's front.
      for (int64_t k = 0; k < pages_needed[i]; ++k) {
        const int64_t page = RingAt(planned_pages + k);
        const OwnerId last = last_owner_[page];
        if (last != kNoOwner && last != request.owner) {
          plan.scrub_pages.push_back(page);
        }
      }
    }
    const int64_t num_slots =
        unit_pages ? pages_needed[i] : shapes[i].num_slots();
    planned_pages += pages_needed[i];
    planned_slots += num_slots;
    result.num_slots = num_slots;
    result.num_new_pages = pages_needed[i];
    admitted.push_back(i);
  }
  plan.num_new_pages = planned_pages;
  plan.num_slots = planned_slots;
  return !admitted.empty();
}

bool PagePool::ExecutePlan(absl::Span<AllocResult> results) {
  const absl::Status executed = executor_->Execute(scratch_.plan);
  if (executed.ok()) return true;
  for (size_t i : scratch_.admitted) {
    results[i] = AllocResult{executed, 0, 0};
  }
  return false;
}

inline void PagePool::GivePages(OwnerId owner, OwnerState& state, int64_t count,
                                int64_t* position_in_out) {
  int64_t position = *position_in_out;
  const bool log = !state.checkpoints.empty();
  for (int64_t k = 0; k < count; ++k) {
    const int64_t page = ring_[position];
    owner_of_[page] = owner;
    allocated_once_[page] = true;
    if (log) LogGiven(state, page);
    if (scrub_) last_owner_[page] = owner;
    // The walk wraps by comparison: a modulo per page (the capacity is
    // seldom a power of two) cost more than the stores.
    if (++position == capacity_) position = 0;
  }
  *position_in_out = position;
  state.pages_owned += count;
  if (log) MaybeCompactLog(owner, state);
}

void PagePool::CommitPlan(absl::Span<const AllocRequest> requests) {
  const BatchPlan& plan = scratch_.plan;
  // The batch's pages leave the front of the free list, in admission order.
  int64_t position = head_;
  OwnerId commit_owner = kNoOwner;
  OwnerState* commit_state = nullptr;
  if (ring_copies_) {
    // Pages by runs of one owner: one owner lookup and one tight loop per
    // run, whatever the number of requests.
    for (const BatchScratch::OwnerRun& run : scratch_.owner_runs) {
      if (run.owner != commit_owner) {
        commit_owner = run.owner;
        commit_state = &owners_.at(commit_owner);
      }
      GivePages(run.owner, *commit_state, run.pages, &position);
    }
  } else {
    const std::vector<int64_t>& pages_needed = scratch_.pages_needed;
    for (size_t i : scratch_.admitted) {
      // Most decodes continue a page and take none.
      if (pages_needed[i] == 0) continue;
      if (requests[i].owner != commit_owner) {
        commit_owner = requests[i].owner;
        commit_state = &owners_.at(commit_owner);
      }
      GivePages(commit_owner, *commit_state, pages_needed[i], &position);
    }
  }
  head_ = position;
  free_count_ -= plan.num_new_pages;
  counters_.pages_allocated += plan.num_new_pages;
  counters_.slots_allocated += plan.num_slots;
  counters_.pages_scrubbed += plan.scrub_pages.size();
  ++counters_.batches_executed;
}

absl::Status PagePool::CheckLastLocOwned(const AllocRequest& request,
                                         int64_t last_loc) const {
  const int64_t page = DivNonNegative(last_loc, geometry_.page_size);
  const OwnerId actual = owner_of_[page];
  if (actual == request.owner) return absl::OkStatus();  // the hot path
  const std::string what = absl::StrFormat(
      "%s request %d: last_locs[%d] (%d)", RequestKindName(request.kind),
      request.index, request.index, last_loc);
  if (actual == kNoOwner) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: page %d %s", what, page, FreePageState(page)));
  }
  return absl::PermissionDeniedError(
      absl::StrFormat("%s: page %d belongs to another session", what, page));
}

absl::StatusOr<int64_t> PagePool::FreeSlots(OwnerId owner,
                                            absl::Span<const int64_t> slots,
                                            FreeOrder order) {
  absl::MutexLock lock(&mu_);
  return FreeDistinct(owner, slots, /*values_are_slots=*/true, order);
}

absl::StatusOr<int64_t> PagePool::FreePages(OwnerId owner,
                                            absl::Span<const int64_t> pages,
                                            FreeOrder order) {
  absl::MutexLock lock(&mu_);
  return FreeDistinct(owner, pages, /*values_are_slots=*/false, order);
}

absl::StatusOr<int64_t> PagePool::FreeDistinct(OwnerId owner,
                                               absl::Span<const int64_t> values,
                                               bool values_are_slots,
                                               FreeOrder order) {
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  const char* field = values_are_slots ? "slots" : "pages";
  const int64_t ps = geometry_.page_size;
  std::vector<int64_t> pages;
  pages.reserve(values_are_slots ? values.size() / ps + 1 : values.size());
  absl::flat_hash_set<int64_t> seen;
  seen.reserve(pages.capacity());
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t value = values[i];
    if (values_are_slots && (value < ps || value >= geometry_.slot_limit())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "slots[%d] (%d) is outside the usable slots [%d, %d)%s", i, value, ps,
          geometry_.slot_limit(),
          value >= 0 && value < ps ? " (page 0 is reserved)" : ""));
    }
    if (!values_are_slots && (value < 1 || value > geometry_.num_pages)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pages[%d] (%d) is outside the usable pages [1, %d]%s", i, value,
          geometry_.num_pages, value == 0 ? " (page 0 is reserved)" : ""));
    }
    const int64_t page = values_are_slots ? value / ps : value;
    if (!seen.insert(page).second) continue;
    const OwnerId actual = owner_of_[page];
    if (actual == kNoOwner) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s[%d] (%d): page %d %s%s", field, i, value, page,
          FreePageState(page), allocated_once_[page] ? " (double free)" : ""));
    }
    if (actual != owner) {
      return absl::PermissionDeniedError(
          absl::StrFormat("%s[%d] (%d): page %d belongs to another session",
                          field, i, value, page));
    }
    pages.push_back(page);
  }
  if (ResolveOrder(order, values_are_slots) == FreeOrder::kAscending) {
    std::sort(pages.begin(), pages.end());
  }
  RETURN_IF_ERROR(ReleasePages(it->second, pages));
  return static_cast<int64_t>(pages.size());
}

absl::Status PagePool::ReleasePages(OwnerState& state,
                                    absl::Span<const int64_t> pages) {
  for (int64_t page : pages) owner_of_[page] = kNoOwner;
  state.pages_owned -= pages.size();
  counters_.pages_freed += pages.size();
  if (policy_ == FreePolicy::kSorted) {
    parked_.insert(parked_.end(), pages.begin(), pages.end());
    return absl::OkStatus();
  }
  return FreesToBack() ? PushBack(pages) : PushFront(pages);
}

absl::StatusOr<uint64_t> PagePool::Checkpoint(OwnerId owner) {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  OwnerState& state = it->second;
  if (state.checkpoints.size() >= static_cast<size_t>(kMaxCheckpoints)) {
    // The oldest ends; its log entries go at the next compaction.
    state.checkpoints.erase(state.checkpoints.begin());
  }
  const uint64_t id = state.next_checkpoint_id++;
  state.checkpoints.push_back(CheckpointMark{id, state.given_log.size()});
  return id;
}

void PagePool::MaybeCompactLog(OwnerId owner, OwnerState& state) {
  std::vector<int64_t>& log = state.given_log;
  const size_t bound = 2 * static_cast<size_t>(state.pages_owned) +
                       4 * static_cast<size_t>(kMaxCheckpoints);
  if (log.size() <= bound) return;
  // Keep the live entries from the oldest checkpoint on, in order, and move
  // each checkpoint to the count of kept entries before its position.
  std::vector<int64_t> kept;
  kept.reserve(state.pages_owned);
  size_t mark = 0;
  for (size_t k = state.checkpoints.front().log_position; k <= log.size();
       ++k) {
    while (mark < state.checkpoints.size() &&
           state.checkpoints[mark].log_position == k) {
      state.checkpoints[mark++].log_position = kept.size();
    }
    if (k == log.size()) break;
    const int64_t page = log[k];
    if (owner_of_[page] == owner && log_index_[page] == k) {
      log_index_[page] = kept.size();
      kept.push_back(page);
    }
  }
  log = std::move(kept);
}

absl::StatusOr<int64_t> PagePool::Rollback(OwnerId owner,
                                           uint64_t checkpoint_id) {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  OwnerState& state = it->second;
  if (state.checkpoints.empty()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("owner %d has no checkpoint to roll back to", owner));
  }
  size_t target = state.checkpoints.size() - 1;
  if (checkpoint_id != 0) {
    while (target > 0 && state.checkpoints[target].id > checkpoint_id) {
      --target;
    }
    if (state.checkpoints[target].id != checkpoint_id) {
      if (checkpoint_id >= state.next_checkpoint_id) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "owner %d never took checkpoint %d (its latest is %d)", owner,
            checkpoint_id, state.next_checkpoint_id - 1));
      }
      return absl::FailedPreconditionError(absl::StrFormat(
          "checkpoint %d of owner %d has ended (rolled back past, ended by a "
          "rollback to the latest, by a clear, or the oldest beyond %d "
          "active checkpoints); its active checkpoints are %d..%d",
          checkpoint_id, owner, kMaxCheckpoints, state.checkpoints.front().id,
          state.checkpoints.back().id));
    }
  }
  const size_t position = state.checkpoints[target].log_position;
  // A page freed after the checkpoint stays freed (it may belong to someone
  // else by now); a page given twice is returned once, for its live give.
  std::vector<int64_t> pages;
  for (size_t k = position; k < state.given_log.size(); ++k) {
    const int64_t page = state.given_log[k];
    if (owner_of_[page] == owner && log_index_[page] == k) {
      pages.push_back(page);
    }
  }
  state.given_log.resize(position);
  state.checkpoints.resize(checkpoint_id == 0 ? target : target + 1);
  if (state.checkpoints.empty()) state.given_log.clear();
  for (int64_t page : pages) owner_of_[page] = kNoOwner;
  state.pages_owned -= pages.size();
  counters_.pages_freed += pages.size();
  // Back to the front regardless of policy: a rollback restores, it does
  // not free for later reuse.
  RETURN_IF_ERROR(PushFront(pages));
  return static_cast<int64_t>(pages.size());
}

absl::StatusOr<int64_t> PagePool::ClearOwner(OwnerId owner) {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  OwnerState& state = it->second;
  EndCheckpoints(state);
  const std::vector<int64_t> pages = PagesOf(owner, state.pages_owned);
  RETURN_IF_ERROR(ReleasePages(state, pages));
  if (free_count_ + static_cast<int64_t>(parked_.size()) == capacity_) {
    // Nobody holds a page: back to the pool's first state, as SGLang's
    // clear. Only the free list's order changes.
    RETURN_IF_ERROR(InitFreeList());
  }
  return static_cast<int64_t>(pages.size());
}

absl::StatusOr<int64_t> PagePool::ClearPool(bool force) {
  absl::MutexLock lock(&mu_);
  int64_t owned = 0;
  std::vector<std::pair<OwnerId, int64_t>> holders;
  for (const auto& [id, state] : owners_) {
    owned += state.pages_owned;
    if (state.pages_owned > 0) holders.emplace_back(id, state.pages_owned);
  }
  if (owned > 0 && !force) {
    std::sort(holders.begin(), holders.end());
    std::string who;
    for (const auto& [id, pages] : holders) {
      absl::StrAppendFormat(&who, "%s%d (%d pages)", who.empty() ? "" : ", ",
                            id, pages);
    }
    return absl::FailedPreconditionError(absl::StrFormat(
        "%d pages are owned, by owners %s; a clear of the whole pool would "
        "void their slots (force it, or clear each owner)",
        owned, who));
  }
  for (auto& [id, state] : owners_) {
    state.pages_owned = 0;
    EndCheckpoints(state);
  }
  counters_.pages_freed += owned;
  RETURN_IF_ERROR(InitFreeList());
  return owned;
}

PoolStats PagePool::Stats() const {
  absl::MutexLock lock(&mu_);
  PoolStats stats = counters_;
  stats.page_size = geometry_.page_size;
  stats.total_pages = geometry_.num_pages;
  stats.free_pages = free_count_;
  stats.parked_pages = parked_.size();
  stats.used_pages = geometry_.num_pages - free_count_ - parked_.size();
  for (const auto& [id, state] : owners_) {
    stats.owners[id] = OwnerStats{
        state.pages_owned, state.quota_pages, !state.checkpoints.empty(),
        static_cast<int64_t>(state.checkpoints.size())};
  }
  return stats;
}

std::vector<int64_t> PagePool::FreeList() const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> list(free_count_);
  for (int64_t i = 0; i < free_count_; ++i) list[i] = RingAt(i);
  return list;
}

std::vector<int64_t> PagePool::ParkedPages() const {
  absl::MutexLock lock(&mu_);
  return parked_;
}

FreeListsView PagePool::FreeLists(int64_t max_pages) const {
  absl::MutexLock lock(&mu_);
  FreeListsView view;
  view.free_count = free_count_;
  view.parked_count = parked_.size();
  const int64_t free_n = std::min(free_count_, std::max<int64_t>(max_pages, 0));
  view.free_pages.resize(free_n);
  for (int64_t i = 0; i < free_n; ++i) view.free_pages[i] = RingAt(i);
  const int64_t parked_n =
      std::min<int64_t>(parked_.size(), std::max<int64_t>(max_pages, 0));
  view.parked_pages.assign(parked_.begin(), parked_.begin() + parked_n);
  return view;
}

OwnerId PagePool::OwnerOf(int64_t page) const {
  absl::MutexLock lock(&mu_);
  return owner_of_[page];
}

OwnerId PagePool::LastOwnerOf(int64_t page) const {
  absl::MutexLock lock(&mu_);
  return scrub_ ? last_owner_[page] : kNoOwner;
}

absl::Status PagePool::CheckInvariants() {
  absl::MutexLock lock(&mu_);
  const int64_t n = geometry_.num_pages;
  std::vector<uint8_t> seen(n + 1, 0);
  auto check_free = [&](int64_t page, const char* where) -> absl::Status {
    mu_.AssertHeld();  // for the thread-safety analysis: lambdas start blank
    if (page < 1 || page > n) {
      return absl::InternalError(
          absl::StrFormat("%s holds page %d, outside [1, %d]", where, page, n));
    }
    if (seen[page]++) {
      return absl::InternalError(
          absl::StrFormat("page %d appears twice among free pages", page));
    }
    if (owner_of_[page] != kNoOwner) {
      return absl::InternalError(absl::StrFormat(
          "page %d is free and owned by %d", page, owner_of_[page]));
    }
    return absl::OkStatus();
  };
  for (int64_t i = 0; i < free_count_; ++i) {
    RETURN_IF_ERROR(check_free(RingAt(i), "the free list"));
  }
  for (int64_t page : parked_) RETURN_IF_ERROR(check_free(page, "parked"));
  absl::flat_hash_map<OwnerId, int64_t> counted;
  if (owner_of_[0] != kNoOwner) {
    return absl::InternalError("page 0 has an owner");
  }
  for (int64_t p = 1; p <= n; ++p) {
    if (seen[p]) continue;
    if (owner_of_[p] == kNoOwner) {
      return absl::InternalError(
          absl::StrFormat("page %d is neither free nor owned (lost)", p));
    }
    if (!owners_.contains(owner_of_[p])) {
      return absl::InternalError(absl::StrFormat(
          "page %d is owned by unregistered owner %d", p, owner_of_[p]));
    }
    ++counted[owner_of_[p]];
  }
  for (const auto& [id, state] : owners_) {
    const int64_t actual = counted.contains(id) ? counted[id] : 0;
    if (actual != state.pages_owned) {
      return absl::InternalError(
          absl::StrFormat("owner %d is counted %d pages but owns %d", id,
                          state.pages_owned, actual));
    }
  }
  RETURN_IF_ERROR(executor_->Synchronize());
  ASSIGN_OR_RETURN(std::vector<int64_t> mirror, executor_->ReadFreeRing());
  if (static_cast<int64_t>(mirror.size()) != capacity_) {
    return absl::InternalError(
        absl::StrFormat("executor ring has %d entries, pool ring %d",
                        mirror.size(), capacity_));
  }
  for (int64_t i = 0; i < free_count_; ++i) {
    const int64_t position = (head_ + i) % capacity_;
    if (mirror[position] != ring_[position]) {
      return absl::InternalError(absl::StrFormat(
          "executor mirror differs at free-list index %d (ring position %d): "
          "%d, pool has %d",
          i, position, mirror[position], ring_[position]));
    }
  }
  return absl::OkStatus();
}

}  // namespace pagealloc
