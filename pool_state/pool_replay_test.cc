// Record, replay, restore: random operation sequences of every kind on a
// pool whose change log encodes each record with the codec (and, once,
// the snapshot it asks for midway). Then
//   (a) a fresh pool replays every record, decoded, and
//   (b) a pool restored from the decoded snapshot replays the records after
//       it;
// both end in the original's state (ExportState equal, CheckInvariants
// OK), give the replayed allocations the original's results, and (a)
// passes through the snapshot's state at the snapshot's record.
//
// Operations: batches of new and continued extends, decodes and page
// allocs, with bad requests (unknown owners, a stranger's last_loc,
// misaligned, longer than the pool), split into calls, some all or
// nothing, some launches failing (FakeExecutor's switch); frees by slots
// and by pages in each order, partial and whole, of owned and adopted
// pages; nested checkpoints and rollbacks (to the latest and to ids);
// publish (pinned or not, chains that other owners published already),
// match and adopt (refused over quota too), unpin, reset of the cache;
// clear an owner, clear the pool (refused and forced), remove an owner and
// register it again with new metadata. Allocations' calls, frees, fences,
// checkpoints, rollbacks and clears are tagged with call ids now and then
// (docs/design.md, "Retries by call id"), some of them retries: of a call
// the owner's window of kept calls holds (answered from what the pool
// kept, or an allocation run again after its pages went back, or refused
// when they moved on), of a kept call whose part did not take effect (the
// part runs), of one older than the window (refused), of one that never
// took effect; and first tries of older ids (kept in order while in the
// window; below a full window run and not kept, an allocation marking the
// kept ones kCallPagesMoved). So the records and the state carry the
// owners' kept calls, which replay must reproduce exactly; every tagged
// kind's retry is recorded in every configuration. Every combination of
// policy, semantics, page size 1 and 16, and scrub.

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/fake_executor.h"
#include "allocator/page_pool.h"
#include "allocator/pool_change_log.h"
#include "allocator/pool_state.h"
#include "gtest/gtest.h"
#include "pool_state/pool_state_codec.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

constexpr int kOwners = 3;  // ids 1..3; owner 3 has a quota
constexpr int kChains = 4;  // content chains the owners publish and match

// Encodes every record; writes the snapshot once, when asked at a record.
class EncodingLog : public PoolChangeLog {
 public:
  void Record(const PoolChange& change) override {
    EncodePoolChange(change, &records.emplace_back());
    is_allocate.push_back(change.kind == PoolChangeKind::kAllocate);
    bool retry = change.call.retry;
    for (const CallSpan& call : change.calls) retry |= call.call.retry;
    retried[static_cast<int>(change.kind)] |= retry;
  }
  bool WantsSnapshot() override {
    return snapshot_at > 0 && records.size() == snapshot_at;
  }
  void WriteSnapshot(const PoolState& state) override {
    EncodePoolState(state, &snapshot);
  }

  size_t snapshot_at = 0;  // after this many records
  std::vector<std::string> records;
  std::vector<bool> is_allocate;
  std::string snapshot;
  // retried[kind]: a record of that kind is of a retry (a retry that ran).
  bool retried[kMaxPoolChangeKind + 1] = {};
};

struct Params {
  FreePolicy policy;
  Semantics semantics;
  int64_t page_size;
  bool scrub;

  friend void PrintTo(const Params& p, std::ostream* os) {
    *os << FreePolicyName(p.policy) << " " << SemanticsName(p.semantics)
        << " page_size " << p.page_size << (p.scrub ? " scrub" : "");
  }
};

// How the tagged calls a driver sent were answered, by what the pool said
// before each (PagePool::RetriedCall).
struct TagCounts {
  int64_t tagged = 0;
  int64_t retries = 0;
  int64_t answered = 0;  // a retry answered from the kept call
  int64_t rerun = 0;     // an allocation's retry whose pages went back
  int64_t refused = 0;   // a retry of an earlier call (ABORTED)
  // A first try below a full window of kept calls (runs, is not kept).
  int64_t too_old = 0;

  void Add(const TagCounts& o) {
    tagged += o.tagged;
    retries += o.retries;
    answered += o.answered;
    rerun += o.rerun;
    refused += o.refused;
    too_old += o.too_old;
  }
};

std::string ResultString(const AllocResult& result) {
  return absl::StrFormat("%s slots %d pages %d", result.status.ToString(),
                         result.num_slots, result.num_new_pages);
}

