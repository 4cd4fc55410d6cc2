// What the allocator's and the kernels' host benchmarks share: a pool whose
// sequences have one token each, each on a page of its own (so that the
// next request continues a partial page, as in serving), one batch stepping
// every one of them, and the benchmark loop that allocates the batch and
// frees its new pages again, so that the pool returns to the same state.

#ifndef PAGEALLOC_ALLOCATOR_BATCH_BENCHMARK_H_
#define PAGEALLOC_ALLOCATOR_BATCH_BENCHMARK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "allocator/page_pool.h"
#include "allocator/pool_change_log.h"
#include "allocator/requests.h"
#include "benchmark/benchmark.h"

namespace pagealloc {

template <typename Executor>
struct BatchFixture {
  static constexpr OwnerId kOwner = 1;
  Executor executor;
  std::unique_ptr<PagePool> pool;
  int64_t page_size = 0;
  std::vector<AllocRequest> requests;
  std::vector<int64_t> out;
};

// Sets up a pool of pages of `page_size` with `num_requests` one-token
// sequences and a batch of `kind` requests stepping each of them: a decode
// of one token, or an extend (or alloc) of `tokens_per_request`. The pool
// has `extra_pages` more pages than the batch needs, for other owners, and
// records its changes to `change_log` when it is not null.
template <typename Executor>
std::unique_ptr<BatchFixture<Executor>> MakeBatchFixture(
    int64_t num_requests, int64_t tokens_per_request, int64_t page_size,
    RequestKind kind, int64_t extra_pages = 0,
    PoolChangeLog* change_log = nullptr) {
  constexpr OwnerId kOwner = BatchFixture<Executor>::kOwner;
  auto f = std::make_unique<BatchFixture<Executor>>();
  f->page_size = page_size;
  const int64_t pages_per_request =
      CeilDiv(tokens_per_request + 1, page_size) + 1;
  const int64_t num_pages =
      num_requests * pages_per_request * 2 + 64 + extra_pages;
  PoolOptions options;
  options.num_pages = num_pages;
  options.page_size = page_size;
  options.free_policy = FreePolicy::kLifo;
  options.change_log = change_log;
  f->pool = *PagePool::Create(options, &f->executor);
  (void)f->pool->AddOwner(kOwner, 0);
  f->out.resize(num_requests * tokens_per_request);
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

// The benchmark loop: allocates the fixture's batch (timed), then frees the
// pages it took (untimed: every slot at a page start is a new page). Stops
// with an error when the pool refuses either. With `tagged` the batch is
// one call with a call id, as a client's call is (PagePool::Allocate keeps
// it as the owner's latest).
template <typename Executor>
void AllocateAndFree(benchmark::State& state, BatchFixture<Executor>& f,
                     bool tagged = false) {
  std::vector<int64_t> new_pages;
  std::vector<AllocResult> results;
  CallSpan call{static_cast<int64_t>(f.requests.size()), false, {}};
  const absl::Span<const CallSpan> calls =
      tagged ? absl::MakeConstSpan(&call, 1) : absl::Span<const CallSpan>();
  for (auto _ : state) {
    ++call.call.id;
    f.pool->Allocate(f.requests, calls, &results);
    state.PauseTiming();
    new_pages.clear();
    for (int64_t slot : f.out) {
      if (slot % f.page_size == 0) new_pages.push_back(slot / f.page_size);
    }
    if (!results.back().status.ok() ||
        !f.pool->FreePages(BatchFixture<Executor>::kOwner, new_pages).ok()) {
      state.SkipWithError("allocation failed");
      break;
    }
    state.ResumeTiming();
  }
}

}  // namespace pagealloc

#endif  // PAGEALLOC_ALLOCATOR_BATCH_BENCHMARK_H_
