#include "allocator/page_pool.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "allocator/plan_expansion.h"
#include "common/status_macros.h"

namespace pagealloc {

PagePool::PagePool(const PoolOptions& options, PlanExecutor* executor)
    : geometry_{options.page_size, options.num_pages},
      policy_(options.free_policy, options.semantics, geometry_),
      scrub_(options.scrub),
      ring_copies_(options.page_size == 1 && options.ring_copy_plans),
      capacity_(options.num_pages),
      executor_(executor),
      max_pins_(options.max_pinned_pages_per_owner),
      sink_(options.kv_event_sink),
      change_log_(options.change_log),
      seen_stamp_(options.num_pages + 1, 0),
      index_(options.num_pages) {}

absl::Status PagePool::ValidateOptions(const PoolOptions& options,
                                       PlanExecutor* executor) {
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
  if (options.max_pinned_pages_per_owner < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_pinned_pages_per_owner (%d) is negative",
                        options.max_pinned_pages_per_owner));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::Create(
    const PoolOptions& options, PlanExecutor* executor) {
  RETURN_IF_ERROR(ValidateOptions(options, executor));
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

absl::Status PagePool::AddOwner(OwnerId owner, int64_t quota_pages,
                                std::string metadata) {
  absl::MutexLock lock(&mu_);
  if (change_log_ == nullptr) {
    return AddOwnerLocked(owner, quota_pages, std::move(metadata));
  }
  // The record points at the owner's own copy of the metadata.
  RETURN_IF_ERROR(AddOwnerLocked(owner, quota_pages, std::move(metadata)));
  PoolChange change;
  change.kind = PoolChangeKind::kAddOwner;
  change.owner = owner;
  change.quota_pages = quota_pages;
  change.metadata = owners_.find(owner)->second.metadata;
  LogChange(change);
  return absl::OkStatus();
}

absl::Status PagePool::AddOwnerLocked(OwnerId owner, int64_t quota_pages,
                                      std::string metadata) {
  if (owner == kNoOwner) {
    return absl::InvalidArgumentError("owner id 0 is reserved for free pages");
  }
  if (owner == kSharedOwner) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "owner id %d is reserved for shared prefix pages", owner));
  }
  if (quota_pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("quota_pages (%d) is negative", quota_pages));
  }
  if (metadata.size() > kMaxOwnerMetadataBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("owner metadata of %d bytes, over the %d allowed",
                        metadata.size(), kMaxOwnerMetadataBytes));
  }
  OwnerState state;
  state.quota_pages = quota_pages;
  state.metadata = std::move(metadata);
  if (!owners_.try_emplace(owner, std::move(state)).second) {
    return absl::AlreadyExistsError(
        absl::StrFormat("owner %d is already registered", owner));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PagePool::OwnerMetadata(OwnerId owner) const {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  return it->second.metadata;
}

absl::StatusOr<int64_t> PagePool::RemoveOwner(OwnerId owner) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const int64_t freed, RemoveOwnerLocked(owner));
  LogOwnerChange(PoolChangeKind::kRemoveOwner, owner);
  return freed;
}

absl::StatusOr<int64_t> PagePool::RemoveOwnerLocked(OwnerId owner) {
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  // Its references and pins go; the pages it published stay cached, for
  // its siblings and its successor.
  DropShared(it->second);
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
                        std::vector<AllocResult>* results_out,
                        Expansion expansion) {
  std::vector<AllocResult>& results = *results_out;
  results.clear();
  results.resize(requests.size());
  const absl::Span<AllocResult> result_span = absl::MakeSpan(results);

  const absl::Span<const CallSpan> given_calls = calls;
  const CallSpan whole_batch{static_cast<int64_t>(requests.size()), false, {}};
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
  const LaunchOutcome launch = AllocateLocked(requests, calls, result_span,
                                              /*replay=*/nullptr, expansion);
  if (change_log_ != nullptr) {
    // Every batch, refused requests and all: refusals count.
    PoolChange change;
    change.kind = PoolChangeKind::kAllocate;
    change.requests = requests;
    change.calls = given_calls;
    if (launch == LaunchOutcome::kFailed) {
      change.launch_failure = &scratch_.launch_status;
    }
    LogChange(change);
  }
}

PagePool::LaunchOutcome PagePool::AllocateLocked(
    absl::Span<const AllocRequest> requests, absl::Span<const CallSpan> calls,
    absl::Span<AllocResult> results, const ReplayedLaunch* replay,
    Expansion expansion) {
  bool tagged = false;
  for (const CallSpan& call : calls) tagged |= call.call.id != 0;
  scratch_.refused_calls.clear();
  if (ABSL_PREDICT_FALSE(tagged)) BeginTaggedCalls(requests, calls, results);
  const int64_t batch_pages = ValidateRequests(requests, results);
  const absl::Status room = MakeRoomForBatch(batch_pages);
  if (!room.ok()) {
    for (AllocResult& result : results) {
      if (result.status.ok()) result.status = room;
    }
    return LaunchOutcome::kNone;
  }
  if (!AdmitAndPlan(requests, calls, results)) return LaunchOutcome::kNone;
  if (!ExecutePlan(results, replay, expansion)) return LaunchOutcome::kFailed;
  const int64_t first = head_;
  CommitPlan(requests);
  if (ABSL_PREDICT_FALSE(tagged)) {
    EndTaggedCalls(requests, calls, results, first);
  }
  return LaunchOutcome::kRan;
}

absl::StatusOr<const PoolKeptCall*> PagePool::RetriedLocked(
    OwnerId owner, CallTag call, CallPart part) const {
  const auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  if (!call.retry || call.id == 0) return nullptr;
  // Every tagged call that took effect with an id above the oldest kept
  // one is kept (the oldest goes first): one of those not kept never took
  // effect, and runs.
  const std::vector<PoolKeptCall>& kept = it->second.kept_calls;
  for (const PoolKeptCall& entry : kept) {
    if (entry.id == call.id)
      return (entry.parts & part) != 0 ? &entry : nullptr;
  }
  if (kept.size() < kKeptCallsPerOwner || call.id > kept.front().id) {
    return nullptr;
  }
  return absl::AbortedError(absl::StrFormat(
      "call %d was sent again after the daemon restarted, but the session's "
      "%d later calls %d..%d took effect before the restart: whether call "
      "%d did is unknown (ListPages gives the session's pages)",
      call.id, kept.size(), kept.front().id, kept.back().id, call.id));
}

absl::StatusOr<std::optional<PoolKeptCall>> PagePool::RetriedCall(
    OwnerId owner, CallTag call, CallPart part) const {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const PoolKeptCall* kept, RetriedLocked(owner, call, part));
  if (kept == nullptr) return std::nullopt;
  return *kept;
}

absl::StatusOr<uint64_t> PagePool::LastCallId(OwnerId owner) const {
  absl::MutexLock lock(&mu_);
  const auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  const std::vector<PoolKeptCall>& kept = it->second.kept_calls;
  return kept.empty() ? 0 : kept.back().id;
}

PoolKeptCall* PagePool::NoteCall(OwnerId owner, CallTag call, CallPart part) {
  if (call.id == 0) return nullptr;
  const auto it = owners_.find(owner);
  if (it == owners_.end()) return nullptr;
  std::vector<PoolKeptCall>& kept = it->second.kept_calls;
  uint64_t order = 0;
  for (const PoolKeptCall& entry : kept) order = std::max(order, entry.order);
  ++order;
  // Ascending ids: the common call is the newest, at the back.
  auto at = kept.end();
  while (at != kept.begin() && (at - 1)->id >= call.id) --at;
  if (at != kept.end() && at->id == call.id) {
    at->parts |= part;
    at->order = order;
    return &*at;
  }
  if (kept.size() == kKeptCallsPerOwner) {
    // Older than every kept call: not kept (a retry of it is refused).
    if (at == kept.begin()) return nullptr;
    // The oldest goes; its entry, pages' storage and all, is reused (every
    // call of a client is tagged: no allocation per call).
    std::rotate(kept.begin(), kept.begin() + 1, at);
    --at;
  } else {
    at = kept.insert(at, PoolKeptCall{});
  }
  at->id = call.id;
  at->parts = part;
  at->order = order;
  at->freed = 0;
  at->checkpoint_id = 0;
  at->returned = 0;
  at->pages.clear();
  return &*at;
}

void PagePool::BeginTaggedCalls(absl::Span<const AllocRequest> requests,
                                absl::Span<const CallSpan> calls,
                                absl::Span<AllocResult> results) {
  scratch_.refused_calls.assign(calls.size(), 0);
  size_t begin = 0;
  for (size_t c = 0; c < calls.size(); ++c) {
    const CallSpan& call = calls[c];
    const size_t end = begin + call.num_requests;
    const CallTag tag = call.call;
    absl::Status refused;
    if (tag.id != 0 && end > begin) {
      const OwnerId owner = requests[begin].owner;
      for (size_t i = begin + 1; i < end && refused.ok(); ++i) {
        if (requests[i].owner != owner) {
          refused = absl::InvalidArgumentError(
              "a tagged call's requests have more than one owner");
        }
      }
      absl::StatusOr<const PoolKeptCall*> kept =
          refused.ok() ? RetriedLocked(owner, tag, kCallAllocate)
                       : absl::StatusOr<const PoolKeptCall*>(nullptr);
      if (!kept.ok()) {
        // An unknown owner is validation's to refuse, request by request.
        if (!absl::IsNotFound(kept.status())) refused = kept.status();
      } else if (*kept != nullptr) {
        // The call's allocation took effect and its answer was lost: give
        // its pages back (to the front, in order: the free list as it was
        // when it ran, unless others have run since), then run it again.
        OwnerState& state = owners_.find(owner)->second;
        PoolKeptCall& last = *std::find_if(
            state.kept_calls.begin(), state.kept_calls.end(),
            [&](const PoolKeptCall& entry) { return entry.id == tag.id; });
        // Its pages must be the owner's still, none awaiting release and
        // none taken again by a kept call that took effect after it (a
        // clear or a rollback in between gave them back). A call that
        // took effect before it may list some of them: freed, and given
        // to this one since.
        const uint32_t epoch = NewSeenEpoch();
        for (int64_t page : state.awaiting_release) seen_stamp_[page] = epoch;
        for (const PoolKeptCall& other : state.kept_calls) {
          if (other.order <= last.order) continue;
          for (int64_t page : other.pages) seen_stamp_[page] = epoch;
        }
        if ((last.parts & kCallPagesMoved) != 0 && !last.pages.empty()) {
          refused = absl::AbortedError(absl::StrFormat(
              "call %d was sent again after the daemon restarted; it had "
              "taken effect, but more of the session's calls were in flight "
              "than the daemon keeps: whether it may run again is unknown "
              "(ListPages gives the session's pages)",
              tag.id));
        }
        for (size_t k = 0; refused.ok() && k < last.pages.size(); ++k) {
          const int64_t page = last.pages[k];
          if (owner_of_[page] != owner || seen_stamp_[page] == epoch) {
            refused = absl::AbortedError(absl::StrFormat(
                "call %d was sent again after the daemon restarted; it had "
                "taken effect, but page %d it took is no longer the "
                "session's to give back: whether the call may run again is "
                "unknown (ListPages gives the session's pages)",
                tag.id, page));
          }
          seen_stamp_[page] = epoch;
        }
        if (refused.ok()) {
          for (int64_t page : last.pages) owner_of_[page] = kNoOwner;
          state.pages_owned -= last.pages.size();
          counters_.pages_freed += last.pages.size();
          const absl::Status pushed = PushFront(last.pages);
          last.pages.clear();
          last.parts &= ~kCallAllocate;
          if (!pushed.ok()) refused = pushed;
        }
      }
    }
    if (!refused.ok()) {
      for (size_t i = begin; i < end; ++i) results[i].status = refused;
      scratch_.refused_calls[c] = 1;
    }
    begin = end;
  }
}

