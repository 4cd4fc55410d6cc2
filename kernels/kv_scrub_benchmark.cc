// What --kv_scrub costs the CPU backend per page: ScrubPage (a memset of the
// page's slots in every buffer) over a slab of SGLang's layouts, cycling
// through enough pages that they are not all in cache. Reports time and
// bytes per page; it never fails on time.
//
//   ./bazelw run -c opt //kernels:kv_scrub_benchmark

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "benchmark/benchmark.h"
#include "kernels/cpu_executor.h"
#include "memory/kv_layout.h"

namespace pagealloc {
namespace {

constexpr const char* kLayouts[] = {
    "mha:layers=32,kv_heads=8,head_dim=128,dtype=bf16",       // Llama-3-8B
    "mla:layers=61,kv_lora_rank=512,rope_dim=64,dtype=bf16",  // DeepSeek-V3
};

// Args: layout index, page size.
void BM_ScrubPage(benchmark::State& state) {
  const KvLayout layout = *ParseKvLayout(kLayouts[state.range(0)]);
  const int64_t page_size = state.range(1);
  // About 1 GiB of pages, at least 8, so that each scrub reaches memory.
  const int64_t page_bytes = layout.slot_bytes() * page_size;
  const int64_t pages = std::max<int64_t>(
      8, (int64_t{1} << 30) / std::max<int64_t>(page_bytes, 1));
  const KvSlabGeometry slab = *PlaceKvSlab(layout, page_size, pages, 4096);
  void* base = mmap(nullptr, slab.total_bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (base == MAP_FAILED) {
    state.SkipWithError("mmap failed");
    return;
  }
  KvScrubTarget target;
  target.page_size = page_size;
  for (const KvBufferPlacement& placement : slab.placements) {
    target.buffers.push_back(
        {static_cast<char*>(base) + placement.offset, placement.stride_bytes});
  }
  int64_t page = 1;
  for (auto _ : state) {
    ScrubPage(target, page);
    benchmark::ClobberMemory();
    page = page == pages ? 1 : page + 1;
  }
  state.SetBytesProcessed(state.iterations() * page_bytes);
  state.counters["page_bytes"] = static_cast<double>(page_bytes);
  state.counters["buffers"] = static_cast<double>(layout.buffers.size());
  state.SetLabel(kLayouts[state.range(0)]);
  munmap(base, slab.total_bytes);
}
BENCHMARK(BM_ScrubPage)
    ->ArgsProduct({{0, 1}, {1, 16, 64}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagealloc
