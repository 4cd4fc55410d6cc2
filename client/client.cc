#include "client/client.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "client/fast_channel_client.h"
#include "client/ring_view.h"
#include "common/grpc_status.h"
#include "common/socket_location.h"
#include "common/status_macros.h"
#include "fast_channel/layout.h"
#include "memory/memory_socket.h"

namespace pagealloc {

RequestSlots Allocation::operator[](size_t i) const {
  RequestSlots request;
  if (codes_[i] != 0) {
    request.status =
        absl::Status(static_cast<absl::StatusCode>(codes_[i]), messages_[i]);
  }
  request.slots = slots_[i];
  request.count = counts_[i];
  request.new_pages = new_pages_[i];
  return request;
}

absl::Status Allocation::status() const {
  for (size_t i = 0; i < codes_.size(); ++i) {
    if (codes_[i] != 0) return (*this)[i].status;
  }
  return absl::OkStatus();
}

Client::Client(const ClientOptions& options) : options_(options) {}

grpc::ChannelArguments ClientChannelArguments() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return args;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ClientOptions& given) {
  ClientOptions options = given;
  if (options.channel == nullptr && options.target.empty()) {
    ASSIGN_OR_RETURN(options.target, FindDaemonTarget(0));
  }
  std::unique_ptr<Client> client(new Client(options));
  if (options.channel != nullptr) {
    client->channel_ = options.channel;
  } else {
    client->channel_ = grpc::CreateCustomChannel(
        options.target,
        options.credentials != nullptr ? options.credentials
                                       : grpc::InsecureChannelCredentials(),
        ClientChannelArguments());
  }
  client->stub_ = v1::PageAllocator::NewStub(client->channel_);
  v1::RegisterResponse registered;
  absl::Status status = client->Register(&registered);
  if (!status.ok()) return status;
  // Keep the lease from now on: mapping the ring can take longer than a
  // short lease (a fresh process creates its CUDA context there).
  client->keepalive_ = std::thread([c = client.get()] { c->KeepAliveLoop(); });
  // The session's memory, as descriptors over the memory socket. Out of
  // reach (another host or container, a daemon with no Unix socket), the
  // session still works over gRPC where its backend allows.
  memory_socket::SessionMemory memory;
  const std::string path = client->MemorySocketPath(registered);
  absl::Status received = absl::UnavailableError(
      "the daemon names no memory socket (it listens on no Unix socket)");
  if (!path.empty()) {
    absl::StatusOr<memory_socket::SessionMemory> got =
        memory_socket::ReceiveSessionMemory(path, client->session_id_,
                                            client->session_token_,
                                            options.call_timeout);
    if (got.ok()) {
      memory = *std::move(got);
      received = absl::OkStatus();
    } else if (got.status().code() != absl::StatusCode::kUnavailable) {
      // The daemon refused the session its memory: say why.
      (void)client->Close();
      return got.status();
    } else {
      received = got.status();
    }
  }
  const bool cuda = client->pool_.backend() == v1::BACKEND_CUDA;
  UniqueFd& ring_fd = cuda ? memory.cuda_ring : memory.ring;
  const uint64_t ring_bytes = cuda ? memory.cuda_ring_bytes : memory.ring_bytes;
  if (!ring_fd.valid() || (cuda && !memory.completion_counter.valid())) {
    (void)client->Close();
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot map the output ring: %s (a client must run on the daemon's "
        "host and reach its memory socket; in a container, mount the "
        "daemon's socket directory)",
        received.ok() ? "the daemon's memory socket sent no ring"
                      : received.message()));
  }
  absl::StatusOr<std::unique_ptr<RingView>> mapped =
      MapRing(client->pool_, registered.ring(), std::move(ring_fd), ring_bytes);
  if (!mapped.ok()) {
    (void)client->Close();  // give the session back at once
    return mapped.status();
  }
  client->ring_ = *std::move(mapped);
  if (cuda) {
    absl::StatusOr<std::unique_ptr<CompletionCounter>> counter =
        MapCompletionCounter(client->pool_,
                             std::move(memory.completion_counter),
                             memory.completion_counter_bytes);
    if (!counter.ok()) {
      (void)client->Close();
      return counter.status();
    }
    client->completion_counter_ = *std::move(counter);
  }
  if (options.map_kv_slab && client->pool_.has_kv_slab()) {
    if (!memory.kv_slab.valid()) {
      (void)client->Close();
      return absl::FailedPreconditionError(absl::StrFormat(
          "cannot map the pool's KV slab: %s (the daemon owns the KV memory; "
          "a client must run on its host and reach its memory socket)",
          received.ok() ? "the daemon handed over none" : received.message()));
    }
    absl::StatusOr<std::unique_ptr<KvSlabView>> slab = KvSlabView::Map(
        client->pool_, std::move(memory.kv_slab), memory.kv_slab_bytes);
    if (!slab.ok()) {
      (void)client->Close();
      return slab.status();
    }
    client->kv_slab_ = *std::move(slab);
  }
  if (registered.has_fast_channel() && memory.channel.valid()) {
    // Without it calls simply go through gRPC.
    absl::StatusOr<std::unique_ptr<FastChannelClient>> fast =
        FastChannelClient::Map(registered.fast_channel(),
                               std::move(memory.channel),
                               std::move(memory.doorbell));
    if (fast.ok()) client->fast_ = *std::move(fast);
  }
  if (client->fast_ != nullptr) {
    // Without it fenced frees fail and say why; the rest works.
    absl::StatusOr<std::unique_ptr<ReleaseWordWriter>> writer =
        MapReleaseWord(client->pool_, client->fast_->codec().release_word());
    if (writer.ok()) {
      client->release_writer_ = *std::move(writer);
    } else {
      client->release_writer_status_ = writer.status();
    }
  } else {
    client->release_writer_status_ = absl::FailedPreconditionError(
        "this session has no fast channel (the daemon's memory socket is "
        "out of reach, or fast_channel is off): it has no release word, so "
        "frees cannot be fenced on a stream; free after the work that "
        "reads the pages is done");
  }
  if (memory.connection.valid()) {
    client->stop_watching_.reset(eventfd(0, EFD_CLOEXEC));
    if (!client->stop_watching_.valid()) {
      (void)client->Close();
      return absl::InternalError(
          absl::StrFormat("eventfd failed: %s", std::strerror(errno)));
    }
    client->memory_connection_ = std::move(memory.connection);
    client->watcher_ = std::thread([c = client.get()] { c->WatchDaemon(); });
  }
  return client;
}

