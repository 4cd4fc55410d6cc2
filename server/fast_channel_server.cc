#include "server/fast_channel_server.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/cpu_relax.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "fast_channel/futex.h"

namespace pagealloc {

using fast_channel::CallKind;
using fast_channel::Capacity;
using fast_channel::ChannelCodec;
using fast_channel::ChannelLayout;

struct FastChannelServer::Channel {
  Channel(uint64_t id, std::string session_token,
          std::unique_ptr<SharedRegion> shared, const Capacity& capacity)
      : session_id(id),
        token(std::move(session_token)),
        region(std::move(shared)),
        codec(region->base(), capacity) {}

  const uint64_t session_id;
  const std::string token;
  const std::unique_ptr<SharedRegion> region;
  // The capacity is the daemon's own record, never the header's.
  ChannelCodec codec;
  int poller = 0;  // the poller that serves this channel
  // Poller only: the last request_seq taken, and the call copied out of
  // shared memory (its arrays reused from call to call).
  uint32_t taken_seq = 0;
  fast_channel::TakenCall taken;
  // A call of this channel is being answered; the poller takes no other
  // (a client that posts again before its answer is not believed).
  std::atomic<bool> in_flight{false};
  std::unique_ptr<ChannelReply> reply;
};

// Answers one call into its channel through the codec: an allocation
// call's results straight into the answer arrays (Deliver), an operation's
// value into op_value; then publishes the answer and wakes a sleeping
// client.
class FastChannelServer::ChannelReply final : public AllocReply {
 public:
  explicit ChannelReply(Channel* channel) : channel_(channel) {}

  // Starts a call: keeps the channel alive until Complete.
  void Begin(std::shared_ptr<Channel> self, uint32_t seq) {
    self_ = std::move(self);
    seq_ = seq;
    delivered_ = false;
    set_value(0);
  }

  void Deliver(const AllocAnswer& answer) override {
    ChannelCodec& codec = channel_->codec;
    // Locals, so that the stores below (which the compiler must assume may
    // alias anything of their type) do not reload them every request.
    const int32_t n = static_cast<int32_t>(answer.results.size());
    const AllocResult* const results = answer.results.data();
    const int64_t* const ring_offsets = answer.ring_offsets.data();
    codec.BeginResults();
    for (int32_t i = 0; i < n; ++i) {
      const AllocResult& result = results[i];
      if (result.status.ok()) {
        codec.Accepted(i, ring_offsets[i], result.num_slots,
                       result.num_new_pages);
      } else {
        codec.Refused(i, result.status);
      }
    }
    codec.FinishResults(n, answer.ring_end, answer.pages_freed_first,
                        answer.launch->batch_requests,
                        answer.launch->launch_id);
    delivered_ = true;
  }

  void Complete(const absl::Status& status) override {
    // Copies first: once in_flight is cleared below, the poller may Begin
    // the channel's next call (if its client posts one early).
    const std::shared_ptr<Channel> keep = std::move(self_);
    const uint32_t seq = seq_;
    ChannelCodec& codec = channel_->codec;
    if (!status.ok()) {
      codec.WriteRefusal(status);
    } else if (!delivered_) {
      codec.WriteOpValue(value());
    }
    channel_->in_flight.store(false, std::memory_order_release);
    codec.Publish(seq);
  }

