// Host-side cost of the allocator: planning a batch plus expanding it on the
// CPU executor, for decode and extend batches of 1 to 8192 requests and up to
// 1M tokens; BM_DecodePacked adds the CUDA executor's host work (packing the
// plan for upload, kernels/plan_packing.h), so that its cost can be profiled
// on a machine without a GPU. Planning is O(requests + new pages); the CPU
// expansion is O(tokens). Each iteration allocates the batch and frees it again
// (one FreePages call), so the pool returns to the same state.

#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "allocator/page_pool.h"
#include "benchmark/benchmark.h"
#include "kernels/cpu_executor.h"
#include "kernels/plan_packing.h"

namespace pagealloc {
namespace {

constexpr OwnerId kOwner = 1;

// The CPU executor, plus packing every plan as the CUDA executor does before
// its upload (into host memory here).
class PackingExecutor final : public PlanExecutor {
 public:
  absl::Status InitFreeRing(int64_t capacity) override {
    capacity_ = capacity;
    return cpu_.InitFreeRing(capacity);
  }
  absl::Status WriteFreeRing(int64_t position,
                             absl::Span<const int64_t> pages) override {
    return cpu_.WriteFreeRing(position, pages);
  }
  absl::Status Execute(const BatchPlan& plan) override {
    block_.resize(MaxPackedPlanBytes(plan.requests.size(), plan.num_slots) /
                  sizeof(int64_t));
    absl::StatusOr<PackedPlan> packed =
        PackPlan(plan, capacity_, absl::MakeSpan(block_));
    if (!packed.ok()) return packed.status();
    benchmark::DoNotOptimize(block_.data());
    return cpu_.Execute(plan);
  }
  absl::Status Synchronize() override { return cpu_.Synchronize(); }
  absl::StatusOr<std::vector<int64_t>> ReadFreeRing() override {
    return cpu_.ReadFreeRing();
  }
  const char* name() const override { return "cpu+packing"; }

 private:
  CpuExecutor cpu_;
  int64_t capacity_ = 0;
  std::vector<int64_t> block_;
};

template <typename Executor>
struct Fixture {
  Executor executor;
  std::unique_ptr<PagePool> pool;
  std::vector<AllocRequest> requests;
  std::vector<int64_t> out;
};

// Sets up a pool with `requests` sequences whose prefixes end inside their
// pages (the common decode case) and a batch stepping each of them.
template <typename Executor = CpuExecutor>
std::unique_ptr<Fixture<Executor>> MakeFixture(int64_t num_requests,
                                               int64_t tokens_per_request,
                                               int64_t page_size,
                                               RequestKind kind) {
  auto f = std::make_unique<Fixture<Executor>>();
  const int64_t pages_per_request =
      CeilDiv(tokens_per_request + 1, page_size) + 1;
  const int64_t num_pages = num_requests * pages_per_request * 2 + 64;
  f->pool = *PagePool::Create({num_pages, page_size, FreePolicy::kLifo},
                              &f->executor);
  (void)f->pool->AddOwner(kOwner, 0);
  f->out.resize(num_requests * tokens_per_request);
  // Give every request a prefix of one token (its own page) so that a decode
  // or extend continues a partial page, as in serving.
  std::vector<AllocRequest> prefill(num_requests);
  std::vector<int64_t> first_slots(num_requests);
  for (int64_t i = 0; i < num_requests; ++i) {
    prefill[i] = {RequestKind::kExtend, kOwner, i, 0, 1, -1, &first_slots[i]};
  }
  (void)f->pool->Allocate(prefill);
  std::mt19937_64 rng(42);
  int64_t offset = 0;
  for (int64_t i = 0; i < num_requests; ++i) {
    AllocRequest r;
    r.kind = kind;
    r.owner = kOwner;
    r.index = i;
    r.last_loc = first_slots[i];
    if (kind == RequestKind::kDecode) {
      r.seq_len = 2;
    } else {
      r.prefix_len = 1;
      r.seq_len = 1 + tokens_per_request;
    }
    r.destination = f->out.data() + offset;
    offset += ToExtendShape(r).num_slots();
    f->requests.push_back(r);
  }
  return f;
}

template <typename Executor = CpuExecutor>
void RunBatch(benchmark::State& state, RequestKind kind, int64_t page_size) {
  const int64_t num_requests = state.range(0);
  const int64_t tokens = kind == RequestKind::kDecode ? 1 : state.range(1);
  auto f = MakeFixture<Executor>(num_requests, tokens, page_size, kind);
  std::vector<int64_t> new_pages;
  for (auto _ : state) {
    std::vector<AllocResult> results = f->pool->Allocate(f->requests);
    state.PauseTiming();
    // Free the pages the batch took: every slot at a page start is a new
    // page.
    new_pages.clear();
    for (int64_t slot : f->out) {
      if (slot % page_size == 0) new_pages.push_back(slot / page_size);
    }
    if (!results.back().status.ok() ||
        !f->pool->FreePages(kOwner, new_pages).ok()) {
      state.SkipWithError("allocation failed");
      break;
    }
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * num_requests);
  state.counters["tokens"] = num_requests * tokens;
}

void BM_Decode(benchmark::State& state) {
  RunBatch(state, RequestKind::kDecode, 16);
}
BENCHMARK(BM_Decode)->Arg(1)->Arg(64)->Arg(256)->Arg(1024)->Arg(4096)->Arg(
    8192);

void BM_DecodePacked(benchmark::State& state) {
  RunBatch<PackingExecutor>(state, RequestKind::kDecode, 16);
}
BENCHMARK(BM_DecodePacked)->Arg(256)->Arg(1024);

void BM_Extend(benchmark::State& state) {
  RunBatch(state, RequestKind::kExtend, 16);
}
BENCHMARK(BM_Extend)
    ->Args({1, 8192})
    ->Args({16, 512})
    ->Args({256, 32})
    ->Args({1024, 8})
    ->Args({4096, 4})
    ->Args({8192, 4})
    ->Args({64, 16384});

}  // namespace
}  // namespace pagealloc
