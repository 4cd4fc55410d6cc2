#include "server/fast_channel_server.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/cpu_relax.h"
#include "common/logging.h"
#include "common/status_macros.h"

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

// Answers one call into its channel: an allocation call's results are
// written straight into the answer arrays (Deliver), an operation's into
// op_value; then response_seq is published and a sleeping client woken.
class FastChannelServer::ChannelReply final : public AllocReply {
 public:
  explicit ChannelReply(Channel* channel) : channel_(channel) {}

  // Starts a call: keeps the channel alive until Complete.
  void Begin(std::shared_ptr<Channel> self, uint32_t seq, CallKind kind) {
    self_ = std::move(self);
    seq_ = seq;
    kind_ = kind;
    delivered_ = false;
    messages_used_ = 0;
    free_response_.Clear();
    rollback_response_.Clear();
  }
  // The call's arrays, copied out of shared memory (so that validation
  // works on values the client can no longer change).
  int64_t* copy_of(int array, int32_t n) {
    std::vector<int64_t>& copy = arrays_[array];
    if (copy.size() < static_cast<size_t>(n)) copy.resize(n);
    return copy.data();
  }
  // Free, Checkpoint, Rollback: the request (which must outlive the
  // operation) and the response.
  v1::FreeRequest* free_request() { return &free_request_; }
  v1::FreeResponse* free_response() { return &free_response_; }
  v1::CheckpointRequest* checkpoint_request() { return &checkpoint_request_; }
  v1::RollbackRequest* rollback_request() { return &rollback_request_; }
  v1::RollbackResponse* rollback_response() { return &rollback_response_; }

  void Deliver(const AllocAnswer& answer) override {
    Channel& c = *channel_;
    ChannelHeader* h = c.header;
    // Locals, so that the stores below (which the compiler must assume may
    // alias anything of their type) do not reload them every request.
    const size_t n = answer.results.size();
    const AllocResult* const results = answer.results.data();
    const int64_t* const ring_offsets = answer.ring_offsets.data();
    int32_t* __restrict const codes = c.At<int32_t>(c.layout.codes);
    int64_t* __restrict const offsets = c.At<int64_t>(c.layout.ring_offsets);
    int64_t* __restrict const counts = c.At<int64_t>(c.layout.counts);
    int64_t* __restrict const new_pages = c.At<int64_t>(c.layout.new_pages);
    for (size_t i = 0; i < n; ++i) {
      const AllocResult& result = results[i];
      if (result.status.ok()) {
        codes[i] = 0;
        offsets[i] = ring_offsets[i];
        counts[i] = result.num_slots;
        new_pages[i] = result.num_new_pages;
      } else {
        codes[i] = static_cast<int32_t>(result.status.code());
        offsets[i] = 0;
        counts[i] = 0;
        new_pages[i] = 0;
        AddMessage(result.status.message(), /*length_prefixed=*/true);
      }
    }
    h->num_results = static_cast<int32_t>(n);
    h->ring_end = answer.ring_end;
    h->pages_freed_first = answer.pages_freed_first;
    h->batch_requests = answer.launch->batch_requests;
    h->launch_id = answer.launch->launch_id;
    delivered_ = true;
  }

  void Complete(const absl::Status& status) override {
    // Copies first: once in_flight is cleared below, the poller may Begin
    // the channel's next call (if its client posts one early).
    const std::shared_ptr<Channel> keep = std::move(self_);
    const uint32_t seq = seq_;
    Channel& c = *channel_;
    ChannelHeader* h = c.header;
    h->op_value = 0;
    if (!delivered_) h->pages_freed_first = 0;
    if (!status.ok()) {
      h->call_code = static_cast<int32_t>(status.code());
      h->num_results = 0;
      messages_used_ = 0;
      AddMessage(status.message(), /*length_prefixed=*/false);
    } else {
      h->call_code = 0;
      if (!delivered_) h->num_results = 0;
      if (kind_ == CallKind::kRollback) {
        h->op_value = rollback_response_.pages_returned();
      } else if (kind_ == CallKind::kFreeSlots ||
                 kind_ == CallKind::kFreePages) {
        h->op_value = free_response_.pages_freed();
      }
    }
    h->messages_used = messages_used_;
    c.in_flight.store(false, std::memory_order_release);
    h->response_seq.store(seq, std::memory_order_seq_cst);
    if (h->client_waiting.load(std::memory_order_seq_cst) != 0) {
      fast_channel::FutexWakeAll(&h->response_seq);
    }
  }

