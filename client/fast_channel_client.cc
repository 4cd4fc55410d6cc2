#include "client/fast_channel_client.h"

#include <algorithm>
#include <utility>

#include "common/cpu_relax.h"
#include "common/status_macros.h"
#include "fast_channel/futex.h"

namespace pagealloc {

using fast_channel::Capacity;
using fast_channel::ChannelLayout;

absl::StatusOr<std::unique_ptr<FastChannelClient>> FastChannelClient::Map(
    const v1::FastChannel& description) {
  const Capacity capacity{description.max_requests(),
                          description.message_bytes()};
  if (!fast_channel::ValidateCapacity(capacity).ok()) {
    return absl::InternalError("the daemon described a malformed fast channel");
  }
  const ChannelLayout layout(capacity.max_requests, capacity.message_bytes);
  ASSIGN_OR_RETURN(
      std::unique_ptr<SharedRegion> channel,
      SharedRegion::Open(description.shm_name(), layout.total_bytes));
  ASSIGN_OR_RETURN(std::unique_ptr<SharedRegion> doorbell,
                   SharedRegion::Open(description.doorbell_shm_name(),
                                      sizeof(fast_channel::Doorbell)));
  auto client = std::unique_ptr<FastChannelClient>(
      new FastChannelClient(std::move(channel), std::move(doorbell), capacity));
  RETURN_IF_ERROR(client->codec_.CheckHeader());
  return client;
}

FastChannelClient::FastChannelClient(std::unique_ptr<SharedRegion> channel,
                                     std::unique_ptr<SharedRegion> doorbell,
                                     const Capacity& capacity)
    : channel_region_(std::move(channel)),
      doorbell_region_(std::move(doorbell)),
      codec_(channel_region_->base(), capacity),
      doorbell_(
          static_cast<fast_channel::Doorbell*>(doorbell_region_->base())) {}

absl::Status FastChannelClient::Call(const fast_channel::CallView& call,
                                     absl::Duration spin, absl::Time deadline,
                                     absl::FunctionRef<absl::Status()> alive) {
  const uint32_t seq = seq_ + 1;
  RETURN_IF_ERROR(codec_.PostCall(call, seq));
  seq_ = seq;
  doorbell_->seq.fetch_add(1, std::memory_order_seq_cst);
  if (doorbell_->pollers_sleeping.load(std::memory_order_seq_cst) != 0) {
    fast_channel::FutexWakeAll(&doorbell_->seq);
  }
  // Spin (the usual answer comes within tens of microseconds), then sleep
  // on response_seq in short slices, watching the deadline and the session
  // (the KeepAlive thread notices a dead daemon).
  fast_channel::ChannelHeader* h = codec_.header();
  const absl::Time start = absl::Now();
  while (!codec_.Answered(seq)) {
    const absl::Time now = absl::Now();
    if (now - start < spin) {
      CpuRelax();
      continue;
    }
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          "no answer on the fast channel before the call's deadline; later "
          "calls go through gRPC");
    }
    RETURN_IF_ERROR(alive());
    h->client_waiting.store(1, std::memory_order_seq_cst);
    const uint32_t seen = h->response_seq.load(std::memory_order_seq_cst);
    if (seen != seq) {
      fast_channel::FutexWait(&h->response_seq, seen,
                              std::min(deadline - now, absl::Milliseconds(50)));
    }
    h->client_waiting.store(0, std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

}  // namespace pagealloc
