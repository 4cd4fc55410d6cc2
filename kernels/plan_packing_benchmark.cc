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

#include "allocator/batch_benchmark.h"
#include "benchmark/benchmark.h"
#include "kernels/cpu_executor.h"
#include "kernels/plan_packing.h"

namespace pagealloc {
namespace {

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
void RunDecodeBatch(benchmark::State& state) {
  const int64_t num_requests = state.range(0);
  auto f = MakeBatchFixture<Executor>(num_requests, /*tokens_per_request=*/1,
                                      kPageSize, RequestKind::kDecode);
  AllocateAndFree(state, *f);
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