void PagePool::EndTaggedCalls(absl::Span<const AllocRequest> requests,
                              absl::Span<const CallSpan> calls,
                              absl::Span<const AllocResult> results,
                              int64_t first) {
  // The batch's pages left the front of the free list in request order.
  int64_t position = first;
  size_t begin = 0;
  for (const CallSpan& call : calls) {
    const size_t end = begin + call.num_requests;
    // A refused request took no page (num_new_pages 0).
    bool given = false;
    int64_t taken = 0;
    for (size_t i = begin; i < end; ++i) {
      given |= results[i].status.ok();
      taken += results[i].num_new_pages;
    }
    PoolKeptCall* last =
        given ? NoteCall(requests[begin].owner, call.call, kCallAllocate)
              : nullptr;
    if (last != nullptr) {
      // Its pages are the ones it takes now.
      last->pages.clear();
      last->parts &= ~kCallPagesMoved;
    }
    if (given && last == nullptr && call.call.id != 0) {
      // Not kept: its pages may be ones a kept call gave and lost (a
      // clear in between); no kept allocation may give its pages back.
      for (PoolKeptCall& kept :
           owners_.find(requests[begin].owner)->second.kept_calls) {
        if ((kept.parts & kCallAllocate) != 0) kept.parts |= kCallPagesMoved;
      }
    }
    // The call's pages are one run of the ring, in two parts when it wraps
    // around the ring's end: copied whole (a decode call of thousands of
    // one-page requests would otherwise append page by page).
    const int64_t before_end = std::min(taken, capacity_ - position);
    if (last != nullptr) {
      last->pages.assign(ring_.begin() + position,
                         ring_.begin() + position + before_end);
      last->pages.insert(last->pages.end(), ring_.begin(),
                         ring_.begin() + (taken - before_end));
    }
    position += taken;
    if (position >= capacity_) position -= capacity_;
    begin = end;
  }
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
  // known_owner starts as kNoOwner, which is never registered, so a request
  // of owner kNoOwner is refused outright rather than taken as known
  // (admission would then find no state for it).
  OwnerId known_owner = kNoOwner;
  for (size_t i = 0; i < requests.size(); ++i) {
    const AllocRequest& request = requests[i];
    AllocResult& result = results[i];
    // Refused before validation (a tagged call's retry).
    if (ABSL_PREDICT_FALSE(!result.status.ok())) continue;
    if (!IsValidShape(request, geometry)) {
      result.status = ValidateShape(request, geometry_);  // never OK here
      continue;
    }
    if (request.owner == kNoOwner ||
        (request.owner != known_owner && !owners_.contains(request.owner))) {
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
  if (policy_.MergeBeforeBatch(batch_pages, free_count_, parked_.size())) {
    RETURN_IF_ERROR(MergeParkedAndSort(/*keep=*/0));
  }
  // One eviction decision per launch: the shortfall of the accepted
  // requests together, before admission, so that admission itself only
  // ever sees free pages. A launch some of whose requests are then refused
  // (quota, all-or-nothing) may have evicted a little more than it took;
  // those pages are free, not lost.
  const int64_t shortfall =
      batch_pages - free_count_ - static_cast<int64_t>(parked_.size());
  if (shortfall > 0 && index_.Counts().evictable_pages > 0) {
    ASSIGN_OR_RETURN(const int64_t evicted, Evict(shortfall));
    counters_.prefix_evicted_for_allocation += evicted;
  }
  return absl::OkStatus();
}

absl::Status PagePool::MakeRoomForCall(absl::Span<const AllocRequest> call,
                                       int64_t planned_pages) {
  if (policy_.MergeBeforeCall(call, free_count_ - planned_pages,
                              parked_.size())) {
    // The pages the earlier calls take stay where they are.
    return MergeParkedAndSort(/*keep=*/planned_pages);
  }
  return absl::OkStatus();
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

// The owner of the current run of requests, for admission: its state and
// its pages planned so far in this batch. A call's requests share an owner,
// so the two lookups happen once per run; entries of pages_by_owner are only
// added when the owner changes, so the pointer stays valid within a run.
struct PagePool::OwnerCursor {
  OwnerId owner = kNoOwner;
  const OwnerState* state = nullptr;
  int64_t* batch_pages = nullptr;
};

namespace {

// Refusal messages, out of the admission loop's way.
ABSL_ATTRIBUTE_NOINLINE absl::Status OutOfPagesError(
    const AllocRequest& request, int64_t pages, int64_t available) {
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s request %d: out of pages: needs %d pages, %d free",
      RequestKindName(request.kind), request.index, pages, available));
}

ABSL_ATTRIBUTE_NOINLINE absl::Status OverQuotaError(const AllocRequest& request,
                                                    int64_t pages, int64_t held,
                                                    int64_t quota_pages) {
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s request %d: over quota: needs %d pages, owner %d holds %d of its %d",
      RequestKindName(request.kind), request.index, pages, request.owner, held,
      quota_pages));
}

}  // namespace

