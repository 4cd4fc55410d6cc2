// kernel_benchmark: times the expand kernel on exactly the cases of the
// seed's Triton anchor benchmark (triton_anchor.py; tools/gpu/README.md):
// page sizes 16 and 64; extend batches 1x8192, 16x512, 256x32, 1024x8,
// 4096x4 and the 64x16384 bulk with the anchor's prefix and length
// distributions; decode batches of 1, 64, 256, 1024 and 4096. Also an empty
// kernel (the launch floor) and the GPU's write bandwidth (a large memset),
// so the bulk case can be read as a fraction of it.
//
// Plans that fit are timed twice: passed in the kernel parameters (what
// CudaExecutor does with them) and uploaded, so the two can be compared.
//
// Each time is the median of many CUDA-event-timed launches after a
// warm-up, with inputs rotated among several sets (fresh random draws of the
// same distribution, each with its own plan block and output), measured two
// ways: "flushed", with a 256 MiB memset before each launch as Triton's
// do_bench does (what the anchor's numbers are), and "rotated", without it
// (inputs and plan as hot as right after Execute uploads them; a spin kernel
// before each launch keeps the host's launch time out of the events). Every
// set's output is checked against the CPU reference first. "call" is the host's
// wall time of CudaExecutor::Execute + Synchronize (packing, upload, launch
// and wait), the counterpart of the anchor's in-process call.
//
// Usage: kernel_benchmark [--json=PATH] [--reps=N] [--sets=N] [--quick]
//                         [--case=NAME]  (one anchor case, e.g. for ncu)

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/executor.h"
#include "allocator/plan_expansion.h"
#include "bench/bench_check.h"
#include "bench/floor_kernel.h"
#include "bench/gpu_timing.h"
#include "kernels/alloc_kernels.h"
#include "kernels/cuda_executor.h"
#include "kernels/plan_packing.h"

namespace pagealloc {
namespace {

constexpr int64_t kFlushBytes = int64_t{256} << 20;  // as do_bench
// The anchor's pool: a random permutation of pages 1 .. 2^20 - 1.
constexpr int64_t kRingCapacity = (int64_t{1} << 20) - 1;

struct Case {
  std::string name;  // the anchor's case name
  bool decode;
  int64_t bs;
  int64_t prefix_max;
  int64_t extend_lo;
  int64_t extend_hi;
};

std::vector<Case> AnchorCases(bool quick) {
  std::vector<Case> cases = {
      {"prefill_1x8192", false, 1, 0, 8192, 8192},
      {"prefill_16x512", false, 16, 4096, 256, 768},
      {"mixed_256x32", false, 256, 4096, 1, 64},
      {"mixed_1024x8", false, 1024, 8192, 1, 16},
      {"mixed_4096x4", false, 4096, 8192, 1, 8},
      {"bulk_64x16384", false, 64, 1024, 16384, 16384},
  };
  for (int64_t bs : {1, 64, 256, 1024, 4096}) {
    cases.push_back({"decode", true, bs, 8192, 1, 1});
  }
  if (quick) cases = {cases[0], cases[2], cases[5], cases[6], cases[10]};
  return cases;
}

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// The anchor's batch generator: prefixes in [0, prefix_max], extends in
// [extend_lo, extend_hi] (decodes: seq_len in [1, 8192]); prefix pages are
// far from the free list (9'000'000 / page_size + i). Destinations are
// consecutive in `out`, as the seed writes one output array.
BatchPlan AnchorPlan(const Case& c, int64_t page_size, std::mt19937_64& rng,
                     int64_t* out) {
  BatchPlan plan;
  plan.page_size = page_size;
  plan.free_ring_capacity = kRingCapacity;
  plan.free_ring_head = 0;
  for (int64_t i = 0; i < c.bs; ++i) {
    PlannedRequest r;
    if (c.decode) {
      r.seq_len = Uniform(rng, 1, 8192);
      r.prefix_len = r.seq_len - 1;
    } else {
      r.prefix_len = Uniform(rng, 0, c.prefix_max);
      r.seq_len = r.prefix_len + Uniform(rng, c.extend_lo, c.extend_hi);
    }
    if (r.prefix_len > 0) {
      r.last_loc = (9'000'000 / page_size + i) * page_size +
                   (r.prefix_len - 1) % page_size;
    }
    r.first_new_page = plan.num_new_pages;
    r.output_offset = plan.num_slots;
    r.destination = out + plan.num_slots;
    plan.num_new_pages += (r.seq_len + page_size - 1) / page_size -
                          (r.prefix_len + page_size - 1) / page_size;
    plan.num_slots += r.seq_len - r.prefix_len;
    plan.requests.push_back(r);
  }
  return plan;
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min<size_t>(v.size() - 1, v.size() * q)];
}

class Timer {
 public:
  Timer(cudaStream_t stream, int reps) : stream_(stream) {
    events_.resize(2 * reps);
    for (cudaEvent_t& e : events_) BENCH_CHECK_CUDA(cudaEventCreate(&e));
    BENCH_CHECK_CUDA(cudaMalloc(&flush_, kFlushBytes));
  }
  ~Timer() {
    for (cudaEvent_t& e : events_) cudaEventDestroy(e);
    cudaFree(flush_);
  }

