// Host-side cost of the shared prefix pages in the pool (the fake
// executor; the daemon's transports come on top):
//   - BM_MatchAdopt: match and adopt a chain of 2,048 pages (32k tokens at
//     page size 16) in one call; the references are dropped untimed.
//   - BM_ParseChain: the call core's parse of a 2,048-key wire chain
//     (each key's size, copied out), before the pool sees it.
//   - BM_Publish: publish 256 freshly written pages under new keys.
//   - BM_EvictInsideAllocation: one allocation of 10,000 pages from a pool
//     whose every page is cached: the launch evicts them all (LRU) once.
//   - BM_DecodeWithPublished: AllocDecode(256)-shaped admission with 0 or
//     1M other pages published and held (the index must not slow the hot
//     path).
//
// ./bazelw run -c opt //allocator:prefix_benchmark --
//     --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// (one line).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "allocator/batch_benchmark.h"
#include "allocator/fake_executor.h"
#include "allocator/page_pool.h"
#include "allocator/prefix_index.h"
#include "benchmark/benchmark.h"

namespace pagealloc {
namespace {

constexpr int64_t kPageSize = 16;
constexpr OwnerId kWriter = 7;
constexpr OwnerId kReader = 8;

PrefixKey KeyOf(uint64_t n) {
  PrefixKey key{};
  for (int b = 0; b < 8; ++b) key[b] = static_cast<uint8_t>(n >> (8 * b));
  key[31] = 0xc3;
  return key;
}

std::vector<PrefixKey> Keys(uint64_t first, int64_t n) {
  std::vector<PrefixKey> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = KeyOf(first + i);
  return keys;
}

// Allocates `n` whole pages for `owner` in chunks; returns their ids.
std::vector<int64_t> TakePages(PagePool& pool, OwnerId owner, int64_t n) {
  constexpr int64_t kChunk = 4096;
  std::vector<int64_t> pages;
  pages.reserve(n);
  std::vector<int64_t> slots(kChunk * kPageSize);
  for (int64_t done = 0; done < n; done += kChunk) {
    const int64_t count = std::min(kChunk, n - done);
    AllocRequest request{RequestKind::kAlloc, owner, 0,           0,
                         count * kPageSize,   -1,    slots.data()};
    if (!pool.Allocate({request})[0].status.ok()) return {};
    for (int64_t k = 0; k < count; ++k) {
      pages.push_back(slots[k * kPageSize] / kPageSize);
    }
  }
  return pages;
}

struct PrefixFixture {
  FakeExecutor executor;
  std::unique_ptr<PagePool> pool;
};

std::unique_ptr<PrefixFixture> MakePool(int64_t num_pages) {
  auto f = std::make_unique<PrefixFixture>();
  f->pool = *PagePool::Create({num_pages, kPageSize, FreePolicy::kLifo},
                              &f->executor);
  (void)f->pool->AddOwner(kWriter, 0);
  (void)f->pool->AddOwner(kReader, 0);
  return f;
}

void BM_MatchAdopt(benchmark::State& state) {
  const int64_t chain = state.range(0);
  auto f = MakePool(2 * chain);
  const std::vector<PrefixKey> keys = Keys(1, chain);
  const std::vector<int64_t> pages = TakePages(*f->pool, kWriter, chain);
  if (!f->pool->Publish(kWriter, pages, keys, nullptr, false).ok()) {
    state.SkipWithError("publish failed");
    return;
  }
  for (auto _ : state) {
    auto adopted = f->pool->MatchPrefix(kReader, keys, /*adopt=*/true);
    state.PauseTiming();
    if (!adopted.ok() || static_cast<int64_t>(adopted->size()) != chain ||
        !f->pool->FreePages(kReader, *adopted).ok()) {
      state.SkipWithError("match or free failed");
      break;
    }
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * chain);
}
BENCHMARK(BM_MatchAdopt)->ArgName("pages")->Arg(2048);

// What the call core does to a wire chain before the pool sees it:
// ParsePrefixKeys of 2,048 keys (each key's size, copied out).
void BM_ParseChain(benchmark::State& state) {
  const int64_t chain = state.range(0);
  std::vector<std::string> wire;
  for (const PrefixKey& key : Keys(1, chain))
    wire.push_back(PrefixKeyBytes(key));
  const std::vector<absl::string_view> views(wire.begin(), wire.end());
  for (auto _ : state) {
    auto parsed = ParsePrefixKeys(views, "keys", 2 * chain);
    if (!parsed.ok()) {
      state.SkipWithError("parse failed");
      break;
    }
    benchmark::DoNotOptimize(parsed->data());
  }
  state.SetItemsProcessed(state.iterations() * chain);
}
BENCHMARK(BM_ParseChain)->ArgName("keys")->Arg(2048);

void BM_Publish(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto f = MakePool(4 * n);
  uint64_t next_key = 1;
  for (auto _ : state) {
    state.PauseTiming();
    const std::vector<int64_t> pages = TakePages(*f->pool, kWriter, n);
    const std::vector<PrefixKey> keys = Keys(next_key, n);
    next_key += n;
    state.ResumeTiming();
    auto published = f->pool->Publish(kWriter, pages, keys, nullptr, false);
    state.PauseTiming();
    if (!published.ok() || published->newly_published != n ||
        !f->pool->FreePages(kWriter, pages).ok() ||
        !f->pool->ResetPrefixCache().ok()) {
      state.SkipWithError("publish failed");
      break;
    }
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_Publish)->ArgName("pages")->Arg(256);

void BM_EvictInsideAllocation(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto f = MakePool(n);
  std::vector<int64_t> slots(n * kPageSize);
  AllocRequest everything{RequestKind::kAlloc, kReader, 0,           0,
                          n * kPageSize,       -1,      slots.data()};
  std::vector<AllocResult> results;
  for (auto _ : state) {
    state.PauseTiming();
    // Every page published, then freed: all cached, none free.
    const std::vector<int64_t> pages = TakePages(*f->pool, kWriter, n);
    if (pages.empty() ||
        !f->pool->Publish(kWriter, pages, Keys(1, n), nullptr, false).ok() ||
        !f->pool->FreePages(kWriter, pages).ok()) {
      state.SkipWithError("setup failed");
      break;
    }
    state.ResumeTiming();
    f->pool->Allocate({everything}, &results);
    state.PauseTiming();
    if (!results[0].status.ok() || !f->pool->ClearOwner(kReader).ok()) {
      state.SkipWithError("allocation failed");
      break;
    }
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_EvictInsideAllocation)
    ->ArgName("pages")
    ->Arg(10000)
    ->Unit(benchmark::kMicrosecond);

// range(0): pages other owners have published and hold.
void BM_DecodeWithPublished(benchmark::State& state) {
  const int64_t published = state.range(0);
  auto f = MakeBatchFixture<FakeExecutor>(256, 1, kPageSize,
                                          RequestKind::kDecode, published);
  (void)f->pool->AddOwner(kWriter, 0);
  if (published > 0) {
    const std::vector<int64_t> pages = TakePages(*f->pool, kWriter, published);
    if (static_cast<int64_t>(pages.size()) != published ||
        !f->pool->Publish(kWriter, pages, Keys(1, published), nullptr, false)
             .ok()) {
      state.SkipWithError("publish failed");
      return;
    }
  }
  AllocateAndFree(state, *f);
  state.SetItemsProcessed(state.iterations() * 256);
}
BENCHMARK(BM_DecodeWithPublished)->ArgName("published")->Arg(0)->Arg(1 << 20);

}  // namespace
}  // namespace pagealloc
