// Allocation requests, their shape validation, and the page arithmetic that
// the whole project shares (SGLang's alloc_extend / alloc_decode semantics).
//
// Every request is planned in "extend form" (prefix_len, seq_len, last_loc):
// a decode is an extend with prefix_len = seq_len - 1, and a plain alloc of n
// tokens is an extend with prefix_len = 0, seq_len = n, last_loc = -1.

#ifndef PAGEALLOC_ALLOCATOR_REQUESTS_H_
#define PAGEALLOC_ALLOCATOR_REQUESTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pagealloc {

// Identifies the session that owns a page. 0 means "free" and is never a
// valid owner.
using OwnerId = uint64_t;
inline constexpr OwnerId kNoOwner = 0;

enum class RequestKind : uint8_t {
  kExtend,  // prefill, chunked prefill, speculative drafts
  kDecode,  // one new token per request
  kAlloc,   // whole pages, n % page_size == 0
};

// Returns "extend", "decode" or "alloc".
absl::string_view RequestKindName(RequestKind kind);

// One request of a batch, as the caller sent it.
struct AllocRequest {
  RequestKind kind = RequestKind::kExtend;
  OwnerId owner = kNoOwner;
  // The request's index in the caller's own call; only used in messages so
  // that an error names the request the client knows.
  int64_t index = 0;
  // kExtend: tokens already in the KV cache. Ignored for kDecode and kAlloc.
  int64_t prefix_len = 0;
  // kExtend, kDecode: the sequence length after this step (kDecode counts the
  // new token). kAlloc: the number of tokens, a multiple of page_size.
  int64_t seq_len = 0;
  // kExtend, kDecode: slot of the last prefix token, or -1 when the prefix is
  // empty. Ignored for kAlloc.
  int64_t last_loc = -1;
  // Where the executor writes the request's slots: seq_len - prefix_len
  // int64 values, in the executor's address space (a host pointer for the
  // CPU executor, a device pointer for the CUDA one).
  int64_t* destination = nullptr;
};

// A client's call as the pool keeps it for a retry (docs/design.md,
// "Retries by call id"): the session numbers its mutating calls, and one
// sent again after the daemon restarted under it carries the same id and
// `retry`. The pool keeps each owner's latest call, so that a retry of a
// call that took effect is answered as it was rather than done twice.
// id 0: an untagged call, which the pool keeps nothing of.
struct CallTag {
  uint64_t id = 0;
  bool retry = false;

  bool operator==(const CallTag& other) const {
    return id == other.id && retry == other.retry;
  }
  bool operator!=(const CallTag& other) const { return !(*this == other); }
};

// One allocation call's requests within a batch: the next `num_requests`
// requests (calls follow each other in order). SGLang's merge trigger and
// all-or-nothing admission work per call.
struct CallSpan {
  int64_t num_requests = 0;
  // Admit every request of the call or none (AllocOptions.all_or_nothing).
  bool all_or_nothing = false;
  // The call's tag (PagePool::Allocate says what a retry does).
  CallTag call;
};

// A request in extend form, with its page arithmetic.
struct ExtendShape {
  int64_t prefix_len = 0;
  int64_t seq_len = 0;
  int64_t last_loc = -1;

  int64_t num_slots() const { return seq_len - prefix_len; }
};

// The geometry every request is checked against.
struct PoolGeometry {
  int64_t page_size = 1;  // >= 1
  int64_t num_pages = 0;  // usable pages, ids 1..num_pages; page 0 is reserved

  // One past the largest slot of the pool: (num_pages + 1) * page_size.
  int64_t slot_limit() const { return (num_pages + 1) * page_size; }
  // The longest sequence the pool can ever hold: num_pages * page_size
  // (page 0 is never handed out). A longer request is refused alone, by
  // the pool, as one that does not fit.
  int64_t usable_slots() const { return num_pages * page_size; }
};