// AdmitCall, AdmitRequest and PlanScrub are always inlined into
// AdmitAndPlan, so that its PlanBuilder stays on its stack and its totals in
// registers (plan_builder.h says why that matters).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void PagePool::PlanScrub(
    OwnerId owner, int64_t pages, PlanBuilder& builder) {
  // The request's pages are the next ones at the free list's front.
  const int64_t first = builder.planned_pages();
  for (int64_t k = 0; k < pages; ++k) {
    const int64_t page = RingAt(first + k);
    const OwnerId last = last_owner_[page];
    if (last != kNoOwner && last != owner) builder.AddScrubPage(page);
  }
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool PagePool::AdmitRequest(
    size_t index, const AllocRequest& request, AllocResult& result,
    PlanBuilder& builder, OwnerCursor& cursor) {
  const int64_t pages = scratch_.pages_needed[index];
  const int64_t available = free_count_ - builder.planned_pages();
  if (request.owner != cursor.owner) {
    cursor.owner = request.owner;
    cursor.state = &owners_.at(request.owner);
    cursor.batch_pages = &scratch_.pages_by_owner[request.owner];
  }
  if (pages > available) {
    ++counters_.out_of_pages_refusals;
    result.status = OutOfPagesError(request, pages, available);
    return false;
  }
  const OwnerState& owner = *cursor.state;
  const int64_t held = owner.pages_owned +
                       static_cast<int64_t>(owner.refs.size()) +
                       *cursor.batch_pages;
  if (owner.quota_pages > 0 && held + pages > owner.quota_pages) {
    ++counters_.quota_refusals;
    result.status = OverQuotaError(request, pages, held, owner.quota_pages);
    return false;
  }
  *cursor.batch_pages += pages;
  if (scrub_) PlanScrub(request.owner, pages, builder);
  result.num_slots = ring_copies_
                         ? builder.AddRingCopy(index, request.owner,
                                               request.destination, pages)
                         : builder.AddRequest(index, scratch_.shapes[index],
                                              request.destination, pages);
  result.num_new_pages = pages;
  return true;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool PagePool::AdmitCall(
    absl::Span<const AllocRequest> requests, size_t begin, size_t end,
    bool all_or_nothing, PlanBuilder& builder, OwnerCursor& cursor,
    absl::Span<AllocResult> results) {
  builder.BeginCall();
  const absl::Status room = MakeRoomForCall(
      requests.subspan(begin, end - begin), builder.planned_pages());
  if (!room.ok()) {
    // The free list's mirror is broken: launch nothing.
    for (AllocResult& result : results) {
      if (result.status.ok()) result = AllocResult{room, 0, 0};
    }
    return false;
  }
  if (all_or_nothing) {
    // A request refused by validation decides for the whole call.
    for (size_t k = begin; k < end; ++k) {
      if (results[k].status.ok()) continue;
      RefuseRestOfCall(requests, results, begin, end, k);
      return true;
    }
  }
  for (size_t i = begin; i < end; ++i) {
    if (!results[i].status.ok()) continue;
    if (AdmitRequest(i, requests[i], results[i], builder, cursor) ||
        !all_or_nothing) {
      continue;
    }
    // Take back what the call's earlier requests were planned to get (they
    // are the plan's last entries), then refuse them all.
    for (size_t k : builder.call_admitted()) {
      scratch_.pages_by_owner[requests[k].owner] -= scratch_.pages_needed[k];
      results[k].num_slots = 0;
      results[k].num_new_pages = 0;
    }
    builder.TakeBackCall();
    RefuseRestOfCall(requests, results, begin, end, i);
    // The owner's running count has changed: look it up again.
    cursor = OwnerCursor{};
    return true;
  }
  return true;
}

bool PagePool::AdmitAndPlan(absl::Span<const AllocRequest> requests,
                            absl::Span<const CallSpan> calls,
                            absl::Span<AllocResult> results) {
  PlanBuilder builder(&scratch_.plan_storage, geometry_.page_size, head_,
                      capacity_, ring_copies_, requests.size());
  scratch_.pages_by_owner.clear();
  OwnerCursor cursor;
  const std::vector<uint8_t>& refused_calls = scratch_.refused_calls;
  size_t begin = 0;
  for (size_t c = 0; c < calls.size(); ++c) {
    const CallSpan& call = calls[c];
    const size_t end = begin + call.num_requests;
    if (!refused_calls.empty() && refused_calls[c]) {
      begin = end;
      continue;
    }
    if (!AdmitCall(requests, begin, end, call.all_or_nothing, builder, cursor,
                   results)) {
      return false;
    }
    begin = end;
  }
  builder.Finish();
  return !builder.empty();
}

bool PagePool::ExecutePlan(absl::Span<AllocResult> results,
                           const ReplayedLaunch* replay, Expansion expansion) {
  const PlanStorage& storage = scratch_.plan_storage;
  absl::Status& executed = scratch_.launch_status;
  if (replay == nullptr) {
    if (expansion == Expansion::kExecutor) {
      executed = executor_->Execute(storage.plan);
    } else if (!storage.plan.scrub_pages.empty()) {
      // Handed out unzeroed, another owner's KV would be readable.
      executed = absl::FailedPreconditionError(
          "the batch has pages to scrub, which only the executor can zero: "
          "it cannot be expanded by the pool");
    } else {
      // The executor's ring mirrors ring_ (the class invariant), so the
      // slots are those its launch would write.
      ExpandPlan(storage.plan, ring_.data());
      executed = absl::OkStatus();
    }
  } else {
    // A replayed batch writes no slots: its destinations are not recorded.
    executed = replay->failure == nullptr ? absl::OkStatus() : *replay->failure;
  }
  if (executed.ok()) return true;
  for (size_t i : storage.admitted) {
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
  const PlanStorage& storage = scratch_.plan_storage;
  const BatchPlan& plan = storage.plan;
  // The batch's pages leave the front of the free list, in admission order.
  int64_t position = head_;
  OwnerId commit_owner = kNoOwner;
  OwnerState* commit_state = nullptr;
  if (ring_copies_) {
    // Pages by runs of one owner: one owner lookup and one tight loop per
    // run, whatever the number of requests.
    for (const OwnerRun& run : storage.owner_runs) {
      if (run.owner != commit_owner) {
        commit_owner = run.owner;
        commit_state = &owners_.at(commit_owner);
      }
      GivePages(run.owner, *commit_state, run.pages, &position);
    }
  } else {
    const std::vector<int64_t>& pages_needed = scratch_.pages_needed;
    for (size_t i : storage.admitted) {
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
  if (actual == kSharedOwner) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s: page %d is a shared prefix page, read-only (copy it into a page "
        "of the session's own first)",
        what, page));
  }
  return absl::PermissionDeniedError(
      absl::StrFormat("%s: page %d belongs to another session", what, page));
}

absl::StatusOr<int64_t> PagePool::FreeSlots(OwnerId owner,
                                            absl::Span<const int64_t> slots,
                                            FreeOrder order, CallTag call) {
  absl::MutexLock lock(&mu_);
  return FreeDistinct(owner, slots, /*values_are_slots=*/true, order, call);
}

absl::StatusOr<int64_t> PagePool::FreePages(OwnerId owner,
                                            absl::Span<const int64_t> pages,
                                            FreeOrder order, CallTag call) {
  absl::MutexLock lock(&mu_);
  return FreeDistinct(owner, pages, /*values_are_slots=*/false, order, call);
}

absl::StatusOr<std::vector<int64_t>> PagePool::CheckFree(
    OwnerId owner, absl::Span<const int64_t> values, bool values_are_slots,
    FreeOrder order) const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> shared;
  ASSIGN_OR_RETURN(
      std::vector<int64_t> pages,
      ResolveFree(owner, values, values_are_slots, order, &shared));
  pages.insert(pages.end(), shared.begin(), shared.end());
  return pages;
}

absl::StatusOr<int64_t> PagePool::FreeDistinct(OwnerId owner,
                                               absl::Span<const int64_t> values,
                                               bool values_are_slots,
                                               FreeOrder order, CallTag call) {
  if (ABSL_PREDICT_FALSE(call.retry)) {
    ASSIGN_OR_RETURN(const PoolKeptCall* kept,
                     RetriedLocked(owner, call, kCallFree));
    if (kept != nullptr) return kept->freed;
  }
  std::vector<int64_t> shared;
  ASSIGN_OR_RETURN(
      const std::vector<int64_t> pages,
      ResolveFree(owner, values, values_are_slots, order, &shared));
  RETURN_IF_ERROR(ApplyFree(owners_.find(owner)->second, pages, shared));
  const int64_t freed = static_cast<int64_t>(pages.size() + shared.size());
  if (PoolKeptCall* last = NoteCall(owner, call, kCallFree)) {
    last->freed = freed;
  }
  if (change_log_ != nullptr) {
    PoolChange change;
    change.kind = PoolChangeKind::kFree;
    change.owner = owner;
    change.pages = pages;
    change.shared_pages = shared;
    change.call = call;
    LogChange(change);
  }
  return freed;
}

absl::Status PagePool::ApplyFree(OwnerState& state,
                                 absl::Span<const int64_t> pages,
                                 absl::Span<const int64_t> shared) {
  ReleaseRefs(state, shared);
  return ReleasePages(state, pages);
}

absl::StatusOr<std::vector<int64_t>> PagePool::ResolveFree(
    OwnerId owner, absl::Span<const int64_t> values, bool values_are_slots,
    FreeOrder order, std::vector<int64_t>* shared) const {
  const auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  const char* field = values_are_slots ? "slots" : "pages";
  const int64_t ps = geometry_.page_size;
  const size_t most_pages =
      values_are_slots ? values.size() / ps + 1 : values.size();
  std::vector<int64_t> pages;
  pages.reserve(most_pages);
  const uint32_t seen = NewSeenEpoch();
  // Shared pages among them: the free drops the owner's reference.
  shared->clear();
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
    if (seen_stamp_[page] == seen) continue;
    seen_stamp_[page] = seen;
    const OwnerId actual = owner_of_[page];
    if (actual == kNoOwner) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s[%d] (%d): page %d %s%s", field, i, value, page,
          FreePageState(page), allocated_once_[page] ? " (double free)" : ""));
    }
    if (actual == kSharedOwner) {
      if (!it->second.refs.contains(page)) {
        return absl::PermissionDeniedError(absl::StrFormat(
            "%s[%d] (%d): page %d is a shared prefix page the session holds "
            "no reference on",
            field, i, value, page));
      }
      // Sized at the first shared page, so that a free of owned pages
      // alone (every decode step's) allocates nothing more.
      if (shared->capacity() == 0) shared->reserve(most_pages);
      shared->push_back(page);
      continue;
    }
    if (actual != owner) {
      return absl::PermissionDeniedError(
          absl::StrFormat("%s[%d] (%d): page %d belongs to another session",
                          field, i, value, page));
    }
    pages.push_back(page);
  }
  if (policy_.ResolveOrder(order, values_are_slots) == FreeOrder::kAscending) {
    std::sort(pages.begin(), pages.end());
  }
  return pages;
}

uint32_t PagePool::NewSeenEpoch() const {
  if (++seen_epoch_ == 0) {
    std::fill(seen_stamp_.begin(), seen_stamp_.end(), 0);
    seen_epoch_ = 1;
  }
  return seen_epoch_;
}

absl::Status PagePool::ReleasePages(OwnerState& state,
                                    absl::Span<const int64_t> pages) {
  EndAwait(state, pages);
  for (int64_t page : pages) owner_of_[page] = kNoOwner;
  state.pages_owned -= pages.size();
  counters_.pages_freed += pages.size();
  switch (policy_.release_target()) {
    case ReleaseTarget::kPark:
      parked_.insert(parked_.end(), pages.begin(), pages.end());
      return absl::OkStatus();
    case ReleaseTarget::kBack:
      return PushBack(pages);
    case ReleaseTarget::kFront:
      break;
  }
  return PushFront(pages);
}

template <typename T, typename Run>
absl::StatusOr<T> PagePool::RunTagged(OwnerId owner, CallTag call,
                                      CallPart part, T PoolKeptCall::*answer,
                                      PoolChange change, Run run) {
  ASSIGN_OR_RETURN(const PoolKeptCall* kept, RetriedLocked(owner, call, part));
  if (kept != nullptr) return kept->*answer;
  ASSIGN_OR_RETURN(const T value, run());
  if (PoolKeptCall* last = NoteCall(owner, call, part)) last->*answer = value;
  if (change_log_ != nullptr) {
    change.owner = owner;
    change.call = call;
    LogChange(change);
  }
  return value;
}

absl::StatusOr<uint64_t> PagePool::Checkpoint(OwnerId owner, CallTag call) {
  absl::MutexLock lock(&mu_);
  PoolChange change;
  change.kind = PoolChangeKind::kCheckpoint;
  return RunTagged(owner, call, kCallCheckpoint, &PoolKeptCall::checkpoint_id,
                   change, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                     return CheckpointLocked(owner);
                   });
}

absl::StatusOr<uint64_t> PagePool::CheckpointLocked(OwnerId owner) {
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
                                           uint64_t checkpoint_id,
                                           CallTag call) {
  absl::MutexLock lock(&mu_);
  PoolChange change;
  change.kind = PoolChangeKind::kRollback;
  change.checkpoint_id = checkpoint_id;
  return RunTagged(owner, call, kCallRollback, &PoolKeptCall::returned, change,
                   [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                     return RollbackLocked(owner, checkpoint_id);
                   });
}

absl::StatusOr<int64_t> PagePool::RollbackLocked(OwnerId owner,
                                                 uint64_t checkpoint_id) {
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
  EndAwait(state, pages);
  for (int64_t page : pages) owner_of_[page] = kNoOwner;
  state.pages_owned -= pages.size();
  counters_.pages_freed += pages.size();
  // Back to the front regardless of policy: a rollback restores, it does
  // not free for later reuse.
  RETURN_IF_ERROR(PushFront(pages));
  return static_cast<int64_t>(pages.size());
}

