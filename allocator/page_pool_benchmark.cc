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

#include <memory>
#include <vector>

#include "allocator/fake_executor.h"
#include "allocator/page_pool.h"
#include "benchmark/benchmark.h"

namespace pagealloc {
namespace {

constexpr OwnerId kOwner = 1;

struct Fixture {
  FakeExecutor executor;
  std::unique_ptr<PagePool> pool;
  std::vector<AllocRequest> requests;
  std::vector<int64_t> out;
};

// Sets up a pool with `requests` sequences whose prefixes end inside their
// pages (the common decode case) and a batch stepping each of them.
std::unique_ptr<Fixture> MakeFixture(int64_t num_requests,
                                     int64_t tokens_per_request,
                                     int64_t page_size, RequestKind kind) {
  auto f = std::make_unique<Fixture>();
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

// Runs one batch shape: range(0) the page size, range(1) the requests,
// range(2) (extend only) the new tokens per request. Reports the time per
// request as a counter (ns_per_request) next to items (requests) per second.
void RunBatch(benchmark::State& state, RequestKind kind) {
  const int64_t page_size = state.range(0);
  const int64_t num_requests = state.range(1);
  const int64_t tokens = kind == RequestKind::kDecode ? 1 : state.range(2);
  auto f = MakeFixture(num_requests, tokens, page_size, kind);
  std::vector<int64_t> new_pages;
  std::vector<AllocResult> results;
  for (auto _ : state) {
    f->pool->Allocate(f->requests, &results);
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

}  // namespace
}  // namespace pagealloc
