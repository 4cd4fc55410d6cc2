// A session registered over gRPC whose fast channel a test maps by hand,
// the way an attacker would: no KeepAlive, no client library, every byte of
// the channel under the test's control.

#ifndef PAGEALLOC_TESTS_RAW_SESSION_H_
#define PAGEALLOC_TESTS_RAW_SESSION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "fast_channel/layout.h"
#include "memory/memory_socket.h"
#include "memory/shared_region.h"
#include "proto/pagealloc.grpc.pb.h"

namespace pagealloc::testing {

// A session registered over gRPC whose fast channel this test maps by hand:
// no KeepAlive, no client library, every byte under the test's control.
struct RawSession {
  v1::RegisterResponse registered;
  // The memory socket's connection, the doorbell and the ring (the
  // channel's memory went into `region`).
  memory_socket::SessionMemory memory;
  std::unique_ptr<SharedRegion> region;
  fast_channel::ChannelHeader* header = nullptr;
  std::optional<fast_channel::ChannelLayout> layout;
  uint32_t seq = 0;

  uint64_t id() const { return registered.session_id(); }
  char* base() { return static_cast<char*>(region->base()); }
  int64_t* array(size_t offset) {
    return reinterpret_cast<int64_t*>(base() + offset);
  }
  // Writes an Alloc of `n` requests of `tokens` each.
  void WriteAlloc(int n, int64_t tokens = 4);
  // Posts the call already written; rings the doorbell when asked.
  void Post(bool ring = true);
  void Ring();
  // Waits (bounded, generously) for the answer to the last post.
  bool Await(absl::Duration timeout = absl::Seconds(30));
  std::string CallMessage();
};

// Registers a session named `name` (quota_pages 0: none) with a fast
// channel through `stub`, receives its memory over the memory socket and
// maps the channel. Failures are test failures (EXPECT); the session is then
// incomplete (region null).
// A resumable session (RegisterRequest.resumable) is kept across its
// link's loss and the daemon's restart, for a Resume.
RawSession OpenRawSession(v1::PageAllocator::Stub& stub,
                          const std::string& name = "raw",
                          int64_t quota_pages = 0, bool resumable = false);

// The session's Alloc of one request of `tokens` over gRPC (its slots
// inline or in its ring); a failed call is a test failure.
v1::AllocResponse RawAlloc(v1::PageAllocator::Stub& stub, const RawSession& raw,
                           int64_t tokens, bool return_inline);

// The session's Alloc of `pages` whole pages of `page_size` tokens, their
// slots inline; returns the pages, in order (empty, and a test failure,
// when the call did not give them).
std::vector<int64_t> RawAllocPages(v1::PageAllocator::Stub& stub,
                                   const RawSession& raw, int64_t pages,
                                   int64_t page_size);

// The session's free of `pages` that waits for its release word to reach
// `value` (FreeRequest.release_value).
absl::Status FencedFree(v1::PageAllocator::Stub& stub, const RawSession& raw,
                        const std::vector<int64_t>& pages, uint64_t value);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_RAW_SESSION_H_
