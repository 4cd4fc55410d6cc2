// The cost of the state journal's operations on the host: an Append of a
// 64-byte and of a 4 KiB payload (copy, crc32 and the commit store), and a
// WriteSnapshot of 64 KiB and 1 MiB. The journal is a memfd; its pages are
// reserved and touched before the timing, as they are in the daemon after
// its first round through the log. When the log is full the loop empties it
// with an empty snapshot, outside the timing.
//
// ./bazelw run -c opt //state_journal:state_journal_benchmark --
//     --benchmark_repetitions=5 --benchmark_report_aggregates_only=true

#include <sys/mman.h>

#include <memory>
#include <string>

#include "benchmark/benchmark.h"
#include "memory/unique_fd.h"
#include "state_journal/state_journal.h"

namespace pagealloc {
namespace {

std::unique_ptr<StateJournal> NewJournal(int64_t snapshot_bytes,
                                         int64_t log_bytes) {
  StateJournalOptions options;
  options.snapshot_capacity_bytes = snapshot_bytes;
  options.log_capacity_bytes = log_bytes;
  auto journal = StateJournal::Create(
      UniqueFd(memfd_create("state-journal-benchmark", MFD_CLOEXEC)), options);
  if (!journal.ok()) return nullptr;
  return std::move(journal).value();
}

void BM_Append(benchmark::State& state) {
  const int64_t payload_bytes = state.range(0);
  std::unique_ptr<StateJournal> journal = NewJournal(0, 16 << 20);
  if (journal == nullptr) {
    state.SkipWithError("cannot create the journal");
    return;
  }
  const std::string payload(payload_bytes, 'p');
  // Touch every page of the log once, untimed.
  while (journal->Append(1, {payload}).ok()) {
  }
  (void)journal->WriteSnapshot("");
  for (auto _ : state) {
    if (!journal->Append(1, {payload}).ok()) {
      state.PauseTiming();
      (void)journal->WriteSnapshot("");
      state.ResumeTiming();
    }
  }
  state.SetBytesProcessed(state.iterations() * payload_bytes);
}
BENCHMARK(BM_Append)->Arg(64)->Arg(4096);

void BM_WriteSnapshot(benchmark::State& state) {
  const int64_t snapshot_bytes = state.range(0);
  std::unique_ptr<StateJournal> journal =
      NewJournal(snapshot_bytes, int64_t{4} << 10);
  if (journal == nullptr) {
    state.SkipWithError("cannot create the journal");
    return;
  }
  const std::string snapshot(snapshot_bytes, 's');
  for (auto _ : state) {
    benchmark::DoNotOptimize(journal->WriteSnapshot(snapshot));
  }
  state.SetBytesProcessed(state.iterations() * snapshot_bytes);
}
BENCHMARK(BM_WriteSnapshot)->Arg(64 << 10)->Arg(1 << 20);

}  // namespace
}  // namespace pagealloc
