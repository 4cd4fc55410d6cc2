// Fuzz target: the shared-prefix calls as they arrive on the wire, run
// against one pool with three sessions.
//
// Input: one byte for the pool's page size, then operations, each an
// opcode byte (the operation, and the session it runs as), a length byte
// and that many bytes of payload. Publish, MatchPrefix and UnpinPrefix
// payloads are the serialized gRPC messages, decoded as the call core
// decodes them (ParsePrefixKeys, ParsePrefixKey); the other operations
// (allocate, free, a session killed, the operator's reset) give the
// sessions pages to publish and end their references. Whatever the bytes:
// every refusal carries one of the codes PagePool documents and a message,
// the answers have the shapes the contracts give, and after every operation
// the pool's invariants hold (a page free, owned by one session, or shared
// with a count equal to the sessions holding it).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "allocator/page_pool.h"
#include "allocator/prefix_index.h"
#include "kernels/cpu_executor.h"
#include "proto/pagealloc.pb.h"

namespace pagealloc {
namespace {

constexpr int64_t kNumPages = 32;
constexpr int64_t kMaxPinned = 6;
constexpr OwnerId kOwners = 3;  // sessions 1..3

[[noreturn]] void Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "prefix_call_fuzzer: %s: %s\n", what,
               status.ToString().c_str());
  std::abort();
}

// A refusal must be one the contract names, with a message.
void CheckRefusal(const char* call, const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kResourceExhausted:
      if (!status.message().empty()) return;
      break;
    default:
      break;
  }
  Fail(call, status);
}

std::vector<absl::string_view> Views(
    const google::protobuf::RepeatedPtrField<std::string>& keys) {
  return std::vector<absl::string_view>(keys.begin(), keys.end());
}

void Publish(PagePool& pool, OwnerId owner, const v1::PublishRequest& call) {
  absl::StatusOr<std::vector<PrefixKey>> keys =
      ParsePrefixKeys(Views(call.keys()), "keys", kNumPages);
  if (!keys.ok()) return CheckRefusal("key chain", keys.status());
  std::optional<PrefixKey> parent;
  if (!call.parent_key().empty()) {
    absl::StatusOr<PrefixKey> parsed =
        ParsePrefixKey(call.parent_key(), "parent_key", 0);
    if (!parsed.ok()) return CheckRefusal("parent key", parsed.status());
    parent = *parsed;
  }
  const std::vector<int64_t> pages(call.pages().begin(), call.pages().end());
  absl::StatusOr<PublishOutcome> outcome = pool.Publish(
      owner, pages, *keys, parent.has_value() ? &*parent : nullptr, call.pin());
  if (!outcome.ok()) return CheckRefusal("Publish", outcome.status());
  if (outcome->pages.size() != keys->size() ||
      outcome->existing.size() != keys->size() ||
      outcome->newly_published < 0 ||
      outcome->newly_published > static_cast<int64_t>(keys->size())) {
    Fail("Publish's outcome does not match its chain", absl::OkStatus());
  }
}

void Match(PagePool& pool, OwnerId owner, const v1::MatchPrefixRequest& call) {
  absl::StatusOr<std::vector<PrefixKey>> keys =
      ParsePrefixKeys(Views(call.keys()), "keys", kNumPages);
  if (!keys.ok()) return CheckRefusal("key chain", keys.status());
  absl::StatusOr<std::vector<int64_t>> pages =
      pool.MatchPrefix(owner, *keys, call.adopt());
  if (!pages.ok()) return CheckRefusal("MatchPrefix", pages.status());
  if (pages->size() > keys->size()) {
    Fail("MatchPrefix found more pages than keys", absl::OkStatus());
  }
  for (const int64_t page : *pages) {
    if (page < 1 || page > kNumPages) {
      Fail("MatchPrefix answered a page outside the pool", absl::OkStatus());
    }
  }
}