std::string Client::MemorySocketPath(
    const v1::RegisterResponse& registered) const {
  // The daemon's path is as its own file system sees it; beside our Unix
  // target is the same socket as ours sees it (a mounted directory).
  absl::string_view target = options_.target;
  if (options_.channel == nullptr && (absl::ConsumePrefix(&target, "unix://") ||
                                      absl::ConsumePrefix(&target, "unix:"))) {
    return memory_socket::MemorySocketPath(target);
  }
  return registered.memory_socket();
}

const std::vector<KvBuffer>& Client::kv_buffers() const {
  static const std::vector<KvBuffer>* const kNone = new std::vector<KvBuffer>();
  return kv_slab_ != nullptr ? kv_slab_->buffers() : *kNone;
}

void Client::WatchDaemon() {
  pollfd watched[2] = {{memory_connection_.get(), POLLIN | POLLRDHUP, 0},
                       {stop_watching_.get(), POLLIN, 0}};
  while (true) {
    if (poll(watched, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (watched[1].revents != 0) return;
    if (watched[0].revents != 0) break;
  }
  // The daemon ended the session (and said why) or went away.
  MarkGone(memory_socket::ReadSessionEnd(memory_connection_.get()));
  if (fast_ != nullptr) fast_->WakeWaiter();
  StopKeepAlive();
}

void Client::StopWatching() {
  if (!watcher_.joinable()) return;
  const uint64_t one = 1;
  (void)!write(stop_watching_.get(), &one, sizeof(one));
  watcher_.join();
}

Client::~Client() {
  (void)Close();
  StopKeepAlive();
  if (keepalive_.joinable()) keepalive_.join();
  StopWatching();
}

void Client::StopKeepAlive() {
  absl::MutexLock lock(&mu_);
  if (!stop_keepalive_.HasBeenNotified()) stop_keepalive_.Notify();
  // A stream blocked in Read (a hung daemon) would otherwise hold the join.
  if (keepalive_context_ != nullptr) keepalive_context_->TryCancel();
}

std::unique_ptr<grpc::ClientContext> Client::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(
      absl::ToChronoTime(absl::Now() + options_.call_timeout));
  return context;
}

v1::SessionRef Client::Ref() const {
  v1::SessionRef ref;
  ref.set_session_id(session_id_);
  ref.set_session_token(session_token_);
  return ref;
}

absl::Status Client::Register(v1::RegisterResponse* response) {
  v1::RegisterRequest request;
  request.set_client_name(options_.client_name);
  request.set_ring_capacity_slots(options_.ring_capacity_slots);
  request.set_quota_pages(options_.quota_pages);
  request.set_fast_channel(options_.fast_channel);
  request.set_register_secret(options_.register_secret);
  auto context = NewContext();
  absl::Status status =
      FromGrpcStatus(stub_->Register(context.get(), request, response));
  if (!status.ok()) return status;
  session_id_ = response->session_id();
  session_token_ = response->session_token();
  pool_ = response->pool();
  lease_ms_ = response->lease_ms();
  quota_pages_ = response->quota_pages();
  return absl::OkStatus();
}

void Client::KeepAliveLoop() {
  const absl::Duration interval =
      options_.keepalive_interval > absl::ZeroDuration()
          ? options_.keepalive_interval
          : absl::Milliseconds(std::max<int64_t>(lease_ms_ / 3, 1));
  absl::Time renewed = absl::Now();
  while (!stop_keepalive_.HasBeenNotified()) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stop_keepalive_.HasBeenNotified()) return;
      keepalive_context_ = &context;
    }
    // Unpublishes the context before it goes out of scope, on every path.
    struct Unpublish {
      Client* client;
      ~Unpublish() {
        absl::MutexLock lock(&client->mu_);
        client->keepalive_context_ = nullptr;
      }
    } unpublish{this};
    auto stream = stub_->KeepAlive(&context);
    v1::KeepAliveRequest ping;
    *ping.mutable_session() = Ref();
    v1::KeepAliveResponse pong;
    while (stream->Write(ping) && stream->Read(&pong)) {
      renewed = absl::Now();
      if (stop_keepalive_.WaitForNotificationWithTimeout(interval)) {
        context.TryCancel();
        return;
      }
    }
    context.TryCancel();
    const absl::Status ended = FromGrpcStatus(stream->Finish());
    if (ended.code() == absl::StatusCode::kNotFound ||
        ended.code() == absl::StatusCode::kUnauthenticated) {
      MarkGone(ended);
      return;
    }
    if (absl::Now() - renewed > absl::Milliseconds(lease_ms_)) {
      MarkGone(absl::UnavailableError(absl::StrFormat(
          "lost contact with the daemon for longer than the %d ms lease "
          "(last error: %s); the session and its slots are gone",
          lease_ms_, ended.ToString())));
      return;
    }
    // A passing failure: try again while the lease may still hold.
    if (stop_keepalive_.WaitForNotificationWithTimeout(interval / 4)) return;
  }
}

