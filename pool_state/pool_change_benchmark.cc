// What recording the pool's changes adds to Allocate: the benchmark loop of
// //allocator:page_pool_benchmark (a decode batch of one-token sequences,
// allocated and freed again) with no change log, with a log that only takes
// the record (the view's construction and the virtual call), and with one
// that encodes each record into a reused string (pool_state_codec.h), as
// the daemon's log does before it hands the bytes on. BM_EncodeDecodeRecord
// times the encoding of one such batch's record alone, and its decoding
// (what a replay pays per record).
//
// ./bazelw run -c opt //pool_state:pool_change_benchmark --
//     --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// (one line).

#include <cstdint>
#include <string>
#include <vector>

#include "allocator/batch_benchmark.h"
#include "allocator/fake_executor.h"
#include "allocator/pool_change_log.h"
#include "allocator/pool_state.h"
#include "benchmark/benchmark.h"
#include "pool_state/pool_state_codec.h"

namespace pagealloc {
namespace {

// Takes each record and drops it.
class NullLog : public PoolChangeLog {
 public:
  void Record(const PoolChange& change) override {
    benchmark::DoNotOptimize(change.requests.data());
  }
  bool WantsSnapshot() override { return false; }
  void WriteSnapshot(const PoolState&) override {}
};

// Encodes each record into one reused string (no allocation once warm).
class EncodingLog : public PoolChangeLog {
 public:
  void Record(const PoolChange& change) override {
    buffer_.clear();
    EncodePoolChange(change, &buffer_);
    benchmark::DoNotOptimize(buffer_.data());
    if (change.kind == PoolChangeKind::kAllocate) {
      allocate_bytes_ = buffer_.size();
    }
  }
  bool WantsSnapshot() override { return false; }
  void WriteSnapshot(const PoolState&) override {}
  size_t allocate_bytes() const { return allocate_bytes_; }

 private:
  std::string buffer_;
  size_t allocate_bytes_ = 0;
};

enum class Log { kNone, kNull, kEncode };

// range(0) the page size, range(1) the requests, range(2) the log,
// range(3) whether the batch is one tagged call, as a client's call is
// (docs/design.md, "Retries by call id").
void BM_DecodeWithLog(benchmark::State& state) {
  const int64_t page_size = state.range(0);
  const int64_t num_requests = state.range(1);
  const Log log = static_cast<Log>(state.range(2));
  const bool tagged = state.range(3) != 0;
  NullLog null_log;
  EncodingLog encoding_log;
  PoolChangeLog* change_log = nullptr;
  if (log == Log::kNull) change_log = &null_log;
  if (log == Log::kEncode) change_log = &encoding_log;
  auto f = MakeBatchFixture<FakeExecutor>(num_requests, 1, page_size,
                                          RequestKind::kDecode,
                                          /*extra_pages=*/0, change_log);
  AllocateAndFree(state, *f, tagged);
  state.SetItemsProcessed(state.iterations() * num_requests);
  state.counters["ns_per_request"] = benchmark::Counter(
      static_cast<double>(state.iterations() * num_requests) * 1e-9,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  if (log == Log::kEncode) {
    state.counters["record_bytes"] = encoding_log.allocate_bytes();
  }
}
BENCHMARK(BM_DecodeWithLog)
    ->ArgNames({"ps", "requests", "log", "tagged"})
    ->ArgsProduct({{1, 16}, {256, 4096}, {0, 1, 2}, {0, 1}});

// One decode batch's record: encoded into a warm string, and decoded.
void BM_EncodeDecodeRecord(benchmark::State& state) {
  const int64_t num_requests = state.range(0);
  const bool decode = state.range(1) != 0;
  std::vector<int64_t> out(num_requests);
  std::vector<AllocRequest> requests(num_requests);
  for (int64_t i = 0; i < num_requests; ++i) {
    requests[i] = {RequestKind::kDecode, 1, i, 0, 2 + i, 16 * i + 17,
                   out.data() + i};
  }
  PoolChange change;
  change.kind = PoolChangeKind::kAllocate;
  change.requests = requests;
  std::string bytes;
  EncodePoolChange(change, &bytes);
  DecodedPoolChange decoded;
  const PoolGeometry geometry{16, 1 << 20};
  for (auto _ : state) {
    if (decode) {
      benchmark::DoNotOptimize(DecodePoolChange(bytes, geometry, &decoded));
    } else {
      bytes.clear();
      EncodePoolChange(change, &bytes);
      benchmark::DoNotOptimize(bytes.data());
    }
  }
  state.SetBytesProcessed(state.iterations() * bytes.size());
}
BENCHMARK(BM_EncodeDecodeRecord)
    ->ArgNames({"requests", "decode"})
    ->ArgsProduct({{256, 4096}, {0, 1}});

}  // namespace
}  // namespace pagealloc