 private:
  Channel* const channel_;
  std::shared_ptr<Channel> self_;
  uint32_t seq_ = 0;
  bool delivered_ = false;
};

absl::StatusOr<std::unique_ptr<FastChannelServer>> FastChannelServer::Create(
    const Options& options, CallCore* core) {
  RETURN_IF_ERROR(fast_channel::ValidateCapacity(
      {options.max_requests, options.message_bytes}));
  std::random_device random;
  ASSIGN_OR_RETURN(
      std::unique_ptr<SharedRegion> doorbell,
      SharedRegion::Create(
          absl::StrFormat("%s.doorbell.%08x", options.shm_prefix, random()),
          sizeof(fast_channel::Doorbell), options.mode));
  auto server = std::unique_ptr<FastChannelServer>(
      new FastChannelServer(options, core, std::move(doorbell)));
  core->AddSessionObserver(server.get());
  return server;
}

FastChannelServer::FastChannelServer(const Options& options, CallCore* core,
                                     std::unique_ptr<SharedRegion> doorbell)
    : options_(options),
      core_(core),
      doorbell_region_(std::move(doorbell)),
      doorbell_(
          static_cast<fast_channel::Doorbell*>(doorbell_region_->base())) {
  for (int i = 0; i < std::max(1, options_.pollers); ++i) {
    pollers_.emplace_back([this, i] { Poll(i); });
  }
}

FastChannelServer::~FastChannelServer() { Stop(); }

void FastChannelServer::Stop() {
  stop_.store(true);
  fast_channel::FutexWakeAll(&doorbell_->seq);
  for (std::thread& poller : pollers_) {
    if (poller.joinable()) poller.join();
  }
}

absl::Status FastChannelServer::Open(uint64_t session_id,
                                     const std::string& session_token,
                                     v1::FastChannel* out) {
  const Capacity capacity{options_.max_requests, options_.message_bytes};
  const ChannelLayout layout(capacity.max_requests, capacity.message_bytes);
  std::random_device random;
  ASSIGN_OR_RETURN(std::unique_ptr<SharedRegion> region,
                   SharedRegion::Create(absl::StrFormat("%s.channel.%d.%08x",
                                                        options_.shm_prefix,
                                                        session_id, random()),
                                        layout.total_bytes, options_.mode));
  out->set_shm_name(region->name());
  out->set_doorbell_shm_name(doorbell_region_->name());
  out->set_max_requests(capacity.max_requests);
  out->set_message_bytes(capacity.message_bytes);
  auto channel = std::make_shared<Channel>(session_id, session_token,
                                           std::move(region), capacity);
  channel->codec.Initialize();
  channel->reply = std::make_unique<ChannelReply>(channel.get());
  absl::MutexLock lock(&mu_);
  channel->poller = next_poller_++ % std::max(1, options_.pollers);
  channels_[session_id] = std::move(channel);
  generation_.fetch_add(1);
  return absl::OkStatus();
}

bool FastChannelServer::HasChannel(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  return channels_.contains(session_id);
}

void FastChannelServer::Close(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(session_id);
  if (it == channels_.end()) return;
  // The name goes now; the memory when the poller and any call in flight
  // let go of the channel.
  it->second->region->Unlink();
  channels_.erase(it);
  generation_.fetch_add(1);
}

void FastChannelServer::Take(const std::shared_ptr<Channel>& channel,
                             uint32_t seq, std::vector<AllocCall>* prepared) {
  Channel& c = *channel;
  ChannelReply& reply = *c.reply;
  fast_channel::TakenCall& call = c.taken;
  c.taken_seq = seq;
  c.in_flight.store(true, std::memory_order_relaxed);
  const absl::Status taken = c.codec.TakeCall(&call);
  reply.Begin(channel, seq);
  if (!taken.ok()) {
    reply.Complete(taken);
    return;
  }
  calls_.fetch_add(1, std::memory_order_relaxed);
  const int32_t n = call.num_requests;
  auto prepare = [&](Method method, const CallArrays& arrays) {
    AllocCallInput input;
    input.method = method;
    input.transport = Transport::kFastChannel;
    input.session_id = c.session_id;
    input.session_token = c.token;
    input.arrays = arrays;
    input.release_ring_up_to = call.release_ring_up_to;
    input.async_completion =
        (call.options & fast_channel::kAsyncCompletion) != 0;
    input.checkpoint_first =
        (call.options & fast_channel::kCheckpointFirst) != 0;
    input.free_pages_first = call.free_first;
    AllocCall prepared_call;
    if (core_->PrepareAlloc(input, &reply, &prepared_call)) {
      prepared->push_back(prepared_call);
    }
  };
  switch (call.kind) {
    case CallKind::kExtend:
      prepare(Method::kAllocExtend, {RequestKind::kExtend, n, call.in0.data(),
                                     call.in1.data(), call.in2.data()});
      return;
    case CallKind::kDecode:
      prepare(Method::kAllocDecode, {RequestKind::kDecode, n, nullptr,
                                     call.in1.data(), call.in2.data()});
      return;
    case CallKind::kAlloc:
      prepare(Method::kAlloc,
              {RequestKind::kAlloc, n, nullptr, call.in1.data(), nullptr});
      return;
    case CallKind::kFreeSlots:
    case CallKind::kFreePages:
      // Runs as soon as the batcher takes it (possibly right here); the
      // values live in the channel's TakenCall until it completes.
      core_->SubmitFree(c.session_id, c.token,
                        call.kind == CallKind::kFreeSlots ? FreeUnit::kSlots
                                                          : FreeUnit::kPages,
                        call.in1, Transport::kFastChannel, &reply);
      return;
    case CallKind::kCheckpoint:
      core_->SubmitCheckpoint(c.session_id, c.token, Transport::kFastChannel,
                              &reply);
      return;
    case CallKind::kRollback:
      core_->SubmitRollback(c.session_id, c.token, Transport::kFastChannel,
                            &reply);
      return;
  }
}

void FastChannelServer::Poll(int index) {
  std::vector<std::shared_ptr<Channel>> channels;
  uint64_t seen_generation = ~uint64_t{0};
  std::vector<AllocCall> prepared;
  absl::Time last_call = absl::Now();
  auto posted = [](const Channel& c) {
    return !c.in_flight.load(std::memory_order_acquire) &&
           c.codec.PostedSeq() != c.taken_seq;
  };
  while (!stop_.load(std::memory_order_relaxed)) {
    const uint64_t generation = generation_.load();
    if (generation != seen_generation) {
      channels.clear();
      absl::MutexLock lock(&mu_);
      for (const auto& [id, channel] : channels_) {
        if (channel->poller == index) channels.push_back(channel);
      }
      seen_generation = generation;
    }
    bool took = false;
    for (const std::shared_ptr<Channel>& channel : channels) {
      if (!posted(*channel)) continue;
      took = true;
      Take(channel, channel->codec.PostedSeq(), &prepared);
    }
    if (took) {
      // Every call posted by now shares one launch (unless one is running).
      core_->SubmitPrepared(std::move(prepared));
      prepared.clear();
      last_call = absl::Now();
      continue;
    }
    if (absl::Now() - last_call < options_.spin) {
      CpuRelax();
      continue;
    }
    // Sleep on the doorbell. A client bumps request_seq, then the doorbell,
    // then reads pollers_sleeping; a poller counts itself in, then looks at
    // its channels once more: one of the two sees the other.
    const uint32_t bell = doorbell_->seq.load(std::memory_order_seq_cst);
    doorbell_->pollers_sleeping.fetch_add(1, std::memory_order_seq_cst);
    bool pending = generation_.load() != seen_generation;
    for (const std::shared_ptr<Channel>& channel : channels) {
      pending = pending || posted(*channel);
    }
    if (!pending && !stop_.load()) {
      sleeps_.fetch_add(1, std::memory_order_relaxed);
      // The timeout bounds how late a Close'd channel list is refreshed.
      fast_channel::FutexWait(&doorbell_->seq, bell, absl::Milliseconds(100));
    }
    doorbell_->pollers_sleeping.fetch_sub(1, std::memory_order_seq_cst);
    last_call = absl::Now();
  }
}

}  // namespace pagealloc
