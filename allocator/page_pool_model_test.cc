// Randomized operation sequences against ReferenceModel: after every step
// the pool and the model agree on every slot, status code, the free list,
// the parked pages and the owner of every page, and the pool's invariants
// (executor mirror included) hold.

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/page_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_executor.h"
#include "tests/reference_model.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using Model = ::pagealloc::testing::ReferenceModel;

struct Params {
  int64_t page_size;
  FreePolicy policy;
};

// A live sequence the generator may extend, decode or free.
struct Sequence {
  OwnerId owner;
  int64_t len;
  int64_t last_loc;
  std::vector<int64_t> slots;
};

class PagePoolModelTest : public ::testing::TestWithParam<Params> {
 protected:
  static constexpr int kOwners = 3;

  void SetUp() override {
    page_size_ = GetParam().page_size;
    // Small pools so that out-of-pages, sorting and reuse happen often.
    num_pages_ = 24 + rng_() % 40;
    ASSERT_OK_AND_ASSIGN(
        pool_, PagePool::Create({num_pages_, page_size_, GetParam().policy},
                                &executor_));
    model_ = std::make_unique<Model>(num_pages_, page_size_,
                                     GetParam().policy == FreePolicy::kSorted);
    for (OwnerId o = 1; o <= kOwners; ++o) {
      const int64_t quota = o == kOwners ? num_pages_ / 3 : 0;
      ASSERT_OK(pool_->AddOwner(o, quota));
      model_->AddOwner(o, quota);
    }
  }

  int64_t Uniform(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  OwnerId RandomOwner() { return Uniform(1, kOwners); }

  // Builds a random batch of extends, decodes and allocs, mostly valid, some
  // deliberately not, and runs it through both.
  void StepAllocate() {
    const int n = Uniform(1, 6);
    std::vector<AllocRequest> requests;
    std::vector<Model::Request> model_requests;
    std::vector<int> seq_of;  // index into live_ or -1 (new sequence / alloc)
    std::vector<bool> used(live_.size(), false);
    for (int i = 0; i < n; ++i) {
      AllocRequest r;
      r.index = i;
      int seq_index = -1;
      const int pick = Uniform(0, 9);
      const bool has_live = !live_.empty();
      if (pick < 3 || !has_live) {  // a new sequence
        r.kind = RequestKind::kExtend;
        r.owner = RandomOwner();
        r.prefix_len = 0;
        r.seq_len = Uniform(0, 3 * page_size_ + 2);
        r.last_loc = -1;
      } else if (pick < 8) {  // continue a live sequence
        seq_index = Uniform(0, live_.size() - 1);
        if (used[seq_index]) {  // one step per sequence per batch
          --i;
          continue;
        }
        used[seq_index] = true;
        const Sequence& s = live_[seq_index];
        r.owner = s.owner;
        r.last_loc = s.last_loc;
        if (pick < 6) {
          r.kind = RequestKind::kDecode;
          r.seq_len = s.len + 1;
        } else {
          r.kind = RequestKind::kExtend;
          r.prefix_len = s.len;
          r.seq_len = s.len + Uniform(0, 2 * page_size_ + 1);
        }
      } else if (pick < 9) {
        r.kind = RequestKind::kAlloc;
        r.owner = RandomOwner();
        r.seq_len = page_size_ * Uniform(0, 3);
      } else {
        // Something wrong: a stranger's last_loc, a misaligned one, an
        // unaligned alloc, a bad length or an unknown owner.
        r.kind = RequestKind::kExtend;
        r.owner = RandomOwner();
        switch (Uniform(0, 4)) {
          case 0: {
            const Sequence& s = live_[Uniform(0, live_.size() - 1)];
            r.owner = s.owner % kOwners + 1;
            r.prefix_len = s.len;
            r.seq_len = s.len + 1;
            r.last_loc = s.last_loc;
            break;
          }
          case 1:
            r.prefix_len = 1;
            r.seq_len = 3;
            r.last_loc = page_size_ + 1;
            break;
          case 2:
            r.kind = RequestKind::kAlloc;
            r.seq_len = page_size_ + 1;
            if (page_size_ == 1) r.seq_len = -1;
            break;
          case 3:
            r.prefix_len = 5;
            r.seq_len = 4;
            r.last_loc = -1;
            break;
          default:
            r.owner = 77;
            r.seq_len = 1;
            break;
        }
      }
      requests.push_back(r);
      model_requests.push_back(
          {static_cast<Model::Kind>(r.kind), r.owner, r.prefix_len, r.seq_len,
           r.last_loc});
      seq_of.push_back(seq_index);
    }
    std::vector<std::vector<int64_t>> out(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      out[i].assign(std::max<int64_t>(ToExtendShape(requests[i]).num_slots(),
                                      0),
                    -7);
      requests[i].destination = out[i].data();
    }
    std::vector<AllocResult> results = pool_->Allocate(requests);
    std::vector<Model::Outcome> expected = model_->Allocate(model_requests);
    ASSERT_EQ(results.size(), expected.size());
    for (size_t i = 0; i < results.size(); ++i) {
      ++outcomes_[{requests[i].kind, results[i].status.code()}];
      SCOPED_TRACE(absl::StrFormat("request %d: %s", i,
                                   results[i].status.ToString()));
      ASSERT_EQ(results[i].status.code(), expected[i].code);
      if (!results[i].status.ok()) continue;
      ASSERT_EQ(out[i], expected[i].slots);
      ASSERT_EQ(results[i].num_slots,
                static_cast<int64_t>(expected[i].slots.size()));
      // Track the sequence for later steps.
      const AllocRequest& r = requests[i];
      if (r.kind == RequestKind::kAlloc) {
        if (!out[i].empty()) {
          live_.push_back({r.owner, r.seq_len, out[i].back(), out[i]});
        }
        continue;
      }
      Sequence* s;
      if (seq_of[i] >= 0) {
        s = &live_[seq_of[i]];
      } else {
        if (out[i].empty()) continue;
        live_.push_back({r.owner, 0, -1, {}});
        s = &live_.back();
      }
      s->len = r.seq_len;
      s->slots.insert(s->slots.end(), out[i].begin(), out[i].end());
      if (!out[i].empty()) s->last_loc = out[i].back();
    }
  }

  void StepFree() {
    if (live_.empty()) return;
    const size_t k = Uniform(0, live_.size() - 1);
    Sequence s = live_[k];
    OwnerId caller = s.owner;
    std::vector<int64_t> values = s.slots;
    bool as_slots = Uniform(0, 1) == 0;
    if (!as_slots) {
      for (int64_t& v : values) v /= page_size_;
    }
    if (Uniform(0, 7) == 0) caller = caller % kOwners + 1;  // a stranger
    if (Uniform(0, 15) == 0) values.push_back(as_slots ? 0 : 0);  // page 0
    absl::StatusOr<int64_t> freed =
        as_slots ? pool_->FreeSlots(caller, values)
                 : pool_->FreePages(caller, values);
    ASSERT_EQ(freed.status().code(), model_->Free(caller, values, as_slots))
        << freed.status();
    if (freed.ok()) {
      live_.erase(live_.begin() + k);
      // Freeing again is a double free.
      if (Uniform(0, 5) == 0 && !values.empty()) {
        absl::StatusOr<int64_t> again =
            as_slots ? pool_->FreeSlots(caller, values)
                     : pool_->FreePages(caller, values);
        ASSERT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
        ASSERT_EQ(model_->Free(caller, values, as_slots),
                  absl::StatusCode::kFailedPrecondition);
      }
    }
  }

  void StepCheckpointOrRollback() {
    const OwnerId o = RandomOwner();
    if (Uniform(0, 1) == 0) {
      ASSERT_OK(pool_->Checkpoint(o));
      ASSERT_EQ(model_->Checkpoint(o), absl::StatusCode::kOk);
    } else {
      absl::StatusOr<int64_t> returned = pool_->Rollback(o);
      ASSERT_EQ(returned.status().code(), model_->Rollback(o));
      if (returned.ok()) pages_rolled_back_ += *returned;
      ForgetDeadSequences();
    }
  }

  void StepReclaim() {
    const OwnerId o = RandomOwner();
    ASSERT_OK(pool_->RemoveOwner(o).status());
    model_->RemoveOwner(o);
    const int64_t quota = o == kOwners ? num_pages_ / 3 : 0;
    ASSERT_OK(pool_->AddOwner(o, quota));
    model_->AddOwner(o, quota);
    ForgetDeadSequences();
  }

  // Drops sequences that lost a page (rolled back or reclaimed).
  void ForgetDeadSequences() {
    std::vector<Sequence> kept;
    for (Sequence& s : live_) {
      bool alive = true;
      for (int64_t slot : s.slots) {
        alive = alive && model_->owner_of(slot / page_size_) == s.owner;
      }
      if (alive) kept.push_back(std::move(s));
    }
    live_ = std::move(kept);
  }

  void ExpectSameState() {
    ASSERT_EQ(pool_->FreeList(), model_->free_list());
    ASSERT_EQ(pool_->ParkedPages(), model_->parked());
    for (int64_t p = 0; p <= num_pages_; ++p) {
      ASSERT_EQ(pool_->OwnerOf(p), model_->owner_of(p)) << "page " << p;
    }
    PoolStats stats = pool_->Stats();
    ASSERT_EQ(stats.free_pages + stats.parked_pages + stats.used_pages,
              num_pages_);
    int64_t owned = 0;
    for (const auto& [id, owner] : stats.owners) {
      ASSERT_EQ(owner.pages_owned, model_->pages_owned(id));
      owned += owner.pages_owned;
    }
    ASSERT_EQ(owned, stats.used_pages);
    ASSERT_OK(pool_->CheckInvariants());
  }

  std::mt19937_64 rng_{std::random_device{}()};
  int64_t page_size_ = 1;
  int64_t num_pages_ = 0;
  CpuExecutor executor_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<Model> model_;
  std::vector<Sequence> live_;
  // How often each (kind, code) came up, to check the generator reaches the
  // interesting paths.
  std::map<std::pair<RequestKind, absl::StatusCode>, int64_t> outcomes_;
  int64_t pages_rolled_back_ = 0;
};

TEST_P(PagePoolModelTest, RandomOperationSequencesMatchTheModel) {
  const uint64_t seed = std::random_device{}();
  rng_.seed(seed);
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  constexpr int kSequences = 250;
  constexpr int kStepsPerSequence = 60;
  for (int sequence = 0; sequence < kSequences; ++sequence) {
    SetUp();  // a fresh pool (and size) per sequence
    live_.clear();
    for (int step = 0; step < kStepsPerSequence; ++step) {
      SCOPED_TRACE(absl::StrFormat("sequence %d step %d", sequence, step));
      const int op = Uniform(0, 19);
      if (op < 11) {
        StepAllocate();
      } else if (op < 16) {
        StepFree();
      } else if (op < 19) {
        StepCheckpointOrRollback();
      } else {
        StepReclaim();
      }
      if (HasFatalFailure()) return;
      ExpectSameState();
      if (HasFatalFailure()) return;
    }
  }
  using Code = absl::StatusCode;
  EXPECT_GT((outcomes_[{RequestKind::kExtend, Code::kOk}]), 1000);
  EXPECT_GT((outcomes_[{RequestKind::kDecode, Code::kOk}]), 1000);
  EXPECT_GT((outcomes_[{RequestKind::kAlloc, Code::kOk}]), 500);
  EXPECT_GT((outcomes_[{RequestKind::kExtend, Code::kResourceExhausted}]), 10);
  EXPECT_GT((outcomes_[{RequestKind::kExtend, Code::kInvalidArgument}]), 10);
  if (page_size_ > 1) {  // with page_size 1 no prefix ends inside a page
    EXPECT_GT((outcomes_[{RequestKind::kExtend, Code::kPermissionDenied}]),
              10);
  }
  EXPECT_GT((outcomes_[{RequestKind::kExtend, Code::kNotFound}]), 10);
  EXPECT_GT(pages_rolled_back_, 100);
}

INSTANTIATE_TEST_SUITE_P(
    PageSizesAndPolicies, PagePoolModelTest,
    ::testing::Values(Params{1, FreePolicy::kLifo},
                      Params{2, FreePolicy::kLifo},
                      Params{16, FreePolicy::kLifo},
                      Params{64, FreePolicy::kLifo},
                      Params{1, FreePolicy::kSorted},
                      Params{2, FreePolicy::kSorted},
                      Params{16, FreePolicy::kSorted},
                      Params{64, FreePolicy::kSorted}),
    [](const ::testing::TestParamInfo<Params>& info) {
      return absl::StrFormat("PageSize%d%s", info.param.page_size,
                             FreePolicyName(info.param.policy) == "lifo"
                                 ? "Lifo"
                                 : "Sorted");
    });

}  // namespace
}  // namespace pagealloc