absl::StatusOr<int64_t> PagePool::ClearOwner(OwnerId owner, CallTag call) {
  absl::MutexLock lock(&mu_);
  PoolChange change;
  change.kind = PoolChangeKind::kClearOwner;
  return RunTagged(owner, call, kCallClear, &PoolKeptCall::returned, change,
                   [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                     return ClearOwnerLocked(owner);
                   });
}

absl::StatusOr<int64_t> PagePool::ClearOwnerLocked(OwnerId owner) {
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  OwnerState& state = it->second;
  EndCheckpoints(state);
  DropShared(state);
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
  ASSIGN_OR_RETURN(const int64_t owned, ClearPoolLocked(force));
  if (change_log_ != nullptr) {
    PoolChange change;
    change.kind = PoolChangeKind::kClearPool;
    change.force = force;
    LogChange(change);
  }
  return owned;
}

absl::StatusOr<int64_t> PagePool::ClearPoolLocked(bool force) {
  int64_t owned = 0;
  std::vector<std::pair<OwnerId, int64_t>> holders;
  for (const auto& [id, state] : owners_) {
    const int64_t held = state.pages_owned + state.refs.size();
    owned += held;
    if (held > 0) holders.emplace_back(id, held);
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
    state.awaiting_release.clear();
    state.refs.Clear();
    state.pins.clear();
    EndCheckpoints(state);
  }
  counters_.pages_freed += owned;
  if (index_.size() > 0) {
    counters_.prefix_cleared += index_.size();
    index_.Clear();
    if (sink_ != nullptr) sink_->AllBlocksCleared();
  }
  RETURN_IF_ERROR(InitFreeList());
  return owned;
}

absl::Status PagePool::CheckChainLength(size_t num_keys) const {
  if (static_cast<int64_t>(num_keys) <= geometry_.num_pages) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("keys has %d keys, more than the pool's %d pages",
                      num_keys, geometry_.num_pages));
}

absl::StatusOr<PublishOutcome> PagePool::Publish(
    OwnerId owner, absl::Span<const int64_t> pages,
    absl::Span<const PrefixKey> keys, const PrefixKey* parent_key, bool pin) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(PublishOutcome outcome,
                   PublishLocked(owner, pages, keys, parent_key, pin));
  if (change_log_ != nullptr) {
    PoolChange change;
    change.kind = PoolChangeKind::kPublish;
    change.owner = owner;
    change.pages = pages;
    change.keys = keys;
    change.parent_key = parent_key;
    change.pin = pin;
    LogChange(change);
  }
  return outcome;
}

absl::StatusOr<PublishOutcome> PagePool::PublishLocked(
    OwnerId owner, absl::Span<const int64_t> pages,
    absl::Span<const PrefixKey> keys, const PrefixKey* parent_key, bool pin) {
  if (pages.size() != keys.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d pages and %d keys: one key per page", pages.size(), keys.size()));
  }
  RETURN_IF_ERROR(CheckChainLength(keys.size()));
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  OwnerState& state = it->second;
  // Validate everything first: a refused publish changes nothing.
  PublishOutcome outcome;
  outcome.pages.resize(keys.size());
  outcome.existing.resize(keys.size());
  PrefixKeyMap<size_t> key_seen;
  absl::flat_hash_map<int64_t, size_t> page_seen;
  key_seen.reserve(keys.size());
  page_seen.reserve(keys.size());
  int64_t new_pins = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const int64_t page = pages[i];
    if (page < 1 || page > geometry_.num_pages) {
      return absl::InvalidArgumentError(
          absl::StrFormat("pages[%d] (%d) is outside the usable pages [1, %d]",
                          i, page, geometry_.num_pages));
    }
    if (const auto [k, fresh] = key_seen.try_emplace(keys[i], i); !fresh) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "keys[%d] repeats keys[%d]: a chain's keys are distinct", i,
          k->second));
    }
    if (const auto [k, fresh] = page_seen.try_emplace(page, i); !fresh) {
      return absl::InvalidArgumentError(
          absl::StrFormat("pages[%d] (%d) repeats pages[%d]: one page per key",
                          i, page, k->second));
    }
    const int64_t existing = index_.Find(keys[i]);
    outcome.existing[i] = existing != 0;
    outcome.pages[i] = existing != 0 ? existing : page;
    if (pin && !state.pins.contains(outcome.pages[i])) ++new_pins;
    if (existing != 0) continue;
    const OwnerId actual = owner_of_[page];
    if (actual == owner) continue;
    if (actual == kNoOwner) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "pages[%d] (%d): page %d %s; a session publishes pages it owns", i,
          page, page, FreePageState(page)));
    }
    if (actual == kSharedOwner) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "pages[%d] (%d) is already shared under another key; a page is "
          "published once",
          i, page));
    }
    return absl::PermissionDeniedError(absl::StrFormat(
        "pages[%d] (%d): page %d belongs to another session", i, page, page));
  }
  if (pin && static_cast<int64_t>(state.pins.size()) + new_pins > max_pins_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "pinning %d more pages would put owner %d at %d pinned pages, over "
        "its bound of %d",
        new_pins, owner, state.pins.size() + new_pins, max_pins_));
  }
  // Commit. Runs of new keys go to the sink as one BlocksStored each.
  StoredBlocks stored;
  auto flush = [&] {
    if (sink_ != nullptr && !stored.keys.empty()) sink_->BlocksStored(stored);
    stored.keys.clear();
  };
  for (size_t i = 0; i < keys.size(); ++i) {
    const PrefixKey* parent = i == 0 ? parent_key : &keys[i - 1];
    const int64_t page = outcome.pages[i];
    if (!outcome.existing[i]) {
      owner_of_[page] = kSharedOwner;
      --state.pages_owned;
      state.refs.Add(page);
      index_.Insert(page, keys[i], parent);
      ++outcome.newly_published;
      if (sink_ != nullptr) {
        if (stored.keys.empty()) {
          stored.parent_key = parent != nullptr ? PrefixKeyBytes(*parent) : "";
          stored.block_size = geometry_.page_size;
        }
        stored.keys.push_back(PrefixKeyBytes(keys[i]));
      }
    } else {
      flush();
    }
    if (pin && state.pins.insert(page).second) index_.Pin(page);
  }
  flush();
  counters_.prefix_pages_published += outcome.newly_published;
  counters_.prefix_publish_existing += keys.size() - outcome.newly_published;
  return outcome;
}

absl::StatusOr<std::vector<int64_t>> PagePool::MatchPrefix(
    OwnerId owner, absl::Span<const PrefixKey> keys, bool adopt) {
  absl::MutexLock lock(&mu_);
  int64_t found = -1;
  absl::StatusOr<std::vector<int64_t>> pages =
      MatchPrefixLocked(owner, keys, adopt, &found);
  if (change_log_ != nullptr && found >= 0) {
    // A plain match changes only the lookup counters, a refused adopt the
    // quota refusals too: both are state, so both are recorded.
    PoolChange change;
    change.kind = PoolChangeKind::kMatchPrefix;
    change.owner = owner;
    change.keys = keys;
    change.adopt = adopt;
    change.refused = !pages.ok();
    change.keys_looked_up = static_cast<int64_t>(keys.size());
    change.pages_found = found;
    if (adopt && pages.ok()) change.pages = *pages;
    LogChange(change);
  }
  return pages;
}

absl::StatusOr<std::vector<int64_t>> PagePool::MatchPrefixLocked(
    OwnerId owner, absl::Span<const PrefixKey> keys, bool adopt,
    int64_t* found) {
  *found = -1;
  RETURN_IF_ERROR(CheckChainLength(keys.size()));
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  OwnerState& state = it->second;
  std::vector<int64_t> pages;
  pages.reserve(keys.size());
  // An adopt takes the references as the walk finds the pages (a second
  // pass over them cost about as much as the walk): the owner's, counting
  // the pages new to it, and the index's on each published page. Cached
  // pages, whose first reference takes them off the LRU, wait for the
  // quota check below (in walk order, as a pass would take them). A
  // refusal gives every reference taken back.
  const int64_t held = state.pages_owned + state.refs.size();
  int64_t new_refs = 0;
  std::vector<int64_t> cached;
  auto give_back = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!adopt) return;
    size_t next_cached = 0;
    for (int64_t page : pages) {
      state.refs.Drop(page);
      if (next_cached < cached.size() && cached[next_cached] == page) {
        ++next_cached;
      } else {
        index_.UndoAddRefIfPublished(page);
      }
    }
  };
  // A key names one page, so a key given twice in the matched prefix is a
  // page found twice: a stamp a page finds it without hashing the chain.
  // Keys past the first miss are never looked at.
  const uint32_t seen = NewSeenEpoch();
  int64_t previous = 0;
  for (const PrefixKey& key : keys) {
    const int64_t page = index_.FindAfter(previous, key);
    if (page == 0) break;
    if (seen_stamp_[page] == seen) {
      const size_t first =
          std::find(pages.begin(), pages.end(), page) - pages.begin();
      const size_t repeat = pages.size();
      give_back();
      return absl::InvalidArgumentError(absl::StrFormat(
          "keys[%d] repeats keys[%d]: a chain's keys are distinct", repeat,
          first));
    }
    seen_stamp_[page] = seen;
    if (adopt) {
      new_refs += state.refs.Add(page);
      if (!index_.AddRefIfPublished(page)) cached.push_back(page);
    }
    pages.push_back(page);
    previous = page;
  }
  counters_.prefix_lookup_pages += keys.size();
  counters_.prefix_hit_pages += pages.size();
  if (!keys.empty()) *found = static_cast<int64_t>(pages.size());
  if (!adopt || pages.empty()) return pages;
  if (state.quota_pages > 0 && held + new_refs > state.quota_pages) {
    give_back();
    ++counters_.quota_refusals;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "adopting %d shared pages (%d new to owner %d) would put it over "
        "quota: it holds %d of its %d",
        pages.size(), new_refs, owner, held, state.quota_pages));
  }
  for (int64_t page : cached) index_.AddRef(page);
  counters_.prefix_pages_adopted += pages.size();
  return pages;
}

