// What the local expansion's tests (tests/local_expansion_test.cc and
// tests/gpu/local_expansion_test.cc) compare with: random extend and decode
// batches over a session's prefix pages, and the thin path's slots for a
// batch on a daemon whose free list is made to start with a given order.

#ifndef PAGEALLOC_TESTS_LOCAL_EXPANSION_REFERENCE_H_
#define PAGEALLOC_TESTS_LOCAL_EXPANSION_REFERENCE_H_

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "client/page_reserve.h"
#include "tests/in_process_server.h"

namespace pagealloc::testing {

// Starts a CPU-backend daemon of `num_pages` pages of `page_size` tokens
// (LIFO frees, rings of 2^16 slots, debug checks); null, with a test
// failure, when it cannot start.
std::unique_ptr<InProcessServer> StartExpansionDaemon(int64_t num_pages,
                                                      int64_t page_size);

// Connects a session to `daemon` over its fast channel; null, with a test
// failure, when it cannot.
std::unique_ptr<Client> ConnectSession(InProcessServer& daemon,
                                       int64_t quota_pages = 0);

// A reserve without its thread (the test refills with Maintain), that
// never waits for other sessions' pages.
PageReserveOptions ManualReserve(int64_t batch, int64_t max_pages);

// Two daemons of the same pool for the identity tests: `local`'s session
// has `reserve` (ManualReserve), filled with the whole pool in the daemon's
// order; `thin`'s session owns nothing. Members go in reverse order:
// reserve, clients, then daemons.
struct ExpansionPair {
  std::unique_ptr<InProcessServer> local_daemon;
  std::unique_ptr<InProcessServer> thin_daemon;
  std::unique_ptr<Client> local;
  std::unique_ptr<Client> thin;
  std::unique_ptr<PageReserve> reserve;
};

// Starts `pair` with pools of `num_pages` pages of `page_size` tokens;
// returns the first error.
absl::Status StartExpansionPair(int64_t num_pages, int64_t page_size,
                                ExpansionPair* pair);

// Puts back into `reserve` the pages a batch took (the first pages of
// `order`, the reserve's pages before the batch, that it no longer holds)
// and the batch's `prefix_pages`.
absl::Status PutBackBatch(PageReserve& reserve, absl::Span<const int64_t> order,
                          absl::Span<const int64_t> prefix_pages);

// One batch in extend form (a decode's prefix_lens are seq_lens - 1).
struct ExpansionBatch {
  bool decode = false;
  std::vector<int64_t> prefix_lens;
  std::vector<int64_t> seq_lens;
  std::vector<int64_t> last_locs;
  int64_t slots = 0;  // sum(seq_lens - prefix_lens)
};

// Returns a batch of up to prefix_pages.size() requests, request k's
// prefix (empty one time in eight) ending in prefix_pages[k], of at most
// half the pool's `usable_slots` tokens, and at most `max_new_pages` new
// pages in all. Extends grow by 0..99 tokens, decodes by one.
ExpansionBatch MakeExpansionBatch(bool decode, int64_t page_size,
                                  int64_t usable_slots,
                                  const std::vector<int64_t>& prefix_pages,
                                  int64_t max_new_pages, std::mt19937_64& rng);

// Returns the thin path's slots for `batch`, sent by `thin` (a session of
// a daemon of `num_pages` pages, owning nothing) after the daemon's free
// list is made to start with `order` and the session to own `prefix_pages`:
// it allocates the whole pool, frees the other pages, then `order` (to the
// free list's front, first page first). Clears the session afterwards.
absl::StatusOr<std::vector<int64_t>> ThinSlotsOnFreeList(
    Client& thin, int64_t num_pages, absl::Span<const int64_t> prefix_pages,
    absl::Span<const int64_t> order, const ExpansionBatch& batch);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_LOCAL_EXPANSION_REFERENCE_H_
