// PagePool: one GPU's pool of KV-cache pages, with SGLang's paged-allocator
// semantics (alloc_extend / alloc_decode), per-page ownership, free
// policies, per-owner checkpoints and stats.
//
// Pages have ids 1..num_pages (page 0 is reserved for padding and never
// handed out); page p covers slots [p * page_size, (p + 1) * page_size).
//
// Invariants (CheckInvariants verifies them):
//   - every page is free (in the free list or, under kSorted, parked) xor
//     owned by exactly one registered owner xor shared (published or
//     cached in the prefix index, owner_of kSharedOwner); no page appears
//     twice;
//   - a shared page's count equals the references the owners hold on it,
//     and its pins the owners' pins on it;
//   - each owner's page count equals the pages the owner table gives it;
//   - the executor's free-ring mirror equals the pool's ring.
// A refused request or call changes nothing.
//
// The free list is kept in a ring of capacity num_pages: allocation pops from
// the front (the head moves forward), kLifo frees push to the front (the head
// moves back). The executor mirrors every write to the ring, so a plan only
// needs the head position to find a batch's pages. Where a free goes and
// when parked pages are merged is the FreeListPolicy's decision
// (free_list_policy.h); the pool moves the pages. A launch's plan is built
// by a PlanBuilder (plan_builder.h) as admission accepts requests.
//
// Shared prefix pages (docs/design.md, "Shared prefix pages"): an owner
// publishes pages it owns under content keys (Publish); any owner matches a
// key chain and adopts the pages found, taking a reference (MatchPrefix);
// freeing a shared page drops the owner's reference; a page no owner holds
// stays cached in the PrefixIndex until a batch that the free list cannot
// serve evicts it (least recently used first, once per launch, before
// admission) or ResetPrefixCache does. Shared pages are read-only by
// contract. Changes go to the PoolOptions.kv_event_sink, in order.
//
// Change records and state (docs/design.md, "The pool's change records and
// state"): every change to the pool's state is reported, with its inputs,
// to PoolOptions.change_log; Replay applies such a record to another pool;
// ExportState and CreateFromState take the whole state out and back. A
// pool restored from an exported state, or rebuilt by replaying the
// records, is in the same state as the original: every later operation
// gives the same results. Nothing the pool does depends on the iteration
// order of its hash containers (Abseil seeds their hash per process), so
// this holds across processes.
//
// This class is thread-safe.

#ifndef PAGEALLOC_ALLOCATOR_PAGE_POOL_H_
#define PAGEALLOC_ALLOCATOR_PAGE_POOL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "allocator/executor.h"
#include "allocator/free_list_policy.h"
#include "allocator/page_ref_counts.h"
#include "allocator/plan_builder.h"
#include "allocator/pool_change_log.h"
#include "allocator/pool_state.h"
#include "allocator/prefix_index.h"
#include "allocator/requests.h"
#include "kv_events/sink.h"

