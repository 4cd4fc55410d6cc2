// What the producer pays per event on the allocation path: a BlocksStored
// of `keys` 32-byte keys (16 tokens each) into a started publisher with no
// sockets, its thread draining meanwhile. The queue is large enough that
// nothing is dropped while the thread keeps up; `dropped` says whether it
// did.
//
//   ./bazelw run -c opt //kv_events:publisher_benchmark

#include <memory>
#include <string>

#include "benchmark/benchmark.h"
#include "kv_events/publisher.h"

namespace pagealloc {
namespace {

void BM_BlocksStored(benchmark::State& state) {
  KvEventPublisherOptions options;
  options.queue_events = 1 << 20;
  auto publisher = KvEventPublisher::Create(options);
  if (!publisher.ok()) {
    state.SkipWithError(publisher.status().ToString().c_str());
    return;
  }
  (*publisher)->Start();
  StoredBlocks blocks;
  for (int64_t k = 0; k < state.range(0); ++k) {
    blocks.keys.push_back(std::string(32, static_cast<char>(k)));
    for (int i = 0; i < 16; ++i) blocks.token_ids.push_back(k * 16 + i);
  }
  blocks.block_size = 16;
  for (auto _ : state) (*publisher)->BlocksStored(blocks);
  (*publisher)->Flush();
  state.counters["dropped"] =
      static_cast<double>((*publisher)->stats().events_dropped);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_BlocksStored)->Arg(1)->Arg(16)->Arg(256)->UseRealTime();

}  // namespace
}  // namespace pagealloc