absl::Status Client::Observe(absl::Status status) {
  // The daemon names the session when it no longer knows it (expired lease,
  // daemon restarted); a wrong token cannot heal either.
  const bool gone = (status.code() == absl::StatusCode::kNotFound &&
                     absl::StrContains(status.message(), "session")) ||
                    status.code() == absl::StatusCode::kUnauthenticated;
  if (gone) MarkGone(status);
  return status;
}

void Client::MarkGone(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (session_status_.ok()) session_status_ = why;
}

absl::Status Client::Fence() {
  if (fast_ == nullptr) return absl::OkStatus();
  // Loaded after the answer was read: clear, the answer was read while the
  // session still owned its pages (the daemon sets the flag before it
  // frees any).
  absl::Status live = fast_->SessionLive(session_id_);
  if (!live.ok()) MarkGone(live);
  return live;
}

absl::Status Client::session_status() const {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::FailedPreconditionError("the session was closed");
  return session_status_;
}

template <typename Request, typename Method>
absl::StatusOr<Allocation> Client::CallAlloc(Request& request,
                                             const CallOptions& options,
                                             Method method) {
  if (absl::Status alive = session_status(); !alive.ok()) return alive;
  *request.mutable_session() = Ref();
  v1::AllocOptions* wire = request.mutable_options();
  wire->set_return_inline(options.return_inline);
  wire->set_async_completion(options.async_completion);
  wire->set_packed_results(true);
  wire->mutable_free_pages_first()->Add(options.free_pages_first.begin(),
                                        options.free_pages_first.end());
  wire->set_checkpoint_first(options.checkpoint_first);
  wire->set_all_or_nothing(options.all_or_nothing);
  {
    absl::MutexLock lock(&mu_);
    wire->set_release_ring_up_to(release_up_to_);
  }
  v1::AllocResponse response;
  auto context = NewContext();
  absl::Status status = Observe(FromGrpcStatus(
      (stub_.get()->*method)(context.get(), request, &response)));
  if (!status.ok()) return status;
  const v1::PackedResults& packed = response.packed();
  AnswerArrays answer;
  answer.codes = packed.codes();
  answer.ring_offsets = packed.ring_offsets();
  answer.counts = packed.counts();
  answer.new_pages = packed.new_pages();
  answer.messages.assign(packed.messages().begin(), packed.messages().end());
  answer.inline_slots = packed.slots();
  answer.ring_end = response.ring_end();
  answer.pages_freed_first = response.pages_freed_first();
  answer.batch_requests = response.batch_requests();
  answer.completion_value = response.completion_value();
  return Fenced(ToAllocation(answer, options));
}

