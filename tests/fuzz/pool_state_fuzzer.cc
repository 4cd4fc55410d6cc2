// Fuzz target: the pool's recovery from bytes a crash (or an attacker who
// can write the daemon's state file) left behind.
//
// Input: one byte, then bytes. The byte's low bit picks the mode, its next
// bits the pool's policy, semantics and scrub (a pool of 16 pages of 4
// slots, at most 3 pins per owner).
//   - State: the rest is a snapshot, decoded (DecodePoolState) and, when it
//     decodes, restored (CreateFromState). A state the pool accepts must
//     pass CheckInvariants, export back to itself and go on working: a
//     batch and a free later, the invariants hold again.
//   - Records: the rest is a sequence of change records, each a u16
//     little-endian length and that many bytes, decoded (DecodePoolChange)
//     and replayed (Replay) onto a fresh pool, whatever they say. After
//     each, the pool's invariants hold; at the end its state encodes,
//     decodes and restores into a second pool with the same state.
// Whatever the bytes: a refusal is DATA_LOSS or INVALID_ARGUMENT with a
// message, never a crash, and nothing allocates beyond the input's size.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "allocator/page_pool.h"
#include "allocator/pool_change_log.h"
#include "allocator/pool_state.h"
#include "kernels/cpu_executor.h"
#include "pool_state/pool_state_codec.h"

namespace pagealloc {
namespace {

constexpr PoolGeometry kGeometry{/*page_size=*/4, /*num_pages=*/16};

[[noreturn]] void Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "pool_state_fuzzer: %s: %s\n", what,
               status.ToString().c_str());
  std::abort();
}

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "pool_state_fuzzer: %s: %s\n", what, detail.c_str());
  std::abort();
}

// Decoders refuse with DATA_LOSS (malformed) or INVALID_ARGUMENT (another
// format version), Replay and CreateFromState with DATA_LOSS.
void CheckRefusal(const char* what, const absl::Status& status) {
  if ((status.code() == absl::StatusCode::kDataLoss ||
       status.code() == absl::StatusCode::kInvalidArgument) &&
      !status.message().empty()) {
    return;
  }
  Fail(what, status);
}

PoolOptions Options(uint8_t mode) {
  PoolOptions options;
  options.num_pages = kGeometry.num_pages;
  options.page_size = kGeometry.page_size;
  options.free_policy = (mode & 2) ? FreePolicy::kSorted : FreePolicy::kLifo;
  options.semantics = (mode & 4) ? Semantics::kSglang : Semantics::kPagealloc;
  options.scrub = (mode & 8) != 0;
  options.max_pinned_pages_per_owner = 3;
  return options;
}

void CheckInvariants(PagePool& pool, const char* when) {
  const absl::Status status = pool.CheckInvariants();
  if (!status.ok()) Fail(when, status);
}

// Restores `state` into a second pool, which must take it and export it
// back unchanged.
void CheckRestores(const PoolOptions& options, const PoolState& state) {
  std::string bytes;
  EncodePoolState(state, &bytes);
  absl::StatusOr<PoolState> decoded = DecodePoolState(bytes, kGeometry);
  if (!decoded.ok())
    Fail("a reachable state does not decode", decoded.status());
  CpuExecutor executor;
  auto pool = PagePool::CreateFromState(options, &executor, *decoded);
  if (!pool.ok()) Fail("a reachable state does not restore", pool.status());
  CheckInvariants(**pool, "a restored reachable state");
  const std::string difference = FirstDifference((*pool)->ExportState(), state);
  if (!difference.empty()) Fail("a restored state differs", difference);
}

void FuzzState(uint8_t mode, absl::string_view bytes) {
  absl::StatusOr<PoolState> state = DecodePoolState(bytes, kGeometry);
  if (!state.ok()) return CheckRefusal("DecodePoolState", state.status());
  // The decoded state's own fingerprint, so that the checks past it run.
  PoolOptions options = Options(mode);
  options.free_policy = state->free_policy;
  options.semantics = state->semantics;
  options.scrub = state->scrub;
  options.max_pinned_pages_per_owner =
      state->max_pinned_pages_per_owner >= 0 &&
              state->max_pinned_pages_per_owner <= kGeometry.num_pages
          ? state->max_pinned_pages_per_owner
          : 0;
  CpuExecutor executor;
  auto pool = PagePool::CreateFromState(options, &executor, *state);
  if (!pool.ok()) return CheckRefusal("CreateFromState", pool.status());
  CheckInvariants(**pool, "an accepted state");
  const std::string difference =
      FirstDifference((*pool)->ExportState(), *state);
  if (!difference.empty())
    Fail("an accepted state exports otherwise", difference);
  // It goes on working: a batch for each owner, then a free of what it got.
  for (const PoolOwnerState& owner : state->owners) {
    std::vector<int64_t> slots(8, -1);
    const AllocRequest request{RequestKind::kAlloc, owner.id, 0, 0, 8, -1,
                               slots.data()};
    const std::vector<AllocResult> results = (*pool)->Allocate({request});
    if (results[0].status.ok()) {
      const absl::Status freed = (*pool)->FreeSlots(owner.id, slots).status();
      if (!freed.ok()) Fail("freeing a batch just allocated", freed);
    }
  }
  CheckInvariants(**pool, "an accepted state after a batch");
}

void FuzzRecords(uint8_t mode, absl::string_view bytes) {
  const PoolOptions options = Options(mode);
  CpuExecutor executor;
  auto pool = PagePool::Create(options, &executor);
  if (!pool.ok()) Fail("Create", pool.status());
  DecodedPoolChange decoded;
  std::vector<AllocResult> results;
  while (bytes.size() >= 2) {
    const size_t length = static_cast<uint8_t>(bytes[0]) |
                          static_cast<size_t>(static_cast<uint8_t>(bytes[1]))
                              << 8;
    bytes.remove_prefix(2);
    const absl::string_view record = bytes.substr(0, length);
    bytes.remove_prefix(record.size());
    const absl::Status status = DecodePoolChange(record, kGeometry, &decoded);
    if (!status.ok()) {
      CheckRefusal("DecodePoolChange", status);
      continue;
    }
    const absl::Status replayed = (*pool)->Replay(decoded.change(), &results);
    if (!replayed.ok()) {
      CheckRefusal("Replay", replayed);
    } else if (decoded.change().kind == PoolChangeKind::kAllocate &&
               results.size() != decoded.change().requests.size()) {
      Fail("Replay", "one result per request");
    }
    CheckInvariants(**pool, "after a replayed record");
  }
  CheckRestores(options, (*pool)->ExportState());
}

}  // namespace
}  // namespace pagealloc

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const absl::string_view bytes(reinterpret_cast<const char*>(data + 1),
                                size - 1);
  if (mode & 1) {
    pagealloc::FuzzRecords(mode, bytes);
  } else {
    pagealloc::FuzzState(mode, bytes);
  }
  return 0;
}
