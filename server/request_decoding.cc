#include "server/request_decoding.h"

#include <limits>

#include "absl/strings/str_format.h"

namespace pagealloc {

absl::Status DecodeCall(const CallArrays& arrays, OwnerId owner,
                        const PoolGeometry& geometry, const CallLimits& limits,
                        DecodedCall* out) {
  const int64_t n = arrays.size;
  if (n > limits.max_requests) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the call has %d requests; at most %d per call (--max_batch_requests)",
        n, limits.max_requests));
  }
  // Resized, not rebuilt: a reused vector keeps its (cache-warm) storage.
  out->requests.resize(n);
  AllocRequest* const requests = out->requests.data();
  int64_t num_slots = 0;
  // One pass: copy each element once (the arrays may be memory another
  // process writes), then check only the copy. Fields are written in place
  // (a whole struct built on the stack and copied stalls on store
  // forwarding).
  for (int64_t i = 0; i < n; ++i) {
    AllocRequest& r = requests[i];
    r.kind = arrays.kind;
    r.owner = owner;
    r.index = i;
    r.destination = nullptr;
    switch (arrays.kind) {
      case RequestKind::kExtend:
        r.prefix_len = arrays.prefix_lens[i];
        r.seq_len = arrays.seq_lens[i];
        r.last_loc = arrays.last_locs[i];
        break;
      case RequestKind::kDecode:
        r.prefix_len = 0;
        r.seq_len = arrays.seq_lens[i];
        r.last_loc = arrays.last_locs[i];
        break;
      case RequestKind::kAlloc:
        r.prefix_len = 0;
        r.seq_len = arrays.seq_lens[i];
        r.last_loc = -1;
        break;
    }
    if (!IsValidShape(r, geometry)) return ValidateShape(r, geometry);
    // A request longer than the pool is well formed (the pool refuses it
    // alone), so its length is bounded only by int64: the sum saturates.
    const int64_t slots = ToExtendShape(r).num_slots();
    num_slots = slots > std::numeric_limits<int64_t>::max() - num_slots
                    ? std::numeric_limits<int64_t>::max()
                    : num_slots + slots;
  }
  if (num_slots > limits.max_slots) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the call asks for %s%d slots; at most %d per call "
        "(--max_batch_tokens)",
        num_slots == std::numeric_limits<int64_t>::max() ? "at least " : "",
        num_slots, limits.max_slots));
  }
  out->num_slots = num_slots;
  return absl::OkStatus();
}

}  // namespace pagealloc