// a / b and a % b for a >= 0, b >= 1. A power-of-two b (every page size in
// practice) takes a shift and a mask: the planning loop does several of
// these per request, and a 64-bit division costs 20-90 cycles.
inline int64_t DivNonNegative(int64_t a, int64_t b) {
  if ((b & (b - 1)) == 0) return a >> __builtin_ctzll(static_cast<uint64_t>(b));
  return a / b;
}
inline int64_t ModNonNegative(int64_t a, int64_t b) {
  if ((b & (b - 1)) == 0) return a & (b - 1);
  return a % b;
}

// ceil(a / b) for a >= 0, b >= 1.
inline int64_t CeilDiv(int64_t a, int64_t b) {
  return DivNonNegative(a + b - 1, b);
}

// Pages a request in extend form takes from the free list:
// ceil(seq_len / ps) - ceil(prefix_len / ps). Correct for page_size 1 too.
inline int64_t NewPagesNeeded(const ExtendShape& shape, int64_t page_size) {
  return CeilDiv(shape.seq_len, page_size) -
         CeilDiv(shape.prefix_len, page_size);
}

// Slots that continue the prefix's partially filled last page:
// min(seq_len, ceil(prefix_len / ps) * ps) - prefix_len.
inline int64_t PartialPageSlots(const ExtendShape& shape, int64_t page_size) {
  const int64_t page_end = CeilDiv(shape.prefix_len, page_size) * page_size;
  return (shape.seq_len < page_end ? shape.seq_len : page_end) -
         shape.prefix_len;
}

// Converts `request` to extend form.
// Inline: the planning path calls it several times per request.
inline ExtendShape ToExtendShape(const AllocRequest& request) {
  switch (request.kind) {
    case RequestKind::kExtend:
      return {request.prefix_len, request.seq_len, request.last_loc};
    case RequestKind::kDecode:
      return {request.seq_len - 1, request.seq_len, request.last_loc};
    case RequestKind::kAlloc:
      return {0, request.seq_len, -1};
  }
  return {};
}

// The checks of ValidateShape (below) as one predicate, inline and with no
// status to build: true exactly when ValidateShape returns OK. The planning
// and decoding loops test every request with this and call ValidateShape
// only for the message of a refusal.
inline bool IsValidShape(const AllocRequest& r, const PoolGeometry& g) {
  const int64_t ps = g.page_size;
  if (r.kind == RequestKind::kAlloc) {
    return r.seq_len >= 0 && ModNonNegative(r.seq_len, ps) == 0;
  }
  const bool decode = r.kind == RequestKind::kDecode;
  if (decode ? r.seq_len < 1 : (r.prefix_len < 0 || r.seq_len < r.prefix_len)) {
    return false;
  }
  const int64_t prefix_len = decode ? r.seq_len - 1 : r.prefix_len;
  if (prefix_len == 0) return r.last_loc == -1;
  return r.last_loc >= ps && r.last_loc < g.slot_limit() &&
         ModNonNegative(r.last_loc + 1, ps) == ModNonNegative(prefix_len, ps);
}

// Checks everything about a request that does not depend on the pool's
// current state: lengths, alignment, slot ranges. A length beyond the pool
// is not a malformed request (the pool refuses it alone, as one that does
// not fit: PoolGeometry::usable_slots). Returns INVALID_ARGUMENT
// naming the wire field and the request index, e.g.
// "seq_lens[3] (12) < prefix_lens[3] (40)".
// When the prefix ends inside a page, the caller must still check that
// last_loc's page is owned by the request's owner (PagePool does).
absl::Status ValidateShape(const AllocRequest& request,
                           const PoolGeometry& geometry);

// The same checks one at a time, each with its message; OK when all pass.
// ValidateShape runs it only after IsValidShape has refused; it is public
// so that tests can hold the two to agreement.
absl::Status CheckShapeInDetail(const AllocRequest& request,
                                const PoolGeometry& geometry);

}  // namespace pagealloc

#endif  // PAGEALLOC_ALLOCATOR_REQUESTS_H_
