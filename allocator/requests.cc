#include "allocator/requests.h"

#include "absl/strings/str_format.h"

namespace pagealloc {

absl::string_view RequestKindName(RequestKind kind) {
  switch (kind) {
    case RequestKind::kExtend:
      return "extend";
    case RequestKind::kDecode:
      return "decode";
    case RequestKind::kAlloc:
      return "alloc";
  }
  return "unknown";
}

namespace {

absl::Status Invalid(const AllocRequest& request, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s request %d: %s", RequestKindName(request.kind), request.index, what));
}

absl::Status ValidateAlloc(const AllocRequest& r, const PoolGeometry& g) {
  const int64_t i = r.index;
  if (r.seq_len < 0) {
    return Invalid(
        r, absl::StrFormat("num_tokens[%d] (%d) is negative", i, r.seq_len));
  }
  if (r.seq_len % g.page_size != 0) {
    return Invalid(r,
                   absl::StrFormat("num_tokens[%d] (%d) is not a multiple of "
                                   "page_size (%d)",
                                   i, r.seq_len, g.page_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckShapeInDetail(const AllocRequest& r, const PoolGeometry& g) {
  if (r.kind == RequestKind::kAlloc) return ValidateAlloc(r, g);
  const int64_t i = r.index;
  const bool decode = r.kind == RequestKind::kDecode;
  if (decode && r.seq_len < 1) {
    return Invalid(r, absl::StrFormat("seq_lens[%d] (%d) must be >= 1 for a "
                                      "decode (it counts the new token)",
                                      i, r.seq_len));
  }
  if (!decode && r.prefix_len < 0) {
    return Invalid(r, absl::StrFormat("prefix_lens[%d] (%d) is negative", i,
                                      r.prefix_len));
  }
  if (!decode && r.seq_len < r.prefix_len) {
    return Invalid(r, absl::StrFormat("seq_lens[%d] (%d) < prefix_lens[%d] "
                                      "(%d)",
                                      i, r.seq_len, i, r.prefix_len));
  }
  const ExtendShape shape = ToExtendShape(r);
  if (shape.prefix_len == 0) {
    if (shape.last_loc != -1) {
      return Invalid(r, absl::StrFormat("last_locs[%d] (%d) must be -1 when "
                                        "the prefix is empty",
                                        i, shape.last_loc));
    }
    return absl::OkStatus();
  }
  // A non-empty prefix ends at last_loc, which lies in a usable page and sits
  // at the same offset in its page as the prefix's last token does.
  if (shape.last_loc < g.page_size || shape.last_loc >= g.slot_limit()) {
    return Invalid(
        r, absl::StrFormat("last_locs[%d] (%d) is outside the usable slots "
                           "[%d, %d)",
                           i, shape.last_loc, g.page_size, g.slot_limit()));
  }
  // Both operands are >= 0 here (checked above).
  if (ModNonNegative(shape.last_loc + 1, g.page_size) !=
      ModNonNegative(shape.prefix_len, g.page_size)) {
    return Invalid(r, absl::StrFormat(
                          "last_locs[%d] (%d) is misaligned: (last_loc + 1) %% "
                          "page_size is %d but prefix_len %% page_size is %d",
                          i, shape.last_loc, (shape.last_loc + 1) % g.page_size,
                          shape.prefix_len % g.page_size));
  }
  return absl::OkStatus();
}

absl::Status ValidateShape(const AllocRequest& r, const PoolGeometry& g) {
  if (IsValidShape(r, g)) return absl::OkStatus();
  absl::Status why = CheckShapeInDetail(r, g);
  if (why.ok()) {
    // The predicate and the described checks disagree: a bug here, never
    // a reason to accept the request.
    return absl::InternalError(absl::StrFormat(
        "%s request %d: refused by the shape check without a reason",
        RequestKindName(r.kind), r.index));
  }
  return why;
}

}  // namespace pagealloc
