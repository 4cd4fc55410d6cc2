#include "tests/pool_model_checker.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace pagealloc::testing {
namespace {

absl::Status Disagree(const std::string& what) {
  return absl::InternalError("pool and model disagree: " + what);
}

std::string Join(const std::vector<int64_t>& values) {
  return "[" + absl::StrJoin(values, ", ") + "]";
}

}  // namespace

absl::StatusOr<std::unique_ptr<PoolModelChecker>> PoolModelChecker::Create(
    int64_t num_pages, int64_t page_size, FreePolicy policy,
    ChoiceSource* choices, Semantics semantics) {
  std::unique_ptr<PoolModelChecker> checker(
      new PoolModelChecker(num_pages, page_size, policy, choices, semantics));
  RETURN_IF_ERROR(checker->Init());
  return checker;
}

PoolModelChecker::PoolModelChecker(int64_t num_pages, int64_t page_size,
                                   FreePolicy policy, ChoiceSource* choices,
                                   Semantics semantics)
    : num_pages_(num_pages),
      page_size_(page_size),
      policy_(policy),
      semantics_(semantics),
      choices_(choices),
      model_(num_pages, page_size, policy == FreePolicy::kSorted,
             semantics == Semantics::kSglang),
      live_(page_size) {}

absl::Status PoolModelChecker::Init() {
  ASSIGN_OR_RETURN(
      pool_, PagePool::Create({num_pages_, page_size_, policy_, semantics_},
                              &executor_));
  for (OwnerId o = 1; o <= kOwners; ++o) {
    RETURN_IF_ERROR(pool_->AddOwner(o, Quota(o)));
    model_.AddOwner(o, Quota(o));
  }
  return absl::OkStatus();
}

absl::Status PoolModelChecker::Step() {
  const int op = choices_->Uniform(0, 39);
  if (op < 22) return StepAllocate();
  if (op < 32) return StepFree();
  if (op < 37) return StepCheckpointOrRollback();
  if (op < 38) return StepClear();
  return StepReclaim();
}