 private:
  // Appends to the message area, truncated to fit.
  void AddMessage(absl::string_view text, bool length_prefixed) {
    Channel& c = *channel_;
    char* messages = c.At<char>(c.layout.messages);
    const int32_t capacity = c.header->message_bytes;
    const int32_t room = capacity - messages_used_ - (length_prefixed ? 4 : 0);
    if (room <= 0) return;
    const int32_t n = std::min<int64_t>(text.size(), room);
    if (length_prefixed) {
      std::memcpy(messages + messages_used_, &n, 4);
      messages_used_ += 4;
    }
    std::memcpy(messages + messages_used_, text.data(), n);
    messages_used_ += n;
  }

  Channel* const channel_;
  std::shared_ptr<Channel> self_;
  uint32_t seq_ = 0;
  CallKind kind_ = CallKind::kDecode;
  bool delivered_ = false;
  int32_t messages_used_ = 0;
  std::vector<int64_t> arrays_[4];  // in0, in1, in2, free_first
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

FastChannelServer::FastChannelServer(const Options& options,
                                     PageAllocatorService* service,
                                     std::unique_ptr<SharedRegion> doorbell)
    : options_(options),
      service_(service),
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
  const ChannelLayout layout(options_.max_requests, options_.message_bytes);
  std::random_device random;
  ASSIGN_OR_RETURN(std::unique_ptr<SharedRegion> region,
                   SharedRegion::Create(absl::StrFormat("%s.channel.%d.%08x",
                                                        options_.shm_prefix,
                                                        session_id, random()),
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
  const int32_t num_free_first = h->num_free_first;
  if (!fast_channel::IsKnownKind(kind)) {
    reply.Complete(absl::InvalidArgumentError(
        absl::StrFormat("fast channel: unknown call kind %d", kind)));
    return false;
  }
  if (n < 0 || n > options_.max_requests) {
    reply.Complete(absl::InvalidArgumentError(
        absl::StrFormat("fast channel: num_requests (%d) is outside [0, %d]", n,
                        options_.max_requests)));
    return false;
  }
  if (num_free_first < 0 || num_free_first > options_.max_requests) {
    reply.Complete(absl::InvalidArgumentError(
        absl::StrFormat("fast channel: num_free_first (%d) is outside [0, %d]",
                        num_free_first, options_.max_requests)));
    return false;
  }
  calls_.fetch_add(1, std::memory_order_relaxed);
  auto set_session = [&](v1::SessionRef* ref) {
    ref->set_session_id(c.session_id);
    ref->set_session_token(c.token);
  };
  auto copy = [&](size_t offset, google::protobuf::RepeatedField<int64_t>* to) {
    to->Resize(n, 0);
    std::memcpy(to->mutable_data(), c.At<int64_t>(offset), n * sizeof(int64_t));
  };
  // An allocation call: its arrays copied out of shared memory, then
  // prepared exactly as a gRPC call is (PrepareAlloc).
  auto copy_in = [&](int array, size_t offset) {
    int64_t* copy = reply.copy_of(array, n);
    std::memcpy(copy, c.At<int64_t>(offset), n * sizeof(int64_t));
    return copy;
  };
  auto prepare = [&](Rpc rpc, const CallArrays& arrays) {
    AllocCallInput input;
    input.rpc = rpc;
    input.session_id = c.session_id;
    input.session_token = c.token;
    input.arrays = arrays;
    input.release_ring_up_to = release_up_to;
    input.async_completion = (options & fast_channel::kAsyncCompletion) != 0;
    input.checkpoint_first = (options & fast_channel::kCheckpointFirst) != 0;
    if (num_free_first > 0) {
      int64_t* pages = reply.copy_of(3, num_free_first);
      std::memcpy(pages, c.At<int64_t>(c.layout.free_first),
                  num_free_first * sizeof(int64_t));
      input.free_pages_first = absl::MakeConstSpan(pages, num_free_first);
    }
    return service_->PrepareAlloc(input, &reply);
  };
  const ChannelLayout& at = c.layout;
  std::optional<PageAllocatorService::PreparedCall> call;
  switch (static_cast<CallKind>(kind)) {
    case CallKind::kExtend:
      call = prepare(Rpc::kAllocExtend,
                     {RequestKind::kExtend, n, copy_in(0, at.in0),
                      copy_in(1, at.in1), copy_in(2, at.in2)});
      break;
    case CallKind::kDecode:
      call =
          prepare(Rpc::kAllocDecode, {RequestKind::kDecode, n, nullptr,
                                      copy_in(1, at.in1), copy_in(2, at.in2)});
      break;
    case CallKind::kAlloc:
      call = prepare(Rpc::kAlloc, {RequestKind::kAlloc, n, nullptr,
                                   copy_in(1, at.in1), nullptr});
      break;
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
           c.header->request_seq.load(std::memory_order_acquire) != c.taken_seq;
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
