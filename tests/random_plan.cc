#include "tests/random_plan.h"

#include <algorithm>
#include <numeric>

#include "allocator/requests.h"

namespace pagealloc::testing {
namespace {

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // inclusive
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

bool Chance(std::mt19937_64& rng, double p) {
  return std::uniform_real_distribution<double>(0, 1)(rng) < p;
}

}  // namespace

RandomBatch MakeRandomBatch(const RandomPlanSpec& spec, int64_t ring_capacity,
                            std::mt19937_64& rng) {
  const int64_t ps = spec.page_size;
  RandomBatch batch;
  BatchPlan& plan = batch.plan;
  plan.page_size = ps;
  plan.free_ring_capacity = ring_capacity;
  plan.free_ring_head = Uniform(rng, 0, ring_capacity - 1);
  plan.requests.reserve(spec.num_requests);
  for (int64_t k = 0; k < spec.num_requests; ++k) {
    const int64_t budget = spec.max_total_slots - plan.num_slots;
    PlannedRequest request;
    const int kind = Chance(rng, spec.decode_fraction) ? 1
                     : Chance(rng, 0.1)                ? 2
                                                       : 0;
    if (kind == 1 && budget >= 1) {  // decode: prefix_len = seq_len - 1
      request.seq_len = Uniform(rng, 1, spec.max_prefix + 1);
      request.prefix_len = request.seq_len - 1;
    } else if (kind == 2) {  // alloc: whole pages, no prefix
      request.seq_len =
          ps *
          std::min(Uniform(rng, 0, std::max<int64_t>(spec.max_extend / ps, 1)),
                   budget / ps);
    } else {
      request.prefix_len = Uniform(rng, 0, spec.max_prefix);
      const int64_t extend = Chance(rng, spec.empty_fraction)
                                 ? 0
                                 : Uniform(rng, 1, spec.max_extend);
      request.seq_len = request.prefix_len + std::min(extend, budget);
    }
    if (request.prefix_len > 0) {
      // The prefix's last slot sits in a page of its own, far above every
      // page of the ring; at the right offset when the prefix ends inside a
      // page, as the pool requires.
      const int64_t prefix_page = ring_capacity + 1000 + k;
      request.last_loc = prefix_page * ps + (request.prefix_len - 1) % ps;
    }
    request.first_new_page = plan.num_new_pages;
    request.output_offset = plan.num_slots;
    plan.num_new_pages += NewPagesNeeded(
        {request.prefix_len, request.seq_len, request.last_loc}, ps);
    plan.num_slots += request.seq_len - request.prefix_len;
    plan.requests.push_back(request);
  }
  // Destinations: requests in shuffled order, with gaps of 0..3 words that
  // must stay poisoned.
  const int64_t n = plan.requests.size();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  batch.destination_offset.assign(n, 0);
  int64_t offset = 0;
  for (int64_t k : order) {
    offset += Uniform(rng, 0, 3);
    batch.destination_offset[k] = offset;
    offset += plan.requests[k].seq_len - plan.requests[k].prefix_len;
  }
  batch.output_words = offset + Uniform(rng, 0, 3);
  return batch;
}

RandomBatch MakeExtendBatch(int64_t page_size,
                            const std::vector<int64_t>& extends,
                            int64_t ring_capacity, std::mt19937_64& rng) {
  RandomBatch batch;
  BatchPlan& plan = batch.plan;
  plan.page_size = page_size;
  plan.free_ring_capacity = ring_capacity;
  plan.free_ring_head = Uniform(rng, 0, ring_capacity - 1);
  for (size_t k = 0; k < extends.size(); ++k) {
    PlannedRequest request;
    request.prefix_len = Uniform(rng, 0, 299);
    request.seq_len = request.prefix_len + extends[k];
    if (request.prefix_len > 0) {
      // As MakeRandomBatch: a prefix page of its own, above the ring's.
      const int64_t prefix_page = ring_capacity + 1000 + k;
      request.last_loc =
          prefix_page * page_size + (request.prefix_len - 1) % page_size;
    }
    request.first_new_page = plan.num_new_pages;
    request.output_offset = plan.num_slots;
    plan.num_new_pages += NewPagesNeeded(
        {request.prefix_len, request.seq_len, request.last_loc}, page_size);
    plan.num_slots += extends[k];
    plan.requests.push_back(request);
    batch.output_words += Uniform(rng, 0, 3);
    batch.destination_offset.push_back(batch.output_words);
    batch.output_words += extends[k];
  }
  batch.output_words += Uniform(rng, 0, 3);
  return batch;
}

void AddRandomRingCopies(RandomBatch& batch, int64_t num_copies,
                         int64_t max_count, std::mt19937_64& rng) {
  BatchPlan& plan = batch.plan;
  for (int64_t k = 0; k < num_copies; ++k) {
    const int64_t count = Uniform(rng, 1, max_count);
    plan.ring_copies.push_back(RingCopy{plan.num_new_pages, count, nullptr});
    batch.output_words += Uniform(rng, 0, 3);
    batch.copy_destination_offset.push_back(batch.output_words);
    batch.output_words += count;
    plan.num_new_pages += count;
    plan.num_slots += count;
  }
  batch.output_words += Uniform(rng, 0, 3);
}

void BindDestinations(RandomBatch& batch, int64_t* base) {
  for (size_t k = 0; k < batch.plan.requests.size(); ++k) {
    batch.plan.requests[k].destination = base + batch.destination_offset[k];
  }
  for (size_t k = 0; k < batch.plan.ring_copies.size(); ++k) {
    batch.plan.ring_copies[k].destination =
        base + batch.copy_destination_offset[k];
  }
}

std::vector<int64_t> RandomRing(int64_t capacity, std::mt19937_64& rng) {
  std::vector<int64_t> ring(capacity);
  std::iota(ring.begin(), ring.end(), 1);
  std::shuffle(ring.begin(), ring.end(), rng);
  return ring;
}

}  // namespace pagealloc::testing
