// The scheduler workload the benchmark runs, in the workers and in the
// in-process floor alike so that both allocate the same shapes: `batch` live
// sequences per client (kept in a testing::SequenceSet), each admitted with
// a prompt of 1..prefill_chunk tokens and grown to a random target length,
// then freed and replaced; each step decodes every sequence, extends a few
// by a prefill chunk, or speculates, by the weights.
//
// How a client uses the slots it gets (Workload::gpu_ordered): either it
// copies them to the host after each call (the host waits for the launch),
// or, as an engine does with SGLang's out_cache_loc, it keeps them on the
// GPU: it orders its own stream after the call (Client::OrderAfter) and a
// kernel there reads them. Then the call is done when OrderAfter returns,
// and the slots reach the host (for the benchmark's own bookkeeping) only
// before the sequences are stepped again; with two lanes (two sets of
// sequences stepped in turn, as SGLang's overlap scheduler keeps two
// batches) the client never waits for the GPU between calls.

#ifndef PAGEALLOC_BENCH_WORKLOAD_H_
#define PAGEALLOC_BENCH_WORKLOAD_H_

#include <algorithm>
#include <cstdint>
#include <random>

#include "absl/status/status.h"

namespace pagealloc::bench {

struct Workload {
  int batch = 256;
  int decode_weight = 80, prefill_weight = 10, spec_weight = 10;
  int prefill_chunk = 256;
  int prefill_requests = 4;
  int draft_tokens = 4;
  int max_seq_len = 2048;
  bool async_completion = false;
  bool piggyback_ops = true;
  // Slots are read on the GPU, on the client's stream ordered after each
  // call, instead of being copied to the host after it (see above).
  bool gpu_ordered = false;
  // Sets of `batch` sequences per client, stepped in turn; 0: 2 when
  // gpu_ordered, else 1.
  int lanes = 0;

  // The lanes a client runs (lanes, or its default).
  int effective_lanes() const {
    return lanes > 0 ? lanes : (gpu_ordered ? 2 : 1);
  }
  // The completion mode's short name: "sync" or "async" (slots copied to
  // the host), "gpu" (async completion, slots read on the GPU) or
  // "sync_gpu".
  const char* mode() const;

  // INVALID_ARGUMENT (naming the flags) unless batch, prefill_chunk and
  // draft_tokens are >= 1, max_seq_len >= 2 and lanes is 0..kMaxLanes.
  absl::Status Validate() const;
};

// Most lanes a client may run.
inline constexpr int kMaxLanes = 8;

// The workload's random choices, from one seeded generator.
// This class is thread-compatible.
class WorkloadRandom {
 public:
  explicit WorkloadRandom(uint64_t seed) : rng_(seed) {}

  // A value in [lo, hi]. REQUIRES: lo <= hi.
  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  // A new sequence's prompt: 1..prefill_chunk tokens.
  int64_t PromptLen(const Workload& w) { return Uniform(1, w.prefill_chunk); }
  // The length at which a sequence admitted with `prompt` tokens finishes:
  // past the prompt (where max_seq_len allows), up to max_seq_len.
  int64_t TargetLen(const Workload& w, int64_t prompt) {
    return Uniform(std::min<int64_t>(prompt + 1, w.max_seq_len), w.max_seq_len);
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_WORKLOAD_H_
