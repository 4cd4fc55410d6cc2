// Page size 1 plans as ring copies (PoolOptions.ring_copy_plans) against the
// general form, expanded requests: the same slots, results and free lists
// on random traces, and the shape of the copies a batch becomes.

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/fake_executor.h"
#include "allocator/page_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr OwnerId kAlice = 1;
constexpr OwnerId kBob = 2;  // has a quota
constexpr OwnerId kNobody = 9;

std::unique_ptr<PagePool> MakePool(int64_t num_pages, FreePolicy policy,
                                   Semantics semantics, bool ring_copies,
                                   FakeExecutor* executor) {
  PoolOptions options;
  options.num_pages = num_pages;
  options.page_size = 1;
  options.free_policy = policy;
  options.semantics = semantics;
  options.ring_copy_plans = ring_copies;
  auto pool = PagePool::Create(options, executor);
  EXPECT_OK(pool.status());
  EXPECT_OK((*pool)->AddOwner(kAlice, 0));
  EXPECT_OK((*pool)->AddOwner(kBob, num_pages / 3));
  return *std::move(pool);
}

AllocRequest Decode(OwnerId owner, int64_t seq, int64_t last) {
  return {RequestKind::kDecode, owner, 0, 0, seq, last, nullptr};
}

// One call's requests written, as the daemon writes them, into one buffer
// at offsets that are the prefix sums of their shapes' slots.
std::vector<AllocResult> RunCalls(PagePool& pool,
                                  std::vector<AllocRequest> requests,
                                  const std::vector<CallSpan>& calls,
                                  std::vector<int64_t>* out) {
  int64_t total = 0;
  for (const AllocRequest& r : requests) {
    total += std::max<int64_t>(ToExtendShape(r).num_slots(), 0);
  }
  out->assign(total + 1, -7);
  int64_t offset = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].index = i;
    requests[i].destination = out->data() + offset;
    offset += std::max<int64_t>(ToExtendShape(requests[i]).num_slots(), 0);
  }
  return pool.Allocate(requests, calls);
}

TEST(RingCopyPlansTest, OneDecodeCallIsOneCopy) {
  FakeExecutor executor;
  std::unique_ptr<PagePool> pool =
      MakePool(16, FreePolicy::kLifo, Semantics::kPagealloc, true, &executor);
  std::vector<int64_t> out;
  std::vector<AllocResult> results = RunCalls(
      *pool,
      {Decode(kAlice, 1, -1), Decode(kAlice, 1, -1), Decode(kAlice, 1, -1)}, {},
      &out);
  for (const AllocResult& result : results) ASSERT_OK(result.status);
  EXPECT_EQ(executor.last_ring_copies(), 1);
  EXPECT_EQ(executor.last_planned_requests(), 0);
  EXPECT_THAT(out, ElementsAre(1, 2, 3, -7));
}

TEST(RingCopyPlansTest, ARefusedRequestSplitsTheCopyAndAWrapIsServed) {
  FakeExecutor executor;
  std::unique_ptr<PagePool> pool =
      MakePool(4, FreePolicy::kLifo, Semantics::kPagealloc, true, &executor);
  std::vector<int64_t> out;
  // Take 3 pages and give them back to the back of the list, so that the
  // next batch's pages wrap around the ring's end: 4, then 1, 2, 3.
  std::vector<AllocResult> results = RunCalls(
      *pool, {{RequestKind::kAlloc, kAlice, 0, 0, 3, -1, nullptr}}, {}, &out);
  ASSERT_OK(results[0].status);
  ASSERT_OK(pool->FreePages(kAlice, {1, 2, 3}).status());
  EXPECT_THAT(pool->FreeList(), ElementsAre(1, 2, 3, 4));
  // A request of an unknown owner between two decodes keeps its place in
  // the output: two copies.
  results = RunCalls(*pool,
                     {Decode(kAlice, 1, -1), Decode(kNobody, 1, -1),
                      Decode(kAlice, 1, -1), Decode(kAlice, 1, -1)},
                     {}, &out);
  EXPECT_THAT(results[1].status, StatusIs(absl::StatusCode::kNotFound,
                                          HasSubstr("unknown owner")));
  EXPECT_EQ(executor.last_ring_copies(), 2);
  EXPECT_THAT(out, ElementsAre(1, -7, 2, 3, -7));
  ASSERT_OK(pool->CheckInvariants());
}