absl::Status PagePool::AwaitRelease(OwnerId owner,
                                    absl::Span<const int64_t> pages,
                                    CallTag call) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const PoolKeptCall* kept,
                   RetriedLocked(owner, call, kCallFree));
  if (kept != nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(AwaitReleaseLocked(owner, pages));
  PoolKeptCall* last = NoteCall(owner, call, kCallFree);
  if (last != nullptr) last->freed = static_cast<int64_t>(pages.size());
  if (change_log_ != nullptr && (!pages.empty() || last != nullptr)) {
    PoolChange change;
    change.kind = PoolChangeKind::kAwaitRelease;
    change.owner = owner;
    change.pages = pages;
    change.call = call;
    LogChange(change);
  }
  return absl::OkStatus();
}

absl::Status PagePool::AwaitReleaseLocked(OwnerId owner,
                                          absl::Span<const int64_t> pages) {
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  OwnerState& state = it->second;
  // Pages already waiting and the call's own pages, in one stamp epoch:
  // a page marked twice is a repeat either way.
  const uint32_t epoch = NewSeenEpoch();
  for (int64_t page : state.awaiting_release) seen_stamp_[page] = epoch;
  for (size_t i = 0; i < pages.size(); ++i) {
    const int64_t page = pages[i];
    if (page < 1 || page > geometry_.num_pages) {
      return absl::InvalidArgumentError(
          absl::StrFormat("pages[%d] (%d) is outside the pool's pages 1..%d", i,
                          page, geometry_.num_pages));
    }
    const bool held =
        owner_of_[page] == owner ||
        (owner_of_[page] == kSharedOwner && state.refs.count(page) > 0);
    if (!held || seen_stamp_[page] == epoch) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "pages[%d] (%d) %s", i, page,
          !held ? absl::StrFormat("is not a page owner %d holds", owner)
                : std::string("awaits release already")));
    }
    seen_stamp_[page] = epoch;
  }
  state.awaiting_release.insert(state.awaiting_release.end(), pages.begin(),
                                pages.end());
  return absl::OkStatus();
}

void PagePool::EndAwait(OwnerState& state, absl::Span<const int64_t> pages) {
  if (state.awaiting_release.empty() || pages.empty()) return;
  const uint32_t epoch = NewSeenEpoch();
  for (int64_t page : pages) seen_stamp_[page] = epoch;
  std::vector<int64_t>& awaiting = state.awaiting_release;
  size_t kept = 0;
  for (int64_t page : awaiting) {
    if (seen_stamp_[page] != epoch) awaiting[kept++] = page;
  }
  awaiting.resize(kept);
}

absl::StatusOr<std::vector<int64_t>> PagePool::PagesAwaitingRelease(
    OwnerId owner) const {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  return it->second.awaiting_release;
}

absl::StatusOr<int64_t> PagePool::Unpin(OwnerId owner,
                                        absl::Span<const int64_t> pages) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const int64_t unpinned, UnpinLocked(owner, pages));
  if (change_log_ != nullptr && unpinned > 0) {
    PoolChange change;
    change.kind = PoolChangeKind::kUnpin;
    change.owner = owner;
    change.pages = pages;
    LogChange(change);
  }
  return unpinned;
}

absl::StatusOr<int64_t> PagePool::UnpinLocked(OwnerId owner,
                                              absl::Span<const int64_t> pages) {
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  OwnerState& state = it->second;
  absl::flat_hash_set<int64_t> seen;
  for (size_t i = 0; i < pages.size(); ++i) {
    if (!state.pins.contains(pages[i]) || !seen.insert(pages[i]).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pages[%d] (%d) is not a page owner %d pins%s", i, pages[i], owner,
          seen.contains(pages[i]) ? " (repeated)" : ""));
    }
  }
  for (int64_t page : pages) {
    state.pins.erase(page);
    index_.Unpin(page);
  }
  return static_cast<int64_t>(pages.size());
}

void PagePool::ReleaseRefs(OwnerState& state, absl::Span<const int64_t> pages) {
  EndAwait(state, pages);
  for (auto page = pages.rbegin(); page != pages.rend(); ++page) {
    state.refs.Drop(*page);
    index_.Release(*page);
  }
}

void PagePool::DropShared(OwnerState& state) {
  // The order decides where the pages this makes cached enter the LRU, so
  // it must not be the hash sets' (Abseil seeds them per process: a replay
  // in another process would evict other pages). Descending page order
  // releases a chain that was allocated front to back deepest page first,
  // as a free does (ReleaseRefs).
  std::vector<int64_t> pages;
  pages.reserve(std::max(state.refs.size(), state.pins.size()));
  std::vector<int64_t> counts;
  counts.reserve(state.refs.size());
  state.refs.ForEach([&](int64_t page, int64_t count) {
    pages.push_back(page);
    counts.push_back(count);
  });
  for (size_t i = pages.size(); i-- > 0;) {
    for (int64_t k = counts[i]; k > 0; --k) index_.Release(pages[i]);
  }
  EndAwait(state, pages);
  state.refs.Clear();
  pages.assign(state.pins.begin(), state.pins.end());
  std::sort(pages.begin(), pages.end(), std::greater<int64_t>());
  for (int64_t page : pages) index_.Unpin(page);
  state.pins.clear();
}

absl::StatusOr<int64_t> PagePool::Evict(int64_t max_pages) {
  std::vector<int64_t> pages;
  std::vector<std::string> keys;
  pages.reserve(std::min(max_pages, index_.Counts().evictable_pages));
  index_.EvictLru(max_pages, &pages, sink_ != nullptr ? &keys : nullptr);
  if (pages.empty()) return 0;
  for (int64_t page : pages) owner_of_[page] = kNoOwner;
  if (sink_ != nullptr) sink_->BlocksRemoved(keys);
  RETURN_IF_ERROR(PushBack(pages));
  return static_cast<int64_t>(pages.size());
}

absl::StatusOr<int64_t> PagePool::ResetPrefixCache() {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const int64_t evicted, ResetPrefixCacheLocked());
  if (change_log_ != nullptr) {
    PoolChange change;
    change.kind = PoolChangeKind::kResetPrefixCache;
    LogChange(change);
  }
  return evicted;
}

absl::StatusOr<int64_t> PagePool::ResetPrefixCacheLocked() {
  const int64_t evictable = index_.Counts().evictable_pages;
  std::vector<int64_t> pages;
  std::vector<std::string> keys;
  pages.reserve(evictable);
  index_.EvictLru(evictable, &pages, sink_ != nullptr ? &keys : nullptr);
  for (int64_t page : pages) owner_of_[page] = kNoOwner;
  counters_.prefix_evicted_by_reset += pages.size();
  if (sink_ != nullptr && !pages.empty()) {
    // A router drops its whole view of the GPU on AllBlocksCleared; when
    // published or pinned pages stay, it hears of each page removed.
    if (index_.size() == 0) {
      sink_->AllBlocksCleared();
    } else {
      sink_->BlocksRemoved(keys);
    }
  }
  RETURN_IF_ERROR(PushBack(pages));
  return static_cast<int64_t>(pages.size());
}

std::vector<int64_t> PagePool::EvictionOrder() const {
  absl::MutexLock lock(&mu_);
  return index_.LruOrder();
}

int64_t PagePool::SharedCount(int64_t page) const {
  absl::MutexLock lock(&mu_);
  return index_.Contains(page) ? index_.count(page) : 0;
}

