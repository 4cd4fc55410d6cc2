#include "client/fast_channel_client.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/cpu_relax.h"
#include "common/status_macros.h"
#include "fast_channel/futex.h"

namespace pagealloc {

using fast_channel::Capacity;
using fast_channel::ChannelLayout;

absl::StatusOr<std::unique_ptr<FastChannelClient>> FastChannelClient::Map(
    const v1::FastChannel& description, UniqueFd channel, UniqueFd doorbell) {
  const Capacity capacity{description.max_requests(),
                          description.message_bytes()};
  if (!fast_channel::ValidateCapacity(capacity).ok()) {
    return absl::InternalError("the daemon described a malformed fast channel");
  }
  if (!doorbell.valid()) {
    return absl::FailedPreconditionError(
        "the daemon handed over no doorbell for the fast channel");
  }
  const ChannelLayout layout(capacity.max_requests, capacity.message_bytes);
  ASSIGN_OR_RETURN(std::unique_ptr<SharedRegion> region,
                   SharedRegion::FromFd(std::move(channel), layout.total_bytes,
                                        SharedRegion::Access::kReadWrite));
  auto client = std::unique_ptr<FastChannelClient>(
      new FastChannelClient(std::move(region), std::move(doorbell), capacity));
  RETURN_IF_ERROR(client->codec_.CheckHeader());
  return client;
}

FastChannelClient::FastChannelClient(std::unique_ptr<SharedRegion> channel,
                                     UniqueFd doorbell,
                                     const Capacity& capacity)
    : channel_region_(std::move(channel)),
      doorbell_(std::move(doorbell)),
      codec_(channel_region_->base(), capacity) {}

void FastChannelClient::WakeWaiter() {
  fast_channel::FutexWakeAll(&codec_.header()->response_seq);
}

absl::Status FastChannelClient::SessionLive(uint64_t session_id) const {
  if (!codec_.SessionEnded()) return absl::OkStatus();
  // The same words as the memory socket's message for the same end.
  return absl::NotFoundError(absl::StrFormat(
      "session %d ended (%s): its pages and slots are gone; register again",
      session_id, codec_.EndReason()));
}

absl::Status FastChannelClient::Call(const fast_channel::CallView& call,
                                     absl::Duration spin, absl::Time deadline,
                                     absl::FunctionRef<absl::Status()> alive) {
  const uint32_t seq = seq_ + 1;
  RETURN_IF_ERROR(codec_.PostCall(call, seq));
  seq_ = seq;
  // PostCall stored request_seq (seq_cst) before this load: either we see
  // the poller's flag or the poller sees the call (fast_channel/layout.h).
  if (codec_.PollerSleeping()) {
    const uint64_t one = 1;
    // Fails only when the counter is full, which wakes the poller anyway.
    (void)!write(doorbell_.get(), &one, sizeof(one));
  }
  // Spin (the usual answer comes within tens of microseconds), then sleep
  // on response_seq in short slices, watching the deadline and the session
  // (the memory socket's watcher notices a dead daemon and wakes us).
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
