// Fuzz target: decoding and validating wire calls, then running the decoded
// requests through a pool.
//
// Input: one selector byte (which message type, and the pool's page size),
// then the serialized message. Whatever the bytes, decoding must either
// refuse with INVALID_ARGUMENT and a message, or produce requests that each
// pass ValidateShape within the call limits; running them (or a Free) through
// a pool must keep every pool invariant.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "allocator/page_pool.h"
#include "kernels/cpu_executor.h"
#include "proto/pagealloc.pb.h"
#include "server/grpc_decoding.h"
#include "server/request_decoding.h"

namespace pagealloc {
namespace {

constexpr int64_t kNumPages = 64;
constexpr CallLimits kLimits{/*max_requests=*/64, /*max_slots=*/4096};
constexpr OwnerId kOwner = 1;
constexpr OwnerId kOther = 2;

[[noreturn]] void Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "request_decoding_fuzzer: %s: %s\n", what,
               status.ToString().c_str());
  std::abort();
}

void CheckRefusal(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kInvalidArgument ||
      status.message().empty()) {
    Fail("decoding refused with the wrong code or no message", status);
  }
}

// A pool where the caller owns pages 1..4 and another session pages 5..6,
// so that ownership paths are reachable.
std::unique_ptr<PagePool> MakePool(int64_t page_size, CpuExecutor* executor) {
  auto pool =
      PagePool::Create({kNumPages, page_size, FreePolicy::kLifo}, executor);
  if (!pool.ok()) Fail("pool", pool.status());
  (void)(*pool)->AddOwner(kOwner, 0);
  (void)(*pool)->AddOwner(kOther, 0);
  std::vector<int64_t> mine(4 * page_size), theirs(2 * page_size);
  AllocRequest a{RequestKind::kAlloc, kOwner, 0,          0,
                 4 * page_size,       -1,     mine.data()};
  AllocRequest b{RequestKind::kAlloc, kOther, 1, 0, 2 * page_size, -1,
                 theirs.data()};
  (void)(*pool)->Allocate({a, b});
  return *std::move(pool);
}

void Run(const DecodedCall& call, int64_t page_size) {
  if (static_cast<int64_t>(call.requests.size()) > kLimits.max_requests ||
      call.num_slots > kLimits.max_slots) {
    Fail("decoded call exceeds the limits", absl::OkStatus());
  }
  const PoolGeometry geometry{page_size, kNumPages};
  int64_t slots = 0;
  for (const AllocRequest& r : call.requests) {
    const absl::Status valid = ValidateShape(r, geometry);
    if (!valid.ok()) Fail("a decoded request is invalid", valid);
    slots += ToExtendShape(r).num_slots();
  }
  if (slots != call.num_slots) Fail("slot count", absl::OkStatus());
  CpuExecutor executor;
  std::unique_ptr<PagePool> pool = MakePool(page_size, &executor);
  std::vector<int64_t> out(call.num_slots);
  std::vector<AllocRequest> requests = call.requests;
  int64_t offset = 0;
  for (AllocRequest& r : requests) {
    r.destination = out.data() + offset;
    offset += ToExtendShape(r).num_slots();
  }
  for (const AllocResult& result : pool->Allocate(requests)) {
    if (result.status.code() == absl::StatusCode::kInternal) {
      Fail("allocation", result.status);
    }
  }
  const absl::Status invariants = pool->CheckInvariants();
  if (!invariants.ok()) Fail("invariants after allocation", invariants);
}

void RunFree(const v1::FreeRequest& call, int64_t page_size) {
  CpuExecutor executor;
  std::unique_ptr<PagePool> pool = MakePool(page_size, &executor);
  const PoolStats before = pool->Stats();
  const absl::StatusOr<int64_t> freed =
      call.slots_size() > 0 ? pool->FreeSlots(kOwner, call.slots())
                            : pool->FreePages(kOwner, call.pages());
  if (!freed.ok() && pool->Stats().used_pages != before.used_pages) {
    Fail("a refused free changed the pool", freed.status());
  }
  const absl::Status invariants = pool->CheckInvariants();
  if (!invariants.ok()) Fail("invariants after free", invariants);
}

}  // namespace
}  // namespace pagealloc

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pagealloc;  // NOLINT: a fuzz entry point
  if (size < 1) return 0;
  const int kind = data[0] % 4;
  static constexpr int64_t kPageSizes[] = {1, 2, 4, 16, 64};
  const int64_t page_size = kPageSizes[(data[0] / 4) % 5];
  const PoolGeometry geometry{page_size, kNumPages};
  const void* message = data + 1;
  const int length = static_cast<int>(size - 1);
  switch (kind) {
    case 0: {
      v1::AllocExtendRequest call;
      if (!call.ParseFromArray(message, length)) return 0;
      auto decoded = DecodeAllocExtend(call, kOwner, geometry, kLimits);
      decoded.ok() ? Run(*decoded, page_size) : CheckRefusal(decoded.status());
      break;
    }
    case 1: {
      v1::AllocDecodeRequest call;
      if (!call.ParseFromArray(message, length)) return 0;
      auto decoded = DecodeAllocDecode(call, kOwner, geometry, kLimits);
      decoded.ok() ? Run(*decoded, page_size) : CheckRefusal(decoded.status());
      break;
    }
    case 2: {
      v1::AllocRequest call;
      if (!call.ParseFromArray(message, length)) return 0;
      auto decoded = DecodeAlloc(call, kOwner, geometry, kLimits);
      decoded.ok() ? Run(*decoded, page_size) : CheckRefusal(decoded.status());
      break;
    }
    default: {
      v1::FreeRequest call;
      if (!call.ParseFromArray(message, length)) return 0;
      const absl::Status valid = ValidateFree(call);
      valid.ok() ? RunFree(call, page_size) : CheckRefusal(valid);
      break;
    }
  }
  return 0;
}
