// What a snapshot of the pool stalls the daemon for: the pool snapshots
// under its lock when half the journal's log is used (KeptState::
// WantsSnapshot), so every call queued behind that one waits for
// ExportState, EncodePoolState and the journal's WriteSnapshot (copy,
// crc32, commit), the steps KeptState::WriteSnapshot takes. The pool holds
// `pages` pages of 16 tokens, half of them owned by 8 sessions in
// scattered allocations, half free; the journal is a memfd whose pages are
// touched before the timing, as in a daemon past its first snapshot.
//
// ./bazelw run -c opt //kept_state:snapshot_benchmark --
//     --benchmark_repetitions=5 --benchmark_report_aggregates_only=true

#include <sys/mman.h>

#include <memory>
#include <string>
#include <vector>

#include "allocator/fake_executor.h"
#include "allocator/page_pool.h"
#include "allocator/pool_state.h"
#include "benchmark/benchmark.h"
#include "memory/unique_fd.h"
#include "pool_state/pool_state_codec.h"
#include "state_journal/state_journal.h"

namespace pagealloc {
namespace {

constexpr int64_t kPageSize = 16;
constexpr int kOwners = 8;

struct SnapshotFixture {
  FakeExecutor executor;
  std::unique_ptr<PagePool> pool;
  std::unique_ptr<StateJournal> journal;
};

// Half the pool owned, in allocations of 1-8 pages round-robin over the
// owners, every other one freed again, so that owners' pages and the free
// list interleave as in a pool that has run for a while.
std::unique_ptr<SnapshotFixture> MakeFixture(int64_t num_pages) {
  auto f = std::make_unique<SnapshotFixture>();
  PoolOptions options;
  options.num_pages = num_pages;
  options.page_size = kPageSize;
  options.free_policy = FreePolicy::kLifo;
  absl::StatusOr<std::unique_ptr<PagePool>> pool =
      PagePool::Create(options, &f->executor);
  if (!pool.ok()) return nullptr;
  f->pool = *std::move(pool);
  for (OwnerId owner = 1; owner <= kOwners; ++owner) {
    if (!f->pool->AddOwner(owner, 0).ok()) return nullptr;
  }
  std::vector<int64_t> slots(8 * kPageSize);
  int64_t taken = 0;
  for (int64_t i = 0; taken < num_pages; ++i) {
    const OwnerId owner = 1 + i % kOwners;
    const int64_t pages = 1 + i % 8;
    if (taken + pages > num_pages) break;
    AllocRequest request{RequestKind::kAlloc, owner, 0,           0,
                         pages * kPageSize,   -1,    slots.data()};
    if (!f->pool->Allocate({request})[0].status.ok()) return nullptr;
    taken += pages;
    if (i % 2 == 1) {
      std::vector<int64_t> freed;
      for (int64_t p = 0; p < pages; ++p) {
        freed.push_back(slots[p * kPageSize] / kPageSize);
      }
      if (!f->pool->FreePages(owner, freed, FreeOrder::kFirstAppearance).ok()) {
        return nullptr;
      }
    }
  }
  std::string bytes;
  EncodePoolState(f->pool->ExportState(), &bytes);
  StateJournalOptions journal_options;
  journal_options.snapshot_capacity_bytes = 2 * bytes.size() + (1 << 20);
  journal_options.log_capacity_bytes = 64 << 10;
  absl::StatusOr<std::unique_ptr<StateJournal>> journal = StateJournal::Create(
      UniqueFd(memfd_create("snapshot-benchmark", MFD_CLOEXEC)),
      journal_options);
  if (!journal.ok()) return nullptr;
  f->journal = *std::move(journal);
  // Both snapshot slots written once, untimed.
  for (int i = 0; i < 2; ++i) {
    if (!f->journal->WriteSnapshot(bytes).ok()) return nullptr;
  }
  return f;
}

void BM_Snapshot(benchmark::State& state) {
  std::unique_ptr<SnapshotFixture> f = MakeFixture(state.range(0));
  if (f == nullptr) {
    state.SkipWithError("cannot build the pool or its journal");
    return;
  }
  std::string bytes;
  for (auto _ : state) {
    bytes.clear();
    EncodePoolState(f->pool->ExportState(), &bytes);
    benchmark::DoNotOptimize(f->journal->WriteSnapshot(bytes));
  }
  state.SetBytesProcessed(state.iterations() * bytes.size());
  state.counters["snapshot_bytes"] = static_cast<double>(bytes.size());
}
BENCHMARK(BM_Snapshot)
    ->ArgName("pages")
    ->Arg(64 << 10)
    ->Arg(1 << 20)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagealloc
