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
#include "tests/raw_session.h"

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

class HostileChannelTest : public InProcessServerTest {
 public:
  // cpu backend, 64 pages of 4 tokens, lease 10 s, rings of 1024 slots,
  // calls of at most 64 requests, a batcher driven by the submitting thread
  // with no window, two pollers, every invariant checked after each batch.
  static ServerOptions DefaultOptions();

 protected:
  using InProcessServerTest::StartServer;
  void StartServer() { StartServer(DefaultOptions()); }

  // An honest client of the client library (fast channel on).
  std::unique_ptr<Client> Connect(const std::string& name,
                                  ClientOptions options = {});
  // A raw session (quota_pages 0: none): OpenRawSession.
  RawSession OpenRaw(const std::string& name = "raw", int64_t quota_pages = 0) {
    return OpenRawSession(*stub_, name, quota_pages);
  }

  // One Alloc + Free of one page by an honest client, checked: OK, one
  // slot on a page of its own, freed again.
  void HonestRoundTrip(Client& client);

  InProcessServer& server() { return *server_; }
  PagePool& pool() { return server_->pool(); }
  FastChannelServer& fast_channels() {
    return *server_->server().fast_channels();
  }
};

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_HOSTILE_HOSTILE_CHANNEL_FIXTURE_H_
