// Turns the wire's allocation and free calls into allocator requests,
// refusing malformed ones. Pure functions of the message: no session, pool
// state or I/O, so the fuzzer can drive them directly.

#ifndef PAGEALLOC_SERVER_REQUEST_DECODING_H_
#define PAGEALLOC_SERVER_REQUEST_DECODING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/requests.h"
#include "proto/pagealloc.pb.h"

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

// The arrays of a message; INVALID_ARGUMENT naming them when parallel
// arrays differ in length (never for AllocRequest, which has one). The
// result points into `call`.
absl::StatusOr<CallArrays> ArraysOf(const v1::AllocExtendRequest& call);
absl::StatusOr<CallArrays> ArraysOf(const v1::AllocDecodeRequest& call);
absl::StatusOr<CallArrays> ArraysOf(const v1::AllocRequest& call);

// ArraysOf, then DecodeCall.
absl::StatusOr<DecodedCall> DecodeAllocExtend(
    const v1::AllocExtendRequest& call, OwnerId owner,
    const PoolGeometry& geometry, const CallLimits& limits);
absl::StatusOr<DecodedCall> DecodeAllocDecode(
    const v1::AllocDecodeRequest& call, OwnerId owner,
    const PoolGeometry& geometry, const CallLimits& limits);
absl::StatusOr<DecodedCall> DecodeAlloc(const v1::AllocRequest& call,
                                        OwnerId owner,
                                        const PoolGeometry& geometry,
                                        const CallLimits& limits);

// Returns INVALID_ARGUMENT when a Free sets both slots and pages.
absl::Status ValidateFree(const v1::FreeRequest& call);

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_REQUEST_DECODING_H_