absl::StatusOr<Allocation> Client::ToAllocation(
    const AnswerArrays& answer, const CallOptions& options) const {
  Allocation allocation;
  allocation.ring_end_ = answer.ring_end;
  allocation.pages_freed_first_ = answer.pages_freed_first;
  allocation.batch_requests_ = answer.batch_requests;
  allocation.completion_value_ = answer.completion_value;
  allocation.on_device_ = !options.return_inline && ring_->on_device();
  // The counter only grows: keep the largest value for
  // OrderAfterCompletion.
  uint64_t seen = last_completion_value_.load(std::memory_order_relaxed);
  while (seen < answer.completion_value &&
         !last_completion_value_.compare_exchange_weak(
             seen, answer.completion_value, std::memory_order_relaxed)) {
  }
  // The answer is untrusted input: every array must have one entry per
  // request, messages one per refusal, slots exactly the accepted counts,
  // and every ring range must lie inside the ring.
  const int n = answer.codes.size();
  auto malformed = [](const std::string& what) {
    return absl::InternalError("the daemon's answer is malformed: " + what);
  };
  if (static_cast<int>(answer.ring_offsets.size()) != n ||
      static_cast<int>(answer.counts.size()) != n ||
      static_cast<int>(answer.new_pages.size()) != n) {
    return malformed(absl::StrFormat(
        "arrays of %d codes, %d ring_offsets, %d counts, %d new_pages", n,
        answer.ring_offsets.size(), answer.counts.size(),
        answer.new_pages.size()));
  }
  allocation.codes_.assign(n, 0);
  allocation.slots_.assign(n, nullptr);
  allocation.counts_.assign(n, 0);
  allocation.new_pages_.assign(answer.new_pages.begin(),
                               answer.new_pages.end());
  allocation.messages_.resize(n);
  allocation.inline_slots_.assign(answer.inline_slots.begin(),
                                  answer.inline_slots.end());
  size_t next_message = 0;
  int64_t inline_at = 0;
  const int64_t* run_start = nullptr;
  const int64_t* run_end = nullptr;
  bool one_run = true;
  for (int i = 0; i < n; ++i) {
    if (answer.codes[i] != 0) {
      if (next_message >= answer.messages.size()) {
        return malformed(
            absl::StrFormat("no message for refused request %d", i));
      }
      allocation.codes_[i] = answer.codes[i];
      allocation.messages_[i] = std::string(answer.messages[next_message++]);
      ++allocation.num_refused_;
      continue;
    }
    const int64_t count = answer.counts[i];
    const int64_t* slots = nullptr;
    if (options.return_inline) {
      if (count < 0 ||
          inline_at + count >
              static_cast<int64_t>(allocation.inline_slots_.size())) {
        return malformed(absl::StrFormat(
            "request %d claims %d inline slots past the %d sent", i, count,
            allocation.inline_slots_.size()));
      }
      slots = allocation.inline_slots_.data() + inline_at;
      inline_at += count;
    } else {
      const int64_t offset = answer.ring_offsets[i];
      if (offset < 0 || count < 0 || offset + count > ring_->capacity_slots()) {
        return absl::InternalError(absl::StrFormat(
            "the daemon answered request %d with ring range [%d, %d) outside "
            "the %d-slot ring",
            i, offset, offset + count, ring_->capacity_slots()));
      }
      slots = ring_->slots() + offset;
    }
    allocation.slots_[i] = slots;
    allocation.counts_[i] = count;
    // The accepted requests' slots as one run when each (non-empty) one
    // starts where the one before ended.
    if (count == 0) continue;
    if (run_start == nullptr) {
      run_start = slots;
    } else if (slots != run_end) {
      one_run = false;
    }
    run_end = slots + count;
  }
  allocation.all_slots_ = one_run ? run_start : nullptr;
  allocation.num_slots_ = !one_run               ? -1
                          : run_start == nullptr ? 0
                                                 : run_end - run_start;
  return allocation;
}

absl::StatusOr<Allocation> Client::AllocExtend(
    absl::Span<const int64_t> prefix_lens, absl::Span<const int64_t> seq_lens,
    absl::Span<const int64_t> last_locs, const CallOptions& options) {
  if (auto fast = FastCall(fast_channel::CallKind::kExtend, prefix_lens,
                           seq_lens, last_locs, options)) {
    return *std::move(fast);
  }
  v1::AllocExtendRequest request;
  request.mutable_prefix_lens()->Add(prefix_lens.begin(), prefix_lens.end());
  request.mutable_seq_lens()->Add(seq_lens.begin(), seq_lens.end());
  request.mutable_last_locs()->Add(last_locs.begin(), last_locs.end());
  return CallAlloc(request, options, &v1::PageAllocator::Stub::AllocExtend);
}