// Drives one pool with random operations, keeping just enough of a model
// (each owner's sequences and adopted pages) to make most operations
// valid; the pool decides, and refusals are part of the test.
class Driver {
 public:
  Driver(const Params& params, uint64_t seed) : params_(params), rng_(seed) {}

  absl::Status Init(int64_t num_pages) {
    options_.num_pages = num_pages;
    options_.page_size = params_.page_size;
    options_.free_policy = params_.policy;
    options_.semantics = params_.semantics;
    options_.scrub = params_.scrub;
    options_.max_pinned_pages_per_owner = 3;
    options_.change_log = &log_;
    auto pool = PagePool::Create(options_, &executor_);
    if (!pool.ok()) return pool.status();
    pool_ = std::move(*pool);
    for (OwnerId owner = 1; owner <= kOwners; ++owner) {
      absl::Status added = AddOwner(owner);
      if (!added.ok()) return added;
    }
    return absl::OkStatus();
  }

  void Step() {
    const int64_t op = Uniform(0, 99);
    if (op < 34) {
      AllocateBatch();
    } else if (op < 50) {
      Free();
    } else if (op < 56) {
      const OwnerId owner = RandomOwner();
      (void)pool_->Checkpoint(owner, Tag(owner, PoolChangeKind::kCheckpoint));
    } else if (op < 62) {
      Rollback();
    } else if (op < 70) {
      Publish();
    } else if (op < 78) {
      Match();
    } else if (op < 82) {
      Unpin();
    } else if (op < 84) {
      (void)pool_->ResetPrefixCache();
    } else if (op < 87) {
      const OwnerId owner = RandomOwner();
      if (pool_->ClearOwner(owner, Tag(owner, PoolChangeKind::kClearOwner))
              .ok()) {
        Forget(owner);
      }
    } else if (op < 89) {
      const bool force = Uniform(0, 2) == 0;
      if (pool_->ClearPool(force).ok()) {
        for (OwnerId owner = 1; owner <= kOwners; ++owner) Forget(owner);
      }
    } else if (op < 92) {
      const OwnerId owner = Uniform(1, kOwners);
      if (pool_->RemoveOwner(owner).ok()) Forget(owner);
      (void)AddOwner(owner);
    } else if (op < 95) {
      AwaitRelease();
    } else {
      AllocateBatch();
    }
    Prune();
  }

  PagePool& pool() { return *pool_; }
  const PoolOptions& options() const { return options_; }
  EncodingLog& log() { return log_; }
  const std::vector<std::vector<AllocResult>>& results() const {
    return results_;
  }
  int64_t launches_failed() const { return launches_failed_; }
  const TagCounts& tags() const { return tags_; }

 private:
  struct Sequence {
    std::vector<int64_t> slots;
  };

  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  // Now and then an owner that is not registered (refused, still recorded
  // for an allocation).
  OwnerId RandomOwner() {
    return Uniform(0, 30) == 0 ? 9 : Uniform(1, kOwners);
  }
  int64_t ps() const { return params_.page_size; }

  // `owner`'s kept calls (PoolOwnerState.kept_calls), ids ascending.
  std::vector<PoolKeptCall> Kept(OwnerId owner) {
    if (owner > kOwners) return {};
    for (const PoolOwnerState& state : pool_->ExportState().owners) {
      if (state.id == owner) return state.kept_calls;
    }
    return {};
  }
  // The ids of `owner`'s kept calls whose `part` took effect (`took`) or
  // did not.
  std::vector<uint64_t> KeptIds(OwnerId owner, CallPart part, bool took) {
    std::vector<uint64_t> ids;
    for (const PoolKeptCall& kept : Kept(owner)) {
      if (((kept.parts & part) != 0) == took) ids.push_back(kept.id);
    }
    return ids;
  }

  // The part of its call an operation of `kind` is.
  static CallPart PartOf(PoolChangeKind kind) {
    switch (kind) {
      case PoolChangeKind::kAllocate:
        return kCallAllocate;
      case PoolChangeKind::kCheckpoint:
        return kCallCheckpoint;
      case PoolChangeKind::kRollback:
        return kCallRollback;
      case PoolChangeKind::kClearOwner:
        return kCallClear;
      default:  // kFree, kAwaitRelease
        return kCallFree;
    }
  }

