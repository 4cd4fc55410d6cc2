#include "kernels/plan_packing.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "allocator/requests.h"
#include "common/status_macros.h"

namespace pagealloc {
namespace {

constexpr int64_t kWord = sizeof(int64_t);
static_assert(sizeof(int64_t*) == kWord, "destinations are packed as words");

int64_t TileMarks(int64_t num_slots) {
  return CeilDiv(num_slots, kExpandTileSlots) + 1;
}

// Stores a 32-bit value (in [0, 2^31)) as the i-th half-word from `base`.
void SetNarrow(int64_t* base, int64_t i, int64_t value) {
  uint64_t word = static_cast<uint64_t>(base[i >> 1]);
  const int shift = (i & 1) * 32;
  word &= ~(uint64_t{0xffffffffu} << shift);
  word |= static_cast<uint64_t>(value) << shift;
  base[i >> 1] = static_cast<int64_t>(word);
}

}  // namespace

int64_t MaxPackedPlanBytes(int64_t max_requests, int64_t max_slots) {
  return kWord * (5 * max_requests + 1 + TileMarks(max_slots));
}

absl::StatusOr<PackedPlan> ValidatePlan(const BatchPlan& plan,
                                        int64_t ring_capacity) {
  const int64_t ps = plan.page_size;
  if (ps < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("plan page_size (%d) must be >= 1", ps));
  }
  if (plan.free_ring_capacity != ring_capacity) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "plan free_ring_capacity (%d) differs from the mirror's %d",
        plan.free_ring_capacity, ring_capacity));
  }
  if (plan.free_ring_head < 0 || plan.free_ring_head >= ring_capacity) {
    return absl::InvalidArgumentError(
        absl::StrFormat("plan free_ring_head (%d) is outside [0, %d)",
                        plan.free_ring_head, ring_capacity));
  }
  if (plan.num_new_pages < 0 || plan.num_new_pages > ring_capacity) {
    return absl::InvalidArgumentError(
        absl::StrFormat("plan num_new_pages (%d) is outside [0, %d]",
                        plan.num_new_pages, ring_capacity));
  }

  // Pass 1: validate, and count what the layout needs. Everything the
  // kernel indexes with is checked here, so that no plan makes it read or
  // write outside its arrays and the ring.
  PackedPlan packed;
  int64_t slots = 0;
  for (size_t k = 0; k < plan.requests.size(); ++k) {
    const PlannedRequest& request = plan.requests[k];
    if (request.prefix_len < 0 || request.seq_len < request.prefix_len) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "plan requests[%d]: seq_len (%d) < prefix_len (%d) or prefix_len "
          "< 0",
          k, request.seq_len, request.prefix_len));
    }
    if (request.output_offset != slots) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "plan requests[%d].output_offset (%d) != the slots before it (%d)", k,
          request.output_offset, slots));
    }
    const int64_t num_slots = request.seq_len - request.prefix_len;
    slots += num_slots;
    if (num_slots == 0) continue;
    if (request.destination == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "plan requests[%d] has %d slots and no destination", k, num_slots));
    }
    const ExtendShape shape{request.prefix_len, request.seq_len,
                            request.last_loc};
    const int64_t new_pages = NewPagesNeeded(shape, ps);
    if (request.first_new_page < 0 ||
        request.first_new_page + new_pages > plan.num_new_pages) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "plan requests[%d]: pages [%d, %d) outside the batch's %d new "
          "pages",
          k, request.first_new_page, request.first_new_page + new_pages,
          plan.num_new_pages));
    }
    ++packed.num_requests;
    packed.max_request_slots = std::max(packed.max_request_slots, num_slots);
  }
  if (slots != plan.num_slots) {
    return absl::InvalidArgumentError(
        absl::StrFormat("plan num_slots (%d) != the requests' slots (%d)",
                        plan.num_slots, slots));
  }
  packed.num_slots = slots;
  return packed;
}

absl::Status ValidateRingCopies(const BatchPlan& plan, int64_t ring_capacity) {
  if (plan.ring_copies.empty()) return absl::OkStatus();
  if (plan.page_size != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the plan has %d ring copies and page_size %d; copies need page_size 1",
        plan.ring_copies.size(), plan.page_size));
  }
  if (plan.free_ring_capacity != ring_capacity || plan.free_ring_head < 0 ||
      plan.free_ring_head >= ring_capacity) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "plan free_ring_head (%d) and free_ring_capacity (%d) do not fit the "
        "mirror's %d entries",
        plan.free_ring_head, plan.free_ring_capacity, ring_capacity));
  }
  if (plan.num_new_pages < 0 || plan.num_new_pages > ring_capacity) {
    return absl::InvalidArgumentError(
        absl::StrFormat("plan num_new_pages (%d) is outside [0, %d]",
                        plan.num_new_pages, ring_capacity));
  }
  int64_t slots = 0;
  for (const PlannedRequest& request : plan.requests) {
    slots += request.seq_len - request.prefix_len;
  }
  for (size_t k = 0; k < plan.ring_copies.size(); ++k) {
    const RingCopy& copy = plan.ring_copies[k];
    if (copy.ring_offset < 0 || copy.count < 1 ||
        copy.count > plan.num_new_pages - copy.ring_offset) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "plan ring_copies[%d]: entries [%d, %d) outside the batch's %d new "
          "pages",
          k, copy.ring_offset, copy.ring_offset + copy.count,
          plan.num_new_pages));
    }
    if (copy.destination == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("plan ring_copies[%d] has no destination", k));
    }
    slots += copy.count;
  }
  if (slots != plan.num_slots) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "plan num_slots (%d) != the requests' and ring copies' slots (%d)",
        plan.num_slots, slots));
  }
  return absl::OkStatus();
}