namespace pagealloc {

// owner_of a shared page (published or cached): held by references, owned
// by no single owner. Never a registered owner.
inline constexpr OwnerId kSharedOwner = ~OwnerId{0};

// Who writes an allocation's slots (PagePool::Allocate).
enum class Expansion : uint8_t {
  // The executor's launch, at destinations in its address space.
  kExecutor,
  // The pool itself, on the calling thread, from its own copy of the free
  // list (ExpandPlan, plan_expansion.h), at host destinations; the executor
  // is not called. For a call whose slots its caller needs on the host at
  // once, such as a session reserve's refill of whole pages: on the CUDA
  // backend the executor's launch and the copy back would wait for the
  // daemon's turn on the GPU, which the clients' own contexts hold for
  // milliseconds at a time without MPS.
  kPool,
};

struct PoolOptions {
  int64_t num_pages = 0;  // usable pages, >= 1
  int64_t page_size = 1;  // tokens per page, >= 1
  FreePolicy free_policy = FreePolicy::kLifo;
  Semantics semantics = Semantics::kPagealloc;
  // Remember each page's last owner and list, in each batch's plan
  // (BatchPlan.scrub_pages), the pages handed to an owner other than their
  // last one, for the executor to zero (--kv_scrub). A page never owned is
  // not listed (the slab starts zeroed).
  bool scrub = false;
  // With page_size 1, plan batches as ring copies (BatchPlan.ring_copies:
  // one per run of requests whose destinations follow each other, e.g. one
  // per decode call) instead of one expanded request each. The slots are
  // the same; the copies cost the planner and the executor O(1) per run
  // instead of per request. Off: the general form, which tests compare
  // against. Ignored for other page sizes.
  bool ring_copy_plans = true;
  // Most pages one owner may pin (Publish with pin); 0: pins are refused.
  int64_t max_pinned_pages_per_owner = 0;
  // Where prefix-cache changes are reported (BlocksStored, BlocksRemoved,
  // AllBlocksCleared), under the pool's lock and in order; may be null.
  // Must outlive the pool.
  KvEventSink* kv_event_sink = nullptr;
  // Where every change to the pool's state is recorded, under the pool's
  // lock and in order (pool_change_log.h); may be null (no records, and no
  // cost beyond a comparison per operation). Must outlive the pool.
  PoolChangeLog* change_log = nullptr;
};

// What Publish did with each key of its chain.
struct PublishOutcome {
  // pages[i]: the page published under keys[i] now: the caller's pages[i],
  // or, when the key was already published or cached, the page that holds
  // it (the caller's pages[i] stays the caller's, for it to free).
  std::vector<int64_t> pages;
  // existing[i]: keys[i] was already in the index.
  std::vector<bool> existing;
  int64_t newly_published = 0;  // keys published by this call
};

// The outcome of one request of a batch.
struct AllocResult {
  absl::Status status;        // OK, or why the request was refused
  int64_t num_slots = 0;      // slots written to the request's destination
  int64_t num_new_pages = 0;  // pages the request took from the free list
};

// Per-owner figures.
struct OwnerStats {
  int64_t pages_owned = 0;
  int64_t quota_pages = 0;  // 0: no quota beyond the pool itself
  bool checkpoint_active = false;
  int64_t checkpoints = 0;  // active checkpoints (the stack's depth)
  // Shared pages the owner holds references on (distinct pages; they count
  // towards its quota), and the pages it pins.
  int64_t shared_pages = 0;
  int64_t pinned_pages = 0;
};

// The free list and the parked pages, read together under the pool's lock
// (a debug view). Each list holds at most the `max_pages` asked for.
struct FreeListsView {
  std::vector<int64_t> free_pages;    // the front of the free list, in order
  std::vector<int64_t> parked_pages;  // in the order they were parked
  int64_t free_count = 0;             // the whole list's length
  int64_t parked_count = 0;
};

// A snapshot of the pool, taken under its lock.
struct PoolStats {
  int64_t page_size = 0;
  int64_t total_pages = 0;   // usable pages (page 0 excluded)
  int64_t free_pages = 0;    // in the free list, ready to hand out
  int64_t parked_pages = 0;  // freed under kSorted, not yet merged back
  int64_t used_pages = 0;    // owned by some owner (shared pages excluded)
  // Shared prefix pages (their sum is the index's size; together with the
  // three above they make total_pages).
  int64_t published_pages = 0;             // held by at least one reference
  int64_t cached_pages = 0;                // held by none, KV still valid
  int64_t pinned_pages = 0;                // pinned, published or cached
  int64_t evictable_pages = 0;             // cached and not pinned
  int64_t max_pinned_pages_per_owner = 0;  // PoolOptions'; fixed
  // Counters since start.
  int64_t slots_allocated = 0;
  int64_t pages_allocated = 0;
  int64_t pages_freed = 0;  // by Free, Rollback and ReleaseOwner together
  int64_t out_of_pages_refusals = 0;
  int64_t quota_refusals = 0;
  int64_t free_list_sorts = 0;
  int64_t batches_executed = 0;
  int64_t pages_scrubbed = 0;  // listed for scrubbing (PoolOptions.scrub)
  // Prefix cache counters since start.
  int64_t prefix_pages_published = 0;         // keys newly published
  int64_t prefix_publish_existing = 0;        // keys published that were there
  int64_t prefix_lookup_pages = 0;            // keys looked up by MatchPrefix
  int64_t prefix_hit_pages = 0;               // of them, found (the prefix)
  int64_t prefix_pages_adopted = 0;           // references taken by adopts
  int64_t prefix_evicted_for_allocation = 0;  // evicted inside a launch
  int64_t prefix_evicted_by_reset = 0;        // by ResetPrefixCache
  int64_t prefix_cleared = 0;                 // dropped by ClearPool
  absl::flat_hash_map<OwnerId, OwnerStats> owners;
};

class PagePool {
 public:
  // Builds a pool whose free list is 1, 2, ..., num_pages and writes it to
  // the executor's mirror. `executor` must outlive the pool. Returns
  // INVALID_ARGUMENT for bad options, or the executor's error.
  static absl::StatusOr<std::unique_ptr<PagePool>> Create(
      const PoolOptions& options, PlanExecutor* executor);

  // Builds a pool in `state` (what ExportState returned, here or in another
  // process) and writes its free list to the executor's mirror. Validates
  // the whole state first: that it fits `options` (semantics version, page
  // size and count, policy, semantics, scrub, pin bound) and the class
  // invariants (every page exactly once: free, parked, owned by a listed
  // owner, or shared with counts and pins that equal the owners'
  // references and pins; owners, checkpoints and logs within their
  // bounds). Returns DATA_LOSS naming the first violation, INVALID_ARGUMENT
  // for bad options, or the executor's error. `executor` must outlive the
  // pool; records go on to options.change_log.
  static absl::StatusOr<std::unique_ptr<PagePool>> CreateFromState(
      const PoolOptions& options, PlanExecutor* executor,
      const PoolState& state);

  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // Most active checkpoints per owner: a Checkpoint beyond them ends the
  // owner's oldest one.
  static constexpr int kMaxCheckpoints = 64;

  const PoolGeometry& geometry() const { return geometry_; }
  FreePolicy free_policy() const { return policy_.policy(); }
  Semantics semantics() const { return policy_.semantics(); }
  PlanExecutor* executor() const { return executor_; }

  // Registers an owner. quota_pages 0 means no quota. `metadata` is kept
  // with the owner, opaque (the server's session record), in ExportState
  // too. Returns INVALID_ARGUMENT for owner 0 or kSharedOwner, a negative
  // quota or metadata over kMaxOwnerMetadataBytes, ALREADY_EXISTS for an
  // owner already registered.
  absl::Status AddOwner(OwnerId owner, int64_t quota_pages,
                        std::string metadata = {}) ABSL_LOCKS_EXCLUDED(mu_);