absl::StatusOr<Allocation> Client::AllocDecode(
    absl::Span<const int64_t> seq_lens, absl::Span<const int64_t> last_locs,
    const CallOptions& options) {
  if (auto fast = FastCall(fast_channel::CallKind::kDecode, {}, seq_lens,
                           last_locs, options)) {
    return *std::move(fast);
  }
  v1::AllocDecodeRequest request;
  request.mutable_seq_lens()->Add(seq_lens.begin(), seq_lens.end());
  request.mutable_last_locs()->Add(last_locs.begin(), last_locs.end());
  return CallAlloc(request, options, &v1::PageAllocator::Stub::AllocDecode);
}

absl::StatusOr<Allocation> Client::Alloc(absl::Span<const int64_t> num_tokens,
                                         const CallOptions& options) {
  if (auto fast = FastCall(fast_channel::CallKind::kAlloc, {}, num_tokens, {},
                           options)) {
    return *std::move(fast);
  }
  v1::AllocRequest request;
  request.mutable_num_tokens()->Add(num_tokens.begin(), num_tokens.end());
  return CallAlloc(request, options, &v1::PageAllocator::Stub::Alloc);
}

absl::Status Client::PostFastCall(const fast_channel::CallView& posted) {
  if (absl::Status alive = session_status(); !alive.ok()) return alive;
  // A channel whose session ended is answered no more: fail at once.
  RETURN_IF_ERROR(Fence());
  fast_channel::CallView call = posted;
  {
    absl::MutexLock lock(&mu_);
    call.release_ring_up_to = release_up_to_;
  }
  const absl::Status answered = fast_->Call(
      call, options_.fast_channel_spin, absl::Now() + options_.call_timeout,
      [this] { return session_status(); });
  if (!answered.ok()) {
    fast_abandoned_ = true;
    return answered;
  }
  return Observe(fast_->codec().CallStatus());
}

std::optional<absl::StatusOr<int64_t>> Client::FastOp(
    fast_channel::CallKind kind, absl::Span<const int64_t> values,
    uint32_t option_bits, uint64_t release_value) {
  if (fast_ == nullptr ||
      values.size() > static_cast<size_t>(fast_->max_requests())) {
    return std::nullopt;
  }
  absl::MutexLock fast_lock(&fast_mu_);
  if (fast_abandoned_) return std::nullopt;
  fast_channel::CallView call;
  call.kind = kind;
  call.options = option_bits;
  call.in1 = values;
  call.release_value = release_value;
  if (absl::Status posted = PostFastCall(call); !posted.ok()) return posted;
  return Fenced<int64_t>(fast_->codec().OpValue());
}

std::optional<absl::StatusOr<std::vector<int64_t>>> Client::FastMatch(
    absl::Span<const std::string> keys, bool adopt) {
  if (fast_ == nullptr ||
      keys.size() > static_cast<size_t>(fast_->max_requests())) {
    return std::nullopt;
  }
  for (const std::string& key : keys) {
    if (key.size() != static_cast<size_t>(fast_channel::kKeyBytes)) {
      return std::nullopt;
    }
  }
  absl::MutexLock fast_lock(&fast_mu_);
  if (fast_abandoned_) return std::nullopt;
  fast_channel::CallView call;
  call.kind = fast_channel::CallKind::kMatchPrefix;
  call.options = adopt ? fast_channel::kAdopt : 0;
  call.keys = keys;
  if (absl::Status posted = PostFastCall(call); !posted.ok()) return posted;
  absl::StatusOr<absl::Span<const int64_t>> pages =
      fast_->codec().ReadMatchedPages(static_cast<int32_t>(keys.size()));
  if (!pages.ok()) return pages.status();
  return Fenced<std::vector<int64_t>>(
      std::vector<int64_t>(pages->begin(), pages->end()));
}