void RingCopiesAsRequests(const BatchPlan& plan, BatchPlan* out) {
  out->page_size = plan.page_size;
  out->free_ring_head = plan.free_ring_head;
  out->free_ring_capacity = plan.free_ring_capacity;
  out->num_new_pages = plan.num_new_pages;
  out->requests.assign(plan.requests.begin(), plan.requests.end());
  out->ring_copies.clear();
  out->scrub_pages.clear();
  int64_t slots = 0;
  for (const PlannedRequest& request : plan.requests) {
    slots += request.seq_len - request.prefix_len;
  }
  for (const RingCopy& copy : plan.ring_copies) {
    PlannedRequest& request = out->requests.emplace_back();
    request.prefix_len = 0;
    request.seq_len = copy.count;
    request.last_loc = -1;
    request.first_new_page = copy.ring_offset;
    request.output_offset = slots;
    request.destination = copy.destination;
    slots += copy.count;
  }
  out->num_slots = slots;
}

absl::StatusOr<PackedPlan> PackPlan(const BatchPlan& plan,
                                    int64_t ring_capacity,
                                    absl::Span<int64_t> block) {
  ASSIGN_OR_RETURN(PackedPlan packed, ValidatePlan(plan, ring_capacity));
  const int64_t slots = packed.num_slots;
  const int64_t ps = plan.page_size;
  if (packed.num_requests == 0) return packed;

  const int64_t n = packed.num_requests;
  // Tile marks cost one word per kExpandTileSlots slots; we always write
  // them so that either kernel can expand any packed plan.
  packed.num_tile_marks = TileMarks(slots);
  packed.slot_begin_offset = 0;
  packed.partial_slots_offset = kWord * (n + 1);
  packed.first_slot_offset = packed.partial_slots_offset + kWord * n;
  packed.ring_start_offset = packed.first_slot_offset + kWord * n;
  packed.destination_offset = packed.ring_start_offset + kWord * n;
  packed.tile_first_request_offset = packed.destination_offset + kWord * n;
  packed.bytes =
      packed.tile_first_request_offset + kWord * packed.num_tile_marks;
  if (packed.bytes > kWord * static_cast<int64_t>(block.size())) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "packed plan of %d requests and %d slots needs %d bytes; the "
        "staging block has %d",
        n, slots, packed.bytes, kWord * block.size()));
  }

  // Pass 2: fill the arrays.
  int64_t* const slot_begin = block.data();
  int64_t* const partial_slots =
      slot_begin + packed.partial_slots_offset / kWord;
  int64_t* const first_slot = slot_begin + packed.first_slot_offset / kWord;
  int64_t* const ring_start = slot_begin + packed.ring_start_offset / kWord;
  // Destinations are stored with memcpy: the block's words are int64_t.
  int64_t* const destination = slot_begin + packed.destination_offset / kWord;
  int64_t* const tile_first_request =
      slot_begin + packed.tile_first_request_offset / kWord;
  int64_t r = 0;
  int64_t next_mark = 0;
  for (const PlannedRequest& request : plan.requests) {
    const int64_t num_slots = request.seq_len - request.prefix_len;
    if (num_slots == 0) continue;
    slot_begin[r] = request.output_offset;
    partial_slots[r] = PartialPageSlots(
        ExtendShape{request.prefix_len, request.seq_len, request.last_loc}, ps);
    first_slot[r] = request.last_loc + 1;
    ring_start[r] = ModNonNegative(plan.free_ring_head + request.first_new_page,
                                   ring_capacity);
    std::memcpy(&destination[r], &request.destination, kWord);
    const int64_t end = request.output_offset + num_slots;
    while (next_mark * kExpandTileSlots < end) {
      tile_first_request[next_mark++] = r;
    }
    ++r;
  }
  slot_begin[n] = slots;
  // The last mark bounds the last tile's search: the last request.
  tile_first_request[next_mark] = n - 1;
  return packed;
}

