// The scheduler workload the benchmark runs, in the workers and in the
// in-process floor alike so that both allocate the same shapes: `batch` live
// sequences per client (kept in a testing::SequenceSet), each admitted with
// a prompt of 1..prefill_chunk tokens and grown to a random target length,
// then freed and replaced; each step decodes every sequence, extends a few
// by a prefill chunk, or speculates, by the weights.

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

  // INVALID_ARGUMENT (naming the flags) unless batch, prefill_chunk and
  // draft_tokens are >= 1 and max_seq_len >= 2.
  absl::Status Validate() const;
};

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