std::optional<absl::StatusOr<Allocation>> Client::FastCall(
    fast_channel::CallKind kind, absl::Span<const int64_t> in0,
    absl::Span<const int64_t> in1, absl::Span<const int64_t> in2,
    const CallOptions& options) {
  if (fast_ == nullptr || options.return_inline) return std::nullopt;
  // Parallel arrays of different lengths are the daemon's to refuse, with
  // its message; gRPC carries them as they are.
  const size_t n = std::max({in0.size(), in1.size(), in2.size()});
  const size_t capacity = fast_->max_requests();
  if (n > capacity || options.free_pages_first.size() > capacity ||
      (!in0.empty() && in0.size() != n) || in1.size() != n ||
      (!in2.empty() && in2.size() != n) ||
      (kind == fast_channel::CallKind::kExtend && in0.size() != n) ||
      (kind != fast_channel::CallKind::kAlloc && in2.size() != n)) {
    return std::nullopt;
  }
  absl::MutexLock fast_lock(&fast_mu_);
  if (fast_abandoned_) return std::nullopt;
  const uint32_t option_bits =
      (options.async_completion ? fast_channel::kAsyncCompletion : 0) |
      (options.checkpoint_first ? fast_channel::kCheckpointFirst : 0) |
      (options.all_or_nothing ? fast_channel::kAllOrNothing : 0);
  fast_channel::CallView call;
  call.kind = kind;
  call.options = option_bits;
  call.in0 = in0;
  call.in1 = in1;
  call.in2 = in2;
  call.free_first = options.free_pages_first;
  if (absl::Status posted = PostFastCall(call); !posted.ok()) return posted;
  fast_channel::AllocAnswerView view;
  if (absl::Status read = fast_->codec().ReadAllocAnswer(n, &view);
      !read.ok()) {
    return read;
  }
  AnswerArrays answer;
  answer.codes = view.codes;
  answer.ring_offsets = view.ring_offsets;
  answer.counts = view.counts;
  answer.new_pages = view.new_pages;
  answer.messages.assign(view.messages.begin(), view.messages.end());
  answer.ring_end = view.ring_end;
  answer.pages_freed_first = view.pages_freed_first;
  answer.batch_requests = view.batch_requests;
  answer.completion_value = view.completion_value;
  return Fenced(ToAllocation(answer, options));
}

absl::StatusOr<int64_t> Client::SendFree(v1::FreeRequest& request) {
  if (absl::Status alive = session_status(); !alive.ok()) return alive;
  *request.mutable_session() = Ref();
  v1::FreeResponse response;
  auto context = NewContext();
  absl::Status status =
      Observe(FromGrpcStatus(stub_->Free(context.get(), request, &response)));
  if (!status.ok()) return status;
  return Fenced<int64_t>(response.pages_freed());
}

namespace {

uint32_t FreeOrderBits(v1::FreeOrder order) {
  switch (order) {
    case v1::FREE_ORDER_ASCENDING:
      return fast_channel::kFreeAscending;
    case v1::FREE_ORDER_FIRST_APPEARANCE:
      return fast_channel::kFreeFirstAppearance;
    default:
      return 0;
  }
}

}  // namespace

absl::StatusOr<int64_t> Client::FreeSlots(absl::Span<const int64_t> slots) {
  return FreeSlots(slots, v1::FREE_ORDER_DEFAULT);
}

absl::StatusOr<int64_t> Client::FreePages(absl::Span<const int64_t> pages) {
  return FreePages(pages, v1::FREE_ORDER_DEFAULT);
}

absl::StatusOr<int64_t> Client::FreeSlots(absl::Span<const int64_t> slots,
                                          v1::FreeOrder order) {
  return Free(/*slots=*/true, slots, order, /*release_value=*/0);
}

absl::StatusOr<int64_t> Client::FreePages(absl::Span<const int64_t> pages,
                                          v1::FreeOrder order) {
  return Free(/*slots=*/false, pages, order, /*release_value=*/0);
}

absl::StatusOr<int64_t> Client::Free(bool slots,
                                     absl::Span<const int64_t> values,
                                     v1::FreeOrder order,
                                     uint64_t release_value) {
  if (auto fast = FastOp(slots ? fast_channel::CallKind::kFreeSlots
                               : fast_channel::CallKind::kFreePages,
                         values, FreeOrderBits(order), release_value)) {
    return *std::move(fast);
  }
  v1::FreeRequest request;
  (slots ? request.mutable_slots() : request.mutable_pages())
      ->Add(values.begin(), values.end());
  request.set_order(order);
  request.set_release_value(release_value);
  return SendFree(request);
}

absl::StatusOr<uint64_t> Client::QueueRelease(void* cuda_stream) {
  if (release_writer_ == nullptr) return release_writer_status_;
  if (absl::Status alive = session_status(); !alive.ok()) return alive;
  // Values reach the stream in the order they are handed out.
  absl::MutexLock lock(&release_mu_);
  const uint64_t value =
      last_release_value_.load(std::memory_order_relaxed) + 1;
  RETURN_IF_ERROR(release_writer_->Write(value, cuda_stream));
  last_release_value_.store(value, std::memory_order_relaxed);
  return value;
}

absl::StatusOr<int64_t> Client::FreePages(absl::Span<const int64_t> pages,
                                          void* cuda_stream,
                                          v1::FreeOrder order) {
  ASSIGN_OR_RETURN(const uint64_t value, QueueRelease(cuda_stream));
  return Free(/*slots=*/false, pages, order, value);
}