absl::Status PoolModelChecker::StepAllocate() {
  const int n = choices_->Uniform(1, 6);
  std::vector<AllocRequest> requests;
  std::vector<ReferenceModel::Request> model_requests;
  std::vector<int> seq_of;  // index into live_, or -1
  std::vector<bool> used(live_.size(), false);
  for (int i = 0; i < n; ++i) {
    AllocRequest r;
    r.index = i;
    int seq_index = -1;
    const int pick = choices_->Uniform(0, 9);
    if (pick < 3 || live_.empty()) {  // a new sequence
      r.kind = RequestKind::kExtend;
      r.owner = RandomOwner();
      r.seq_len = choices_->Uniform(0, 3 * page_size_ + 2);
    } else if (pick < 8) {  // continue a live sequence, once per batch
      seq_index = choices_->Uniform(0, live_.size() - 1);
      if (used[seq_index]) continue;
      used[seq_index] = true;
      const LiveSequence& s = live_[seq_index];
      r.owner = s.owner;
      r.last_loc = s.last_loc;
      if (pick < 6) {
        r.kind = RequestKind::kDecode;
        r.seq_len = s.len + 1;
      } else {
        r.kind = RequestKind::kExtend;
        r.prefix_len = s.len;
        r.seq_len = s.len + choices_->Uniform(0, 2 * page_size_ + 1);
      }
    } else if (pick < 9) {
      r.kind = RequestKind::kAlloc;
      r.owner = RandomOwner();
      r.seq_len = page_size_ * choices_->Uniform(0, 3);
    } else {
      r.kind = RequestKind::kExtend;
      r.owner = RandomOwner();
      switch (choices_->Uniform(0, 5)) {
        case 0: {  // a stranger continues someone's sequence
          const LiveSequence& s = live_[choices_->Uniform(0, live_.size() - 1)];
          r.owner = s.owner % kOwners + 1;
          r.prefix_len = s.len;
          r.seq_len = s.len + 1;
          r.last_loc = s.last_loc;
          break;
        }
        case 1:  // misaligned
          r.prefix_len = 1;
          r.seq_len = 3;
          r.last_loc = page_size_ + 1;
          break;
        case 2:  // unaligned (or negative) alloc
          r.kind = RequestKind::kAlloc;
          r.seq_len = page_size_ == 1 ? -1 : page_size_ + 1;
          break;
        case 3:  // seq < prefix
          r.prefix_len = 5;
          r.seq_len = 4;
          break;
        case 4:  // longer than the pool, by a little
          r.seq_len = num_pages_ * page_size_ + choices_->Uniform(1, 2);
          if (choices_->Uniform(0, 1) == 0) {
            r.kind = RequestKind::kAlloc;
            r.seq_len = (num_pages_ + 1) * page_size_;
          }
          break;
        default:
          r.owner = 77;  // unknown
          r.seq_len = 1;
          break;
      }
    }
    requests.push_back(r);
    model_requests.push_back({static_cast<ReferenceModel::Kind>(r.kind),
                              r.owner, r.prefix_len, r.seq_len, r.last_loc});
    seq_of.push_back(seq_index);
  }
  std::vector<std::vector<int64_t>> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    out[i].assign(std::max<int64_t>(ToExtendShape(requests[i]).num_slots(), 0),
                  -7);
    requests[i].destination = out[i].data();
  }
  // Split the batch into one to three calls, some all-or-nothing.
  std::vector<CallSpan> calls;
  std::vector<ReferenceModel::Call> model_calls;
  for (int64_t left = requests.size(); left > 0;) {
    const int64_t n = calls.size() == 2
                          ? left
                          : choices_->Uniform(1, std::min<int64_t>(left, 4));
    const bool all_or_nothing = choices_->Uniform(0, 2) == 0;
    calls.push_back({n, all_or_nothing, {}});
    model_calls.push_back({n, all_or_nothing});
    left -= n;
  }
  const std::vector<AllocResult> results = pool_->Allocate(requests, calls);
  const std::vector<ReferenceModel::Outcome> expected =
      model_.Allocate(model_requests, model_calls);
  size_t call_begin = 0;
  for (const CallSpan& call : calls) {
    bool any_ok = false;
    for (int64_t k = 0; k < call.num_requests; ++k) {
      any_ok = any_ok || results[call_begin + k].status.ok();
    }
    calls_refused_whole_ += call.all_or_nothing && !any_ok;
    call_begin += call.num_requests;
  }
  for (size_t i = 0; i < results.size(); ++i) {
    ++outcomes_[{requests[i].kind, results[i].status.code()}];
    if (results[i].status.code() != expected[i].code) {
      return Disagree(absl::StrFormat(
          "request %d: pool says %s, model says code %d", i,
          results[i].status.ToString(), static_cast<int>(expected[i].code)));
    }
    if (!results[i].status.ok()) continue;
    if (out[i] != expected[i].slots ||
        results[i].num_slots != static_cast<int64_t>(out[i].size())) {
      return Disagree(absl::StrFormat("request %d: slots %s, model %s", i,
                                      Join(out[i]), Join(expected[i].slots)));
    }
    if (out[i].empty()) continue;
    // A new sequence, or a continued one. A stranger's successful
    // continuation of someone's prefix (possible where the prefix ends on
    // a page boundary) is the stranger's new sequence on a shared prefix.
    const size_t s = seq_of[i] >= 0 ? seq_of[i] : live_.Add(requests[i].owner);
    const absl::Status recorded =
        live_.Record(s, ToExtendShape(requests[i]), out[i]);
    if (!recorded.ok()) {
      return Disagree(
          absl::StrFormat("request %d: %s", i, recorded.ToString()));
    }
  }
  return absl::OkStatus();
}

absl::Status PoolModelChecker::StepFree() {
  if (live_.empty()) return absl::OkStatus();
  const size_t k = choices_->Uniform(0, live_.size() - 1);
  OwnerId caller = live_[k].owner;
  std::vector<int64_t> values = live_.SlotsOf(k);
  const bool as_slots = choices_->Uniform(0, 1) == 0;
  if (!as_slots) {
    for (int64_t& v : values) v /= page_size_;
  }
  if (choices_->Uniform(0, 7) == 0) caller = caller % kOwners + 1;
  if (choices_->Uniform(0, 15) == 0) values.push_back(0);
  // Sometimes the pages of two sequences together (a free group), in the
  // order given.
  if (live_.size() > 1 && choices_->Uniform(0, 3) == 0) {
    const size_t other = (k + 1) % live_.size();
    if (live_[other].owner == live_[k].owner) {
      std::vector<int64_t> more = live_.SlotsOf(other);
      if (!as_slots) {
        for (int64_t& v : more) v /= page_size_;
      }
      values.insert(values.begin(), more.begin(), more.end());
    }
  }
  const int order_choice = choices_->Uniform(0, 2);
  const FreeOrder order = static_cast<FreeOrder>(order_choice);
  const auto model_order = static_cast<ReferenceModel::Order>(order_choice);
  auto free = [&]() {
    return as_slots ? pool_->FreeSlots(caller, values, order)
                    : pool_->FreePages(caller, values, order);
  };
  const absl::StatusOr<int64_t> freed = free();
  const absl::StatusCode expected =
      model_.Free(caller, values, as_slots, model_order);
  if (freed.status().code() != expected) {
    return Disagree(absl::StrFormat("free: pool says %s, model code %d",
                                    freed.status().ToString(),
                                    static_cast<int>(expected)));
  }
  if (!freed.ok()) return absl::OkStatus();
  ForgetDeadSequences();
  if (choices_->Uniform(0, 5) == 0 && !values.empty()) {
    const absl::StatusOr<int64_t> again = free();
    if (again.status().code() != absl::StatusCode::kFailedPrecondition ||
        model_.Free(caller, values, as_slots, model_order) !=
            absl::StatusCode::kFailedPrecondition) {
      return Disagree("a double free was not FAILED_PRECONDITION: " +
                      again.status().ToString());
    }
  }
  return absl::OkStatus();
}

