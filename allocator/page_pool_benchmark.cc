// Host-side cost of the allocator: planning a batch plus expanding it on the
// allocator's fake executor (plain host code, the CPU reference executor's
// semantics), for decode and extend batches of 1 to 8192 requests and up to
// 1M tokens. Planning is O(requests + new pages); the expansion is
// O(tokens). Each iteration allocates the batch and frees it again (one
// FreePages call, outside the timing), so the pool returns to the same
// state. Every shape runs at page sizes 1, 16 and 64.
//
// ./bazelw run -c opt //allocator:page_pool_benchmark --
//     --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// (one line).
// kernels/plan_packing_benchmark.cc adds the CUDA executor's host packing.
// BM_FreePages and BM_FreeSlots time the other half: a free of 256 or 4096
// whole pages, by page ids or by every slot of them (SGLang's free of a
// finished request's indices), allocated again outside the timing.

#include "allocator/batch_benchmark.h"
#include "allocator/fake_executor.h"
#include "benchmark/benchmark.h"

namespace pagealloc {
namespace {

// Runs one batch shape: range(0) the page size, range(1) the requests,
// range(2) (extend only) the new tokens per request. Reports the time per
// request as a counter (ns_per_request) next to items (requests) per second.
void RunBatch(benchmark::State& state, RequestKind kind, bool tagged = false) {
  const int64_t page_size = state.range(0);
  const int64_t num_requests = state.range(1);
  const int64_t tokens = kind == RequestKind::kDecode ? 1 : state.range(2);
  auto f =
      MakeBatchFixture<FakeExecutor>(num_requests, tokens, page_size, kind);
  AllocateAndFree(state, *f, tagged);
  state.SetItemsProcessed(state.iterations() * num_requests);
  state.counters["ns_per_request"] = benchmark::Counter(
      static_cast<double>(state.iterations() * num_requests) * 1e-9,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["tokens"] = num_requests * tokens;
}

void BM_Decode(benchmark::State& state) {
  RunBatch(state, RequestKind::kDecode);
}
// Page size 1 is SGLang's default (its token allocator); 16 and 64 are its
// paged allocator's usual sizes.
BENCHMARK(BM_Decode)
    ->ArgNames({"ps", "requests"})
    ->ArgsProduct({{1, 16, 64}, {1, 64, 256, 1024, 4096, 8192}});

// The same batch as one call with a call id, as every client call is
// (docs/design.md, "Retries by call id"): the pool keeps it as the owner's
// latest, with the pages it took.
void BM_DecodeTagged(benchmark::State& state) {
  RunBatch(state, RequestKind::kDecode, /*tagged=*/true);
}
BENCHMARK(BM_DecodeTagged)
    ->ArgNames({"ps", "requests"})
    ->ArgsProduct({{1, 16}, {1, 256, 4096}});

void BM_Extend(benchmark::State& state) {
  RunBatch(state, RequestKind::kExtend);
}
BENCHMARK(BM_Extend)
    ->ArgNames({"ps", "requests", "tokens"})
    ->ArgsProduct({{1, 16, 64}, {1}, {8192}})
    ->ArgsProduct({{1, 16, 64}, {16}, {512}})
    ->ArgsProduct({{1, 16, 64}, {256}, {32}})
    ->ArgsProduct({{1, 16, 64}, {1024}, {8}})
    ->ArgsProduct({{1, 16, 64}, {8192}, {4}})
    ->ArgsProduct({{1, 16, 64}, {64}, {16384}});

// range(0) the page size, range(1) the pages; by slots when `by_slots`.
void RunFree(benchmark::State& state, bool by_slots) {
  const int64_t page_size = state.range(0);
  const int64_t num_pages = state.range(1);
  auto f = MakeBatchFixture<FakeExecutor>(1, 1, page_size, RequestKind::kDecode,
                                          num_pages);
  constexpr OwnerId kOwner = BatchFixture<FakeExecutor>::kOwner;
  std::vector<int64_t> slots(num_pages * page_size);
  std::vector<int64_t> pages(num_pages);
  for (auto _ : state) {
    state.PauseTiming();
    const AllocRequest request{RequestKind::kAlloc,   kOwner, 0,           0,
                               num_pages * page_size, -1,     slots.data()};
    if (!f->pool->Allocate({request})[0].status.ok()) {
      state.SkipWithError("allocation failed");
      break;
    }
    for (int64_t k = 0; k < num_pages; ++k)
      pages[k] = slots[k * page_size] / page_size;
    state.ResumeTiming();
    const absl::StatusOr<int64_t> freed =
        by_slots ? f->pool->FreeSlots(kOwner, slots)
                 : f->pool->FreePages(kOwner, pages);
    if (!freed.ok() || *freed != num_pages) {
      state.SkipWithError("free failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * num_pages);
}

void BM_FreePages(benchmark::State& state) { RunFree(state, false); }
BENCHMARK(BM_FreePages)
    ->ArgNames({"ps", "pages"})
    ->ArgsProduct({{16}, {256, 4096}});

void BM_FreeSlots(benchmark::State& state) { RunFree(state, true); }
BENCHMARK(BM_FreeSlots)
    ->ArgNames({"ps", "pages"})
    ->ArgsProduct({{1, 16}, {256}});

}  // namespace
}  // namespace pagealloc