PoolStats PagePool::Stats() const {
  absl::MutexLock lock(&mu_);
  PoolStats stats;
  const PoolCounters& c = counters_;
  stats.slots_allocated = c.slots_allocated;
  stats.pages_allocated = c.pages_allocated;
  stats.pages_freed = c.pages_freed;
  stats.out_of_pages_refusals = c.out_of_pages_refusals;
  stats.quota_refusals = c.quota_refusals;
  stats.free_list_sorts = c.free_list_sorts;
  stats.batches_executed = c.batches_executed;
  stats.pages_scrubbed = c.pages_scrubbed;
  stats.prefix_pages_published = c.prefix_pages_published;
  stats.prefix_publish_existing = c.prefix_publish_existing;
  stats.prefix_lookup_pages = c.prefix_lookup_pages;
  stats.prefix_hit_pages = c.prefix_hit_pages;
  stats.prefix_pages_adopted = c.prefix_pages_adopted;
  stats.prefix_evicted_for_allocation = c.prefix_evicted_for_allocation;
  stats.prefix_evicted_by_reset = c.prefix_evicted_by_reset;
  stats.prefix_cleared = c.prefix_cleared;
  stats.page_size = geometry_.page_size;
  stats.total_pages = geometry_.num_pages;
  stats.free_pages = free_count_;
  stats.parked_pages = parked_.size();
  const PrefixIndexCounts shared = index_.Counts();
  stats.published_pages = shared.published_pages;
  stats.cached_pages = shared.cached_pages;
  stats.pinned_pages = shared.pinned_pages;
  stats.evictable_pages = shared.evictable_pages;
  stats.max_pinned_pages_per_owner = max_pins_;
  stats.used_pages =
      geometry_.num_pages - free_count_ - parked_.size() - index_.size();
  for (const auto& [id, state] : owners_) {
    stats.owners[id] =
        OwnerStats{state.pages_owned,
                   state.quota_pages,
                   !state.checkpoints.empty(),
                   static_cast<int64_t>(state.checkpoints.size()),
                   static_cast<int64_t>(state.refs.size()),
                   static_cast<int64_t>(state.pins.size())};
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

absl::StatusOr<PagePool::OwnedPages> PagePool::PagesOwnedBy(
    OwnerId owner) const {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  OwnedPages pages;
  pages.owned = PagesOf(owner, it->second.pages_owned);
  it->second.refs.ForEach(
      [&](int64_t page, int64_t) { pages.shared.push_back(page); });
  return pages;
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
  // References and pins the owners hold, per shared page.
  absl::flat_hash_map<int64_t, int64_t> refs;
  absl::flat_hash_map<int64_t, int64_t> pins;
  for (const auto& [id, state] : owners_) {
    state.refs.ForEach(
        [&](int64_t page, int64_t count) { refs[page] += count; });
    for (int64_t page : state.pins) ++pins[page];
  }
  RETURN_IF_ERROR(index_.CheckInvariants());
  int64_t shared = 0;
  for (int64_t p = 1; p <= n; ++p) {
    if (seen[p]) {
      if (index_.Contains(p)) {
        return absl::InternalError(
            absl::StrFormat("page %d is free and in the prefix index", p));
      }
      continue;
    }
    if ((owner_of_[p] == kSharedOwner) != index_.Contains(p)) {
      return absl::InternalError(
          absl::StrFormat("page %d: owner %d, %sin the prefix index", p,
                          owner_of_[p], index_.Contains(p) ? "" : "not "));
    }
    if (owner_of_[p] == kSharedOwner) {
      ++shared;
      const int64_t held = refs.contains(p) ? refs[p] : 0;
      const int64_t pinned = pins.contains(p) ? pins[p] : 0;
      if (index_.count(p) != held || index_.pins(p) != pinned) {
        return absl::InternalError(absl::StrFormat(
            "shared page %d has count %d and %d pins; owners hold %d "
            "references and %d pins",
            p, index_.count(p), index_.pins(p), held, pinned));
      }
      continue;
    }
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
  if (shared != index_.size()) {
    return absl::InternalError(
        absl::StrFormat("%d pages are shared, the prefix index holds %d",
                        shared, index_.size()));
  }
  for (const auto& [id, state] : owners_) {
    absl::flat_hash_set<int64_t> awaiting;
    for (int64_t page : state.awaiting_release) {
      const bool held =
          page >= 1 && page <= n &&
          (owner_of_[page] == id ||
           (owner_of_[page] == kSharedOwner && state.refs.count(page) > 0));
      if (!held || !awaiting.insert(page).second) {
        return absl::InternalError(
            absl::StrFormat("owner %d: page %d awaits release %s", id, page,
                            held ? "twice" : "but is not the owner's"));
      }
    }
  }
  for (const auto& [page, count] : refs) {
    if (!index_.Contains(page)) {
      return absl::InternalError(absl::StrFormat(
          "owners hold %d references on page %d, which is not shared", count,
          page));
    }
  }
  for (const auto& [page, count] : pins) {
    if (!index_.Contains(page)) {
      return absl::InternalError(
          absl::StrFormat("owners pin page %d, which is not shared", page));
    }
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

void PagePool::LogChange(const PoolChange& change) {
  change_log_->Record(change);
  if (change_log_->WantsSnapshot()) {
    change_log_->WriteSnapshot(ExportStateLocked());
  }
}

void PagePool::LogOwnerChange(PoolChangeKind kind, OwnerId owner) {
  if (change_log_ == nullptr) return;
  PoolChange change;
  change.kind = kind;
  change.owner = owner;
  LogChange(change);
}

PoolState PagePool::ExportState() const {
  absl::MutexLock lock(&mu_);
  return ExportStateLocked();
}

PoolState PagePool::ExportStateLocked() const {
  PoolState state;
  state.semantics_version = kPoolSemanticsVersion;
  state.num_pages = geometry_.num_pages;
  state.page_size = geometry_.page_size;
  state.free_policy = policy_.policy();
  state.semantics = policy_.semantics();
  state.scrub = scrub_;
  state.max_pinned_pages_per_owner = max_pins_;
  state.ring_head = head_;
  state.free_pages.resize(free_count_);
  for (int64_t i = 0; i < free_count_; ++i) state.free_pages[i] = RingAt(i);
  state.parked_pages = parked_;
  state.owner_of = owner_of_;
  state.allocated_once = allocated_once_;
  state.last_owner = last_owner_;
  // Owners, references and pins sorted: the hash containers' order is the
  // process's.
  std::vector<OwnerId> ids;
  ids.reserve(owners_.size());
  for (const auto& [id, owner] : owners_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  state.owners.reserve(ids.size());
  for (OwnerId id : ids) {
    const OwnerState& owner = owners_.find(id)->second;
    PoolOwnerState& out = state.owners.emplace_back();
    out.id = id;
    out.quota_pages = owner.quota_pages;
    out.metadata = owner.metadata;
    out.next_checkpoint_id = owner.next_checkpoint_id;
    out.checkpoints.reserve(owner.checkpoints.size());
    for (const CheckpointMark& mark : owner.checkpoints) {
      out.checkpoints.push_back({mark.id, mark.log_position});
    }
    out.given_log = owner.given_log;
    // log_index_ itself is not state: only whether it marks an entry live
    // (the rollback's test) is.
    out.given_live.resize(owner.given_log.size());
    for (size_t k = 0; k < owner.given_log.size(); ++k) {
      const int64_t page = owner.given_log[k];
      out.given_live[k] = owner_of_[page] == id && log_index_[page] == k;
    }
    out.refs.clear();
    owner.refs.ForEach([&](int64_t page, int64_t count) {
      out.refs.emplace_back(page, count);
    });
    out.pins.assign(owner.pins.begin(), owner.pins.end());
    std::sort(out.pins.begin(), out.pins.end());
    out.awaiting_release = owner.awaiting_release;
    out.kept_calls = owner.kept_calls;
  }
  index_.Export(&state.prefix_entries, &state.prefix_lru);
  state.counters = counters_;
  return state;
}

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::CreateFromState(
    const PoolOptions& options, PlanExecutor* executor,
    const PoolState& state) {
  RETURN_IF_ERROR(ValidateOptions(options, executor));
  std::unique_ptr<PagePool> pool(new PagePool(options, executor));
  absl::MutexLock lock(&pool->mu_);
  RETURN_IF_ERROR(pool->RestoreState(state));
  return pool;
}

namespace {

// The first violation RestoreState finds, as DATA_LOSS: the state is not
// one a pool with these options could be in.
template <typename... Args>
absl::Status Corrupt(const absl::FormatSpec<Args...>& format,
                     const Args&... args) {
  return absl::DataLossError(
      absl::StrCat("pool state: ", absl::StrFormat(format, args...)));
}

}  // namespace

absl::Status PagePool::RestoreState(const PoolState& state) {
  const int64_t n = geometry_.num_pages;
  // The fingerprint: the state must be one of these options' pools.
  if (state.semantics_version != kPoolSemanticsVersion) {
    return Corrupt("semantics version %d; this pool's is %d",
                   state.semantics_version, kPoolSemanticsVersion);
  }
  if (state.num_pages != n || state.page_size != geometry_.page_size) {
    return Corrupt("%d pages of %d tokens; this pool has %d pages of %d",
                   state.num_pages, state.page_size, n, geometry_.page_size);
  }
  if (state.free_policy != policy_.policy() ||
      state.semantics != policy_.semantics()) {
    return Corrupt(
        "free policy %s, semantics %s; this pool's are %s, %s",
        FreePolicyName(state.free_policy), SemanticsName(state.semantics),
        FreePolicyName(policy_.policy()), SemanticsName(policy_.semantics()));
  }
  if (state.scrub != scrub_ || state.max_pinned_pages_per_owner != max_pins_) {
    return Corrupt("scrub %d, %d pins per owner; this pool's are %d, %d",
                   state.scrub, state.max_pinned_pages_per_owner, scrub_,
                   max_pins_);
  }
  // Per-page tables.
  if (static_cast<int64_t>(state.owner_of.size()) != n + 1 ||
      static_cast<int64_t>(state.allocated_once.size()) != n + 1 ||
      static_cast<int64_t>(state.last_owner.size()) != (scrub_ ? n + 1 : 0)) {
    return Corrupt(
        "per-page tables of %d, %d and %d entries for %d pages (scrub %d)",
        state.owner_of.size(), state.allocated_once.size(),
        state.last_owner.size(), n, scrub_);
  }
  if (state.owner_of[0] != kNoOwner || state.allocated_once[0] ||
      (scrub_ && state.last_owner[0] != kNoOwner)) {
    return Corrupt("page 0 (reserved) has an owner or was handed out");
  }
  // The free list and the parked pages: every free page once.
  if (state.ring_head < 0 || state.ring_head >= capacity_) {
    return Corrupt("ring head %d outside the ring of %d entries",
                   state.ring_head, capacity_);
  }
  if (static_cast<int64_t>(state.free_pages.size()) > n ||
      static_cast<int64_t>(state.parked_pages.size()) >
          n - static_cast<int64_t>(state.free_pages.size())) {
    return Corrupt("%d free and %d parked pages in a pool of %d",
                   state.free_pages.size(), state.parked_pages.size(), n);
  }
  if (!state.parked_pages.empty() &&
      policy_.release_target() != ReleaseTarget::kPark) {
    return Corrupt("%d parked pages under free policy %s",
                   state.parked_pages.size(), FreePolicyName(policy_.policy()));
  }
  std::vector<uint8_t> free(n + 1, 0);
  auto check_free = [&](const char* list, size_t i,
                        int64_t page) -> absl::Status {
    if (page < 1 || page > n) {
      return Corrupt("%s[%d] (%d) is outside [1, %d]", list, i, page, n);
    }
    if (free[page]++) {
      return Corrupt("%s[%d]: page %d is free twice", list, i, page);
    }
    if (state.owner_of[page] != kNoOwner) {
      return Corrupt("%s[%d]: page %d is free and owned by %d", list, i, page,
                     state.owner_of[page]);
    }
    return absl::OkStatus();
  };
  for (size_t i = 0; i < state.free_pages.size(); ++i) {
    RETURN_IF_ERROR(check_free("free_pages", i, state.free_pages[i]));
  }
  for (size_t i = 0; i < state.parked_pages.size(); ++i) {
    RETURN_IF_ERROR(check_free("parked_pages", i, state.parked_pages[i]));
  }
  // Owners: ascending ids (so each once), their bounds, their logs.
  const size_t max_log =
      2 * static_cast<size_t>(n) + 4 * static_cast<size_t>(kMaxCheckpoints);
  absl::flat_hash_map<int64_t, int64_t> refs_on;  // page -> references
  absl::flat_hash_map<int64_t, int64_t> pins_on;  // page -> pins
  std::vector<uint8_t> live(n + 1, 0);
  for (size_t o = 0; o < state.owners.size(); ++o) {
    const PoolOwnerState& owner = state.owners[o];
    const OwnerId id = owner.id;
    if (id == kNoOwner || id == kSharedOwner) {
      return Corrupt("owners[%d] has the reserved id %d", o, id);
    }
    if (o > 0 && state.owners[o - 1].id >= id) {
      return Corrupt("owners[%d] (%d) does not follow owner %d", o, id,
                     state.owners[o - 1].id);
    }
    if (owner.quota_pages < 0 || owner.next_checkpoint_id < 1 ||
        owner.metadata.size() > kMaxOwnerMetadataBytes) {
      return Corrupt(
          "owner %d: quota %d, next checkpoint %d, %d bytes of "
          "metadata",
          id, owner.quota_pages, owner.next_checkpoint_id,
          owner.metadata.size());
    }
    if (owner.checkpoints.size() > static_cast<size_t>(kMaxCheckpoints) ||
        owner.given_log.size() > max_log ||
        owner.given_live.size() != owner.given_log.size() ||
        (owner.checkpoints.empty() && !owner.given_log.empty())) {
      return Corrupt(
          "owner %d: %d checkpoints (at most %d), a log of %d entries (at "
          "most %d) with %d liveness bits",
          id, owner.checkpoints.size(), kMaxCheckpoints, owner.given_log.size(),
          max_log, owner.given_live.size());
    }
    for (size_t c = 0; c < owner.checkpoints.size(); ++c) {
      const PoolCheckpointState& mark = owner.checkpoints[c];
      const bool ordered = c == 0 || (owner.checkpoints[c - 1].id < mark.id &&
                                      owner.checkpoints[c - 1].log_position <=
                                          mark.log_position);
      if (mark.id < 1 || mark.id >= owner.next_checkpoint_id || !ordered ||
          mark.log_position > owner.given_log.size()) {
        return Corrupt(
            "owner %d: checkpoint %d (id %d at log position %d) is out of "
            "order or bounds (next id %d, log of %d)",
            id, c, mark.id, mark.log_position, owner.next_checkpoint_id,
            owner.given_log.size());
      }
    }
    for (size_t k = 0; k < owner.given_log.size(); ++k) {
      const int64_t page = owner.given_log[k];
      if (page < 1 || page > n) {
        return Corrupt("owner %d: given_log[%d] (%d) is outside [1, %d]", id, k,
                       page, n);
      }
      if (!owner.given_live[k]) continue;
      if (state.owner_of[page] != id || live[page]++) {
        return Corrupt(
            "owner %d: given_log[%d] (page %d) is live but the page is %s", id,
            k, page,
            state.owner_of[page] != id ? "not the owner's" : "live twice");
      }
    }
    for (size_t r = 0; r < owner.refs.size(); ++r) {
      const auto [page, count] = owner.refs[r];
      if (page < 1 || page > n || state.owner_of[page] != kSharedOwner ||
          count < 1 || (r > 0 && owner.refs[r - 1].first >= page)) {
        return Corrupt(
            "owner %d: refs[%d] (%d references on page %d) is not a shared "
            "page's, in order",
            id, r, count, page);
      }
      int64_t& total = refs_on[page];
      if (__builtin_add_overflow(total, count, &total)) {
        return Corrupt("page %d: references overflow", page);
      }
    }
    if (static_cast<int64_t>(owner.pins.size()) > max_pins_) {
      return Corrupt("owner %d pins %d pages, over the bound of %d", id,
                     owner.pins.size(), max_pins_);
    }
    for (size_t p = 0; p < owner.pins.size(); ++p) {
      const int64_t page = owner.pins[p];
      if (page < 1 || page > n || state.owner_of[page] != kSharedOwner ||
          (p > 0 && owner.pins[p - 1] >= page)) {
        return Corrupt("owner %d: pins[%d] (%d) is not a shared page, in order",
                       id, p, page);
      }
      ++pins_on[page];
    }
    if (owner.awaiting_release.size() > static_cast<size_t>(n)) {
      return Corrupt("owner %d: %d pages await release, in a pool of %d", id,
                     owner.awaiting_release.size(), n);
    }
    absl::flat_hash_set<int64_t> awaiting;
    for (size_t a = 0; a < owner.awaiting_release.size(); ++a) {
      const int64_t page = owner.awaiting_release[a];
      const bool held =
          page >= 1 && page <= n &&
          (state.owner_of[page] == id ||
           (state.owner_of[page] == kSharedOwner &&
            std::binary_search(owner.refs.begin(), owner.refs.end(),
                               std::pair<int64_t, int64_t>(page, 0),
                               [](const auto& x, const auto& y) {
                                 return x.first < y.first;
                               })));
      if (!held || !awaiting.insert(page).second) {
        return Corrupt("owner %d: awaiting_release[%d] (%d) is %s", id, a, page,
                       held ? "listed twice" : "not a page the owner holds");
      }
    }
    // The kept calls' pages need not be the owner's still (later
    // operations may have freed them): a retry checks.
    if (owner.kept_calls.size() > kKeptCallsPerOwner) {
      return Corrupt("owner %d: %d kept calls, at most %d", id,
                     owner.kept_calls.size(), kKeptCallsPerOwner);
    }
    for (size_t c = 0; c < owner.kept_calls.size(); ++c) {
      const PoolKeptCall& kept = owner.kept_calls[c];
      if (kept.id == 0 || (c > 0 && owner.kept_calls[c - 1].id >= kept.id) ||
          (kept.parts & ~kKnownCallParts) != 0 ||
          (!kept.pages.empty() && (kept.parts & kCallAllocate) == 0) ||
          kept.pages.size() > static_cast<size_t>(n)) {
        return Corrupt(
            "owner %d: kept call %d (%d) with parts %#x and %d pages, not in "
            "order or not a call",
            id, c, kept.id, kept.parts, kept.pages.size());
      }
      for (size_t k = 0; k < kept.pages.size(); ++k) {
        if (kept.pages[k] < 1 || kept.pages[k] > n) {
          return Corrupt(
              "owner %d: kept call %d's pages[%d] (%d) is outside [1, %d]", id,
              kept.id, k, kept.pages[k], n);
        }
      }
    }
  }
  auto listed = [&state](OwnerId id) {
    auto it = std::lower_bound(
        state.owners.begin(), state.owners.end(), id,
        [](const PoolOwnerState& o, OwnerId v) { return o.id < v; });
    return it != state.owners.end() && it->id == id;
  };
  // The prefix index keeps its own invariants; the pool checks that its
  // pages are the shared ones, with the owners' counts and pins. (On
  // failure the pool is dropped, its index with it.)
  RETURN_IF_ERROR(index_.Import(state.prefix_entries, state.prefix_lru));
  for (int64_t p = 1; p <= n; ++p) {
    const OwnerId owner = state.owner_of[p];
    if (owner == kNoOwner) {
      if (!free[p]) {
        return Corrupt("page %d is neither free nor owned (lost)", p);
      }
      continue;
    }
    if (owner == kSharedOwner) {
      if (!index_.Contains(p)) {
        return Corrupt("page %d is shared but not in the prefix index", p);
      }
      const auto held = refs_on.find(p);
      const auto pinned = pins_on.find(p);
      const int64_t refs = held == refs_on.end() ? 0 : held->second;
      const int64_t pins = pinned == pins_on.end() ? 0 : pinned->second;
      if (index_.count(p) != refs || index_.pins(p) != pins) {
        return Corrupt(
            "shared page %d has count %d and %d pins; owners hold %d "
            "references and %d pins",
            p, index_.count(p), index_.pins(p), refs, pins);
      }
      continue;
    }
    if (index_.Contains(p) || !listed(owner)) {
      return Corrupt("page %d is owned by %s owner %d", p,
                     index_.Contains(p) ? "a shared page's" : "an unlisted",
                     owner);
    }
  }
  // Every prefix entry's page is shared: a free or owned page in the index
  // passed the loop above.
  for (const PrefixEntryState& entry : state.prefix_entries) {
    if (state.owner_of[entry.page] != kSharedOwner) {
      return Corrupt("prefix entry of page %d, which is not shared",
                     entry.page);
    }
  }
  const PoolCounters& c = state.counters;
  for (int64_t v :
       {c.slots_allocated, c.pages_allocated, c.pages_freed,
        c.out_of_pages_refusals, c.quota_refusals, c.free_list_sorts,
        c.batches_executed, c.pages_scrubbed, c.prefix_pages_published,
        c.prefix_publish_existing, c.prefix_lookup_pages, c.prefix_hit_pages,
        c.prefix_pages_adopted, c.prefix_evicted_for_allocation,
        c.prefix_evicted_by_reset, c.prefix_cleared}) {
    if (v < 0) return Corrupt("a counter is negative (%d)", v);
  }

  // Everything checked: take it over.
  owner_of_ = state.owner_of;
  allocated_once_ = state.allocated_once;
  last_owner_ = state.last_owner;
  parked_ = state.parked_pages;
  head_ = state.ring_head;
  free_count_ = state.free_pages.size();
  // No entry of a log can be live by accident: a page's index is set only
  // for its live entry.
  log_index_.assign(n + 1, std::numeric_limits<size_t>::max());
  owners_.clear();
  owners_.reserve(state.owners.size());
  for (const PoolOwnerState& in : state.owners) {
    OwnerState owner;
    owner.quota_pages = in.quota_pages;
    owner.metadata = in.metadata;
    owner.next_checkpoint_id = in.next_checkpoint_id;
    for (const PoolCheckpointState& mark : in.checkpoints) {
      owner.checkpoints.push_back(
          CheckpointMark{mark.id, static_cast<size_t>(mark.log_position)});
    }
    owner.given_log = in.given_log;
    for (size_t k = 0; k < in.given_log.size(); ++k) {
      if (in.given_live[k]) log_index_[in.given_log[k]] = k;
    }
    for (const auto& [page, count] : in.refs) owner.refs.Set(page, count);
    owner.pins.reserve(in.pins.size());
    owner.pins.insert(in.pins.begin(), in.pins.end());
    owner.awaiting_release = in.awaiting_release;
    owner.kept_calls = in.kept_calls;
    owners_.emplace(in.id, std::move(owner));
  }
  for (int64_t p = 1; p <= n; ++p) {
    const OwnerId owner = owner_of_[p];
    if (owner != kNoOwner && owner != kSharedOwner) {
      ++owners_.find(owner)->second.pages_owned;
    }
  }
  counters_ = state.counters;
  // The mirror gets the free list where the pool keeps it; the rest of the
  // ring is never read before it is written.
  RETURN_IF_ERROR(executor_->InitFreeRing(capacity_));
  ring_.assign(capacity_, 0);
  return WriteRing(head_, state.free_pages);
}

absl::Status PagePool::Replay(const PoolChange& change,
                              std::vector<AllocResult>* results) {
  absl::MutexLock lock(&mu_);
  absl::Status applied;
  switch (change.kind) {
    case PoolChangeKind::kAddOwner:
      applied = AddOwnerLocked(change.owner, change.quota_pages,
                               std::string(change.metadata));
      break;
    case PoolChangeKind::kRemoveOwner:
      applied = RemoveOwnerLocked(change.owner).status();
      break;
    case PoolChangeKind::kAllocate:
      return ReplayAllocate(change, results);
    case PoolChangeKind::kFree:
      applied = ReplayFree(change);
      if (applied.ok()) {
        ReplayNote(change, static_cast<int64_t>(change.pages.size() +
                                                change.shared_pages.size()));
      }
      break;
    case PoolChangeKind::kCheckpoint: {
      absl::StatusOr<uint64_t> id = CheckpointLocked(change.owner);
      applied = id.status();
      if (id.ok()) ReplayNote(change, static_cast<int64_t>(*id));
      break;
    }
    case PoolChangeKind::kRollback: {
      absl::StatusOr<int64_t> returned =
          RollbackLocked(change.owner, change.checkpoint_id);
      applied = returned.status();
      if (returned.ok()) ReplayNote(change, *returned);
      break;
    }
    case PoolChangeKind::kClearOwner: {
      absl::StatusOr<int64_t> freed = ClearOwnerLocked(change.owner);
      applied = freed.status();
      if (freed.ok()) ReplayNote(change, *freed);
      break;
    }
    case PoolChangeKind::kClearPool:
      applied = ClearPoolLocked(change.force).status();
      break;
    case PoolChangeKind::kPublish:
      applied = PublishLocked(change.owner, change.pages, change.keys,
                              change.parent_key, change.pin)
                    .status();
      break;
    case PoolChangeKind::kMatchPrefix: {
      if (change.keys.empty()) {
        applied = ReplayFoundMatchLocked(change);
        break;
      }
      // The keys as the caller gave them (the pool's own record, or one of
      // record format 1).
      int64_t found = -1;
      applied =
          MatchPrefixLocked(change.owner, change.keys, change.adopt, &found)
              .status();
      if (found < 0) {
        return absl::DataLossError(absl::StrFormat(
            "replaying a match_prefix of owner %d: it changed nothing here "
            "(%s)",
            change.owner, applied.ToString()));
      }
      // A recorded refusal (over quota) is the outcome to reproduce.
      if (change.refused != !applied.ok()) {
        return absl::DataLossError(absl::StrFormat(
            "replaying a match_prefix of owner %d: recorded as %s, here %s",
            change.owner, change.refused ? "refused" : "done",
            applied.ToString()));
      }
      applied = absl::OkStatus();
      break;
    }
    case PoolChangeKind::kUnpin:
      applied = UnpinLocked(change.owner, change.pages).status();
      break;
    case PoolChangeKind::kAwaitRelease:
      applied = AwaitReleaseLocked(change.owner, change.pages);
      if (applied.ok()) {
        ReplayNote(change, static_cast<int64_t>(change.pages.size()));
      }
      break;
    case PoolChangeKind::kResetPrefixCache:
      applied = ResetPrefixCacheLocked().status();
      break;
    default:
      return absl::DataLossError(absl::StrFormat(
          "a pool change of unknown kind %d", static_cast<int>(change.kind)));
  }
  if (applied.ok()) return applied;
  return absl::DataLossError(absl::StrFormat("replaying a %s of owner %d: %s",
                                             PoolChangeKindName(change.kind),
                                             change.owner, applied.ToString()));
}

void PagePool::ReplayNote(const PoolChange& change, int64_t value) {
  switch (change.kind) {
    case PoolChangeKind::kFree:
    case PoolChangeKind::kAwaitRelease:
      if (PoolKeptCall* last = NoteCall(change.owner, change.call, kCallFree)) {
        last->freed = value;
      }
      return;
    case PoolChangeKind::kCheckpoint:
      if (PoolKeptCall* last =
              NoteCall(change.owner, change.call, kCallCheckpoint)) {
        last->checkpoint_id = static_cast<uint64_t>(value);
      }
      return;
    case PoolChangeKind::kRollback:
      if (PoolKeptCall* last =
              NoteCall(change.owner, change.call, kCallRollback)) {
        last->returned = value;
      }
      return;
    case PoolChangeKind::kClearOwner:
      if (PoolKeptCall* last =
              NoteCall(change.owner, change.call, kCallClear)) {
        last->returned = value;
      }
      return;
    default:
      return;
  }
}

absl::Status PagePool::ReplayFoundMatchLocked(const PoolChange& change) {
  const int64_t looked_up = change.keys_looked_up;
  const int64_t found = change.pages_found;
  if (looked_up < 1 || looked_up > geometry_.num_pages || found < 0 ||
      found > looked_up) {
    return absl::DataLossError(absl::StrFormat(
        "%d pages found for %d keys looked up (a pool of %d pages)", found,
        looked_up, geometry_.num_pages));
  }
  if (!owners_.contains(change.owner)) {
    return absl::NotFoundError(
        absl::StrFormat("unknown owner %d", change.owner));
  }
  // Only an adopt of at least one page is ever refused.
  if (change.refused && (!change.adopt || found == 0)) {
    return absl::DataLossError(
        absl::StrFormat("refused, yet it adopted nothing (adopt %d, %d found)",
                        change.adopt, found));
  }
  const bool took = change.adopt && !change.refused && found > 0;
  if (static_cast<int64_t>(change.pages.size()) != (took ? found : 0)) {
    return absl::DataLossError(
        absl::StrFormat("%d pages listed for %d found%s", change.pages.size(),
                        found, took ? "" : " by a match that took none"));
  }
  if (!took) {
    counters_.prefix_lookup_pages += looked_up;
    counters_.prefix_hit_pages += found;
    if (change.refused) ++counters_.quota_refusals;
    return absl::OkStatus();
  }
  // The adopt walks its pages' keys, so that it takes them exactly as the
  // original did (references, the LRU, the quota check) and finds exactly
  // them; then the lookups past the matched prefix are counted.
  std::vector<PrefixKey> keys;
  keys.reserve(change.pages.size());
  for (int64_t page : change.pages) {
    if (page < 1 || page > geometry_.num_pages || !index_.Contains(page)) {
      return absl::DataLossError(
          absl::StrFormat("page %d is not in the prefix index", page));
    }
    keys.push_back(index_.key(page));
  }
  int64_t walked = -1;
  ASSIGN_OR_RETURN(const std::vector<int64_t> pages,
                   MatchPrefixLocked(change.owner, keys, true, &walked));
  if (!std::equal(pages.begin(), pages.end(), change.pages.begin(),
                  change.pages.end())) {
    return absl::DataLossError(
        absl::StrFormat("the walk took %d pages, not the %d recorded",
                        pages.size(), change.pages.size()));
  }
  counters_.prefix_lookup_pages += looked_up - found;
  return absl::OkStatus();
}

absl::Status PagePool::ReplayAllocate(const PoolChange& change,
                                      std::vector<AllocResult>* results_out) {
  const absl::Span<const AllocRequest> requests = change.requests;
  absl::Span<const CallSpan> calls = change.calls;
  const CallSpan whole_batch{static_cast<int64_t>(requests.size()), false, {}};
  if (calls.empty()) {
    calls = absl::MakeConstSpan(&whole_batch, 1);
  } else {
    // Allocate refuses such a batch before it records it.
    int64_t total = 0;
    for (const CallSpan& call : calls) {
      if (call.num_requests < 0 ||
          call.num_requests > static_cast<int64_t>(requests.size()) - total) {
        return absl::DataLossError(absl::StrFormat(
            "replaying an allocate: its calls do not cover its %d requests",
            requests.size()));
      }
      total += call.num_requests;
    }
    if (total != static_cast<int64_t>(requests.size())) {
      return absl::DataLossError(absl::StrFormat(
          "replaying an allocate: its calls cover %d of its %d requests", total,
          requests.size()));
    }
  }
  std::vector<AllocResult> local;
  std::vector<AllocResult>& results =
      results_out != nullptr ? *results_out : local;
  results.clear();
  results.resize(requests.size());
  const ReplayedLaunch replay{change.launch_failure};
  if (change.launch_failure != nullptr && change.launch_failure->ok()) {
    return absl::DataLossError(
        "replaying an allocate: its launch failure is OK");
  }
  const LaunchOutcome launch =
      AllocateLocked(requests, calls, absl::MakeSpan(results), &replay);
  if (change.launch_failure != nullptr && launch != LaunchOutcome::kFailed) {
    // The merges and evictions before the launch have happened, as they
    // did in the original; its launch had work, this one none.
    return absl::DataLossError(
        "replaying an allocate: the recorded launch failed, here nothing was "
        "launched");
  }
  return absl::OkStatus();
}

absl::Status PagePool::ReplayFree(const PoolChange& change) {
  // The record's pages are resolved already: check that they resolve to
  // themselves here (owned pages, then shared ones, each once), and free
  // them in that order.
  std::vector<int64_t> values;
  values.reserve(change.pages.size() + change.shared_pages.size());
  values.insert(values.end(), change.pages.begin(), change.pages.end());
  values.insert(values.end(), change.shared_pages.begin(),
                change.shared_pages.end());
  std::vector<int64_t> shared;
  ASSIGN_OR_RETURN(const std::vector<int64_t> pages,
                   ResolveFree(change.owner, values, /*values_are_slots=*/false,
                               FreeOrder::kFirstAppearance, &shared));
  if (!std::equal(pages.begin(), pages.end(), change.pages.begin(),
                  change.pages.end()) ||
      !std::equal(shared.begin(), shared.end(), change.shared_pages.begin(),
                  change.shared_pages.end())) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "its %d owned and %d shared pages resolve to %d owned and %d shared "
        "here",
        change.pages.size(), change.shared_pages.size(), pages.size(),
        shared.size()));
  }
  return ApplyFree(owners_.find(change.owner)->second, pages, shared);
}

}  // namespace pagealloc
