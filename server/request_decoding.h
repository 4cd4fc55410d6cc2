// Turns an allocation call's request arrays, however they arrived (the
// gRPC adapter's messages, server/grpc_decoding.h, or a fast channel's
// copies), into allocator requests, refusing malformed ones. Pure functions
// of the arrays: no session, pool state, I/O or wire types, so the call core
// builds without protobuf and the fuzzers drive them directly.

#ifndef PAGEALLOC_SERVER_REQUEST_DECODING_H_
#define PAGEALLOC_SERVER_REQUEST_DECODING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "allocator/requests.h"

namespace pagealloc {

// What one call may ask for: it must fit one launch.
struct CallLimits {
  int64_t max_requests = 8192;
  int64_t max_slots = int64_t{1} << 21;
};

struct DecodedCall {
  // One per wire request, index = position, owner = the caller, destination
  // unset.
  std::vector<AllocRequest> requests;
  int64_t num_slots = 0;  // all requests together
};

// The request arrays of one allocation call, however it arrived (a gRPC
// message or a fast channel), all of one length. kExtend uses all three;
// kDecode seq_lens and last_locs; kAlloc seq_lens (the wire's num_tokens).
// The others are ignored.
struct CallArrays {
  RequestKind kind = RequestKind::kExtend;
  int64_t size = 0;
  const int64_t* prefix_lens = nullptr;
  const int64_t* seq_lens = nullptr;
  const int64_t* last_locs = nullptr;
};

// Decodes `arrays` into `out` (reusing its vector's capacity), reading each
// element exactly once, and validates the copies: INVALID_ARGUMENT naming
// the field and request index when a request is malformed (ValidateShape)
// or the call exceeds `limits`. On error `out` is unspecified.
absl::Status DecodeCall(const CallArrays& arrays, OwnerId owner,
                        const PoolGeometry& geometry, const CallLimits& limits,
                        DecodedCall* out);

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_REQUEST_DECODING_H_
