#include "tests/hostile/hostile_channel_fixture.h"

#include <unistd.h>

#include <utility>

#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {

namespace fc = ::pagealloc::fast_channel;
namespace ms = ::pagealloc::memory_socket;

PoolSnapshot PoolSnapshot::Of(PagePool& pool) {
  PoolSnapshot snapshot;
  snapshot.free_list = pool.FreeList();
  snapshot.parked = pool.ParkedPages();
  const PoolStats stats = pool.Stats();
  snapshot.used_pages = stats.used_pages;
  snapshot.owner_of_page.resize(stats.total_pages + 1);
  for (int64_t page = 1; page <= stats.total_pages; ++page) {
    snapshot.owner_of_page[page] = pool.OwnerOf(page);
  }
  return snapshot;
}

ServerOptions HostileChannelTest::DefaultOptions() {
  ServerOptions options;
  options.backend = "cpu";
  options.pool = {64, 4, FreePolicy::kLifo};
  options.sessions.lease = absl::Seconds(10);
  options.sessions.default_ring_capacity_slots = 1024;
  options.batcher.max_batch_requests = 64;
  options.batcher.max_batch_tokens = 4096;
  options.batcher.spin = absl::ZeroDuration();
  options.batcher.batch_window = absl::ZeroDuration();
  options.fast_channel_pollers = 2;
  options.debug_checks = true;
  return options;
}

std::unique_ptr<Client> HostileChannelTest::Connect(const std::string& name,
                                                    ClientOptions options) {
  options.client_name = name;
  absl::StatusOr<std::unique_ptr<Client>> client = server_->Connect(options);
  EXPECT_OK(client.status());
  if (!client.ok()) return nullptr;
  EXPECT_TRUE((*client)->uses_fast_channel());
  return *std::move(client);
}

void HostileChannelTest::HonestRoundTrip(Client& client) {
  ASSERT_OK_AND_ASSIGN(Allocation a, client.Alloc({4}));
  ASSERT_OK(a[0].status);
  ASSERT_EQ(a[0].count, 4);
  std::vector<int64_t> slots(4);
  ASSERT_OK(client.CopyToHost(a[0].slots, 4, slots.data()));
  const int64_t page = slots[0] / 4;
  for (int i = 0; i < 4; ++i) ASSERT_EQ(slots[i], page * 4 + i);
  ASSERT_EQ(pool().OwnerOf(page), client.session_id());
  client.Release(a);
  ASSERT_THAT(client.FreeSlots(slots), IsOkAndHolds(1));
}

}  // namespace pagealloc::testing
