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

void RawSession::WriteAlloc(int n, int64_t tokens) {
  header->kind = static_cast<uint32_t>(fc::CallKind::kAlloc);
  header->num_requests = n;
  header->num_free_first = 0;
  header->options = 0;
  for (int i = 0; i < n; ++i) array(layout->in1)[i] = tokens;
}

void RawSession::Post(bool ring) {
  header->request_seq.store(++seq);
  if (ring) Ring();
}

void RawSession::Ring() {
  const uint64_t one = 1;
  ASSERT_EQ(write(memory.doorbell.get(), &one, sizeof(one)), 8);
}

bool RawSession::Await(absl::Duration timeout) {
  return WaitFor([&] { return header->response_seq.load() == seq; }, timeout,
                 absl::Microseconds(20));
}

std::string RawSession::CallMessage() {
  return std::string(base() + layout->messages, header->messages_used);
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

void HostileChannelTest::StartServer(const ServerOptions& options) {
  StopServer();
  ASSERT_OK_AND_ASSIGN(server_, InProcessServer::Start(options));
  stub_ = server_->NewStub();
}

void HostileChannelTest::StopServer() {
  stub_.reset();
  server_.reset();
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

RawSession HostileChannelTest::OpenRaw(const std::string& name,
                                       int64_t quota_pages) {
  RawSession raw;
  v1::RegisterRequest request;
  request.set_client_name(name);
  request.set_quota_pages(quota_pages);
  request.set_fast_channel(true);
  grpc::ClientContext context;
  EXPECT_TRUE(stub_->Register(&context, request, &raw.registered).ok());
  const v1::FastChannel& channel = raw.registered.fast_channel();
  raw.layout.emplace(channel.max_requests(), channel.message_bytes());
  absl::StatusOr<ms::SessionMemory> memory = ms::ReceiveSessionMemory(
      raw.registered.memory_socket(), raw.registered.session_id(),
      raw.registered.session_token(), absl::Seconds(30));
  EXPECT_OK(memory.status());
  if (!memory.ok()) return raw;
  raw.memory = *std::move(memory);
  EXPECT_TRUE(raw.memory.doorbell.valid());
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::FromFd(
      std::move(raw.memory.channel), raw.layout->total_bytes,
      SharedRegion::Access::kReadWrite);
  EXPECT_OK(region.status());
  if (region.ok()) {
    raw.region = *std::move(region);
    raw.header = static_cast<fc::ChannelHeader*>(raw.region->base());
  }
  return raw;
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
