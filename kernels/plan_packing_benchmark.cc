// Host-side cost of the CUDA executor's plan packing (plan_packing.h), so
// that it can be profiled on a machine without a GPU. Each benchmark plans a
// decode batch on a PagePool and expands it on the CPU executor;
// BM_DecodePacked also packs every plan for upload as the CUDA executor
// does (into host memory here), so the difference from BM_DecodeCpu at the
// same size is the packing. Each iteration allocates the batch and frees it
// again (one FreePages call), so the pool returns to the same state.
//
// ./bazelw run -c opt //kernels:plan_packing_benchmark

#include <memory>
#include <vector>

#include "allocator/page_pool.h"
#include "benchmark/benchmark.h"
#include "kernels/cpu_executor.h"
#include "kernels/plan_packing.h"

namespace pagealloc {
namespace {

constexpr OwnerId kOwner = 1;
constexpr int64_t kPageSize = 16;

// The CPU executor, plus packing every plan as the CUDA executor does before
// its upload.
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

// Sets up a pool with `num_requests` one-token sequences (each on a page of
// its own, so that a decode continues a partial page, as in serving) and a
// batch decoding one token for each.
template <typename Executor>
std::unique_ptr<Fixture<Executor>> MakeDecodeFixture(int64_t num_requests) {
  auto f = std::make_unique<Fixture<Executor>>();
  const int64_t num_pages = num_requests * 4 + 64;
  f->pool = *PagePool::Create({num_pages, kPageSize, FreePolicy::kLifo},
                              &f->executor);
  (void)f->pool->AddOwner(kOwner, 0);
  f->out.resize(num_requests);
  std::vector<AllocRequest> prefill(num_requests);
  std::vector<int64_t> first_slots(num_requests);
  for (int64_t i = 0; i < num_requests; ++i) {
    prefill[i] = {RequestKind::kExtend, kOwner, i, 0, 1, -1, &first_slots[i]};
  }
  (void)f->pool->Allocate(prefill);
  for (int64_t i = 0; i < num_requests; ++i) {
    f->requests.push_back({RequestKind::kDecode, kOwner, i, 0, 2,
                           first_slots[i], f->out.data() + i});
  }
  return f;
}

template <typename Executor>
void RunDecodeBatch(benchmark::State& state) {
  const int64_t num_requests = state.range(0);
  auto f = MakeDecodeFixture<Executor>(num_requests);
  std::vector<int64_t> new_pages;
  for (auto _ : state) {
    std::vector<AllocResult> results = f->pool->Allocate(f->requests);
    state.PauseTiming();
    // Free the pages the batch took: every slot at a page start is a new
    // page.
    new_pages.clear();
    for (int64_t slot : f->out) {
      if (slot % kPageSize == 0) new_pages.push_back(slot / kPageSize);
    }
    if (!results.back().status.ok() ||
        !f->pool->FreePages(kOwner, new_pages).ok()) {
      state.SkipWithError("allocation failed");
      break;
    }
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * num_requests);
}

void BM_DecodeCpu(benchmark::State& state) {
  RunDecodeBatch<CpuExecutor>(state);
}
BENCHMARK(BM_DecodeCpu)->Arg(256)->Arg(1024);

void BM_DecodePacked(benchmark::State& state) {
  RunDecodeBatch<PackingExecutor>(state);
}
BENCHMARK(BM_DecodePacked)->Arg(256)->Arg(1024);

}  // namespace
}  // namespace pagealloc
