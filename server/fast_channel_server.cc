#include "server/fast_channel_server.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "allocator/status_macros.h"
#include "server/logging.h"

namespace pagealloc {

using fast_channel::CallKind;
using fast_channel::ChannelHeader;
using fast_channel::ChannelLayout;
using fast_channel::SharedRegion;

struct FastChannelServer::Channel {
  Channel(uint64_t id, std::string session_token,
          std::unique_ptr<SharedRegion> shared, const ChannelLayout& parts)
      : session_id(id),
        token(std::move(session_token)),
        region(std::move(shared)),
        header(static_cast<ChannelHeader*>(region->base())),
        layout(parts) {}

  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(region->base()) + offset);
  }

  const uint64_t session_id;
  const std::string token;
  const std::unique_ptr<SharedRegion> region;
  ChannelHeader* const header;
  const ChannelLayout layout;
  int poller = 0;  // the poller that serves this channel
  // Poller only: the last request_seq taken.
  uint32_t taken_seq = 0;
  // A call of this channel is being answered; the poller takes no other
  // (a client that posts again before its answer is not believed).
  std::atomic<bool> in_flight{false};
  std::unique_ptr<ChannelReply> reply;
};

// Answers one call into its channel: the AllocResponse the service fills
// (packed form) is copied into the answer arrays, then response_seq is
// published and a sleeping client woken.
class FastChannelServer::ChannelReply final : public Reply {
 public:
  explicit ChannelReply(Channel* channel) : channel_(channel) {}

  // Starts a call: keeps the channel alive until Complete.
  void Begin(std::shared_ptr<Channel> self, uint32_t seq, CallKind kind) {
    self_ = std::move(self);
    seq_ = seq;
    kind_ = kind;
    response_.Clear();
    free_response_.Clear();
    rollback_response_.Clear();
  }
  v1::AllocResponse* response() { return &response_; }
  // Free, Checkpoint, Rollback: the request (which must outlive the
  // operation) and the response.
  v1::FreeRequest* free_request() { return &free_request_; }
  v1::FreeResponse* free_response() { return &free_response_; }
  v1::CheckpointRequest* checkpoint_request() { return &checkpoint_request_; }
  v1::RollbackRequest* rollback_request() { return &rollback_request_; }
  v1::RollbackResponse* rollback_response() { return &rollback_response_; }

  void Complete(const absl::Status& status) override {
    // Copies first: once in_flight is cleared below, the poller may Begin
    // the channel's next call (if its client posts one early).
    const std::shared_ptr<Channel> keep = std::move(self_);
    const uint32_t seq = seq_;
    Channel& c = *channel_;
    ChannelHeader* h = c.header;
    char* messages = c.At<char>(c.layout.messages);
    const int32_t capacity = h->message_bytes;
    int32_t used = 0;
    auto add_message = [&](absl::string_view text, bool length_prefixed) {
      const int32_t room = capacity - used - (length_prefixed ? 4 : 0);
      if (room <= 0) return;
      const int32_t n = std::min<int64_t>(text.size(), room);
      if (length_prefixed) {
        std::memcpy(messages + used, &n, 4);
        used += 4;
      }
      std::memcpy(messages + used, text.data(), n);
      used += n;
    };
    h->op_value = 0;
    if (!status.ok()) {
      h->call_code = static_cast<int32_t>(status.code());
      h->num_results = 0;
      add_message(status.message(), /*length_prefixed=*/false);
    } else if (fast_channel::IsOperation(kind_)) {
      h->call_code = 0;
      h->num_results = 0;
      h->op_value = kind_ == CallKind::kRollback
                        ? rollback_response_.pages_returned()
                        : free_response_.pages_freed();
    } else {
      const v1::PackedResults& packed = response_.packed();
      const int n = packed.codes_size();
      h->call_code = 0;
      h->num_results = n;
      std::copy(packed.codes().begin(), packed.codes().end(),
                c.At<int32_t>(c.layout.codes));
      std::copy(packed.ring_offsets().begin(), packed.ring_offsets().end(),
                c.At<int64_t>(c.layout.ring_offsets));
      std::copy(packed.counts().begin(), packed.counts().end(),
                c.At<int64_t>(c.layout.counts));
      std::copy(packed.new_pages().begin(), packed.new_pages().end(),
                c.At<int64_t>(c.layout.new_pages));
      for (const std::string& message : packed.messages()) {
        add_message(message, /*length_prefixed=*/true);
      }
      h->ring_end = response_.ring_end();
      h->batch_requests = response_.batch_requests();
      h->launch_id = response_.launch_id();
    }
    h->messages_used = used;
    c.in_flight.store(false, std::memory_order_release);
    h->response_seq.store(seq, std::memory_order_seq_cst);
    if (h->client_waiting.load(std::memory_order_seq_cst) != 0) {
      fast_channel::FutexWakeAll(&h->response_seq);
    }
  }

