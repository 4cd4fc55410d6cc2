// Random batch plans for executor tests: mixed extend / decode / alloc
// requests in extend form, built exactly as PagePool builds plans (prefix
// sums of slots and new pages), with each request's destination at its own
// place in one output buffer (shuffled order, gaps between requests), so
// that a test can poison the buffer, run an executor and compare the whole
// buffer with the CPU reference, gaps included.

#ifndef PAGEALLOC_TESTS_RANDOM_PLAN_H_
#define PAGEALLOC_TESTS_RANDOM_PLAN_H_

#include <cstdint>
#include <random>
#include <vector>

#include "allocator/executor.h"

namespace pagealloc::testing {

struct RandomPlanSpec {
  int64_t page_size = 16;
  int64_t num_requests = 1;
  // Per request: prefix_len in [0, max_prefix], extend in [0, max_extend]
  // (decodes have extend 1; allocs a multiple of page_size).
  int64_t max_prefix = 4096;
  int64_t max_extend = 64;
  // Probability that a request is a decode.
  double decode_fraction = 0.3;
  // Probability that an extend request writes no slots.
  double empty_fraction = 0.05;
  // Extends are clamped so the batch writes at most this many slots.
  int64_t max_total_slots = int64_t{1} << 21;
};

struct RandomBatch {
  BatchPlan plan;  // free ring head/capacity set; destinations unbound
  // Request k writes its slots at output[destination_offset[k] ...]; ring
  // copy k at output[copy_destination_offset[k] ...].
  std::vector<int64_t> destination_offset;
  std::vector<int64_t> copy_destination_offset;
  int64_t output_words = 0;  // size of the output buffer, gaps included
};

// Returns a random plan following `spec`, reading its pages from a ring of
// `ring_capacity` entries starting at a random head. REQUIRES: ring_capacity
// >= spec.max_total_slots (a bound on the pages any such batch takes).
RandomBatch MakeRandomBatch(const RandomPlanSpec& spec, int64_t ring_capacity,
                            std::mt19937_64& rng);

// Returns a plan of requests that extend by extends[k] slots from random
// prefixes of 0..299 (most ending inside a page), with destinations in order
// and gaps of 0..3 words between them (so about half start at an odd slot),
// reading pages from a ring of `ring_capacity` entries from a random head.
// REQUIRES: ring_capacity >= the sum of `extends` (a bound on its pages).
RandomBatch MakeExtendBatch(int64_t page_size,
                            const std::vector<int64_t>& extends,
                            int64_t ring_capacity, std::mt19937_64& rng);

// Adds `num_copies` ring copies of 1 to `max_count` entries to `batch`
// (whose plan must have page_size 1), back to back in the ring after the
// plan's pages, each to its own place past the output buffer's end, with
// gaps of 0..3 words; some start at offsets the head makes wrap around the
// ring's end when the head is near it. Grows num_new_pages, num_slots and
// output_words. REQUIRES: the plan's pages plus num_copies * max_count fit
// in the ring.
void AddRandomRingCopies(RandomBatch& batch, int64_t num_copies,
                         int64_t max_count, std::mt19937_64& rng);

// Points request k's destination at base + destination_offset[k], and ring
// copy k's at base + copy_destination_offset[k].
void BindDestinations(RandomBatch& batch, int64_t* base);

// Returns a random permutation of page ids 1..capacity.
std::vector<int64_t> RandomRing(int64_t capacity, std::mt19937_64& rng);

// The value test buffers are filled with before a run; no slot equals it.
inline constexpr int64_t kPoison = -0x5a5a5a5a5a5a5a5b;

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_RANDOM_PLAN_H_