absl::StatusOr<bool> PackInlinePlan(const BatchPlan& plan,
                                    int64_t ring_capacity,
                                    const int64_t* free_ring,
                                    MaxInlineExpandParams* params) {
  // A decode record is 2 words, a general one 3.5: no plan with more
  // requests than this fits, and we skip validating it twice.
  if (static_cast<int64_t>(plan.requests.size()) > kMaxInlineDecodeRequests) {
    return false;
  }
  ASSIGN_OR_RETURN(const PackedPlan summary, ValidatePlan(plan, ring_capacity));
  const int64_t n = summary.num_requests;
  if (n == 0) return false;
  constexpr int64_t kNarrowLimit = int64_t{1} << 31;
  if (summary.num_slots >= kNarrowLimit || ring_capacity >= kNarrowLimit ||
      plan.page_size >= kNarrowLimit) {
    return false;
  }
  const bool decode = summary.max_request_slots == 1;
  const int64_t words = decode ? InlineDecodeWords(n) : InlineGeneralWords(n);
  if (words > InlineWordsLimit(decode, summary.max_request_slots)) {
    return false;
  }

  InlinePlanHeader& header = params->header;
  header.free_ring = free_ring;
  header.ring_capacity = ring_capacity;
  header.page_size = plan.page_size;
  header.page_shift = PageShift(plan.page_size);
  header.num_requests = n;
  header.num_slots = summary.num_slots;
  header.max_request_slots = summary.max_request_slots;
  header.kind = decode ? kInlineDecode : kInlineGeneral;
  header.narrow_base = 2 * n;
  header.words_used = words;
  int64_t* const w = params->words;
  int64_t* const narrow = w + 2 * n;
  if (!decode) narrow[words - 2 * n - 1] = 0;  // a half-filled last word
  int64_t r = 0;
  for (const PlannedRequest& request : plan.requests) {
    const int64_t num_slots = request.seq_len - request.prefix_len;
    if (num_slots == 0) continue;
    const int64_t partial = PartialPageSlots(
        ExtendShape{request.prefix_len, request.seq_len, request.last_loc},
        plan.page_size);
    const int64_t ring_start = ModNonNegative(
        plan.free_ring_head + request.first_new_page, ring_capacity);
    w[n + r] =
        static_cast<int64_t>(reinterpret_cast<uintptr_t>(request.destination));
    if (decode) {
      // One slot: the prefix page's next slot, or the start of a new page.
      w[r] = partial > 0 ? request.last_loc + 1 : -(ring_start + 1);
    } else {
      w[r] = request.last_loc + 1;
      SetNarrow(narrow, r, request.output_offset);
      SetNarrow(narrow, n + 1 + r, ring_start);
      SetNarrow(narrow, 2 * n + 1 + r, partial);
    }
    ++r;
  }
  if (!decode) SetNarrow(narrow, n, summary.num_slots);
  return true;
}

ExpandParams MakeExpandParams(const PackedPlan& packed,
                              const void* device_block,
                              const int64_t* free_ring, int64_t ring_capacity,
                              int64_t page_size) {
  const char* base = static_cast<const char*>(device_block);
  ExpandParams params;
  params.slot_begin =
      reinterpret_cast<const int64_t*>(base + packed.slot_begin_offset);
  params.partial_slots =
      reinterpret_cast<const int64_t*>(base + packed.partial_slots_offset);
  params.first_slot =
      reinterpret_cast<const int64_t*>(base + packed.first_slot_offset);
  params.ring_start =
      reinterpret_cast<const int64_t*>(base + packed.ring_start_offset);
  params.destination =
      reinterpret_cast<int64_t* const*>(base + packed.destination_offset);
  params.tile_first_request =
      reinterpret_cast<const int64_t*>(base + packed.tile_first_request_offset);
  params.free_ring = free_ring;
  params.ring_capacity = ring_capacity;
  params.page_size = page_size;
  params.num_requests = packed.num_requests;
  params.num_slots = packed.num_slots;
  params.max_request_slots = packed.max_request_slots;
  return params;
}

absl::StatusOr<bool> PackLocalDecode(absl::Span<const int64_t> new_pages,
                                     absl::Span<const int64_t> pages,
                                     const LocalDecodeHeader& header,
                                     MaxLocalDecodeParams* params) {
  const auto n = static_cast<int64_t>(new_pages.size());
  if (n == 0) {
    return absl::InvalidArgumentError("a local decode of no request");
  }
  if (n > kMaxLocalDecodeRequests) return false;
  params->header = header;
  params->header.num_requests = n;
  int64_t* const words = params->words;
  std::memset(words, 0, LocalDecodeWords(n) * sizeof(int64_t));
  size_t next = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (new_pages[r] == 0) continue;
    if (new_pages[r] != 1 || next >= pages.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "request %d of a local decode takes %d new pages (%d ids given)", r,
          new_pages[r], pages.size()));
    }
    const int64_t page = pages[next++];
    if (page < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "request %d of a local decode takes page %d", r, page));
    }
    if (page >= (int64_t{1} << 31)) return false;
    words[r >> 1] |=
        static_cast<int64_t>(static_cast<uint64_t>(page) << ((r & 1) * 32));
  }
  if (next != pages.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a local decode takes %d new pages, not the %d ids given", next,
        pages.size()));
  }
  return true;
}

}  // namespace pagealloc
