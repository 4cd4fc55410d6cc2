// The scheduler's side of the allocation semantics: the live sequences a
// scheduler keeps (length, last slot, pages), the shapes of the calls that
// continue them, and the checking and recording of each answer. Every test
// and benchmark that drives the allocator like a scheduler keeps its
// sequences here: the model checker and the GPU test on a PagePool,
// tests/load_client and pagealloc-bench's workers through the client
// library, the benchmark's in-process floor on a PagePool again.
//
// It holds plain data and makes no call itself: the caller builds a call
// from the shapes (CallArrays for the client library, AllocRequest fields
// for a PagePool), issues it, and hands each request's slots to Record,
// which checks them against the semantics before it changes anything:
//
//   SequenceSet live(page_size);
//   CallArrays call;
//   for (const LiveSequence& s : live) call.Add(s.Decode());
//   ASSIGN_OR_RETURN(Allocation a, client->AllocDecode(call.seq_lens,
//                                                      call.last_locs));
//   for (size_t i = 0; i < a.size(); ++i) {
//     std::vector<int64_t> slots(a[i].count);
//     RETURN_IF_ERROR(client->CopyToHost(a[i].slots, a[i].count,
//                                        slots.data()));
//     RETURN_IF_ERROR(live.Record(i, call[i], slots));
//   }
//
// The semantics (SGLang's alloc_extend / alloc_decode): a request for
// tokens [prefix_len, seq_len) gets one slot per token; a token whose
// position is a multiple of the page size opens a new page and gets that
// page's first slot (never in page 0, which is reserved); every other token
// gets the slot after the previous token's (last_loc for the first).

#ifndef PAGEALLOC_TESTS_WORKLOAD_H_
#define PAGEALLOC_TESTS_WORKLOAD_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "allocator/requests.h"

namespace pagealloc::testing {

// One sequence as a scheduler tracks it. Its tokens [shared_len, len) have
// slots in `pages`, in order: token t is at slot
// pages[(t - shared_len) / page_size] * page_size + t % page_size.
struct LiveSequence {
  // Unique within its SequenceSet; Mark and Rollback know sequences by it.
  uint64_t id = 0;
  // Pool-level tests: the owner whose requests grow this sequence.
  OwnerId owner = kNoOwner;
  // Tokens in the KV cache, and the slot of the last one (-1 when none).
  int64_t len = 0;
  int64_t last_loc = -1;
  // Tokens [0, shared_len) are a prefix whose pages someone else holds
  // (this sequence continues it from a page boundary); usually 0.
  int64_t shared_len = 0;
  std::vector<int64_t> pages;
  // Workloads that end sequences: the length at which this one is done
  // (0: never).
  int64_t target_len = 0;

  bool finished() const { return target_len > 0 && len >= target_len; }
  // The shape of a decode step (one token) and of an extend by `tokens`.
  ExtendShape Decode() const { return {len, len + 1, last_loc}; }
  ExtendShape Extend(int64_t tokens) const {
    return {len, len + tokens, last_loc};
  }
};

// A new sequence's first call: `tokens` tokens from an empty prefix.
inline ExtendShape Prefill(int64_t tokens) { return {0, tokens, -1}; }

// One call's per-request arrays, as Client::AllocExtend (prefix_lens,
// seq_lens, last_locs) and Client::AllocDecode (seq_lens, last_locs) take
// them.
struct CallArrays {
  std::vector<int64_t> prefix_lens, seq_lens, last_locs;

  void Add(const ExtendShape& shape);
  size_t size() const { return seq_lens.size(); }
  bool empty() const { return seq_lens.empty(); }
  // Request i's shape.
  ExtendShape operator[](size_t i) const {
    return {prefix_lens[i], seq_lens[i], last_locs[i]};
  }
};

// The live sequences of one scheduler (or of one owner set, on a pool), in
// the order they were added. Indices shift when a sequence is removed; ids
// do not. This class is thread-compatible.
class SequenceSet {
 public:
  // REQUIRES: page_size >= 1.
  explicit SequenceSet(int64_t page_size);

  int64_t page_size() const { return page_size_; }
  size_t size() const { return sequences_.size(); }
  bool empty() const { return sequences_.empty(); }
  LiveSequence& operator[](size_t i) { return sequences_[i]; }
  const LiveSequence& operator[](size_t i) const { return sequences_[i]; }
  std::vector<LiveSequence>::iterator begin() { return sequences_.begin(); }
  std::vector<LiveSequence>::iterator end() { return sequences_.end(); }
  std::vector<LiveSequence>::const_iterator begin() const {
    return sequences_.begin();
  }
  std::vector<LiveSequence>::const_iterator end() const {
    return sequences_.end();
  }
  // All pages the sequences hold.
  int64_t pages_held() const;

  // Adds an empty sequence (no tokens yet) at the end; returns its index.
  size_t Add(OwnerId owner = kNoOwner, int64_t target_len = 0);

  // Checks `slots`, the answer to `call` for sequence i (host memory), and
  // records it: the pages it opened, the new length and last slot. `call`
  // continues the sequence (prefix_len == len, last_loc == last_loc), or,
  // for a sequence with no tokens yet, may start at a page-aligned prefix
  // held elsewhere (see LiveSequence::shared_len). Appends the pages the
  // answer opened to `new_pages` when given.
  //
  // Returns INVALID_ARGUMENT for a call that does not continue the
  // sequence (the caller's mistake), and DATA_LOSS naming the token and
  // the slots when the answer breaks the semantics: not one slot per
  // token, a page opened at an unaligned slot or in page 0, a token not
  // right after the previous one. On an error nothing changes.
  absl::Status Record(size_t i, const ExtendShape& call,
                      absl::Span<const int64_t> slots,
                      std::vector<int64_t>* new_pages = nullptr);

  // The slot of token `token` of sequence i. REQUIRES: shared_len <= token
  // < len.
  int64_t SlotOf(size_t i, int64_t token) const;
  // The slots of tokens [shared_len, len) of sequence i, in order: what a
  // free by slots names.
  std::vector<int64_t> SlotsOf(size_t i) const;

  // Removes sequence i (finished, preempted, freed); appends its pages to
  // `pages` when given.
  void Remove(size_t i, std::vector<int64_t>* pages = nullptr);
  // Removes the sequences at `indices` (distinct, any order); appends their
  // pages to `pages`, in the order of `indices`, when given.
  void RemoveAll(absl::Span<const size_t> indices,
                 std::vector<int64_t>* pages = nullptr);
  // Removes every sequence for which `dead` returns true; appends their
  // pages to `pages` when given.
  void RemoveIf(absl::FunctionRef<bool(const LiveSequence&)> dead,
                std::vector<int64_t>* pages = nullptr);

  // Each sequence's page count when a checkpoint was taken.
  struct Mark {
    absl::flat_hash_map<uint64_t, size_t> pages;
  };
  Mark MarkCheckpoint() const;
  // Applies a Rollback to the checkpoint of `mark`: the pages opened since
  // went back to the pool and are appended to `returned`. A sequence that
  // lost pages lost its last slot with them and cannot go on: it leaves the
  // set, and the older pages it still holds are appended to `orphaned` for
  // the caller to free. A sequence that opened no page keeps the tokens it
  // gained (their slots are in pages it still holds). REQUIRES: no page was
  // freed since the mark.
  void Rollback(const Mark& mark, std::vector<int64_t>* returned,
                std::vector<int64_t>* orphaned);

 private:
  int64_t page_size_;
  uint64_t next_id_ = 1;
  std::vector<LiveSequence> sequences_;
};

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_WORKLOAD_H_
