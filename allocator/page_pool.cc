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

PagePool::PagePool(const PoolOptions& options, PlanExecutor* executor)
    : geometry_{options.page_size, options.num_pages},
      policy_(options.free_policy),
      scrub_(options.scrub),
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

absl::Status PagePool::MergeParkedAndSort() {
  std::vector<int64_t> merged;
  merged.reserve(free_count_ + parked_.size());
  for (int64_t i = 0; i < free_count_; ++i) merged.push_back(RingAt(i));
  merged.insert(merged.end(), parked_.begin(), parked_.end());
  std::sort(merged.begin(), merged.end());
  parked_.clear();
  free_count_ = merged.size();
  ++counters_.free_list_sorts;
  return WriteRing(head_, merged);
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
  if (!owners_.try_emplace(owner, OwnerState{0, quota_pages, std::nullopt})
           .second) {
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
  std::vector<int64_t> pages;
  pages.reserve(it->second.pages_owned);
  if (it->second.pages_owned > 0) {
    // Reclaim is rare (a session closing or losing its lease): a scan of the
    // owner table keeps the hot path free of per-owner page sets.
    for (int64_t p = 1; p <= geometry_.num_pages; ++p) {
      if (owner_of_[p] == owner) pages.push_back(p);
    }
  }
  RETURN_IF_ERROR(ReleasePages(it->second, pages));
  owners_.erase(it);
  return static_cast<int64_t>(pages.size());
}

std::vector<AllocResult> PagePool::Allocate(
    absl::Span<const AllocRequest> requests) {
  std::vector<AllocResult> results;
  Allocate(requests, &results);
  return results;
}

void PagePool::Allocate(absl::Span<const AllocRequest> requests,
                        std::vector<AllocResult>* results_out) {
  std::vector<AllocResult>& results = *results_out;
  results.clear();
  results.resize(requests.size());
  const absl::Span<AllocResult> result_span = absl::MakeSpan(results);

  absl::MutexLock lock(&mu_);
  const int64_t batch_pages = ValidateRequests(requests, result_span);
  const absl::Status room = MakeRoomForBatch(batch_pages);
  if (!room.ok()) {
    for (AllocResult& result : results) {
      if (result.status.ok()) result.status = room;
    }
    return;
  }
  if (!AdmitAndPlan(requests, result_span)) return;
  if (!ExecutePlan(result_span)) return;
  CommitPlan(requests);
}

int64_t PagePool::ValidateRequests(absl::Span<const AllocRequest> requests,
                                   absl::Span<AllocResult> results) {
  std::vector<ExtendShape>& shapes = scratch_.shapes;
  std::vector<int64_t>& pages_needed = scratch_.pages_needed;
  shapes.resize(requests.size());
  pages_needed.assign(requests.size(), 0);
  int64_t batch_pages = 0;
  // A call's requests share an owner: look it up once per run of requests.
  OwnerId known_owner = kNoOwner;
  for (size_t i = 0; i < requests.size(); ++i) {
    const AllocRequest& request = requests[i];
    AllocResult& result = results[i];
    if (!IsValidShape(request, geometry_)) {
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
    shapes[i] = ToExtendShape(request);
    if (shapes[i].num_slots() > 0 && request.destination == nullptr) {
      result.status = absl::InvalidArgumentError(absl::StrFormat(
          "%s request %d: no destination for its %d slots",
          RequestKindName(request.kind), request.index, shapes[i].num_slots()));
      continue;
    }
    if (ModNonNegative(shapes[i].prefix_len, geometry_.page_size) != 0 &&
        shapes[i].num_slots() > 0) {
      // The request writes into the rest of last_loc's page: it must be the
      // caller's.
      result.status = CheckLastLocOwned(request, shapes[i].last_loc);
      if (!result.status.ok()) continue;
    }
    pages_needed[i] = NewPagesNeeded(shapes[i], geometry_.page_size);
    batch_pages += pages_needed[i];
  }
  return batch_pages;
}

absl::Status PagePool::MakeRoomForBatch(int64_t batch_pages) {
  // SGLang sorts before a batch that does not fit; doing it once, up front,
  // gives the same slots as SGLang whenever SGLang's batch would succeed.
  if (policy_ == FreePolicy::kSorted && batch_pages > free_count_ &&
      !parked_.empty()) {
    return MergeParkedAndSort();
  }
  return absl::OkStatus();
}

bool PagePool::AdmitAndPlan(absl::Span<const AllocRequest> requests,
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
  plan.scrub_pages.clear();
  plan.requests.reserve(requests.size());
  std::vector<size_t>& admitted = scratch_.admitted;
  admitted.clear();
  absl::flat_hash_map<OwnerId, int64_t>& batch_pages_by_owner =
      scratch_.pages_by_owner;
  batch_pages_by_owner.clear();
  // The current run's owner and its batch count (entries are only added
  // when the owner changes, so the pointers stay valid within a run).
  OwnerId run_owner = kNoOwner;
  const OwnerState* owner_state = nullptr;
  int64_t* owner_batch_pages_ptr = nullptr;
  for (size_t i = 0; i < requests.size(); ++i) {
    AllocResult& result = results[i];
    if (!result.status.ok()) continue;
    const AllocRequest& request = requests[i];
    const int64_t available = free_count_ - plan.num_new_pages;
    if (pages_needed[i] > available) {
      ++counters_.out_of_pages_refusals;
      result.status = absl::ResourceExhaustedError(absl::StrFormat(
          "%s request %d: out of pages: needs %d pages, %d free",
          RequestKindName(request.kind), request.index, pages_needed[i],
          available));
      continue;
    }
    if (request.owner != run_owner) {
      run_owner = request.owner;
      owner_state = &owners_.at(request.owner);
      owner_batch_pages_ptr = &batch_pages_by_owner[request.owner];
    }
    const OwnerState& owner = *owner_state;
    int64_t& owner_batch_pages = *owner_batch_pages_ptr;
    if (owner.quota_pages > 0 &&
        owner.pages_owned + owner_batch_pages + pages_needed[i] >
            owner.quota_pages) {
      ++counters_.quota_refusals;
      result.status = absl::ResourceExhaustedError(absl::StrFormat(
          "%s request %d: over quota: needs %d pages, owner %d holds %d of "
          "its %d",
          RequestKindName(request.kind), request.index, pages_needed[i],
          request.owner, owner.pages_owned + owner_batch_pages,
          owner.quota_pages));
      continue;
    }
    owner_batch_pages += pages_needed[i];
    // Fields written in place: building a temporary and copying it cost a
    // store-forwarding stall per request (a third of this loop, by perf).
    PlannedRequest& planned = plan.requests.emplace_back();
    planned.prefix_len = shapes[i].prefix_len;
    planned.seq_len = shapes[i].seq_len;
    planned.last_loc = shapes[i].last_loc;
    planned.first_new_page = plan.num_new_pages;
    planned.output_offset = plan.num_slots;
    planned.destination = request.destination;
    if (scrub_) {
      // The request's pages are the next ones at the free list's front.
      for (int64_t k = 0; k < pages_needed[i]; ++k) {
        const int64_t page = RingAt(plan.num_new_pages + k);
        const OwnerId last = last_owner_[page];
        if (last != kNoOwner && last != request.owner) {
          plan.scrub_pages.push_back(page);
        }
      }
    }
    plan.num_new_pages += pages_needed[i];
    plan.num_slots += shapes[i].num_slots();
    result.num_slots = shapes[i].num_slots();
    result.num_new_pages = pages_needed[i];
    admitted.push_back(i);
  }
  return !plan.requests.empty();
}

bool PagePool::ExecutePlan(absl::Span<AllocResult> results) {
  const absl::Status executed = executor_->Execute(scratch_.plan);
  if (executed.ok()) return true;
  for (size_t i : scratch_.admitted) {
    results[i] = AllocResult{executed, 0, 0};
  }
  return false;
}

void PagePool::CommitPlan(absl::Span<const AllocRequest> requests) {
  const std::vector<int64_t>& pages_needed = scratch_.pages_needed;
  const BatchPlan& plan = scratch_.plan;
  // The batch's pages leave the front of the free list, in admission order.
  int64_t next = 0;
  OwnerId commit_owner = kNoOwner;
  OwnerState* commit_state = nullptr;
  for (size_t i : scratch_.admitted) {
    if (requests[i].owner != commit_owner) {
      commit_owner = requests[i].owner;
      commit_state = &owners_.at(commit_owner);
    }
    OwnerState& owner = *commit_state;
    for (int64_t k = 0; k < pages_needed[i]; ++k) {
      const int64_t page = RingAt(next++);
      owner_of_[page] = requests[i].owner;
      allocated_once_[page] = true;
      if (scrub_) last_owner_[page] = requests[i].owner;
      if (owner.given_since_checkpoint.has_value()) {
        owner.given_since_checkpoint->push_back(page);
      }
    }
    owner.pages_owned += pages_needed[i];
  }
  head_ = (head_ + plan.num_new_pages) % capacity_;
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
                                            absl::Span<const int64_t> slots) {
  absl::MutexLock lock(&mu_);
  return FreeDistinct(owner, slots, /*values_are_slots=*/true);
}

absl::StatusOr<int64_t> PagePool::FreePages(OwnerId owner,
                                            absl::Span<const int64_t> pages) {
  absl::MutexLock lock(&mu_);
  return FreeDistinct(owner, pages, /*values_are_slots=*/false);
}

absl::StatusOr<int64_t> PagePool::FreeDistinct(OwnerId owner,
                                               absl::Span<const int64_t> values,
                                               bool values_are_slots) {
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
  return PushFront(pages);
}

absl::Status PagePool::Checkpoint(OwnerId owner) {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  it->second.given_since_checkpoint.emplace();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PagePool::Rollback(OwnerId owner) {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown owner %d", owner));
  }
  OwnerState& state = it->second;
  if (!state.given_since_checkpoint.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("owner %d has no checkpoint to roll back to", owner));
  }
  std::vector<int64_t> given = std::move(*state.given_since_checkpoint);
  state.given_since_checkpoint.reset();
  // A page freed after the checkpoint stays freed (it may belong to someone
  // else by now); one given twice is returned once.
  std::vector<int64_t> pages;
  pages.reserve(given.size());
  absl::flat_hash_set<int64_t> seen;
  for (int64_t page : given) {
    if (owner_of_[page] == owner && seen.insert(page).second) {
      pages.push_back(page);
    }
  }
  for (int64_t page : pages) owner_of_[page] = kNoOwner;
  state.pages_owned -= pages.size();
  counters_.pages_freed += pages.size();
  // Back to the front regardless of policy: a rollback restores, it does
  // not free for later reuse.
  RETURN_IF_ERROR(PushFront(pages));
  return static_cast<int64_t>(pages.size());
}

absl::Status PagePool::Clear() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, state] : owners_) {
    counters_.pages_freed += state.pages_owned;
    state.pages_owned = 0;
    state.given_since_checkpoint.reset();
  }
  return InitFreeList();
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
    stats.owners[id] = OwnerStats{state.pages_owned, state.quota_pages,
                                  state.given_since_checkpoint.has_value()};
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