  // Returns the metadata `owner` was registered with, or NOT_FOUND.
  absl::StatusOr<std::string> OwnerMetadata(OwnerId owner) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Frees every page `owner` holds (as Free does, under the pool's policy)
  // and forgets the owner. Returns the number of pages freed, or NOT_FOUND.
  absl::StatusOr<int64_t> RemoveOwner(OwnerId owner) ABSL_LOCKS_EXCLUDED(mu_);

  // Plans and executes a batch in one executor launch. `calls` divides the
  // batch into allocation calls (their num_requests add up to
  // requests.size(); empty: the whole batch is one call). Requests are
  // admitted in order, each all-or-nothing: a request that fails
  // validation, would take a page the pool does not have
  // (RESOURCE_EXHAUSTED with pages needed and pages free), is longer than
  // the pool's num_pages * page_size slots (RESOURCE_EXHAUSTED: it can never
  // fit) or would exceed its owner's quota is refused and changes nothing;
  // the rest of the batch proceeds. A call with all_or_nothing set is
  // admitted whole or not at all: when one of its requests is refused, every
  // other request of the call is refused too, with RESOURCE_EXHAUSTED when
  // the refusal was RESOURCE_EXHAUSTED (it does not fit) and ABORTED
  // otherwise, each message naming the request that decided.
  //
  // A call tagged with a CallTag (docs/design.md, "Retries by call id";
  // its requests share one owner) is kept among its owner's latest calls
  // (the kKeptCallsPerOwner largest ids that took effect) when a request
  // of it was admitted: the pages it took, in order (none for a request of
  // no new page). A retry of a call (CallTag.retry):
  //   - of a kept call whose allocation took effect: the pages it took go
  //     back to the front of the free list first (its caller never had
  //     them: the answer was lost with the daemon), and then it runs as a
  //     first call would, within the same operation. When one of those
  //     pages is no longer the owner's (or awaits release, or another kept
  //     call took it again), or a tagged allocation of the owner was too
  //     old to be kept since (kCallPagesMoved), every request of the call
  //     is refused with ABORTED (whether it took effect is unknown).
  //   - of a call older than every kept one, with kKeptCallsPerOwner kept:
  //     every request of the call is refused with ABORTED.
  //   - otherwise (the call, or its allocation, did not take effect): it
  //     runs as a first call would.
  //
  // Under kSorted, parked pages are merged into the free list and the list
  // sorted ascending: under Semantics::kPagealloc once, before admission,
  // when the batch as a whole needs more pages than are free; under
  // Semantics::kSglang before each call whose SGLang over-estimate exceeds
  // the free pages left (extend: slots // page_size + requests + 1; decode:
  // requests; alloc, and every call with page_size 1: the pages it needs),
  // whether or not the call then fits. A merge is a free-list change only
  // and stays when the call is refused. Returns one result per request, in
  // order; with a `calls` that does not add up, every result is INTERNAL.
  std::vector<AllocResult> Allocate(absl::Span<const AllocRequest> requests,
                                    absl::Span<const CallSpan> calls = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same, into `results` (resized to one per request). A caller that
  // allocates batch after batch keeps one vector and so reuses its storage.
  // With Expansion::kPool every destination is host memory, and the pool
  // writes the slots there itself instead of launching the executor.
  void Allocate(absl::Span<const AllocRequest> requests,
                std::vector<AllocResult>* results) ABSL_LOCKS_EXCLUDED(mu_) {
    Allocate(requests, {}, results);
  }
  void Allocate(absl::Span<const AllocRequest> requests,
                absl::Span<const CallSpan> calls,
                std::vector<AllocResult>* results,
                Expansion expansion = Expansion::kExecutor)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the pool lists pages to scrub (PoolOptions.scrub), which only the
  // executor can zero: Expansion::kPool then refuses a batch that has any.
  bool scrubs() const { return scrub_; }

  // Frees the distinct pages of `slots` (slot / page_size), all or nothing,
  // and puts them back in `order` (FreeOrder::kDefault: the pool's) under
  // the pool's policy: kSorted parks them; kLifo puts them at the front of
  // the free list, or, under Semantics::kSglang with page_size 1, at its
  // back (SGLang's token allocator reuses freed slots last). Returns the
  // number of pages freed, or INVALID_ARGUMENT (a slot outside the usable
  // range), FAILED_PRECONDITION (a free page: "was never allocated", or
  // "was already freed" for a double free), PERMISSION_DENIED (a page of
  // another owner) or NOT_FOUND (unknown owner), naming slots[i].
  //
  // Tagged operations. FreeSlots, FreePages, AwaitRelease, Checkpoint,
  // Rollback and ClearOwner take the caller's CallTag (`call`; the default
  // is untagged). A tagged one that takes effect is kept as a part of its
  // call among the owner's latest (PoolKeptCall, as Allocate keeps its
  // calls); a retry is answered as RetriedCall says, changing nothing when
  // it is answered from what was kept.
  absl::StatusOr<int64_t> FreeSlots(OwnerId owner,
                                    absl::Span<const int64_t> slots,
                                    FreeOrder order = FreeOrder::kDefault,
                                    CallTag call = {}) ABSL_LOCKS_EXCLUDED(mu_);

  // As FreeSlots, for page ids (messages name pages[i]). The default order
  // is first appearance under both semantics: a list of page ids is
  // SGLang's free_segment (one slot per page, in the sequence's order).
  absl::StatusOr<int64_t> FreePages(OwnerId owner,
                                    absl::Span<const int64_t> pages,
                                    FreeOrder order = FreeOrder::kDefault,
                                    CallTag call = {}) ABSL_LOCKS_EXCLUDED(mu_);

  // Checks a free of `values` (slots when `values_are_slots`, else page
  // ids) exactly as FreeSlots / FreePages would, with the same errors, and
  // returns its distinct pages in the order that free would put them back
  // (shared prefix pages, whose free drops a reference, last); changes
  // nothing. (A free whose pages stay owned until a fence passes is
  // checked now and done later with FreePages of these pages in this
  // order, FreeOrder::kFirstAppearance.)
  absl::StatusOr<std::vector<int64_t>> CheckFree(
      OwnerId owner, absl::Span<const int64_t> values, bool values_are_slots,
      FreeOrder order = FreeOrder::kDefault) const ABSL_LOCKS_EXCLUDED(mu_);

  // Marks `pages` of `owner` as awaiting release: a free that waits for
  // the owner's release fence has been accepted for them
  // (docs/design.md, "The release fence"), and they stay the owner's until
  // it is done (FreePages). Nothing else changes: no operation's outcome
  // depends on it. The mark is state, kept across the daemon's restart, so
  // that a restarted daemon knows which of a session's pages were freed
  // already and waited only for the session's GPU work. A page stops
  // awaiting when it stops being the owner's (freed, rolled back, cleared,
  // its reference dropped); one the owner publishes meanwhile awaits as
  // the shared page it holds a reference on. Each page must be the
  // owner's or a shared page it holds a reference on, and not awaiting
  // already: FAILED_PRECONDITION naming pages[i] otherwise (a repeat too),
  // INVALID_ARGUMENT for a page outside the pool, NOT_FOUND for an unknown
  // owner; nothing changes then. Tagged, it is the free part of its call
  // (the free's answer: pages.size() pages freed).
  absl::Status AwaitRelease(OwnerId owner, absl::Span<const int64_t> pages,
                            CallTag call = {}) ABSL_LOCKS_EXCLUDED(mu_);
  // `owner`'s pages awaiting release, in the order they began to wait, or
  // NOT_FOUND.
  absl::StatusOr<std::vector<int64_t>> PagesAwaitingRelease(OwnerId owner) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Pushes a checkpoint on `owner`'s stack and returns its id (per owner,
  // from 1, never reused). From then on the pool records the pages the
  // owner is given. At kMaxCheckpoints active checkpoints the oldest ends.
  // Returns NOT_FOUND for an unknown owner.
  absl::StatusOr<uint64_t> Checkpoint(OwnerId owner, CallTag call = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // Returns every page `owner` was given since checkpoint `checkpoint_id`
  // and still owns to the front of the free list, in the order they were
  // given, under either policy and semantics; with one owner and no frees
  // since the checkpoint this restores the free list exactly (SGLang's
  // restore_state). Pages freed since stay freed. The checkpoints taken
  // after it end; the checkpoint itself stays active, so it can be rolled
  // back to again (restore_state of the same state twice).
  // checkpoint_id 0 means the latest, and ends it too. Returns the pages
  // returned, FAILED_PRECONDITION when the owner has no active checkpoint
  // or none with that id (never taken, or ended: rolled back past, by a
  // rollback with id 0, by ClearOwner or Clear, or as the oldest beyond
  // kMaxCheckpoints), or NOT_FOUND.
  absl::StatusOr<int64_t> Rollback(OwnerId owner, uint64_t checkpoint_id = 0,
                                   CallTag call = {}) ABSL_LOCKS_EXCLUDED(mu_);

  // Frees every page `owner` holds (ascending, as RemoveOwner does) and
  // ends its checkpoints; the owner stays registered. When no page of the
  // pool is owned afterwards, the free list is reset to 1..num_pages and
  // nothing stays parked (SGLang's clear). Returns the pages freed, or
  // NOT_FOUND.
  absl::StatusOr<int64_t> ClearOwner(OwnerId owner, CallTag call = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // What `part` of tagged `call` of `owner` does now: the kept call, when
  // `call` is a retry of one and that part took effect (the caller answers
  // with what it kept: PoolKeptCall's fields, and does nothing); nullopt
  // when it is to run (untagged, a first try, or a retry of a call or part
  // that did not take effect: a call newer than the oldest kept, or any
  // while fewer than kKeptCallsPerOwner are kept, that is not kept never
  // took effect); ABORTED when `call` is a retry older than every kept
  // call and kKeptCallsPerOwner are kept (whether it took effect is
  // unknown); NOT_FOUND for an unknown owner. The tagged operations
  // answer so themselves; a caller that must know before it acts (a
  // fenced free checks its pages first, which the done free changed)
  // asks here, in order with the owner's other operations.
  absl::StatusOr<std::optional<PoolKeptCall>> RetriedCall(OwnerId owner,
                                                          CallTag call,
                                                          CallPart part) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The id of `owner`'s latest tagged call (0: none), or NOT_FOUND. A
  // client that resumes the session numbers its calls on from it.
  absl::StatusOr<uint64_t> LastCallId(OwnerId owner) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Frees every page and resets the free list to 1..num_pages. Owners stay
  // registered; checkpoints end. Without `force`, refuses with
  // FAILED_PRECONDITION, naming the owners and their pages, when any owner
  // holds a page, and changes nothing. Returns the pages freed.
  absl::StatusOr<int64_t> ClearPool(bool force) ABSL_LOCKS_EXCLUDED(mu_);
  // ClearPool(/*force=*/true).
  absl::Status Clear() ABSL_LOCKS_EXCLUDED(mu_) {
    return ClearPool(/*force=*/true).status();
  }

  // Publishes `owner`'s pages[i] under keys[i], in chain order: keys[0]'s
  // parent is `parent_key` (null at the start of a chain), keys[i]'s is
  // keys[i - 1]. A page published becomes shared with one reference, the
  // owner's (its free drops it), and leaves the owner's pages (a rollback
  // does not return it). A key already in the index keeps its page, which
  // the outcome names; the caller's page stays its own. With `pin` every
  // key's page is pinned by the owner (never evicted while pinned; pins
  // end with Unpin, ClearOwner or RemoveOwner), refused with
  // RESOURCE_EXHAUSTED beyond PoolOptions.max_pinned_pages_per_owner.
  //
  // REQUIRES of the caller (not checkable here): the GPU work that fills
  // the pages is complete; the pages are whole (page_size tokens each).
  //
  // All or nothing. Returns NOT_FOUND (unknown owner), INVALID_ARGUMENT
  // (pages and keys of different lengths, more keys than the pool's pages,
  // a key repeated in the call, a page out of range or repeated; naming the
  // index), FAILED_PRECONDITION (a free page, or a shared page published
  // under another key), PERMISSION_DENIED (another owner's page).
  absl::StatusOr<PublishOutcome> Publish(OwnerId owner,
                                         absl::Span<const int64_t> pages,
                                         absl::Span<const PrefixKey> keys,
                                         const PrefixKey* parent_key, bool pin)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Returns the pages of the longest prefix of `keys` that is published or
  // cached, in chain order. With `adopt`, takes one reference for `owner`
  // on each, atomically with the match (no eviction in between): cached
  // pages become published; the owner frees them (FreePages/FreeSlots) to
  // drop the references. Returns NOT_FOUND (unknown owner),
  // INVALID_ARGUMENT (more keys than the pool's pages, or a key the matched
  // prefix holds twice, "keys[i] repeats keys[j]": the keys after the first
  // miss are not looked at), or, for an adopt that would put the owner over
  // its quota, RESOURCE_EXHAUSTED; a refused match or adopt changes nothing.
  absl::StatusOr<std::vector<int64_t>> MatchPrefix(
      OwnerId owner, absl::Span<const PrefixKey> keys, bool adopt)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Removes `owner`'s pins from `pages` (shared pages it pinned), all or
  // nothing. Returns the pins removed, NOT_FOUND or INVALID_ARGUMENT (a
  // page the owner has not pinned, naming pages[i]).
  absl::StatusOr<int64_t> Unpin(OwnerId owner, absl::Span<const int64_t> pages)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Evicts every cached, unpinned page (the operator's reset) to the back
  // of the free list, reporting them removed, or AllBlocksCleared when the
  // cache ends empty. Published and pinned pages stay. Returns the pages
  // evicted, or the executor's error when the free list's mirror write
  // fails.
  absl::StatusOr<int64_t> ResetPrefixCache() ABSL_LOCKS_EXCLUDED(mu_);

  // The cached, unpinned pages, least recently used (evicted) first.
  std::vector<int64_t> EvictionOrder() const ABSL_LOCKS_EXCLUDED(mu_);
  // The count of references on shared `page` (0 for a cached one, or a
  // page that is not shared). REQUIRES: 0 <= page <= num_pages.
  int64_t SharedCount(int64_t page) const ABSL_LOCKS_EXCLUDED(mu_);

  PoolStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // The free list in order (parked pages not included), and the parked
  // pages in the order they were freed.
  std::vector<int64_t> FreeList() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<int64_t> ParkedPages() const ABSL_LOCKS_EXCLUDED(mu_);
  // Both, read together, at most `max_pages` of each (>= 0).
  FreeListsView FreeLists(int64_t max_pages) const ABSL_LOCKS_EXCLUDED(mu_);

  // The owner of `page`, kNoOwner when free. REQUIRES: 0 <= page <= num_pages.
  OwnerId OwnerOf(int64_t page) const ABSL_LOCKS_EXCLUDED(mu_);
  // The pages `owner` owns, ascending, and the shared pages it holds
  // references on, ascending (a scan of the owner table: O(num_pages)).
  // NOT_FOUND for an unknown owner.
  struct OwnedPages {
    std::vector<int64_t> owned;
    std::vector<int64_t> shared;
  };
  absl::StatusOr<OwnedPages> PagesOwnedBy(OwnerId owner) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The last owner `page` was handed to (kept after it is freed), kNoOwner
  // when it never was; always kNoOwner unless PoolOptions.scrub.
  // REQUIRES: 0 <= page <= num_pages.
  OwnerId LastOwnerOf(int64_t page) const ABSL_LOCKS_EXCLUDED(mu_);

  // Verifies the class invariants, the executor mirror included (which
  // synchronizes the executor). Returns INTERNAL describing the first
  // violation.
  absl::Status CheckInvariants() ABSL_LOCKS_EXCLUDED(mu_);

  // Returns the whole state, read under the lock (pool_state.h). O(pages).
  PoolState ExportState() const ABSL_LOCKS_EXCLUDED(mu_);

  // Applies `change`, a record another pool (or this one) made, as that
  // operation, with Execute skipped for an allocation: the batch is
  // admitted and committed (or, when the record's launch failed, refused
  // with the recorded error) as the original was, and the free ring's
  // writes still go to the executor's mirror, but no slots are written.
  // Applied in order to a pool in the recording pool's state at the first
  // record, records leave it in that pool's state. With `results`, an
  // allocation's results go there (as Allocate returned them). The change
  // is not recorded again to this pool's change log. Returns DATA_LOSS when
  // the record does not apply: the operation refuses it (which changes
  // nothing), or its outcome differs from the recorded one (the pools had
  // diverged before it: an allocation that launched nothing where the
  // original's launch failed, an adopt refused on one side only); the
  // message says which, with the operation's own error.
  absl::Status Replay(const PoolChange& change,
                      std::vector<AllocResult>* results = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // An active checkpoint: its id and where the owner's log stood.
  struct CheckpointMark {
    uint64_t id = 0;
    size_t log_position = 0;
  };
  struct OwnerState {
    int64_t pages_owned = 0;
    int64_t quota_pages = 0;
    // Active checkpoints, oldest first.
    std::vector<CheckpointMark> checkpoints;
    // While a checkpoint is active: the pages given since the log was last
    // empty, in order. Entry k is live (the page is still the owner's from
    // that give) when owner_of_[page] is the owner and log_index_[page] ==
    // k; frees leave dead entries, which CompactLog drops.
    std::vector<int64_t> given_log;
    uint64_t next_checkpoint_id = 1;
    // References on shared pages: page -> count (> 0). refs.size() counts
    // towards the quota.
    PageRefCounts refs;
    // Shared pages the owner pins (one pin per page and owner).
    absl::flat_hash_set<int64_t> pins;
    // AddOwner's opaque bytes.
    std::string metadata;
    // Pages awaiting release (AwaitRelease), in the order they began to
    // wait; empty on the common path, where nothing is fenced.
    std::vector<int64_t> awaiting_release;
    // The owner's latest tagged calls (PoolOwnerState.kept_calls).
    std::vector<PoolKeptCall> kept_calls;
  };

  // What an allocation's launch did (for its record).
  enum class LaunchOutcome : uint8_t {
    kNone,    // nothing was launched
    kRan,     // the plan ran and was committed
    kFailed,  // the executor failed it (scratch_.launch_status): refused
  };
  // A launch Replay stands in for: Execute is skipped and the launch taken
  // to have failed with *failure, or to have run when failure is null.
  struct ReplayedLaunch {
    const absl::Status* failure = nullptr;
  };

  PagePool(const PoolOptions& options, PlanExecutor* executor);

  // INVALID_ARGUMENT for options Create refuses.
  static absl::Status ValidateOptions(const PoolOptions& options,
                                      PlanExecutor* executor);
  // Sets the pool's state to `state` after checking it all
  // (CreateFromState), and writes the free list to the executor's mirror.
  // DATA_LOSS naming the first violation.
  absl::Status RestoreState(const PoolState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PoolState ExportStateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reports `change` to the change log, then hands it a snapshot when it
  // wants one. REQUIRES: change_log_ != nullptr.
  void LogChange(const PoolChange& change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs a change that names only its kind and owner, when the pool has a
  // change log.
  void LogOwnerChange(PoolChangeKind kind, OwnerId owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The operations' bodies, under the lock, for the public methods (which
  // record them) and Replay (which does not).
  absl::Status AddOwnerLocked(OwnerId owner, int64_t quota_pages,
                              std::string metadata)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> RemoveOwnerLocked(OwnerId owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Allocate's body: validates, makes room, admits, launches (on the
  // executor, or as `replay` says when it is not null) and commits.
  // REQUIRES: `calls` adds up to requests.size(); results.size() ==
  // requests.size(), every status OK.
  LaunchOutcome AllocateLocked(absl::Span<const AllocRequest> requests,
                               absl::Span<const CallSpan> calls,
                               absl::Span<AllocResult> results,
                               const ReplayedLaunch* replay,
                               Expansion expansion = Expansion::kExecutor)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint64_t> CheckpointLocked(OwnerId owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> RollbackLocked(OwnerId owner, uint64_t checkpoint_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> ClearOwnerLocked(OwnerId owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> ClearPoolLocked(bool force)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<PublishOutcome> PublishLocked(OwnerId owner,
                                               absl::Span<const int64_t> pages,
                                               absl::Span<const PrefixKey> keys,
                                               const PrefixKey* parent_key,
                                               bool pin)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets *found to the number of pages the walk found when the call
  // counted its lookups (it then changed the counters, refused or not, and
  // is recorded), to -1 when it did not.
  absl::StatusOr<std::vector<int64_t>> MatchPrefixLocked(
      OwnerId owner, absl::Span<const PrefixKey> keys, bool adopt,
      int64_t* found) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replays a kMatchPrefix record of what the walk found, without its keys
  // (record format 2):
  // an adopt's pages are walked again by their keys in the index, which
  // must find them all and take them as the original did; a plain match
  // or a refused adopt counts. DATA_LOSS when it does not apply.
  absl::Status ReplayFoundMatchLocked(const PoolChange& change)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AwaitReleaseLocked(OwnerId owner,
                                  absl::Span<const int64_t> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RetriedCall under the lock: the kept call to answer with, or null to
  // run the part.
  absl::StatusOr<const PoolKeptCall*> RetriedLocked(OwnerId owner, CallTag call,
                                                    CallPart part) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes that `part` of tagged `call` took effect for `owner`: returns
  // its kept call for the caller to fill in the part's answer (a new one
  // replaces the oldest when kKeptCallsPerOwner are kept), or null when
  // the call is not kept (untagged, or older than every kept call with
  // kKeptCallsPerOwner kept). Valid until the next NoteCall.
  PoolKeptCall* NoteCall(OwnerId owner, CallTag call, CallPart part)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A tagged operation's frame, under the lock: a retry of `part` that
  // took effect is answered with the kept call's `answer`, and nothing
  // runs; otherwise `run` (returning absl::StatusOr<T>) runs and, when it
  // succeeds, the part is kept with its answer and `change`, tagged with
  // `call`, is recorded.
  template <typename T, typename Run>
  absl::StatusOr<T> RunTagged(OwnerId owner, CallTag call, CallPart part,
                              T PoolKeptCall::*answer, PoolChange change,
                              Run run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Allocate's tagged calls before validation: refuses the retries that
  // cannot run, and gives back the pages of those that run again.
  void BeginTaggedCalls(absl::Span<const AllocRequest> requests,
                        absl::Span<const CallSpan> calls,
                        absl::Span<AllocResult> results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the commit: keeps each tagged call a request of which was admitted,
  // with the pages it took (from ring position `first` on, in request order).
  void EndTaggedCalls(absl::Span<const AllocRequest> requests,
                      absl::Span<const CallSpan> calls,
                      absl::Span<const AllocResult> results, int64_t first)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replay's half of a tagged operation: notes its part as the original
  // did, with `value` its answer.
  void ReplayNote(const PoolChange& change, int64_t value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the wait of those of `pages` that await release in `state` (they
  // stopped being its owner's). O(1) when none awaits.
  void EndAwait(OwnerState& state, absl::Span<const int64_t> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> UnpinLocked(OwnerId owner,
                                      absl::Span<const int64_t> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> ResetPrefixCacheLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replay's allocation and free (the rest map one to one onto the bodies).
  absl::Status ReplayAllocate(const PoolChange& change,
                              std::vector<AllocResult>* results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReplayFree(const PoolChange& change)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status InitFreeList() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t RingAt(int64_t index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ring_[ModNonNegative(head_ + index, capacity_)];
  }
  // Writes ring_[position .. position + pages.size()) (modulo capacity) and
  // mirrors the write to the executor.
  absl::Status WriteRing(int64_t position, absl::Span<const int64_t> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pushes `pages` to the front of the free list, first page first.
  absl::Status PushFront(absl::Span<const int64_t> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends `pages` to the back of the free list, first page first.
  absl::Status PushBack(absl::Span<const int64_t> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Merges parked pages into the free list past its first `keep` entries
  // (pages a batch being planned takes) and sorts that part ascending.
  // REQUIRES: 0 <= keep <= free_count_.
  absl::Status MergeParkedAndSort(int64_t keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pages `owner` holds, ascending (a scan of the owner table).
  std::vector<int64_t> PagesOf(OwnerId owner, int64_t count) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records `page` as given to `state`'s owner when a checkpoint is active.
  void LogGiven(OwnerState& state, int64_t page)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (state.checkpoints.empty()) return;
    log_index_[page] = state.given_log.size();
    state.given_log.push_back(page);
  }
  // Drops the log entries no checkpoint needs (dead ones, and those before
  // the oldest checkpoint) once the log has grown well past the pages the
  // owner holds, so that it stays O(pages owned + kMaxCheckpoints).
  void MaybeCompactLog(OwnerId owner, OwnerState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends every checkpoint of `state`.
  static void EndCheckpoints(OwnerState& state) {
    state.checkpoints.clear();
    state.given_log.clear();
  }
  // Checks that `request`'s owner owns last_loc's page (the request writes
  // into it). Messages name last_locs[index]; they are only built on refusal.
  // A free page is FAILED_PRECONDITION, worded by FreePageState.
  absl::Status CheckLastLocOwned(const AllocRequest& request,
                                 int64_t last_loc) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "was never allocated" or "was already freed": why a free `page` cannot
  // be freed or written into.
  const char* FreePageState(int64_t page) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return allocated_once_[page] ? "was already freed" : "was never allocated";
  }
  // Validates and frees the distinct pages of `values` (slots or page ids),
  // all or nothing, in `order`, and records the free. Messages name
  // slots[i] or pages[i].
  absl::StatusOr<int64_t> FreeDistinct(OwnerId owner,
                                       absl::Span<const int64_t> values,
                                       bool values_are_slots, FreeOrder order,
                                       CallTag call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees what ResolveFree resolved: drops `state`'s references on
  // `shared`, then releases `pages`.
  absl::Status ApplyFree(OwnerState& state, absl::Span<const int64_t> pages,
                         absl::Span<const int64_t> shared)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FreeDistinct's checks: the distinct owned pages of `values`, in
  // `order`; the shared pages among them (whose free drops the owner's
  // reference) into `shared`.
  absl::StatusOr<std::vector<int64_t>> ResolveFree(
      OwnerId owner, absl::Span<const int64_t> values, bool values_are_slots,
      FreeOrder order, std::vector<int64_t>* shared) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts a call's repeat check (seen_stamp_): a new epoch, the table
  // cleared when the epoch wraps.
  uint32_t NewSeenEpoch() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `pages` free and returns them under the pool's policy.
  absl::Status ReleasePages(OwnerState& state, absl::Span<const int64_t> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops one of `state`'s references on each shared page of `pages`, the
  // last page first, so that of the pages this makes cached the deepest of
  // a chain is evicted first. REQUIRES: state holds a reference on each.
  void ReleaseRefs(OwnerState& state, absl::Span<const int64_t> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT when a chain of `num_keys` keys is longer than the
  // pool's pages (the index could never hold it).
  absl::Status CheckChainLength(size_t num_keys) const;
  // Drops every reference and pin `state` holds (its pages stay shared), in
  // descending page order: the pages this makes cached enter the LRU in an
  // order that does not depend on the hash sets' iteration.
  void DropShared(OwnerState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts up to `max_pages` cached pages, least recently used first, to
  // the back of the free list (the launch being admitted takes from its
  // front up to the free count) and reports their keys removed. Returns
  // the pages evicted, or the executor's error.
  absl::StatusOr<int64_t> Evict(int64_t max_pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Allocate's passes, in the order it runs them. Each reads and writes
  // scratch_; only the merges (MakeRoomForBatch, MakeRoomForCall: a sort
  // of the free list) and CommitPlan change the pool.
  //
  // Checks everything about each request that does not depend on admission
  // order: its shape, its owner, its length against the pool, its
  // destination, and that last_loc's page is the owner's when the request
  // writes into it. Sets results[i].status for each request it refuses and
  // leaves the others OK; fills scratch_.shapes and scratch_.pages_needed
  // (0 for a refused request). Returns the pages the requests it accepts
  // need, together.
  // REQUIRES: results.size() == requests.size(), every status OK.
  int64_t ValidateRequests(absl::Span<const AllocRequest> requests,
                           absl::Span<AllocResult> results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ValidateRequests' loop, compiled once for page_size 1 (kUnitPages: no
  // prefix ends inside a page; shapes are kept only for request plans) and
  // once for the rest.
  template <bool kUnitPages>
  int64_t ValidateRequestsOf(absl::Span<const AllocRequest> requests,
                             absl::Span<AllocResult> results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Merges the parked pages into the free list and sorts it when the
  // policy's per-batch trigger says so for a batch needing `batch_pages`
  // (FreeListPolicy::MergeBeforeBatch); then, when the free and parked
  // pages together still fall short, evicts the shortfall of cached pages
  // once for the whole launch. Otherwise changes nothing. Returns the
  // executor's error when the mirror write fails.
  absl::Status MakeRoomForBatch(int64_t batch_pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Merges the parked pages into the free list past the `planned_pages`
  // the launch's earlier calls take, and sorts that part, when the policy's
  // per-call trigger says so for `call` (FreeListPolicy::MergeBeforeCall).
  absl::Status MakeRoomForCall(absl::Span<const AllocRequest> call,
                               int64_t planned_pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Admission: AdmitAndPlan runs AdmitCall per call, which runs
  // AdmitRequest per request; a PlanBuilder on AdmitAndPlan's stack
  // collects the plan. None changes page or owner state; the free list only
  // by MakeRoomForCall's merges.
  //
  // Admits the requests ValidateRequests accepted, in order, against the
  // free pages and their owners' quotas, and builds scratch_.plan_storage
  // (the plan, reading from the current head of the free list, and the
  // admitted requests' indices). Sets a refused request's status to
  // RESOURCE_EXHAUSTED and counts the refusal; fills an admitted request's
  // num_slots and num_new_pages. Refuses an all-or-nothing call whole (see
  // Allocate). Returns false when no request was admitted (nothing to
  // launch), or with every admitted result set to the error when a merge's
  // mirror write failed.
  // REQUIRES: ValidateRequests (and MakeRoomForBatch) ran on `requests`;
  // `calls` adds up to requests.size().
  bool AdmitAndPlan(absl::Span<const AllocRequest> requests,
                    absl::Span<const CallSpan> calls,
                    absl::Span<AllocResult> results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The owner of the run of requests being admitted (page_pool.cc).
  struct OwnerCursor;
  // Admits the call of requests [begin, end): makes room for it, then
  // admits its requests in order; an all-or-nothing call that loses a
  // request is taken back out of `builder` and refused whole. Returns false
  // when a merge's mirror write failed, with every result still OK set to
  // the error.
  bool AdmitCall(absl::Span<const AllocRequest> requests, size_t begin,
                 size_t end, bool all_or_nothing, PlanBuilder& builder,
                 OwnerCursor& cursor, absl::Span<AllocResult> results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Admits request `index` against the free pages `builder` leaves and its
  // owner's quota, into `builder` (with its pages to scrub). Returns false,
  // with `result.status` set and the refusal counted, when it does not fit.
  bool AdmitRequest(size_t index, const AllocRequest& request,
                    AllocResult& result, PlanBuilder& builder,
                    OwnerCursor& cursor) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lists, in `builder`, the `pages` pages `owner` takes next from the
  // front of the free list whose last owner is another (PoolOptions.scrub).
  void PlanScrub(OwnerId owner, int64_t pages, PlanBuilder& builder)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Refuses every request of the call [begin, end) that is still OK after
  // request `decider` was refused (all_or_nothing).
  void RefuseRestOfCall(absl::Span<const AllocRequest> requests,
                        absl::Span<AllocResult> results, size_t begin,
                        size_t end, size_t decider)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Launches scratch_.plan_storage's plan on the executor (with `replay`,
  // takes the launch's outcome from it instead). Returns true when the
  // launch succeeded. On failure nothing has been committed, so the batch
  // rolls back by refusing it: every admitted request's result becomes the
  // executor's status (kept in scratch_.launch_status) with no slots and no
  // pages, and the call returns false. REQUIRES: AdmitAndPlan returned true.
  bool ExecutePlan(absl::Span<AllocResult> results,
                   const ReplayedLaunch* replay, Expansion expansion)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the plan's pages to the admitted requests' owners (recording them
  // in active checkpoints), moves the free list's head past them and
  // counts the batch. Cannot fail. REQUIRES: ExecutePlan returned true.
  void CommitPlan(absl::Span<const AllocRequest> requests)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the `count` pages from ring position *position_in_out on to
  // `owner` (whose state is `state`) and moves *position_in_out past them,
  // wrapping.
  void GivePages(OwnerId owner, OwnerState& state, int64_t count,
                 int64_t* position_in_out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PoolGeometry geometry_;
  // Where frees go, in which order, and when parked pages are merged.
  const FreeListPolicy policy_;
  const bool scrub_;
  // page_size 1 and PoolOptions.ring_copy_plans.
  const bool ring_copies_;
  const int64_t capacity_;  // ring capacity: num_pages
  PlanExecutor* const executor_;
  const int64_t max_pins_;
  KvEventSink* const sink_;
  PoolChangeLog* const change_log_;

  mutable absl::Mutex mu_;
  // The free list is ring_[head_], ring_[head_ + 1], ... (modulo capacity_),
  // free_count_ entries.
  std::vector<int64_t> ring_ ABSL_GUARDED_BY(mu_);
  int64_t head_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t free_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> parked_ ABSL_GUARDED_BY(mu_);
  // owner_of_[p] for p in 0..num_pages; page 0 stays kNoOwner.
  std::vector<OwnerId> owner_of_ ABSL_GUARDED_BY(mu_);
  // allocated_once_[p]: page p has been handed out since the pool was
  // created (Clear keeps it). One bit a page, set as pages are handed out,
  // so that a refusal can tell a page never allocated from a double free.
  std::vector<bool> allocated_once_ ABSL_GUARDED_BY(mu_);
  // log_index_[p]: where page p's latest give sits in its owner's
  // given_log (meaningful only while that entry is live; see OwnerState).
  std::vector<size_t> log_index_ ABSL_GUARDED_BY(mu_);
  // last_owner_[p]: the owner page p was last handed to (PoolOptions.scrub;
  // empty otherwise). Freeing keeps it; so does Clear.
  std::vector<OwnerId> last_owner_ ABSL_GUARDED_BY(mu_);
  // ResolveFree's repeat check, O(1) a page without a hash set: page p was
  // seen by the current call when seen_stamp_[p] == seen_epoch_, which
  // each call moves on (NewSeenEpoch). Scratch, not state.
  mutable std::vector<uint32_t> seen_stamp_ ABSL_GUARDED_BY(mu_);
  mutable uint32_t seen_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<OwnerId, OwnerState> owners_ ABSL_GUARDED_BY(mu_);
  // The shared pages: the pages whose owner_of_ is kSharedOwner.
  PrefixIndex index_ ABSL_GUARDED_BY(mu_);
  PoolCounters counters_ ABSL_GUARDED_BY(mu_);

  // Allocate's working storage, kept between batches so that it stays warm
  // in cache (fresh vectors per batch showed in the profile).
  struct BatchScratch {
    std::vector<ExtendShape> shapes;
    std::vector<int64_t> pages_needed;
    absl::flat_hash_map<OwnerId, int64_t> pages_by_owner;
    PlanStorage plan_storage;
    // Per call of a batch with tagged calls: refused before validation
    // (BeginTaggedCalls), so admission skips it whole, its merge too
    // (a refused retry changes nothing). Empty for an untagged batch.
    std::vector<uint8_t> refused_calls;
    // The last launch's status (a failed one's error, for its record).
    absl::Status launch_status;
  };
  BatchScratch scratch_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pagealloc

#endif  // PAGEALLOC_ALLOCATOR_PAGE_POOL_H_
