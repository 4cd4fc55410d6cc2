#include "server/grpc_decoding.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace pagealloc {
namespace {

// Checks that parallel arrays have equal lengths; names them all otherwise.
absl::Status CheckSameLength(
    std::initializer_list<std::pair<const char*, int>> arrays) {
  const int n = arrays.begin()->second;
  for (const auto& [name, size] : arrays) {
    if (size == n) continue;
    std::string sizes;
    for (const auto& [other, other_size] : arrays) {
      absl::StrAppendFormat(&sizes, "%s%s has %d", sizes.empty() ? "" : ", ",
                            other, other_size);
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("parallel arrays differ in length: %s entries", sizes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CallArrays> ArraysOf(const v1::AllocExtendRequest& call) {
  RETURN_IF_ERROR(CheckSameLength({{"prefix_lens", call.prefix_lens_size()},
                                   {"seq_lens", call.seq_lens_size()},
                                   {"last_locs", call.last_locs_size()}}));
  return CallArrays{RequestKind::kExtend, call.seq_lens_size(),
                    call.prefix_lens().data(), call.seq_lens().data(),
                    call.last_locs().data()};
}

absl::StatusOr<CallArrays> ArraysOf(const v1::AllocDecodeRequest& call) {
  RETURN_IF_ERROR(CheckSameLength({{"seq_lens", call.seq_lens_size()},
                                   {"last_locs", call.last_locs_size()}}));
  return CallArrays{RequestKind::kDecode, call.seq_lens_size(), nullptr,
                    call.seq_lens().data(), call.last_locs().data()};
}

absl::StatusOr<CallArrays> ArraysOf(const v1::AllocRequest& call) {
  return CallArrays{RequestKind::kAlloc, call.num_tokens_size(), nullptr,
                    call.num_tokens().data(), nullptr};
}

namespace {

template <typename Message>
absl::StatusOr<DecodedCall> DecodeMessage(const Message& call, OwnerId owner,
                                          const PoolGeometry& geometry,
                                          const CallLimits& limits) {
  ASSIGN_OR_RETURN(const CallArrays arrays, ArraysOf(call));
  DecodedCall decoded;
  RETURN_IF_ERROR(DecodeCall(arrays, owner, geometry, limits, &decoded));
  return decoded;
}

}  // namespace

absl::StatusOr<DecodedCall> DecodeAllocExtend(
    const v1::AllocExtendRequest& call, OwnerId owner,
    const PoolGeometry& geometry, const CallLimits& limits) {
  return DecodeMessage(call, owner, geometry, limits);
}

absl::StatusOr<DecodedCall> DecodeAllocDecode(
    const v1::AllocDecodeRequest& call, OwnerId owner,
    const PoolGeometry& geometry, const CallLimits& limits) {
  return DecodeMessage(call, owner, geometry, limits);
}

absl::StatusOr<DecodedCall> DecodeAlloc(const v1::AllocRequest& call,
                                        OwnerId owner,
                                        const PoolGeometry& geometry,
                                        const CallLimits& limits) {
  return DecodeMessage(call, owner, geometry, limits);
}

absl::Status ValidateFree(const v1::FreeRequest& call) {
  if (call.slots_size() > 0 && call.pages_size() > 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "set either slots (%d given) or pages (%d given), not both",
        call.slots_size(), call.pages_size()));
  }
  return absl::OkStatus();
}

}  // namespace pagealloc
