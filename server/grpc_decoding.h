// Turns the gRPC adapter's allocation and free messages into the call
// core's plain inputs (server/request_decoding.h), refusing malformed ones.
// Pure functions of the message: no session, pool state or I/O, so the
// fuzzer can drive them directly.

#ifndef PAGEALLOC_SERVER_GRPC_DECODING_H_
#define PAGEALLOC_SERVER_GRPC_DECODING_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/requests.h"
#include "proto/pagealloc.pb.h"
#include "server/request_decoding.h"

namespace pagealloc {

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

#endif  // PAGEALLOC_SERVER_GRPC_DECODING_H_