  // A tag for an operation of `kind` of `owner`: untagged about a third of
  // the time; else mostly a new id (the owner's next), now and then a
  // retry: of its latest id; of a kept call whose part took effect
  // (answered, or an allocation given back and run again); of a kept call
  // whose part did not (the part runs, kept with the call); of an older id
  // (refused once it left the window of kept calls); of one it never sent;
  // or a first try that reuses an older id (kept when in the window; else
  // not, and an allocation's marks the kept ones kCallPagesMoved). Until a
  // retry of `kind` has been recorded (one that ran), half the tagged ones
  // are retries that run, so that every kind's retry is replayed however
  // rarely the kind takes effect. Counts what the pool says the retry will
  // do.
  CallTag Tag(OwnerId owner, PoolChangeKind kind) {
    const CallPart part = PartOf(kind);
    int64_t choice = Uniform(0, 39);
    if (choice < 13) return CallTag{};
    if (!log_.retried[static_cast<int>(kind)] && Uniform(0, 1) == 0) {
      choice = 34;
    }
    uint64_t& latest = owner <= kOwners ? last_id_[owner] : stranger_id_;
    CallTag tag;
    if (choice < 31 || latest == 0) {
      tag = {++latest, false};
    } else if (choice < 33) {
      tag = {latest, true};
    } else if (choice < 34) {
      const std::vector<uint64_t> ids = KeptIds(owner, part, /*took=*/true);
      tag = {ids.empty() ? latest : ids[Uniform(0, ids.size() - 1)], true};
    } else if (choice < 35) {
      // Else one it never sent: either way the part runs.
      const std::vector<uint64_t> ids = KeptIds(owner, part, /*took=*/false);
      tag = {ids.empty() ? ++latest : ids[Uniform(0, ids.size() - 1)], true};
    } else if (choice < 37) {
      tag = {static_cast<uint64_t>(Uniform(1, latest)), true};
    } else if (choice < 38) {
      tag = {++latest, true};  // its first try was lost on the way
    } else {
      tag = {static_cast<uint64_t>(Uniform(1, latest)), false};
      const std::vector<PoolKeptCall> kept = Kept(owner);
      if (kept.size() == kKeptCallsPerOwner && tag.id < kept.front().id) {
        ++tags_.too_old;
      }
    }
    ++tags_.tagged;
    if (tag.retry) {
      ++tags_.retries;
      const absl::StatusOr<std::optional<PoolKeptCall>> kept =
          pool_->RetriedCall(owner, tag, part);
      if (absl::IsAborted(kept.status())) {
        ++tags_.refused;
      } else if (kept.ok() && kept->has_value()) {
        ++(part == kCallAllocate ? tags_.rerun : tags_.answered);
      }
    }
    return tag;
  }

  absl::Status AddOwner(OwnerId owner) {
    ++registrations_;
    return pool_->AddOwner(
        owner, owner == kOwners ? options_.num_pages / 3 : 0,
        absl::StrFormat("session %d generation %d", owner, registrations_));
  }

  void Forget(OwnerId owner) {
    sequences_[owner].clear();
    adopted_[owner].clear();
  }

  // Drops what the pool no longer gives the owner (rolled back, cleared,
  // freed through another path).
  void Prune() {
    for (OwnerId owner = 1; owner <= kOwners; ++owner) {
      std::vector<Sequence>& seqs = sequences_[owner];
      for (size_t i = 0; i < seqs.size();) {
        bool held = true;
        for (int64_t slot : seqs[i].slots) {
          const OwnerId o = pool_->OwnerOf(slot / ps());
          if (o != owner && o != kSharedOwner) held = false;
        }
        if (held) {
          ++i;
        } else {
          seqs.erase(seqs.begin() + i);
        }
      }
      std::vector<int64_t>& adopted = adopted_[owner];
      for (size_t i = 0; i < adopted.size();) {
        if (pool_->OwnerOf(adopted[i]) == kSharedOwner) {
          ++i;
        } else {
          adopted.erase(adopted.begin() + i);
        }
      }
    }
  }

  // One request of `owner`: a new sequence, a continuation, or a bad one.
  AllocRequest MakeRequest(OwnerId owner, int64_t* sequence) {
    AllocRequest r;
    r.owner = owner;
    *sequence = -1;
    static std::vector<Sequence> none;
    std::vector<Sequence>& seqs = owner <= kOwners ? sequences_[owner] : none;
    const int64_t choice = Uniform(0, 19);
    const int64_t max_new = ps() == 1 ? 12 : 3 * ps() + 3;
    if (choice < 6 || seqs.empty()) {
      r.kind = RequestKind::kExtend;
      r.prefix_len = 0;
      r.seq_len = Uniform(1, max_new);
      r.last_loc = -1;
    } else if (choice < 14) {
      *sequence = Uniform(0, seqs.size() - 1);
      const Sequence& seq = seqs[*sequence];
      const bool decode = choice < 10;
      r.kind = decode ? RequestKind::kDecode : RequestKind::kExtend;
      r.prefix_len = seq.slots.size();
      r.seq_len = r.prefix_len + (decode ? 1 : Uniform(1, max_new));
      r.last_loc = seq.slots.back();
    } else if (choice < 17) {
      r.kind = RequestKind::kAlloc;
      r.seq_len = ps() * Uniform(0, 3);
    } else if (choice < 18) {
      // A stranger's last_loc, or a misaligned one.
      r.kind = RequestKind::kExtend;
      r.prefix_len = Uniform(1, 2 * ps());
      r.seq_len = r.prefix_len + 1;
      r.last_loc = Uniform(ps(), options_.num_pages * ps());
    } else if (choice < 19) {
      r.kind = RequestKind::kExtend;
      r.seq_len = options_.num_pages * ps() + 1;  // longer than the pool
    } else {
      r.kind = RequestKind::kAlloc;
      r.seq_len = ps() == 1 ? -1 : ps() + 1;  // malformed
    }
    return r;
  }

