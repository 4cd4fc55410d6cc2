#include "server/request_decoding.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "allocator/status_macros.h"

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
    return absl::InvalidArgumentError(absl::StrFormat(
        "parallel arrays differ in length: %s entries", sizes));
  }
  return absl::OkStatus();
}

absl::Status CheckCount(int count, const CallLimits& limits) {
  if (count > limits.max_requests) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the call has %d requests; at most %d per call (--max_batch_requests)",
        count, limits.max_requests));
  }
  return absl::OkStatus();
}

// Validates every request's shape and the call's total.
absl::StatusOr<DecodedCall> Finish(std::vector<AllocRequest> requests,
                                   const PoolGeometry& geometry,
                                   const CallLimits& limits) {
  DecodedCall call;
  for (const AllocRequest& request : requests) {
    RETURN_IF_ERROR(ValidateShape(request, geometry));
    call.num_slots += ToExtendShape(request).num_slots();
  }
  if (call.num_slots > limits.max_slots) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the call asks for %d slots; at most %d per call "
        "(--max_batch_tokens)",
        call.num_slots, limits.max_slots));
  }
  call.requests = std::move(requests);
  return call;
}

}  // namespace

absl::StatusOr<DecodedCall> DecodeAllocExtend(
    const v1::AllocExtendRequest& call, OwnerId owner,
    const PoolGeometry& geometry, const CallLimits& limits) {
  RETURN_IF_ERROR(CheckSameLength({{"prefix_lens", call.prefix_lens_size()},
                                   {"seq_lens", call.seq_lens_size()},
                                   {"last_locs", call.last_locs_size()}}));
  RETURN_IF_ERROR(CheckCount(call.seq_lens_size(), limits));
  std::vector<AllocRequest> requests(call.seq_lens_size());
  for (int i = 0; i < call.seq_lens_size(); ++i) {
    requests[i] = {RequestKind::kExtend, owner,           i,
                   call.prefix_lens(i),  call.seq_lens(i), call.last_locs(i),
                   nullptr};
  }
  return Finish(std::move(requests), geometry, limits);
}

absl::StatusOr<DecodedCall> DecodeAllocDecode(
    const v1::AllocDecodeRequest& call, OwnerId owner,
    const PoolGeometry& geometry, const CallLimits& limits) {
  RETURN_IF_ERROR(CheckSameLength({{"seq_lens", call.seq_lens_size()},
                                   {"last_locs", call.last_locs_size()}}));
  RETURN_IF_ERROR(CheckCount(call.seq_lens_size(), limits));
  std::vector<AllocRequest> requests(call.seq_lens_size());
  for (int i = 0; i < call.seq_lens_size(); ++i) {
    requests[i] = {RequestKind::kDecode, owner, i, 0, call.seq_lens(i),
                   call.last_locs(i),    nullptr};
  }
  return Finish(std::move(requests), geometry, limits);
}

absl::StatusOr<DecodedCall> DecodeAlloc(const v1::AllocRequest& call,
                                        OwnerId owner,
                                        const PoolGeometry& geometry,
                                        const CallLimits& limits) {
  RETURN_IF_ERROR(CheckCount(call.num_tokens_size(), limits));
  std::vector<AllocRequest> requests(call.num_tokens_size());
  for (int i = 0; i < call.num_tokens_size(); ++i) {
    requests[i] = {RequestKind::kAlloc, owner, i, 0, call.num_tokens(i), -1,
                   nullptr};
  }
  return Finish(std::move(requests), geometry, limits);
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
