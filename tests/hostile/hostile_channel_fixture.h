// What the hostile-channel tests share: an in-process daemon on the CPU
// backend, raw sessions that hold their fast channel's memory and doorbell
// the way an attacker would (mapped by hand, written field by field), honest
// clients of the client library as victims, and a snapshot of the pool to
// show that an attack changed nothing.

#ifndef PAGEALLOC_TESTS_HOSTILE_HOSTILE_CHANNEL_FIXTURE_H_
#define PAGEALLOC_TESTS_HOSTILE_HOSTILE_CHANNEL_FIXTURE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "allocator/page_pool.h"
#include "client/client.h"
#include "fast_channel/layout.h"
#include "gtest/gtest.h"
#include "memory/memory_socket.h"
#include "memory/shared_region.h"
#include "proto/pagealloc.grpc.pb.h"
#include "server/server.h"
#include "tests/in_process_server.h"

namespace pagealloc::testing {

// The pool as every session sees it: where each page is, and who owns it.
struct PoolSnapshot {
  std::vector<int64_t> free_list;
  std::vector<int64_t> parked;
  std::vector<uint64_t> owner_of_page;  // by page, 0 unused
  int64_t used_pages = 0;

  static PoolSnapshot Of(PagePool& pool);
  bool operator==(const PoolSnapshot& other) const {
    return free_list == other.free_list && parked == other.parked &&
           owner_of_page == other.owner_of_page &&
           used_pages == other.used_pages;
  }
};

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

class HostileChannelTest : public ::testing::Test {
 public:
  // cpu backend, 64 pages of 4 tokens, lease 10 s, rings of 1024 slots,
  // calls of at most 64 requests, a batcher driven by the submitting thread
  // with no window, two pollers, every invariant checked after each batch.
  static ServerOptions DefaultOptions();

 protected:
  void StartServer(const ServerOptions& options = DefaultOptions());
  // Stops and destroys the server; clients must be gone first.
  void StopServer();

  // An honest client of the client library (fast channel on).
  std::unique_ptr<Client> Connect(const std::string& name,
                                  ClientOptions options = {});
  // A raw session (quota_pages 0: none).
  RawSession OpenRaw(const std::string& name = "raw", int64_t quota_pages = 0);

  // One Alloc + Free of one page by an honest client, checked: OK, one
  // slot on a page of its own, freed again.
  void HonestRoundTrip(Client& client);

  InProcessServer& server() { return *server_; }
  PagePool& pool() { return server_->pool(); }
  FastChannelServer& fast_channels() {
    return *server_->server().fast_channels();
  }

  std::unique_ptr<InProcessServer> server_;
  std::unique_ptr<v1::PageAllocator::Stub> stub_;
};

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_HOSTILE_HOSTILE_CHANNEL_FIXTURE_H_
