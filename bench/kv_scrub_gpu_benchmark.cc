// kv_scrub_gpu_benchmark: what --kv_scrub costs per page on the CUDA
// backend. Times the scrub kernel (kernels/scrub_kernels.cu) on the layouts
// and page sizes of the CPU backend's table (docs/performance.md, "KV
// scrub"): SGLang's MHA pool of Llama-3-8B (32 layers, 8 KV heads of 128,
// bf16: 64 buffers) and MLA pool of DeepSeek-V3 (61 layers, 512 + 64, bf16:
// 61 buffers); pages of 1, 16 and 64 slots; batches of 1, 16 and 256 pages
// (the pages one allocation launch hands to new owners).
//
// Each batch is a fresh random set of distinct pages of a slab of at least
// 2 GiB (so that pages come from memory, not the 50 MB L2), placed as the
// daemon places it (memory/kv_layout.h). Each time is the median of
// CUDA-event-timed launches; a spin kernel queued before each keeps the GPU
// busy while the host queues the events and the launch, so the events time
// the GPU alone. Two times per row: the kernel alone, and what the CUDA
// executor adds to an allocation launch (the batch's page list copied from
// pinned host memory, then the kernel). Also the floors: an empty kernel
// and the GPU's write bandwidth (a 1 GiB memset). Every batch's pages are
// checked to read zero afterwards (and a page outside it not to), so a
// broken kernel cannot report a good time.
//
// Prints a Markdown table (rows start with '|'); it never fails on time.
// Usage: kv_scrub_gpu_benchmark [--reps=N] [--quick]

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "bench/bench_check.h"
#include "bench/floor_kernel.h"
#include "bench/gpu_timing.h"
#include "kernels/scrub_kernels.h"
#include "memory/kv_layout.h"