absl::Status PoolModelChecker::StepCheckpointOrRollback() {
  const OwnerId o = RandomOwner();
  if (choices_->Uniform(0, 1) == 0) {
    ASSIGN_OR_RETURN(const uint64_t id, pool_->Checkpoint(o));
    const uint64_t expected = model_.Checkpoint(o);
    if (id != expected) {
      return Disagree(
          absl::StrFormat("checkpoint id %d, model %d", id, expected));
    }
    return absl::OkStatus();
  }
  // The latest (which ends), or an id: active, ended, or never taken.
  uint64_t id = 0;
  if (choices_->Uniform(0, 1) == 0) {
    id = choices_->Uniform(1, model_.last_checkpoint_id(o) + 2);
    ++rollbacks_to_an_id_;
  }
  const absl::StatusOr<int64_t> returned = pool_->Rollback(o, id);
  const absl::StatusCode expected = model_.Rollback(o, id);
  if (returned.status().code() != expected) {
    return Disagree(absl::StrFormat("rollback: pool says %s, model code %d",
                                    returned.status().ToString(),
                                    static_cast<int>(expected)));
  }
  if (returned.ok()) pages_rolled_back_ += *returned;
  ForgetDeadSequences();
  return absl::OkStatus();
}

absl::Status PoolModelChecker::StepReclaim() {
  const OwnerId o = RandomOwner();
  RETURN_IF_ERROR(pool_->RemoveOwner(o).status());
  model_.RemoveOwner(o);
  RETURN_IF_ERROR(pool_->AddOwner(o, Quota(o)));
  model_.AddOwner(o, Quota(o));
  ForgetDeadSequences();
  return absl::OkStatus();
}

absl::Status PoolModelChecker::StepClear() {
  if (choices_->Uniform(0, 3) > 0) {
    const OwnerId o = RandomOwner();
    RETURN_IF_ERROR(pool_->ClearOwner(o).status());
    model_.ClearOwner(o);
  } else {
    const bool force = choices_->Uniform(0, 1) == 0;
    const absl::StatusCode got = pool_->ClearPool(force).status().code();
    const absl::StatusCode expected = model_.ClearPool(force);
    if (got != expected) {
      return Disagree(absl::StrFormat("clear pool: pool code %d, model %d",
                                      static_cast<int>(got),
                                      static_cast<int>(expected)));
    }
  }
  ForgetDeadSequences();
  return absl::OkStatus();
}

void PoolModelChecker::ForgetDeadSequences() {
  live_.RemoveIf([&](const LiveSequence& s) {
    for (int64_t page : s.pages) {
      if (model_.owner_of(page) != s.owner) return true;
    }
    return false;
  });
}

absl::Status PoolModelChecker::CheckSameState() {
  if (pool_->FreeList() != model_.free_list()) {
    return Disagree(absl::StrFormat("free list %s, model %s",
                                    Join(pool_->FreeList()),
                                    Join(model_.free_list())));
  }
  if (pool_->ParkedPages() != model_.parked()) {
    return Disagree(absl::StrFormat("parked %s, model %s",
                                    Join(pool_->ParkedPages()),
                                    Join(model_.parked())));
  }
  for (int64_t p = 0; p <= num_pages_; ++p) {
    if (pool_->OwnerOf(p) != model_.owner_of(p)) {
      return Disagree(absl::StrFormat("page %d owned by %d, model %d", p,
                                      pool_->OwnerOf(p), model_.owner_of(p)));
    }
  }
  const PoolStats stats = pool_->Stats();
  if (stats.free_pages + stats.parked_pages + stats.used_pages != num_pages_) {
    return Disagree("free + parked + used != total");
  }
  int64_t owned = 0;
  for (const auto& [id, owner] : stats.owners) {
    if (owner.pages_owned != model_.pages_owned(id)) {
      return Disagree(absl::StrFormat("owner %d holds %d pages, model %d", id,
                                      owner.pages_owned,
                                      model_.pages_owned(id)));
    }
    owned += owner.pages_owned;
    if (owner.checkpoints != model_.checkpoints(id)) {
      return Disagree(absl::StrFormat("owner %d has %d checkpoints, model %d",
                                      id, owner.checkpoints,
                                      model_.checkpoints(id)));
    }
  }
  if (owned != stats.used_pages) return Disagree("owners' pages != used");
  return pool_->CheckInvariants();
}

}  // namespace pagealloc::testing