absl::StatusOr<int64_t> Client::FreeSlots(absl::Span<const int64_t> slots,
                                          void* cuda_stream,
                                          v1::FreeOrder order) {
  ASSIGN_OR_RETURN(const uint64_t value, QueueRelease(cuda_stream));
  return Free(/*slots=*/true, slots, order, value);
}

absl::StatusOr<int64_t> Client::FreePagesAfter(absl::Span<const int64_t> pages,
                                               uint64_t release_value,
                                               v1::FreeOrder order) {
  return Free(/*slots=*/false, pages, order, release_value);
}

absl::StatusOr<int64_t> Client::FreeSlotsAfter(absl::Span<const int64_t> slots,
                                               uint64_t release_value,
                                               v1::FreeOrder order) {
  return Free(/*slots=*/true, slots, order, release_value);
}

void Client::WaitForReleases() {
  if (release_writer_ == nullptr) return;
  const uint64_t last = last_release_value_.load(std::memory_order_relaxed);
  if (last == 0) return;
  // The stream passes its writes on its own; a host poll of a few
  // microseconds at a time, once, at close.
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  while (release_writer_->Read() < last && absl::Now() < deadline) {
    absl::SleepFor(absl::Microseconds(50));
  }
}

absl::StatusOr<int64_t> Client::FreeGroup::End() {
  if (slots_.empty()) return 0;
  absl::StatusOr<int64_t> freed = client_->FreeSlots(slots_);
  slots_.clear();
  return freed;
}

absl::Status Client::Checkpoint() { return CheckpointId().status(); }

absl::StatusOr<uint64_t> Client::CheckpointId() {
  if (auto fast = FastOp(fast_channel::CallKind::kCheckpoint, {})) {
    if (!fast->ok()) return fast->status();
    return static_cast<uint64_t>(**fast);
  }
  if (absl::Status alive = session_status(); !alive.ok()) return alive;
  v1::CheckpointRequest request;
  *request.mutable_session() = Ref();
  v1::CheckpointResponse response;
  auto context = NewContext();
  const absl::Status status = Observe(
      FromGrpcStatus(stub_->Checkpoint(context.get(), request, &response)));
  if (!status.ok()) return status;
  RETURN_IF_ERROR(Fence());
  return response.checkpoint_id();
}

absl::StatusOr<int64_t> Client::Rollback() { return Rollback(uint64_t{0}); }

absl::StatusOr<int64_t> Client::Rollback(uint64_t checkpoint_id) {
  const int64_t id = static_cast<int64_t>(checkpoint_id);
  if (auto fast = FastOp(fast_channel::CallKind::kRollback,
                         checkpoint_id == 0 ? absl::Span<const int64_t>()
                                            : absl::MakeConstSpan(&id, 1))) {
    return *std::move(fast);
  }
  if (absl::Status alive = session_status(); !alive.ok()) return alive;
  v1::RollbackRequest request;
  *request.mutable_session() = Ref();
  request.set_checkpoint_id(checkpoint_id);
  v1::RollbackResponse response;
  auto context = NewContext();
  absl::Status status = Observe(
      FromGrpcStatus(stub_->Rollback(context.get(), request, &response)));
  if (!status.ok()) return status;
  return Fenced<int64_t>(response.pages_returned());
}

absl::StatusOr<int64_t> Client::ClearSession() {
  if (absl::Status alive = session_status(); !alive.ok()) return alive;
  v1::ClearSessionRequest request;
  *request.mutable_session() = Ref();
  v1::ClearSessionResponse response;
  auto context = NewContext();
  absl::Status status = Observe(
      FromGrpcStatus(stub_->ClearSession(context.get(), request, &response)));
  if (!status.ok()) return status;
  return response.pages_freed();
}

absl::StatusOr<Client::PublishResult> Client::Publish(
    absl::Span<const int64_t> pages, absl::Span<const std::string> keys,
    absl::string_view parent_key, bool pin) {
  if (absl::Status alive = session_status(); !alive.ok()) return alive;
  v1::PublishRequest request;
  *request.mutable_session() = Ref();
  request.mutable_pages()->Add(pages.begin(), pages.end());
  for (const std::string& key : keys) request.add_keys(key);
  request.set_parent_key(std::string(parent_key));
  request.set_pin(pin);
  v1::PublishResponse response;
  auto context = NewContext();
  absl::Status status = Observe(
      FromGrpcStatus(stub_->Publish(context.get(), request, &response)));
  if (!status.ok()) return status;
  PublishResult result;
  result.pages.assign(response.pages().begin(), response.pages().end());
  result.existing.assign(response.existing().begin(),
                         response.existing().end());
  result.newly_published = response.newly_published();
  return result;
}