  // Returns the median event-timed microseconds of launch(rep) over
  // `reps` reps after `warmup` untimed ones. Before each rep (outside the
  // timed region): with flush, a 256 MiB memset, so caches start cold (as
  // do_bench); without, a ~20 us spin kernel, so the GPU is still busy when
  // the host has queued the rep and the events time the GPU alone.
  double MedianUs(const std::function<void(int)>& launch, int reps, bool flush,
                  int warmup = 20) {
    for (int i = 0; i < warmup; ++i) launch(i);
    const int n = std::min<int>(reps, events_.size() / 2);
    for (int i = 0; i < n; ++i) {
      if (flush) {
        BENCH_CHECK_CUDA(
            cudaMemsetAsync(flush_, i & 0xff, kFlushBytes, stream_));
      } else {
        BENCH_CHECK_CUDA(LaunchSpinKernel(stream_, 40000));
      }
      BENCH_CHECK_CUDA(cudaEventRecord(events_[2 * i], stream_));
      launch(i);
      BENCH_CHECK_CUDA(cudaEventRecord(events_[2 * i + 1], stream_));
    }
    BENCH_CHECK_CUDA(cudaStreamSynchronize(stream_));
    return MedianEventPairUs(events_.data(), n);
  }

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  void* flush_ = nullptr;
};

// One input set of a case: its plan, packed block on the device, the same
// plan packed into kernel parameters (when it fits) and output.
struct InputSet {
  BatchPlan plan;
  ExpandParams params;
  void* device_block = nullptr;
  std::unique_ptr<MaxInlineExpandParams> inline_params =
      std::make_unique<MaxInlineExpandParams>();
  bool fits_inline = false;
  int64_t* device_out = nullptr;
};

struct Row {
  std::string json;
  std::string line;
};

int Main(int argc, char** argv) {
  std::string json_path;
  int reps = 300;
  int sets = 8;
  bool quick = false;
  std::string only_case;  // e.g. "bulk_64x16384": one case (profilers)
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--json=")) {
      json_path = arg.substr(7);
    } else if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (absl::StartsWith(arg, "--reps=")) {
      reps = std::atoi(arg.c_str() + 7);
    } else if (absl::StartsWith(arg, "--sets=")) {
      sets = std::atoi(arg.c_str() + 7);
    } else if (arg == "--quick") {
      quick = true;
    } else if (absl::StartsWith(arg, "--case=")) {
      only_case = arg.substr(7);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--json=PATH] [--reps=N] [--sets=N] [--quick] "
                   "[--case=NAME]\n",
                   argv[0]);
      return 2;
    }
  }
  if (reps < 1 || sets < 1) {
    std::fprintf(stderr, "--reps and --sets must be >= 1\n");
    return 2;
  }

  BENCH_CHECK_CUDA(cudaSetDevice(0));
  cudaDeviceProp props;
  BENCH_CHECK_CUDA(cudaGetDeviceProperties(&props, 0));
  int driver = 0;
  int runtime = 0;
  BENCH_CHECK_CUDA(cudaDriverGetVersion(&driver));
  BENCH_CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
  std::printf("# device: %s, %d SMs, L2 %d MiB, driver API %d, runtime %d\n",
              props.name, props.multiProcessorCount, props.l2CacheSize >> 20,
              driver, runtime);

  CudaExecutorOptions options;
  options.max_slots_per_batch = int64_t{1} << 21;
  absl::StatusOr<std::unique_ptr<CudaExecutor>> created =
      CudaExecutor::Create(options);
  BENCH_CHECK_OK(created.status());
  CudaExecutor& executor = **created;
  cudaStream_t stream = executor.stream();
  Timer timer(stream, reps);
  std::vector<std::string> json;

  // Floors: an empty launch, and the write bandwidth of a 4 GiB memset.
  const double floor_us = timer.MedianUs(
      [&](int) { BENCH_CHECK_CUDA(LaunchEmptyKernel(stream)); }, reps,
      /*flush=*/true);
  const double floor_rotated_us = timer.MedianUs(
      [&](int) { BENCH_CHECK_CUDA(LaunchEmptyKernel(stream)); }, reps,
      /*flush=*/false);
  const int64_t bw_bytes = int64_t{4} << 30;
  void* bw_buffer = nullptr;
  BENCH_CHECK_CUDA(cudaMalloc(&bw_buffer, bw_bytes));
  const double memset_us = timer.MedianUs(
      [&](int i) {
        BENCH_CHECK_CUDA(
            cudaMemsetAsync(bw_buffer, i & 0xff, bw_bytes, stream));
      },
      9, /*flush=*/false, /*warmup=*/2);
  const double copy_us = timer.MedianUs(
      [&](int) {
        BENCH_CHECK_CUDA(cudaMemcpyAsync(
            static_cast<char*>(bw_buffer) + bw_bytes / 2, bw_buffer,
            bw_bytes / 2, cudaMemcpyDeviceToDevice, stream));
      },
      9, /*flush=*/false, /*warmup=*/2);
  BENCH_CHECK_CUDA(cudaFree(bw_buffer));
  const double write_gbps = bw_bytes / (memset_us * 1e3);
  // The bulk case's output size, written by a memset under both timing
  // protocols: what 8 MiB of plain writes costs here.
  void* fill = nullptr;
  const int64_t fill_bytes = int64_t{8} << 20;
  BENCH_CHECK_CUDA(cudaMalloc(&fill, fill_bytes));
  const double fill_us = timer.MedianUs(
      [&](int i) {
        BENCH_CHECK_CUDA(cudaMemsetAsync(fill, i & 0xff, fill_bytes, stream));
      },
      reps, /*flush=*/true);
  const double fill_rotated_us = timer.MedianUs(
      [&](int i) {
        BENCH_CHECK_CUDA(cudaMemsetAsync(fill, i & 0xff, fill_bytes, stream));
      },
      reps, /*flush=*/false);
  BENCH_CHECK_CUDA(cudaFree(fill));
  std::printf("fill: 8 MiB memset %.2f us (flushed), %.2f us (rotated)\n",
              fill_us, fill_rotated_us);
  json.push_back(absl::StrFormat(
      "{\"case\": \"fill_8MiB\", \"us\": %.3f, \"rotated_us\": %.3f}", fill_us,
      fill_rotated_us));
  const double copy_gbps = bw_bytes / (copy_us * 1e3);  // read + write
  std::printf(
      "floor: empty kernel %.2f us (flushed), %.2f us (rotated); write "
      "bandwidth (4 GiB memset) %.0f GB/s; copy (read+write) %.0f GB/s\n",
      floor_us, floor_rotated_us, write_gbps, copy_gbps);
  json.push_back(absl::StrFormat(
      "{\"case\": \"floor_empty_kernel\", \"us\": %.3f, \"rotated_us\": %.3f}",
      floor_us, floor_rotated_us));
  // The same empty launch carrying the inline plan's parameter sizes.
  for (const int bytes : {2048, 8192, 32736}) {
    auto launch = [&](int) {
      BENCH_CHECK_CUDA(LaunchEmptyKernelWithParams(stream, bytes));
    };
    const double us = timer.MedianUs(launch, reps, /*flush=*/true);
    const double rotated = timer.MedianUs(launch, reps, /*flush=*/false);
    std::printf(
        "floor: empty kernel with %d parameter bytes %.2f us "
        "(flushed), %.2f us (rotated)\n",
        bytes, us, rotated);
    json.push_back(
        absl::StrFormat("{\"case\": \"floor_params_%d\", \"us\": %.3f, "
                        "\"rotated_us\": %.3f}",
                        bytes, us, rotated));
  }
  json.push_back(absl::StrFormat(
      "{\"case\": \"bandwidth\", \"write_GBps\": %.1f, \"copy_GBps\": %.1f}",
      write_gbps, copy_gbps));

  // flushed_us / rotated_us: the launch Execute makes (the inline plan when
  // it fits, "path"); up_*: the same plans uploaded, for comparison.
  std::printf(
      "%-7s %-16s %3s %5s %8s %7s %4s %-6s %10s %10s %9s %9s %9s %9s "
      "%8s\n",
      "kind", "case", "ps", "bs", "tokens", "pages", "ok", "path", "flushed_us",
      "rotated_us", "up_flush", "up_rot", "call_p50", "call_p99", "GB/s");
  std::mt19937_64 rng(1234);
  BENCH_CHECK_OK(executor.InitFreeRing(kRingCapacity));
  bool all_ok = true;
  for (const int64_t page_size : {16, 64}) {
    // The ring, on the device twice: a copy the kernel timings read
    // directly, and the executor's own mirror for the call timings.
    std::vector<int64_t> ring(kRingCapacity);
    std::iota(ring.begin(), ring.end(), 1);
    std::shuffle(ring.begin(), ring.end(), rng);
    int64_t* device_ring = nullptr;
    BENCH_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&device_ring),
                                kRingCapacity * sizeof(int64_t)));
    BENCH_CHECK_CUDA(cudaMemcpy(device_ring, ring.data(),
                                kRingCapacity * sizeof(int64_t),
                                cudaMemcpyHostToDevice));
    BENCH_CHECK_OK(executor.WriteFreeRing(0, ring));

    for (const Case& c : AnchorCases(quick)) {
      if (!only_case.empty() && c.name != only_case) continue;
      // Input sets: the largest case writes 8 MiB a set.
      std::vector<InputSet> inputs(sets);
      bool ok = true;
      int64_t tokens = 0;
      int64_t pages = 0;
      for (InputSet& set : inputs) {
        // Output sized for the largest draw of this case.
        const int64_t max_slots = c.bs * std::max<int64_t>(c.extend_hi, 1);
        BENCH_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&set.device_out),
                                    max_slots * sizeof(int64_t)));
        BENCH_CHECK_CUDA(
            cudaMemset(set.device_out, 0xa5, max_slots * sizeof(int64_t)));
        set.plan = AnchorPlan(c, page_size, rng, set.device_out);
        std::vector<int64_t> block(
            MaxPackedPlanBytes(set.plan.requests.size(), set.plan.num_slots) /
            8);
        absl::StatusOr<PackedPlan> packed =
            PackPlan(set.plan, kRingCapacity, absl::MakeSpan(block));
        BENCH_CHECK_OK(packed.status());
        BENCH_CHECK_CUDA(cudaMalloc(&set.device_block, packed->bytes));
        BENCH_CHECK_CUDA(cudaMemcpy(set.device_block, block.data(),
                                    packed->bytes, cudaMemcpyHostToDevice));
        // The memset and copies above ran on the legacy stream, which does
        // not order against our non-blocking one: wait for them.
        BENCH_CHECK_CUDA(cudaDeviceSynchronize());
        set.params = MakeExpandParams(*packed, set.device_block, device_ring,
                                      kRingCapacity, page_size);
        absl::StatusOr<bool> fits = PackInlinePlan(
            set.plan, kRingCapacity, device_ring, set.inline_params.get());
        BENCH_CHECK_OK(fits.status());
        set.fits_inline = *fits;
        // Check each path's output against the CPU reference, from a
        // poisoned buffer.
        std::vector<int64_t> expected(set.plan.num_slots);
        for (const PlannedRequest& r : set.plan.requests) {
          PlannedRequest host = r;
          host.destination = expected.data() + r.output_offset;
          ExpandRequest(host, page_size, ring.data(), kRingCapacity,
                        set.plan.free_ring_head, host.destination);
        }
        for (const bool inline_path : {false, true}) {
          if (inline_path && !set.fits_inline) continue;
          BENCH_CHECK_CUDA(cudaMemsetAsync(
              set.device_out, 0xa5, max_slots * sizeof(int64_t), stream));
          BENCH_CHECK_CUDA(
              inline_path ? LaunchExpandInlinePlan(*set.inline_params, stream)
                          : LaunchExpandPlan(set.params, stream));
          BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
          std::vector<int64_t> actual(set.plan.num_slots);
          BENCH_CHECK_CUDA(cudaMemcpy(actual.data(), set.device_out,
                                      actual.size() * sizeof(int64_t),
                                      cudaMemcpyDeviceToHost));
          ok = ok && actual == expected;
        }
        tokens = set.plan.num_slots;  // of the last set, like the anchor
        pages = set.plan.num_new_pages;
      }
      all_ok = all_ok && ok;
      bool all_inline = true;
      for (const InputSet& set : inputs) {
        all_inline = all_inline && set.fits_inline;
      }
      auto uploaded = [&](int i) {
        BENCH_CHECK_CUDA(LaunchExpandPlan(inputs[i % sets].params, stream));
      };
      auto inlined = [&](int i) {
        BENCH_CHECK_CUDA(
            LaunchExpandInlinePlan(*inputs[i % sets].inline_params, stream));
      };
      const double up_flushed_us =
          timer.MedianUs(uploaded, reps, /*flush=*/true);
      const double up_rotated_us =
          timer.MedianUs(uploaded, reps, /*flush=*/false);
      const double flushed_us =
          all_inline ? timer.MedianUs(inlined, reps, /*flush=*/true)
                     : up_flushed_us;
      const double rotated_us =
          all_inline ? timer.MedianUs(inlined, reps, /*flush=*/false)
                     : up_rotated_us;
      // The whole executor call, host wall clock, rotating the plans.
      std::vector<double> call_us;
      for (int i = 0; i < reps + 20; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        BENCH_CHECK_OK(executor.Execute(inputs[i % sets].plan));
        BENCH_CHECK_OK(executor.Synchronize());
        const auto t1 = std::chrono::steady_clock::now();
        if (i >= 20) {
          call_us.push_back(
              std::chrono::duration<double, std::micro>(t1 - t0).count());
        }
      }
      const double gbps = tokens * 8 / (flushed_us * 1e3);
      std::printf(
          "%-7s %-16s %3ld %5ld %8ld %7ld %4s %-6s %10.2f %10.2f %9.2f "
          "%9.2f %9.1f %9.1f %8.0f\n",
          c.decode ? "decode" : "extend", c.name.c_str(), page_size, c.bs,
          tokens, pages, ok ? "yes" : "NO", all_inline ? "inline" : "upload",
          flushed_us, rotated_us, up_flushed_us, up_rotated_us, Median(call_us),
          Percentile(call_us, 0.99), gbps);
      std::fflush(stdout);
      if (c.name == "bulk_64x16384") {
        std::printf(
            "        bulk: %.1f%% of the memset write bandwidth (flushed), "
            "%.1f%% (rotated)\n",
            100.0 * gbps / write_gbps,
            100.0 * tokens * 8 / (rotated_us * 1e3) / write_gbps);
      }
      json.push_back(absl::StrFormat(
          "{\"case\": \"%s\", \"page_size\": %d, \"bs\": %d, \"tokens\": %d, "
          "\"pages\": %d, \"ok\": %s, \"kernel_us\": %.3f, "
          "\"kernel_rotated_us\": %.3f, \"uploaded_us\": %.3f, "
          "\"uploaded_rotated_us\": %.3f, \"path\": \"%s\", "
          "\"call_p50_us\": %.2f, "
          "\"call_p99_us\": %.2f, \"write_fraction\": %.4f}",
          c.decode ? "decode" : "extend_" + c.name, page_size, c.bs, tokens,
          pages, ok ? "true" : "false", flushed_us, rotated_us, up_flushed_us,
          up_rotated_us, all_inline ? "inline" : "upload", Median(call_us),
          Percentile(call_us, 0.99), gbps / write_gbps));
      for (InputSet& set : inputs) {
        BENCH_CHECK_CUDA(cudaFree(set.device_block));
        BENCH_CHECK_CUDA(cudaFree(set.device_out));
      }
    }
    BENCH_CHECK_CUDA(cudaFree(device_ring));
  }
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr) {
      std::perror(json_path.c_str());
      return 1;
    }
    std::fprintf(f, "[\n %s\n]\n", absl::StrJoin(json, ",\n ").c_str());
    std::fclose(f);
  }
  if (!all_ok) {
    std::fprintf(stderr, "some outputs differ from the CPU reference\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace pagealloc

int main(int argc, char** argv) { return pagealloc::Main(argc, argv); }
