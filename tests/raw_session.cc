#include "tests/raw_session.h"

#include <unistd.h>

#include <utility>

#include "common/grpc_status.h"
#include "grpcpp/client_context.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {

namespace fc = ::pagealloc::fast_channel;
namespace ms = ::pagealloc::memory_socket;

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

RawSession OpenRawSession(v1::PageAllocator::Stub& stub,
                          const std::string& name, int64_t quota_pages,
                          bool resumable) {
  RawSession raw;
  v1::RegisterRequest request;
  request.set_client_name(name);
  request.set_quota_pages(quota_pages);
  request.set_resumable(resumable);
  request.set_fast_channel(true);
  grpc::ClientContext context;
  EXPECT_TRUE(stub.Register(&context, request, &raw.registered).ok());
  const v1::FastChannel& channel = raw.registered.fast_channel();
  raw.layout.emplace(channel.max_requests(), channel.message_bytes());
  absl::StatusOr<ms::SessionMemory> memory = ms::ReceiveSessionMemory(
      raw.registered.memory_socket(), raw.registered.session_id(),
      raw.registered.session_token(), absl::Seconds(30));
  EXPECT_OK(memory.status());
  if (!memory.ok()) return raw;
  raw.memory = *std::move(memory);
  EXPECT_TRUE(raw.memory.doorbell.valid());
  // The output ring: a memfd on the CPU backend, CUDA memory's POSIX file
  // descriptor on the CUDA one.
  EXPECT_TRUE(raw.memory.ring.valid() || raw.memory.cuda_ring.valid());
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

v1::AllocResponse RawAlloc(v1::PageAllocator::Stub& stub, const RawSession& raw,
                           int64_t tokens, bool return_inline) {
  v1::AllocRequest request;
  request.mutable_session()->set_session_id(raw.id());
  request.mutable_session()->set_session_token(raw.registered.session_token());
  request.add_num_tokens(tokens);
  request.mutable_options()->set_return_inline(return_inline);
  v1::AllocResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  EXPECT_TRUE(stub.Alloc(&context, request, &response).ok());
  return response;
}

std::vector<int64_t> RawAllocPages(v1::PageAllocator::Stub& stub,
                                   const RawSession& raw, int64_t pages,
                                   int64_t page_size) {
  const v1::AllocResponse allocated =
      RawAlloc(stub, raw, pages * page_size, /*return_inline=*/true);
  if (allocated.results_size() != 1 ||
      allocated.results(0).slots_size() != pages * page_size) {
    ADD_FAILURE() << "an Alloc of " << pages << " pages answered "
                  << allocated.ShortDebugString();
    return {};
  }
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < pages; ++i) {
    ids.push_back(allocated.results(0).slots(i * page_size) / page_size);
  }
  return ids;
}

absl::Status FencedFree(v1::PageAllocator::Stub& stub, const RawSession& raw,
                        const std::vector<int64_t>& pages, uint64_t value) {
  v1::FreeRequest request;
  request.mutable_session()->set_session_id(raw.id());
  request.mutable_session()->set_session_token(raw.registered.session_token());
  for (int64_t page : pages) request.add_pages(page);
  request.set_release_value(value);
  v1::FreeResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  return FromGrpcStatus(stub.Free(&context, request, &response));
}

}  // namespace pagealloc::testing