  void AllocateBatch() {
    std::vector<AllocRequest> requests;
    std::vector<CallSpan> calls;
    std::vector<int64_t> sequence_of;
    const int64_t num_calls = Uniform(1, 3);
    for (int64_t c = 0; c < num_calls; ++c) {
      const OwnerId owner = RandomOwner();
      const int64_t n = Uniform(1, 4);
      for (int64_t i = 0; i < n; ++i) {
        int64_t sequence = -1;
        AllocRequest r = MakeRequest(owner, &sequence);
        // One continuation per sequence per batch.
        for (int64_t s : sequence_of) {
          if (sequence >= 0 && s == sequence) sequence = -2;
        }
        if (sequence == -2) {
          r = AllocRequest{RequestKind::kAlloc, owner, 0, 0, ps(), -1, nullptr};
          sequence = -1;
        }
        r.index = i;
        requests.push_back(r);
        sequence_of.push_back(sequence);
      }
      calls.push_back(
          {n, Uniform(0, 2) == 0, Tag(owner, PoolChangeKind::kAllocate)});
      if (calls.back().call.id != 0 && n > 1 && Uniform(0, 30) == 0) {
        // A tagged call of two owners (refused whole).
        requests.back().owner = owner % kOwners + 1;
      }
    }
    // Destinations, one buffer; now and then a request without one.
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (const AllocRequest& r : requests) {
      offsets.push_back(total);
      if (IsValidShape(r, {ps(), options_.num_pages})) {
        total += std::max<int64_t>(ToExtendShape(r).num_slots(), 0);
      }
    }
    std::vector<int64_t> out(total + 1, -1);
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i].destination =
          Uniform(0, 40) == 0 ? nullptr : out.data() + offsets[i];
    }
    if (Uniform(0, 19) == 0) {
      executor_.FailNextLaunches(1, absl::InternalError("injected failure"));
    }
    if (Uniform(0, 60) == 0) {
      // Calls that do not add up: refused before the lock, not recorded.
      calls.push_back({1, false, {}});
      (void)pool_->Allocate(requests, calls);
      return;
    }
    std::vector<AllocResult> results = Uniform(0, 3) == 0
                                           ? pool_->Allocate(requests)
                                           : pool_->Allocate(requests, calls);
    if (executor_.failures_pending() > 0) {
      // Nothing was launched: disarm, so the failure lands where meant.
      executor_.FailNextLaunches(0, absl::InternalError("disarmed"));
    }
    for (const AllocResult& result : results) {
      if (result.status.message() == "injected failure") {
        ++launches_failed_;
        break;
      }
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      if (!results[i].status.ok() || requests[i].destination == nullptr) {
        continue;
      }
      const int64_t n = results[i].num_slots;
      const int64_t* slots = requests[i].destination;
      std::vector<Sequence>& seqs = sequences_[requests[i].owner];
      if (sequence_of[i] >= 0 && sequence_of[i] < seqs.size()) {
        Sequence& seq = seqs[sequence_of[i]];
        seq.slots.insert(seq.slots.end(), slots, slots + n);
      } else if (requests[i].kind == RequestKind::kExtend && n > 0) {
        seqs.push_back({std::vector<int64_t>(slots, slots + n)});
      } else if (requests[i].kind == RequestKind::kAlloc && n > 0) {
        seqs.push_back({std::vector<int64_t>(slots, slots + n)});
      }
    }
    results_.push_back(std::move(results));
  }

  std::vector<int64_t> PagesOf(const Sequence& seq) {
    std::vector<int64_t> pages;
    for (int64_t slot : seq.slots) {
      if (pages.empty() || pages.back() != slot / ps()) {
        pages.push_back(slot / ps());
      }
    }
    return pages;
  }

  void Free() {
    const OwnerId owner = RandomOwner();
    const FreeOrder order =
        static_cast<FreeOrder>(Uniform(0, 2));  // default, asc, first
    if (owner > kOwners) {
      (void)pool_->FreePages(owner, {1}, order,
                             Tag(owner, PoolChangeKind::kFree));
      return;
    }
    std::vector<int64_t>& adopted = adopted_[owner];
    if (!adopted.empty() && Uniform(0, 2) == 0) {
      const size_t n = Uniform(1, adopted.size());
      std::vector<int64_t> pages(adopted.end() - n, adopted.end());
      if (pool_
              ->FreePages(owner, pages, order,
                          Tag(owner, PoolChangeKind::kFree))
              .ok()) {
        adopted.resize(adopted.size() - n);
      }
      return;
    }
    std::vector<Sequence>& seqs = sequences_[owner];
    if (seqs.empty()) return;
    const size_t i = Uniform(0, seqs.size() - 1);
    const Sequence seq = seqs[i];
    seqs.erase(seqs.begin() + i);
    if (Uniform(0, 1) == 0) {
      // By slots, whole or a tail (duplicates of a page collapse).
      const size_t from =
          Uniform(0, 2) == 0 ? Uniform(0, seq.slots.size() - 1) : 0;
      std::vector<int64_t> slots(seq.slots.begin() + from, seq.slots.end());
      std::shuffle(slots.begin(), slots.end(), rng_);
      (void)pool_->FreeSlots(owner, slots, order,
                             Tag(owner, PoolChangeKind::kFree));
    } else {
      std::vector<int64_t> pages = PagesOf(seq);
      std::shuffle(pages.begin(), pages.end(), rng_);
      if (Uniform(0, 9) == 0) pages.push_back(pages.front());  // a repeat
      (void)pool_->FreePages(owner, pages, order,
                             Tag(owner, PoolChangeKind::kFree));
    }
  }

  // Marks some of an owner's pages (of a sequence, or adopted shared ones)
  // as awaiting release; now and then a page it does not hold, or one
  // marked already (refused).
  void AwaitRelease() {
    const OwnerId owner = RandomOwner();
    if (owner > kOwners) {
      (void)pool_->AwaitRelease(owner, {1},
                                Tag(owner, PoolChangeKind::kAwaitRelease));
      return;
    }
    std::vector<int64_t> pages;
    if (!adopted_[owner].empty() && Uniform(0, 2) == 0) {
      pages.push_back(adopted_[owner][Uniform(0, adopted_[owner].size() - 1)]);
    } else if (!sequences_[owner].empty()) {
      std::vector<Sequence>& seqs = sequences_[owner];
      pages = PagesOf(seqs[Uniform(0, seqs.size() - 1)]);
      std::shuffle(pages.begin(), pages.end(), rng_);
      pages.resize(Uniform(1, pages.size()));
    }
    if (pages.empty() || Uniform(0, 5) == 0) {
      pages.push_back(Uniform(1, options_.num_pages));
    }
    if (Uniform(0, 20) == 0) pages.clear();  // a tagged one is recorded
    (void)pool_->AwaitRelease(owner, pages,
                              Tag(owner, PoolChangeKind::kAwaitRelease));
  }

  void Rollback() {
    const OwnerId owner = RandomOwner();
    const uint64_t id = Uniform(0, 1) == 0 ? 0 : Uniform(1, 12);
    (void)pool_->Rollback(owner, id, Tag(owner, PoolChangeKind::kRollback));
  }

  static PrefixKey ChainKey(int64_t chain, int64_t depth) {
    PrefixKey key{};
    key[0] = static_cast<uint8_t>(chain);
    key[1] = static_cast<uint8_t>(depth);
    key[31] = 0xc3;
    return key;
  }

  void Publish() {
    const OwnerId owner = RandomOwner();
    if (owner > kOwners || sequences_[owner].empty()) return;
    std::vector<Sequence>& seqs = sequences_[owner];
    const Sequence& seq = seqs[Uniform(0, seqs.size() - 1)];
    // Whole pages only (the sequence starts at a page's first slot).
    const int64_t whole = seq.slots.size() / ps();
    if (whole == 0) return;
    const int64_t n = Uniform(1, std::min<int64_t>(whole, 4));
    std::vector<int64_t> pages = PagesOf(seq);
    pages.resize(n);
    const int64_t chain = Uniform(0, kChains - 1);
    const int64_t first = Uniform(0, 1);  // a chain's start or its middle
    std::vector<PrefixKey> keys;
    for (int64_t k = 0; k < n; ++k) keys.push_back(ChainKey(chain, first + k));
    const PrefixKey parent = ChainKey(chain, 0);
    const bool pin = Uniform(0, 1) == 0;
    (void)pool_->Publish(owner, pages, keys, first == 0 ? nullptr : &parent,
                         pin);
  }

  void Match() {
    const OwnerId owner = RandomOwner();
    const int64_t chain = Uniform(0, kChains - 1);
    std::vector<PrefixKey> keys;
    const int64_t n = Uniform(0, 5);
    for (int64_t k = 0; k < n; ++k) keys.push_back(ChainKey(chain, k));
    const bool adopt = Uniform(0, 2) != 0;
    auto pages = pool_->MatchPrefix(owner, keys, adopt);
    if (adopt && pages.ok() && owner <= kOwners) {
      adopted_[owner].insert(adopted_[owner].end(), pages->begin(),
                             pages->end());
    }
  }

  void Unpin() {
    const OwnerId owner = RandomOwner();
    const PoolState state = pool_->ExportState();
    std::vector<int64_t> pins;
    for (const PoolOwnerState& o : state.owners) {
      if (o.id == owner) pins = o.pins;
    }
    if (pins.empty() || Uniform(0, 5) == 0) {
      pins.push_back(Uniform(1, options_.num_pages));  // refused
    } else {
      pins.resize(Uniform(1, pins.size()));
    }
    (void)pool_->Unpin(owner, pins);
  }

  Params params_;
  std::mt19937_64 rng_;
  PoolOptions options_;
  FakeExecutor executor_;
  EncodingLog log_;
  std::unique_ptr<PagePool> pool_;
  std::vector<Sequence> sequences_[kOwners + 1];
  std::vector<int64_t> adopted_[kOwners + 1];
  std::vector<std::vector<AllocResult>> results_;
  int64_t registrations_ = 0;
  int64_t launches_failed_ = 0;
  // The latest call id sent for each owner (and for the unknown one); ids
  // go on across a removal, as a client's would not need to.
  uint64_t last_id_[kOwners + 1] = {};
  uint64_t stranger_id_ = 0;
  TagCounts tags_;
};