// A random trace runs on two pools of page size 1, one planning ring copies
// and one expanded requests; every answer, slot and free list must agree.
class Twins {
 public:
  Twins(int64_t num_pages, FreePolicy policy, Semantics semantics,
        uint64_t seed)
      : rng_(seed) {
    copies_ = MakePool(num_pages, policy, semantics, true, &copies_executor_);
    general_ =
        MakePool(num_pages, policy, semantics, false, &general_executor_);
  }

  // Runs one random step on both pools and compares them.
  void Step() {
    const int64_t what = Uniform(0, 99);
    if (what < 60) {
      Allocate();
    } else if (what < 85) {
      Free();
    } else if (what < 95) {
      CheckpointOrRollback();
    } else {
      const OwnerId owner = RandomOwner();
      ASSERT_EQ(copies_->ClearOwner(owner).status(),
                general_->ClearOwner(owner).status());
      sequences_[owner].clear();
    }
    ASSERT_EQ(copies_->FreeList(), general_->FreeList());
    ASSERT_EQ(copies_->ParkedPages(), general_->ParkedPages());
    ASSERT_OK(copies_->CheckInvariants());
    ASSERT_OK(general_->CheckInvariants());
  }

  int64_t admitted() const { return admitted_; }
  int64_t refused() const { return refused_; }

 private:
  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  OwnerId RandomOwner() { return Uniform(0, 1) == 0 ? kAlice : kBob; }

  // A request for a new sequence, for one of `owner`'s sequences, or a bad
  // one; `sequence` is the sequence it continues (-1: none).
  AllocRequest RandomRequest(OwnerId owner, RequestKind kind,
                             int64_t* sequence) {
    std::vector<std::vector<int64_t>>& live = sequences_[owner];
    *sequence = -1;
    const int64_t pick = Uniform(0, 19);
    if (pick == 0) return Decode(kNobody, 1, -1);
    if (pick == 1) {
      return {RequestKind::kExtend, owner, 0, 5, 3, -1, nullptr};
    }
    if (kind == RequestKind::kAlloc) {
      return {kind, owner, 0, 0, Uniform(0, 6), -1, nullptr};
    }
    if (!live.empty() && Uniform(0, 3) > 0) {
      *sequence = Uniform(0, live.size() - 1);
      const std::vector<int64_t>& slots = live[*sequence];
      const int64_t length = slots.size();
      const int64_t last = length == 0 ? -1 : slots.back();
      if (kind == RequestKind::kDecode) return Decode(owner, length + 1, last);
      return {kind, owner, 0, length, length + Uniform(0, 5), last, nullptr};
    }
    *sequence = -2;  // a new sequence
    if (kind == RequestKind::kDecode) return Decode(owner, 1, -1);
    return {kind, owner, 0, 0, Uniform(0, 6), -1, nullptr};
  }