absl::StatusOr<std::vector<int64_t>> Client::MatchPrefix(
    absl::Span<const std::string> keys, bool adopt) {
  if (auto fast = FastMatch(keys, adopt)) return *std::move(fast);
  if (absl::Status alive = session_status(); !alive.ok()) return alive;
  v1::MatchPrefixRequest request;
  *request.mutable_session() = Ref();
  for (const std::string& key : keys) request.add_keys(key);
  request.set_adopt(adopt);
  v1::MatchPrefixResponse response;
  auto context = NewContext();
  absl::Status status = Observe(
      FromGrpcStatus(stub_->MatchPrefix(context.get(), request, &response)));
  if (!status.ok()) return status;
  return Fenced<std::vector<int64_t>>(
      std::vector<int64_t>(response.pages().begin(), response.pages().end()));
}

absl::StatusOr<int64_t> Client::UnpinPrefix(absl::Span<const int64_t> pages) {
  if (absl::Status alive = session_status(); !alive.ok()) return alive;
  v1::UnpinPrefixRequest request;
  *request.mutable_session() = Ref();
  request.mutable_pages()->Add(pages.begin(), pages.end());
  v1::UnpinPrefixResponse response;
  auto context = NewContext();
  absl::Status status = Observe(
      FromGrpcStatus(stub_->UnpinPrefix(context.get(), request, &response)));
  if (!status.ok()) return status;
  return response.pages_unpinned();
}

void Client::Release(const Allocation& allocation) {
  absl::MutexLock lock(&mu_);
  release_up_to_ = std::max(release_up_to_, allocation.ring_end());
}

absl::Status Client::FlushRelease() {
  if (absl::Status alive = session_status(); !alive.ok()) return alive;
  v1::ReleaseRingRequest request;
  *request.mutable_session() = Ref();
  {
    absl::MutexLock lock(&mu_);
    request.set_up_to(release_up_to_);
  }
  v1::ReleaseRingResponse response;
  auto context = NewContext();
  return Observe(
      FromGrpcStatus(stub_->ReleaseRing(context.get(), request, &response)));
}

absl::StatusOr<v1::GetStatsResponse> Client::GetStats(bool include_sessions) {
  v1::GetStatsRequest request;
  request.set_include_sessions(include_sessions);
  v1::GetStatsResponse response;
  auto context = NewContext();
  absl::Status status =
      FromGrpcStatus(stub_->GetStats(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::Status Client::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::OkStatus();
    closed_ = true;
    if (!session_status_.ok()) return absl::OkStatus();  // already gone
  }
  // A Connect that failed before Register succeeded has nothing to close
  // (and, without a target, no stub to close it with).
  if (session_token_.empty()) return absl::OkStatus();
  // The daemon reclaims pages still waiting for the release fence with the
  // session: first let this process's queued work on them finish.
  WaitForReleases();
  StopKeepAlive();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  auto stream = stub_->KeepAlive(&context);
  v1::KeepAliveRequest goodbye;
  *goodbye.mutable_session() = Ref();
  goodbye.set_close(true);
  stream->Write(goodbye);
  stream->WritesDone();
  return FromGrpcStatus(stream->Finish());
}

absl::Status Client::OrderAfter(const Allocation& allocation,
                                void* cuda_stream) const {
  if (completion_counter_ == nullptr || !allocation.on_device()) {
    return absl::OkStatus();
  }
  return completion_counter_->OrderAfter(allocation.completion_value(),
                                         cuda_stream);
}

absl::Status Client::OrderAfterCompletion(void* cuda_stream) const {
  if (completion_counter_ == nullptr) return absl::OkStatus();
  return completion_counter_->OrderAfter(
      last_completion_value_.load(std::memory_order_relaxed), cuda_stream);
}

const int64_t* Client::ring_slots() const { return ring_->slots(); }

int64_t Client::ring_capacity_slots() const { return ring_->capacity_slots(); }

bool Client::ring_on_device() const { return ring_->on_device(); }

const fast_channel::ChannelCodec* Client::reserve_channel() const {
  return fast_ != nullptr ? &fast_->codec() : nullptr;
}

absl::Status Client::CopyToHost(const int64_t* slots, int64_t count,
                                int64_t* out) const {
  if (slots >= ring_->slots() &&
      slots + count <= ring_->slots() + ring_->capacity_slots()) {
    return ring_->CopyToHost(slots, count, out);
  }
  // Inline results are host memory already.
  std::copy(slots, slots + count, out);
  return absl::OkStatus();
}

}  // namespace pagealloc