void Allocate(PagePool& pool, OwnerId owner, int64_t page_size,
              absl::string_view payload) {
  const int64_t pages =
      payload.empty() ? 1 : 1 + static_cast<uint8_t>(payload[0]) % 8;
  std::vector<int64_t> out(pages * page_size);
  AllocRequest request{RequestKind::kAlloc, owner, 0,         0,
                       pages * page_size,   -1,    out.data()};
  for (const AllocResult& result : pool.Allocate({request})) {
    if (!result.status.ok() &&
        result.status.code() != absl::StatusCode::kResourceExhausted) {
      Fail("allocation", result.status);
    }
  }
}

void FreePages(PagePool& pool, OwnerId owner, absl::string_view payload) {
  std::vector<int64_t> pages;
  for (const char byte : payload) {
    pages.push_back(static_cast<uint8_t>(byte) % (kNumPages + 2));
  }
  const PoolStats before = pool.Stats();
  const absl::StatusOr<int64_t> freed = pool.FreePages(owner, pages);
  if (!freed.ok()) {
    CheckRefusal("FreePages", freed.status());
    if (pool.Stats().free_pages != before.free_pages) {
      Fail("a refused free changed the free list", freed.status());
    }
  }
}

void Operate(PagePool& pool, int64_t page_size, uint8_t opcode,
             absl::string_view payload) {
  const OwnerId owner = 1 + (opcode >> 4) % kOwners;
  const int length = static_cast<int>(payload.size());
  switch (opcode % 8) {
    case 0: {
      v1::PublishRequest call;
      if (call.ParseFromArray(payload.data(), length)) {
        Publish(pool, owner, call);
      }
      break;
    }
    case 1: {
      v1::MatchPrefixRequest call;
      if (call.ParseFromArray(payload.data(), length)) {
        Match(pool, owner, call);
      }
      break;
    }
    case 2: {
      v1::UnpinPrefixRequest call;
      if (call.ParseFromArray(payload.data(), length)) {
        absl::StatusOr<int64_t> unpinned = pool.Unpin(
            owner,
            std::vector<int64_t>(call.pages().begin(), call.pages().end()));
        if (!unpinned.ok()) CheckRefusal("Unpin", unpinned.status());
      }
      break;
    }
    case 3:
    case 4:
      Allocate(pool, owner, page_size, payload);
      break;
    case 5:
      FreePages(pool, owner, payload);
      break;
    case 6: {
      // The session is killed, and a new one takes its id's place.
      absl::StatusOr<int64_t> removed = pool.RemoveOwner(owner);
      if (!removed.ok()) Fail("RemoveOwner", removed.status());
      const absl::Status added = pool.AddOwner(owner, 0);
      if (!added.ok()) Fail("AddOwner", added);
      break;
    }
    default: {
      absl::StatusOr<int64_t> evicted = pool.ResetPrefixCache();
      if (!evicted.ok()) Fail("ResetPrefixCache", evicted.status());
      break;
    }
  }
}

}  // namespace
}  // namespace pagealloc

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pagealloc;  // NOLINT: a fuzz entry point
  if (size < 1) return 0;
  static constexpr int64_t kPageSizes[] = {1, 4, 16};
  const int64_t page_size = kPageSizes[data[0] % 3];
  CpuExecutor executor;
  PoolOptions options{kNumPages, page_size, FreePolicy::kLifo};
  options.max_pinned_pages_per_owner = kMaxPinned;
  absl::StatusOr<std::unique_ptr<PagePool>> pool =
      PagePool::Create(options, &executor);
  if (!pool.ok()) Fail("pool", pool.status());
  for (OwnerId owner = 1; owner <= kOwners; ++owner) {
    const absl::Status added = (*pool)->AddOwner(owner, 0);
    if (!added.ok()) Fail("AddOwner", added);
  }
  size_t at = 1;
  while (at + 2 <= size) {
    const uint8_t opcode = data[at];
    const size_t length = std::min<size_t>(data[at + 1], size - at - 2);
    const absl::string_view payload(
        reinterpret_cast<const char*>(data) + at + 2, length);
    at += 2 + length;
    Operate(**pool, page_size, opcode, payload);
    const absl::Status invariants = (*pool)->CheckInvariants();
    if (!invariants.ok()) Fail("invariants", invariants);
  }
  return 0;
}