// Replays `records[from..]` (decoded) into `pool`, checking each
// allocation's results against the original's (`results`, one per
// allocation record, counted from the first record), and, when
// `snapshot` is not null, the pool's state at `snapshot_at` against it.
void ReplayInto(PagePool& pool, const EncodingLog& log, size_t from,
                const std::vector<std::vector<AllocResult>>& results,
                const PoolState* snapshot, const PoolGeometry& geometry) {
  size_t allocation = 0;
  for (size_t i = 0; i < from; ++i) allocation += log.is_allocate[i];
  DecodedPoolChange decoded;
  std::vector<AllocResult> replayed;
  for (size_t i = from; i < log.records.size(); ++i) {
    SCOPED_TRACE(absl::StrFormat("record %d", i));
    ASSERT_OK(DecodePoolChange(log.records[i], geometry, &decoded));
    ASSERT_OK(pool.Replay(decoded.change(), &replayed));
    if (log.is_allocate[i]) {
      ASSERT_LT(allocation, results.size());
      const std::vector<AllocResult>& original = results[allocation++];
      ASSERT_EQ(replayed.size(), original.size());
      for (size_t r = 0; r < original.size(); ++r) {
        ASSERT_EQ(ResultString(replayed[r]), ResultString(original[r]))
            << "request " << r;
      }
    }
    if (snapshot != nullptr && i + 1 == log.snapshot_at) {
      ASSERT_EQ(FirstDifference(pool.ExportState(), *snapshot), "");
    }
  }
  EXPECT_EQ(allocation, results.size());
}

class PoolReplayTest : public ::testing::TestWithParam<Params> {};

