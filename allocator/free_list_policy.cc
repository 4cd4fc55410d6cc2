#include "allocator/free_list_policy.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace pagealloc {

absl::StatusOr<FreePolicy> ParseFreePolicy(absl::string_view name) {
  if (name == "lifo") return FreePolicy::kLifo;
  if (name == "sorted") return FreePolicy::kSorted;
  return absl::InvalidArgumentError(absl::StrFormat(
      "free_policy \"%s\" is not one of \"lifo\", \"sorted\"", name));
}

absl::string_view FreePolicyName(FreePolicy policy) {
  return policy == FreePolicy::kLifo ? "lifo" : "sorted";
}

absl::StatusOr<Semantics> ParseSemantics(absl::string_view name) {
  if (name == "pagealloc") return Semantics::kPagealloc;
  if (name == "sglang") return Semantics::kSglang;
  return absl::InvalidArgumentError(absl::StrFormat(
      "semantics \"%s\" is not one of \"pagealloc\", \"sglang\"", name));
}

absl::string_view SemanticsName(Semantics semantics) {
  return semantics == Semantics::kPagealloc ? "pagealloc" : "sglang";
}

int64_t SglangCallEstimate(absl::Span<const AllocRequest> call,
                           const PoolGeometry& geometry) {
  if (call.empty()) return 0;
  const int64_t ps = geometry.page_size;
  // SGLang's figures count every request of its batch, malformed ones too
  // (it never sees them; we refuse them alone, later).
  const int64_t num_requests = call.size();
  int64_t slots = 0;
  int64_t pages = 0;
  for (const AllocRequest& r : call) {
    if (!IsValidShape(r, geometry)) continue;
    ExtendShape shape = ToExtendShape(r);
    shape.seq_len = std::min(shape.seq_len, geometry.slot_limit());
    shape.prefix_len = std::min(shape.prefix_len, shape.seq_len);
    slots += shape.num_slots();
    pages += NewPagesNeeded(shape, ps);
  }
  if (ps > 1 && call.front().kind == RequestKind::kExtend) {
    return slots / ps + num_requests + 1;
  }
  if (ps > 1 && call.front().kind == RequestKind::kDecode) return num_requests;
  return pages;  // alloc, and the token allocator (page_size 1)
}

FreeListPolicy::FreeListPolicy(FreePolicy policy, Semantics semantics,
                               const PoolGeometry& geometry)
    : policy_(policy),
      semantics_(semantics),
      geometry_(geometry),
      release_target_(policy == FreePolicy::kSorted ? ReleaseTarget::kPark
                      : semantics == Semantics::kSglang &&
                              geometry.page_size == 1
                          ? ReleaseTarget::kBack
                          : ReleaseTarget::kFront),
      merge_trigger_(policy == FreePolicy::kLifo ? MergeTrigger::kNever
                     : semantics == Semantics::kSglang
                         ? MergeTrigger::kPerCall
                         : MergeTrigger::kPerBatch) {}

}  // namespace pagealloc