namespace pagealloc {
namespace {

constexpr const char* kLayouts[] = {
    "mha:layers=32,kv_heads=8,head_dim=128,dtype=bf16",       // Llama-3-8B
    "mla:layers=61,kv_lora_rank=512,rope_dim=64,dtype=bf16",  // DeepSeek-V3
};
constexpr int64_t kPageSizes[] = {1, 16, 64};
constexpr int64_t kBatches[] = {1, 16, 256};
constexpr int64_t kMinSlabBytes = int64_t{2} << 30;
// The daemon's slab is a CUDA VMM allocation at the device's granularity;
// 2 MiB is the H200's.
constexpr int64_t kAlignment = int64_t{2} << 20;
// ~20 us of spinning: longer than the host takes to queue a rep.
constexpr long long kSpinCycles = 40000;

// Median event-timed microseconds of launch(rep), each rep after a spin
// kernel, over `reps` reps after `warmup` untimed ones.
double MedianUs(cudaStream_t stream, const std::function<void(int)>& launch,
                int reps, int warmup) {
  for (int i = 0; i < warmup; ++i) launch(i);
  std::vector<cudaEvent_t> events(2 * reps);
  for (cudaEvent_t& e : events) BENCH_CHECK_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    BENCH_CHECK_CUDA(LaunchSpinKernel(stream, kSpinCycles));
    BENCH_CHECK_CUDA(cudaEventRecord(events[2 * i], stream));
    launch(warmup + i);
    BENCH_CHECK_CUDA(cudaEventRecord(events[2 * i + 1], stream));
  }
  BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
  const double median = MedianEventPairUs(events.data(), reps);
  for (cudaEvent_t& e : events) cudaEventDestroy(e);
  return median;
}

std::string Bytes(double bytes) {
  if (bytes >= (1 << 30)) return absl::StrFormat("%.1f GiB", bytes / (1 << 30));
  if (bytes >= (1 << 20)) return absl::StrFormat("%.1f MiB", bytes / (1 << 20));
  return absl::StrFormat("%.0f KiB", bytes / 1024);
}

std::string Micros(double us) {
  return us >= 100 ? absl::StrFormat("%.0f us", us)
                   : absl::StrFormat("%.2f us", us);
}

// Whether every byte of [at, at + bytes) on the device is `value`.
bool DeviceBytesAre(const char* at, int64_t bytes, int value) {
  std::vector<unsigned char> host(bytes);
  BENCH_CHECK_CUDA(cudaMemcpy(host.data(), at, bytes, cudaMemcpyDeviceToHost));
  return std::all_of(host.begin(), host.end(),
                     [&](unsigned char b) { return b == value; });
}

int Main(int argc, char** argv) {
  int reps = 200;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--reps=")) {
      reps = std::max(1, std::atoi(arg.c_str() + 7));
    } else if (arg == "--quick") {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: %s [--reps=N] [--quick]\n", argv[0]);
      return 2;
    }
  }
  if (quick) reps = std::min(reps, 20);
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::fprintf(stderr, "kv_scrub_gpu_benchmark: no CUDA GPU here\n");
    return 2;
  }
  BENCH_CHECK_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop;
  BENCH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream = nullptr;
  BENCH_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Floors.
  const int floor_reps = std::max(reps, 50);
  const double empty_us = MedianUs(
      stream, [&](int) { BENCH_CHECK_CUDA(LaunchEmptyKernel(stream)); },
      floor_reps, 10);
  const int64_t memset_bytes = int64_t{1} << 30;
  void* memset_buffer = nullptr;
  BENCH_CHECK_CUDA(cudaMalloc(&memset_buffer, memset_bytes));
  const double memset_us = MedianUs(
      stream,
      [&](int i) {
        BENCH_CHECK_CUDA(
            cudaMemsetAsync(memset_buffer, i & 0xff, memset_bytes, stream));
      },
      9, 2);
  BENCH_CHECK_CUDA(cudaFree(memset_buffer));
  absl::PrintF(
      "KV scrub kernel on %s: median of %d event-timed launches a row; "
      "floor: empty kernel %.2f us, write bandwidth (1 GiB memset) %.0f "
      "GB/s\n\n",
      prop.name, reps, empty_us, memset_bytes / (memset_us * 1e3));
  absl::PrintF(
      "| layout | page size | bytes a page | pages a batch | kernel a batch | "
      "kernel a page | rate | with the page list upload, a page |\n");
  absl::PrintF("| --- | --- | --- | --- | --- | --- | --- | --- |\n");

  std::mt19937_64 rng(20240611);
  int failures = 0;
  for (const char* layout_text : kLayouts) {
    const KvLayout layout = *ParseKvLayout(layout_text);
    for (const int64_t page_size : kPageSizes) {
      const int64_t page_bytes = layout.slot_bytes() * page_size;
      const int64_t max_batch = kBatches[std::size(kBatches) - 1];
      const int64_t pages = std::max(
          2 * max_batch, (kMinSlabBytes + page_bytes - 1) / page_bytes);
      absl::StatusOr<KvSlabGeometry> slab =
          PlaceKvSlab(layout, page_size, pages, kAlignment);
      if (!slab.ok()) {
        std::fprintf(stderr, "%s\n", slab.status().ToString().c_str());
        return 1;
      }
      char* base = nullptr;
      BENCH_CHECK_CUDA(
          cudaMalloc(reinterpret_cast<void**>(&base), slab->total_bytes));
      BENCH_CHECK_CUDA(cudaMemset(base, 0xff, slab->total_bytes));
      // `stream` does not wait for the legacy stream the memset ran on.
      BENCH_CHECK_CUDA(cudaDeviceSynchronize());
      std::vector<ScrubBuffer> table;
      for (const KvBufferPlacement& placement : slab->placements) {
        table.push_back(
            {base + placement.offset, placement.stride_bytes * page_size});
      }
      ScrubBuffer* buffers = nullptr;
      BENCH_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&buffers),
                                  table.size() * sizeof(ScrubBuffer)));
      BENCH_CHECK_CUDA(cudaMemcpy(buffers, table.data(),
                                  table.size() * sizeof(ScrubBuffer),
                                  cudaMemcpyHostToDevice));

      for (const int64_t batch : kBatches) {
        // One fresh batch of distinct random pages for every launch.
        const int launches = reps + 10;
        std::vector<int64_t> lists(launches * batch);
        std::vector<int64_t> all(pages);
        std::iota(all.begin(), all.end(), 1);
        for (int l = 0; l < launches; ++l) {
          for (int64_t i = 0; i < batch; ++i) {
            std::swap(all[i], all[i + rng() % (pages - i)]);
          }
          std::copy(all.begin(), all.begin() + batch,
                    lists.begin() + l * batch);
        }
        int64_t* device_lists = nullptr;
        int64_t* staged = nullptr;  // pinned: the executor's staging
        int64_t* upload = nullptr;  // the executor's device page list
        BENCH_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&device_lists),
                                    lists.size() * sizeof(int64_t)));
        BENCH_CHECK_CUDA(cudaMemcpy(device_lists, lists.data(),
                                    lists.size() * sizeof(int64_t),
                                    cudaMemcpyHostToDevice));
        BENCH_CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&staged),
                                       lists.size() * sizeof(int64_t),
                                       cudaHostAllocDefault));
        std::copy(lists.begin(), lists.end(), staged);
        BENCH_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&upload),
                                    batch * sizeof(int64_t)));
        ScrubParams params;
        params.buffers = buffers;
        params.num_buffers = static_cast<int32_t>(table.size());
        params.num_pages = batch;

        const double kernel_us = MedianUs(
            stream,
            [&](int l) {
              params.pages = device_lists + l * batch;
              BENCH_CHECK_CUDA(LaunchScrubPages(params, stream));
            },
            reps, 10);
        BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
        // The last batch scrubbed reads zero in every buffer; a page
        // outside it (not in any batch of this row) still reads 0xff.
        const int64_t* last = lists.data() + (launches - 1) * batch;
        bool ok = true;
        std::vector<bool> scrubbed(pages + 1, false);
        for (int64_t page : lists) scrubbed[page] = true;
        int64_t untouched = 0;
        for (int64_t page = 1; page <= pages && untouched == 0; ++page) {
          if (!scrubbed[page]) untouched = page;
        }
        for (const ScrubBuffer& buffer : table) {
          for (int64_t i = 0; i < std::min<int64_t>(batch, 4); ++i) {
            ok &= DeviceBytesAre(buffer.base + last[i] * buffer.page_bytes,
                                 buffer.page_bytes, 0);
          }
          if (untouched != 0) {
            ok &= DeviceBytesAre(buffer.base + untouched * buffer.page_bytes,
                                 buffer.page_bytes, 0xff);
          }
        }
        const double upload_us = MedianUs(
            stream,
            [&](int l) {
              BENCH_CHECK_CUDA(cudaMemcpyAsync(upload, staged + l * batch,
                                               batch * sizeof(int64_t),
                                               cudaMemcpyHostToDevice, stream));
              params.pages = upload;
              BENCH_CHECK_CUDA(LaunchScrubPages(params, stream));
            },
            reps, 10);
        BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
        // The next row finds the slab poisoned again.
        BENCH_CHECK_CUDA(cudaMemset(base, 0xff, slab->total_bytes));
        BENCH_CHECK_CUDA(cudaDeviceSynchronize());
        if (!ok) ++failures;
        absl::PrintF(
            "| `%s` (%zu buffers) | %d | %s | %d | %s | %s | %.0f GB/s | %s "
            "|%s\n",
            layout_text, table.size(), page_size, Bytes(page_bytes), batch,
            Micros(kernel_us), Micros(kernel_us / batch),
            batch * page_bytes / (kernel_us * 1e3), Micros(upload_us / batch),
            ok ? ""
               : " WRONG: a scrubbed page is not zero, or a "
                 "page outside the batch is");
        std::fflush(stdout);
        cudaFree(device_lists);
        cudaFreeHost(staged);
        cudaFree(upload);
      }
      cudaFree(buffers);
      cudaFree(base);
    }
  }
  cudaStreamDestroy(stream);
  if (failures != 0) {
    std::fprintf(stderr, "kv_scrub_gpu_benchmark: %d rows scrubbed wrongly\n",
                 failures);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace pagealloc

int main(int argc, char** argv) { return pagealloc::Main(argc, argv); }