  void Allocate() {
    std::vector<AllocRequest> requests;
    std::vector<CallSpan> calls;
    std::vector<std::pair<OwnerId, int64_t>> continues;
    const int64_t num_calls = Uniform(1, 3);
    for (int64_t c = 0; c < num_calls; ++c) {
      const OwnerId owner = RandomOwner();
      const RequestKind kind = static_cast<RequestKind>(Uniform(0, 2));
      const int64_t n = Uniform(0, 8);
      for (int64_t k = 0; k < n; ++k) {
        int64_t sequence = -1;
        requests.push_back(RandomRequest(owner, kind, &sequence));
        continues.emplace_back(owner, sequence);
      }
      calls.push_back({n, Uniform(0, 3) == 0, {}});
    }
    std::vector<int64_t> copies_out;
    std::vector<int64_t> general_out;
    const std::vector<AllocResult> a =
        RunCalls(*copies_, requests, calls, &copies_out);
    const std::vector<AllocResult> b =
        RunCalls(*general_, requests, calls, &general_out);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      SCOPED_TRACE(absl::StrFormat("request %d", i));
      ASSERT_EQ(a[i].status, b[i].status);
      ASSERT_EQ(a[i].num_slots, b[i].num_slots);
      ASSERT_EQ(a[i].num_new_pages, b[i].num_new_pages);
    }
    ASSERT_EQ(copies_out, general_out);
    // Grow the sequences the admitted requests continue (or start).
    int64_t offset = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const int64_t slots =
          std::max<int64_t>(ToExtendShape(requests[i]).num_slots(), 0);
      const auto [owner, sequence] = continues[i];
      if (a[i].status.ok()) {
        ++admitted_;
        std::vector<int64_t> written(copies_out.begin() + offset,
                                     copies_out.begin() + offset + slots);
        if (sequence == -2) {
          sequences_[owner].push_back(written);
        } else if (sequence >= 0 && requests[i].owner == owner &&
                   requests[i].kind != RequestKind::kAlloc) {
          std::vector<int64_t>& grown = sequences_[owner][sequence];
          grown.insert(grown.end(), written.begin(), written.end());
        }
      } else {
        ++refused_;
      }
      offset += slots;
    }
  }

  void Free() {
    const OwnerId owner = RandomOwner();
    std::vector<std::vector<int64_t>>& live = sequences_[owner];
    if (live.empty()) return;
    const size_t k = Uniform(0, live.size() - 1);
    std::vector<int64_t> slots = live[k];
    std::shuffle(slots.begin(), slots.end(), rng_);
    live.erase(live.begin() + k);
    const auto order = static_cast<FreeOrder>(Uniform(0, 2));
    ASSERT_EQ(copies_->FreeSlots(owner, slots, order),
              general_->FreeSlots(owner, slots, order));
  }

  void CheckpointOrRollback() {
    const OwnerId owner = RandomOwner();
    if (Uniform(0, 1) == 0) {
      ASSERT_EQ(copies_->Checkpoint(owner), general_->Checkpoint(owner));
      return;
    }
    ASSERT_EQ(copies_->Rollback(owner), general_->Rollback(owner));
    // Some of the owner's slots went back: forget its sequences (the pages
    // they still hold stay owned until a clear).
    sequences_[owner].clear();
  }

  std::mt19937_64 rng_;
  FakeExecutor copies_executor_;
  FakeExecutor general_executor_;
  std::unique_ptr<PagePool> copies_;
  std::unique_ptr<PagePool> general_;
  std::map<OwnerId, std::vector<std::vector<int64_t>>> sequences_;
  int64_t admitted_ = 0;
  int64_t refused_ = 0;
};

TEST(RingCopyPlansTest, SameSlotsAsTheGeneralFormOnRandomTraces) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrFormat("seed %d", seed));
  std::mt19937_64 seeds(seed);
  for (Semantics semantics : {Semantics::kPagealloc, Semantics::kSglang}) {
    for (FreePolicy policy : {FreePolicy::kLifo, FreePolicy::kSorted}) {
      int64_t admitted = 0;
      int64_t refused = 0;
      for (int trace = 0; trace < 40; ++trace) {
        SCOPED_TRACE(absl::StrFormat("%s %s trace %d", SemanticsName(semantics),
                                     FreePolicyName(policy), trace));
        Twins twins(std::uniform_int_distribution<int64_t>(8, 48)(seeds),
                    policy, semantics, seeds());
        for (int step = 0; step < 80; ++step) {
          SCOPED_TRACE(absl::StrFormat("step %d", step));
          ASSERT_NO_FATAL_FAILURE(twins.Step());
        }
        admitted += twins.admitted();
        refused += twins.refused();
      }
      // The traces reach both outcomes often.
      EXPECT_GT(admitted, 1000);
      EXPECT_GT(refused, 300);
    }
  }
}

}  // namespace
}  // namespace pagealloc