TEST_P(PoolReplayTest, ReplayAndRestoreReachTheOriginalsState) {
  const Params params = GetParam();
  constexpr int kSequences = 10;
  constexpr int kSteps = 250;
  int64_t records = 0;
  int64_t failed_launches = 0;
  int64_t kinds[kMaxPoolChangeKind + 1] = {};
  // Records with a tag, and with a retry, by kind; the owners' kept calls
  // at the end and at the snapshot, those that kept pages, those marked
  // kCallPagesMoved, and the owners whose window was full.
  int64_t tagged_kinds[kMaxPoolChangeKind + 1] = {};
  int64_t retry_kinds[kMaxPoolChangeKind + 1] = {};
  int64_t kept_calls = 0;
  int64_t kept_calls_with_pages = 0;
  int64_t kept_calls_moved = 0;
  int64_t full_windows = 0;
  TagCounts tags;
  PoolCounters counters;
  for (int sequence = 0; sequence < kSequences; ++sequence) {
    const uint64_t seed = 1000 * sequence + 17 * params.page_size +
                          (params.policy == FreePolicy::kSorted) * 7 +
                          (params.semantics == Semantics::kSglang) * 3 +
                          params.scrub;
    SCOPED_TRACE(absl::StrFormat("sequence %d (seed %d)", sequence, seed));
    Driver driver(params, seed);
    const int64_t num_pages = params.page_size == 1 ? 48 : 24 + sequence * 4;
    ASSERT_OK(driver.Init(num_pages));
    driver.log().snapshot_at = 30 + sequence * 17;
    for (int step = 0; step < kSteps; ++step) driver.Step();
    ASSERT_OK(driver.pool().CheckInvariants());
    const EncodingLog& log = driver.log();
    ASSERT_GT(log.records.size(), log.snapshot_at);
    ASSERT_FALSE(log.snapshot.empty());
    records += log.records.size();
    failed_launches += driver.launches_failed();
    tags.Add(driver.tags());
    DecodedPoolChange decoded;
    for (const std::string& record : log.records) {
      ASSERT_OK(DecodePoolChange(record, driver.pool().geometry(), &decoded));
      const PoolChange& change = decoded.change();
      const int kind = static_cast<int>(change.kind);
      ++kinds[kind];
      bool tagged = change.call.id != 0;
      bool retry = change.call.retry;
      for (const CallSpan& call : change.calls) {
        tagged |= call.call.id != 0;
        retry |= call.call.retry;
      }
      tagged_kinds[kind] += tagged;
      retry_kinds[kind] += retry;
    }
    const PoolState original = driver.pool().ExportState();
    // And at the snapshot: (b) starts from what it kept of them.
    ASSERT_OK_AND_ASSIGN(
        const PoolState at_snapshot,
        DecodePoolState(log.snapshot, driver.pool().geometry()));
    for (const PoolState* state : {&original, &at_snapshot}) {
      for (const PoolOwnerState& owner : state->owners) {
        full_windows += owner.kept_calls.size() == kKeptCallsPerOwner;
        for (const PoolKeptCall& call : owner.kept_calls) {
          ++kept_calls;
          kept_calls_with_pages += !call.pages.empty();
          kept_calls_moved += (call.parts & kCallPagesMoved) != 0;
        }
      }
    }
    counters.free_list_sorts += original.counters.free_list_sorts;
    counters.quota_refusals += original.counters.quota_refusals;
    counters.out_of_pages_refusals += original.counters.out_of_pages_refusals;
    counters.prefix_evicted_for_allocation +=
        original.counters.prefix_evicted_for_allocation;
    counters.prefix_pages_adopted += original.counters.prefix_pages_adopted;
    counters.pages_scrubbed += original.counters.pages_scrubbed;
    PoolOptions options = driver.options();
    options.change_log = nullptr;
    const PoolGeometry geometry = driver.pool().geometry();

    // (a) Every record, from the initial state.
    ASSERT_OK_AND_ASSIGN(const PoolState snapshot,
                         DecodePoolState(log.snapshot, geometry));
    FakeExecutor replay_executor;
    ASSERT_OK_AND_ASSIGN(auto replayed,
                         PagePool::Create(options, &replay_executor));
    ReplayInto(*replayed, log, 0, driver.results(), &snapshot, geometry);
    if (HasFatalFailure()) return;
    ASSERT_OK(replayed->CheckInvariants());
    EXPECT_EQ(FirstDifference(replayed->ExportState(), original), "");
    EXPECT_EQ(replay_executor.launches(), 0);

    // (b) From the snapshot, the records after it.
    FakeExecutor restore_executor;
    ASSERT_OK_AND_ASSIGN(
        auto restored,
        PagePool::CreateFromState(options, &restore_executor, snapshot));
    ASSERT_OK(restored->CheckInvariants());
    ReplayInto(*restored, log, log.snapshot_at, driver.results(), nullptr,
               geometry);
    if (HasFatalFailure()) return;
    ASSERT_OK(restored->CheckInvariants());
    EXPECT_EQ(FirstDifference(restored->ExportState(), original), "");
  }
  std::string summary;
  for (int kind = 1; kind <= kMaxPoolChangeKind; ++kind) {
    absl::StrAppendFormat(&summary, " %s %d",
                          PoolChangeKindName(static_cast<PoolChangeKind>(kind)),
                          kinds[kind]);
  }
  std::cout << "records:" << summary << "; failed launches " << failed_launches
            << "\n";
  summary.clear();
  for (int kind = 1; kind <= kMaxPoolChangeKind; ++kind) {
    if (tagged_kinds[kind] == 0) continue;
    absl::StrAppendFormat(&summary, " %s %d (%d retries)",
                          PoolChangeKindName(static_cast<PoolChangeKind>(kind)),
                          tagged_kinds[kind], retry_kinds[kind]);
  }
  std::cout << "tagged records:" << summary << "; calls tagged " << tags.tagged
            << ", retries " << tags.retries << " (answered " << tags.answered
            << ", allocations run again " << tags.rerun << ", refused "
            << tags.refused << "); first tries too old to keep " << tags.too_old
            << "; kept calls " << kept_calls << " (" << kept_calls_with_pages
            << " with pages, " << kept_calls_moved
            << " with their pages moved; " << full_windows
            << " full windows)\n";
  // The generator reaches every kind of record, and failed launches.
  for (int kind = 1; kind <= kMaxPoolChangeKind; ++kind) {
    EXPECT_GT(kinds[kind], 0)
        << PoolChangeKindName(static_cast<PoolChangeKind>(kind));
  }
  EXPECT_GT(failed_launches, 0);
  EXPECT_GT(records, 2000);
  // Every kind that takes a tag is recorded tagged, and retried; retries
  // are answered from the kept call, run again, and refused; first tries
  // come too old to keep; owners keep calls, some of them allocations, and
  // fill their window.
  for (PoolChangeKind kind :
       {PoolChangeKind::kAllocate, PoolChangeKind::kFree,
        PoolChangeKind::kCheckpoint, PoolChangeKind::kRollback,
        PoolChangeKind::kClearOwner, PoolChangeKind::kAwaitRelease}) {
    EXPECT_GT(tagged_kinds[static_cast<int>(kind)], 0)
        << PoolChangeKindName(kind);
    EXPECT_GT(retry_kinds[static_cast<int>(kind)], 0)
        << PoolChangeKindName(kind);
  }
  EXPECT_GT(tags.answered, 0);
  EXPECT_GT(tags.rerun, 0);
  EXPECT_GT(tags.refused, 0);
  EXPECT_GT(tags.too_old, 0);
  EXPECT_GT(kept_calls, 0);
  EXPECT_GT(kept_calls_with_pages, 0);
  EXPECT_GT(full_windows, 0);
  // ... and the paths whose outcome depends most on the state's order.
  EXPECT_GT(counters.quota_refusals, 0);
  EXPECT_GT(counters.out_of_pages_refusals, 0);
  EXPECT_GT(counters.prefix_evicted_for_allocation, 0);
  EXPECT_GT(counters.prefix_pages_adopted, 0);
  if (params.policy == FreePolicy::kSorted) {
    EXPECT_GT(counters.free_list_sorts, 0);
  }
  if (params.scrub) {
    EXPECT_GT(counters.pages_scrubbed, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    PoliciesSemanticsPageSizesAndScrub, PoolReplayTest, ::testing::ValuesIn([] {
      std::vector<Params> params;
      for (FreePolicy policy : {FreePolicy::kLifo, FreePolicy::kSorted}) {
        for (Semantics semantics :
             {Semantics::kPagealloc, Semantics::kSglang}) {
          for (int64_t page_size : {1, 16}) {
            for (bool scrub : {false, true}) {
              params.push_back({policy, semantics, page_size, scrub});
            }
          }
        }
      }
      return params;
    }()),
    [](const ::testing::TestParamInfo<Params>& info) {
      return absl::StrFormat(
          "%s%sPageSize%d%s", FreePolicyName(info.param.policy),
          SemanticsName(info.param.semantics), info.param.page_size,
          info.param.scrub ? "Scrub" : "");
    });

}  // namespace
}  // namespace pagealloc