 private:
  Channel* const channel_;
  std::shared_ptr<Channel> self_;
  uint32_t seq_ = 0;
  CallKind kind_ = CallKind::kDecode;
  v1::AllocResponse response_;
  v1::FreeRequest free_request_;
  v1::FreeResponse free_response_;
  v1::CheckpointRequest checkpoint_request_;
  v1::RollbackRequest rollback_request_;
  v1::RollbackResponse rollback_response_;
};

absl::StatusOr<std::unique_ptr<FastChannelServer>> FastChannelServer::Create(
    const Options& options, PageAllocatorService* service) {
  if (options.max_requests < 1 || options.message_bytes < 64) {
    return absl::InvalidArgumentError(
        "fast channel: max_requests must be >= 1 and message_bytes >= 64");
  }
  std::random_device random;
  ASSIGN_OR_RETURN(
      std::unique_ptr<SharedRegion> doorbell,
      SharedRegion::Create(
          absl::StrFormat("%s.doorbell.%08x", options.shm_prefix, random()),
          sizeof(fast_channel::Doorbell), options.mode));
  return std::unique_ptr<FastChannelServer>(
      new FastChannelServer(options, service, std::move(doorbell)));
}

FastChannelServer::FastChannelServer(
    const Options& options, PageAllocatorService* service,
    std::unique_ptr<SharedRegion> doorbell)
    : options_(options),
      service_(service),
      doorbell_region_(std::move(doorbell)),
      doorbell_(static_cast<fast_channel::Doorbell*>(doorbell_region_->base())) {
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
  const ChannelLayout layout(options_.max_requests, options_.message_bytes);
  std::random_device random;
  ASSIGN_OR_RETURN(std::unique_ptr<SharedRegion> region,
                   SharedRegion::Create(
                       absl::StrFormat("%s.channel.%d.%08x",
                                       options_.shm_prefix, session_id,
                                       random()),
                       layout.total_bytes, options_.mode));
  auto* header = static_cast<ChannelHeader*>(region->base());
  header->magic = fast_channel::kMagic;
  header->version = fast_channel::kVersion;
  header->max_requests = options_.max_requests;
  header->message_bytes = options_.message_bytes;
  out->set_shm_name(region->name());
  out->set_doorbell_shm_name(doorbell_region_->name());
  out->set_max_requests(options_.max_requests);
  out->set_message_bytes(options_.message_bytes);
  auto channel = std::make_shared<Channel>(session_id, session_token,
                                           std::move(region), layout);
  channel->reply = std::make_unique<ChannelReply>(channel.get());
  absl::MutexLock lock(&mu_);
  channel->poller = next_poller_++ % std::max(1, options_.pollers);
  channels_[session_id] = std::move(channel);
  generation_.fetch_add(1);
  return absl::OkStatus();
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

bool FastChannelServer::Take(
    const std::shared_ptr<Channel>& channel, uint32_t seq,
    std::vector<PageAllocatorService::PreparedCall>* prepared) {
  Channel& c = *channel;
  const ChannelHeader* h = c.header;
  ChannelReply& reply = *c.reply;
  // Read each field once: the client may be writing (it must not, but a
  // daemon cannot rely on that). Everything below works on the copies.
  const uint32_t kind = h->kind;
  c.taken_seq = seq;
  c.in_flight.store(true, std::memory_order_relaxed);
  reply.Begin(channel, seq, static_cast<CallKind>(kind));
  const int32_t n = h->num_requests;
  const uint32_t options = h->options;
  const int64_t release_up_to = h->release_ring_up_to;
  if (!fast_channel::IsKnownKind(kind)) {
    reply.Complete(absl::InvalidArgumentError(
        absl::StrFormat("fast channel: unknown call kind %d", kind)));
    return false;
  }
  if (n < 0 || n > h->max_requests) {
    reply.Complete(absl::InvalidArgumentError(absl::StrFormat(
        "fast channel: num_requests (%d) is outside [0, %d]", n,
        options_.max_requests)));
    return false;
  }
  calls_.fetch_add(1, std::memory_order_relaxed);
  auto set_session = [&](v1::SessionRef* ref) {
    ref->set_session_id(c.session_id);
    ref->set_session_token(c.token);
  };
  auto fill_common = [&](auto* request) {
    set_session(request->mutable_session());
    v1::AllocOptions* wire = request->mutable_options();
    wire->set_async_completion((options & fast_channel::kAsyncCompletion) != 0);
    wire->set_release_ring_up_to(release_up_to);
    wire->set_packed_results(true);
  };
  auto copy = [&](size_t offset, google::protobuf::RepeatedField<int64_t>* to) {
    to->Resize(n, 0);
    std::memcpy(to->mutable_data(), c.At<int64_t>(offset),
                n * sizeof(int64_t));
  };
  std::optional<PageAllocatorService::PreparedCall> call;
  switch (static_cast<CallKind>(kind)) {
    case CallKind::kExtend: {
      v1::AllocExtendRequest request;
      fill_common(&request);
      copy(c.layout.in0, request.mutable_prefix_lens());
      copy(c.layout.in1, request.mutable_seq_lens());
      copy(c.layout.in2, request.mutable_last_locs());
      call = service_->PrepareAllocExtend(request, reply.response(), &reply);
      break;
    }
    case CallKind::kDecode: {
      v1::AllocDecodeRequest request;
      fill_common(&request);
      copy(c.layout.in1, request.mutable_seq_lens());
      copy(c.layout.in2, request.mutable_last_locs());
      call = service_->PrepareAllocDecode(request, reply.response(), &reply);
      break;
    }
    case CallKind::kAlloc: {
      v1::AllocRequest request;
      fill_common(&request);
      copy(c.layout.in1, request.mutable_num_tokens());
      call = service_->PrepareAlloc(request, reply.response(), &reply);
      break;
    }
    case CallKind::kFreeSlots:
    case CallKind::kFreePages: {
      // Runs as soon as the batcher takes it (possibly right here); the
      // request lives in the reply until it completes.
      v1::FreeRequest* request = reply.free_request();
      request->Clear();
      set_session(request->mutable_session());
      copy(c.layout.in1, static_cast<CallKind>(kind) == CallKind::kFreeSlots
                             ? request->mutable_slots()
                             : request->mutable_pages());
      service_->SubmitFree(*request, reply.free_response(), &reply);
      return false;
    }
    case CallKind::kCheckpoint: {
      v1::CheckpointRequest* request = reply.checkpoint_request();
      set_session(request->mutable_session());
      service_->SubmitCheckpoint(*request, &reply);
      return false;
    }
    case CallKind::kRollback: {
      v1::RollbackRequest* request = reply.rollback_request();
      set_session(request->mutable_session());
      service_->SubmitRollback(*request, reply.rollback_response(), &reply);
      return false;
    }
  }
  if (!call.has_value()) return false;  // refused and answered
  prepared->push_back(*std::move(call));
  return true;
}

void FastChannelServer::Poll(int index) {
  std::vector<std::shared_ptr<Channel>> channels;
  uint64_t seen_generation = ~uint64_t{0};
  std::vector<PageAllocatorService::PreparedCall> prepared;
  absl::Time last_call = absl::Now();
  auto posted = [](const Channel& c) {
    return !c.in_flight.load(std::memory_order_acquire) &&
           c.header->request_seq.load(std::memory_order_acquire) !=
               c.taken_seq;
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
      Take(channel,
           channel->header->request_seq.load(std::memory_order_acquire),
           &prepared);
    }
    if (took) {
      // Every call posted by now shares one launch (unless one is running).
      service_->SubmitPrepared(std::move(prepared));
      prepared.clear();
      last_call = absl::Now();
      continue;
    }
    if (absl::Now() - last_call < options_.spin) {
      fast_channel::CpuRelax();
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
