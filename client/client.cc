#include "client/client.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
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

std::shared_ptr<grpc::Channel> Client::Dial(bool own_subchannels) const {
  if (options_.channel != nullptr) return options_.channel;
  grpc::ChannelArguments args = ClientChannelArguments();
  // gRPC shares a target's connections (subchannels) among its channels,
  // and with them their reconnect backoff: a channel made to reach a
  // restarted daemon would wait out the backoff (1 s at first) that the
  // dead daemon's refusals started. Its own pool dials at once.
  if (own_subchannels) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(options_.target,
                                   options_.credentials != nullptr
                                       ? options_.credentials
                                       : grpc::InsecureChannelCredentials(),
                                   args);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ClientOptions& options) {
  return Open(options, nullptr);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Resume(
    const ClientOptions& options, uint64_t session_id,
    std::string session_token, bool take_over) {
  v1::ResumeRequest request;
  request.mutable_session()->set_session_id(session_id);
  request.mutable_session()->set_session_token(std::move(session_token));
  request.set_ring_capacity_slots(options.ring_capacity_slots);
  request.set_fast_channel(options.fast_channel);
  request.set_take_over(take_over);
  request.set_register_secret(options.register_secret);
  return Open(options, &request);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Open(
    const ClientOptions& given, const v1::ResumeRequest* resume) {
  ClientOptions options = given;
  if (options.channel == nullptr && options.target.empty()) {
    ASSIGN_OR_RETURN(options.target, FindDaemonTarget(0));
  }
  std::unique_ptr<Client> client(new Client(options));
  std::shared_ptr<grpc::Channel> channel = client->Dial();
  std::shared_ptr<v1::PageAllocator::Stub> stub =
      v1::PageAllocator::NewStub(channel);
  {
    absl::MutexLock lock(&client->mu_);
    client->channel_ = channel;
    client->stub_ = stub;
  }
  v1::RegisterResponse registered;
  auto context = client->NewContext(absl::Now() + options.call_timeout);
  grpc::Status answered;
  if (resume != nullptr) {
    answered = stub->Resume(context.get(), *resume, &registered);
  } else {
    v1::RegisterRequest request;
    request.set_client_name(options.client_name);
    request.set_ring_capacity_slots(options.ring_capacity_slots);
    request.set_quota_pages(options.quota_pages);
    request.set_fast_channel(options.fast_channel);
    request.set_register_secret(options.register_secret);
    request.set_resumable(options.resumable);
    answered = stub->Register(context.get(), request, &registered);
  }
  if (absl::Status status = FromGrpcStatus(answered); !status.ok()) {
    return status;
  }
  client->Accept(registered);
  // Keep the lease from now on: mapping the ring can take longer than a
  // short lease (a fresh process creates its CUDA context there).
  client->keepalive_ = std::thread([c = client.get()] { c->KeepAliveLoop(); });
  absl::StatusOr<std::unique_ptr<Link>> link =
      client->MapLink(registered, options.map_kv_slab, options.call_timeout);
  if (!link.ok()) {
    if (resume == nullptr) {
      (void)client->Close();  // give the session back at once
    } else {
      // A session taken back is the caller's to keep: it waits for another
      // Resume until its lease runs out.
      absl::MutexLock lock(&client->mu_);
      client->closed_ = true;
      client->closed_status_ = absl::FailedPreconditionError(
          "the session's memory could not be mapped here");
    }
    return link.status();
  }
  const bool watch = (*link)->memory_connection.valid();
  client->Install(*std::move(link));
  if (watch) {
    client->stop_watching_.reset(eventfd(0, EFD_CLOEXEC));
    if (!client->stop_watching_.valid()) {
      (void)client->Close();
      return absl::InternalError(
          absl::StrFormat("eventfd failed: %s", std::strerror(errno)));
    }
    client->watcher_ = std::thread([c = client.get()] { c->WatchDaemon(); });
  }
  return client;
}

void Client::Accept(const v1::RegisterResponse& response) {
  session_id_ = response.session_id();
  session_token_ = response.session_token();
  resumable_ = response.resumable();
  pool_ = response.pool();
  lease_ms_ = response.lease_ms();
  quota_pages_ = response.quota_pages();
  reconnect_timeout_ = options_.reconnect_timeout;
  NoteCalls(response);
  if (reconnect_timeout_ < absl::ZeroDuration()) {
    reconnect_timeout_ = pool_.state_kept() ? absl::Milliseconds(lease_ms_)
                                            : absl::ZeroDuration();
  }
}

absl::StatusOr<std::unique_ptr<Client::Link>> Client::MapLink(
    const v1::RegisterResponse& registered, bool map_kv_slab,
    absl::Duration timeout) {
  auto link = std::make_unique<Link>();
  // The session's memory, as descriptors over the memory socket. Out of
  // reach (another host or container, a daemon with no Unix socket), the
  // session still works over gRPC where its backend allows.
  memory_socket::SessionMemory memory;
  const std::string path = MemorySocketPath(registered);
  absl::Status received = absl::UnavailableError(
      "the daemon names no memory socket (it listens on no Unix socket)");
  if (!path.empty()) {
    absl::StatusOr<memory_socket::SessionMemory> got =
        memory_socket::ReceiveSessionMemory(path, session_id_, session_token_,
                                            timeout);
    if (got.ok()) {
      memory = *std::move(got);
      received = absl::OkStatus();
    } else if (got.status().code() != absl::StatusCode::kUnavailable) {
      // The daemon refused the session its memory: say why.
      return got.status();
    } else {
      received = got.status();
    }
  }
  const bool cuda = pool_.backend() == v1::BACKEND_CUDA;
  UniqueFd& ring_fd = cuda ? memory.cuda_ring : memory.ring;
  const uint64_t ring_bytes = cuda ? memory.cuda_ring_bytes : memory.ring_bytes;
  if (!ring_fd.valid() || (cuda && !memory.completion_counter.valid())) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot map the output ring: %s (a client must run on the daemon's "
        "host and reach its memory socket; in a container, mount the "
        "daemon's socket directory)",
        received.ok() ? "the daemon's memory socket sent no ring"
                      : received.message()));
  }
  ASSIGN_OR_RETURN(link->ring, MapRing(pool_, registered.ring(),
                                       std::move(ring_fd), ring_bytes));
  if (cuda) {
    ASSIGN_OR_RETURN(
        link->completion_counter,
        MapCompletionCounter(pool_, std::move(memory.completion_counter),
                             memory.completion_counter_bytes));
  }
  if (map_kv_slab && pool_.has_kv_slab()) {
    if (!memory.kv_slab.valid()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "cannot map the pool's KV slab: %s (the daemon owns the KV memory; "
          "a client must run on its host and reach its memory socket)",
          received.ok() ? "the daemon handed over none" : received.message()));
    }
    ASSIGN_OR_RETURN(kv_slab_, KvSlabView::Map(pool_, std::move(memory.kv_slab),
                                               memory.kv_slab_bytes));
  }
  if (registered.has_fast_channel() && memory.channel.valid()) {
    // Without it calls simply go through gRPC.
    absl::StatusOr<std::unique_ptr<FastChannelClient>> fast =
        FastChannelClient::Map(registered.fast_channel(),
                               std::move(memory.channel),
                               std::move(memory.doorbell));
    if (fast.ok()) link->fast = *std::move(fast);
  }
  if (link->fast != nullptr) {
    // Without it fenced frees fail and say why; the rest works.
    absl::StatusOr<std::unique_ptr<ReleaseWordWriter>> writer =
        MapReleaseWord(pool_, link->fast->codec().release_word());
    if (writer.ok()) {
      link->release_writer = *std::move(writer);
    } else {
      link->release_writer_status = writer.status();
    }
  } else {
    link->release_writer_status = absl::FailedPreconditionError(
        "this session has no fast channel (the daemon's memory socket is "
        "out of reach, or fast_channel is off): it has no release word, so "
        "frees cannot be fenced on a stream; free after the work that "
        "reads the pages is done");
  }
  link->memory_connection = std::move(memory.connection);
  return link;
}

void Client::Install(std::unique_ptr<Link> link) {
  absl::MutexLock release_lock(&release_mu_);
  absl::MutexLock fast_lock(&fast_mu_);
  absl::MutexLock lock(&mu_);
  link->epoch = links_.empty() ? 0 : links_.back()->epoch + 1;
  ring_.store(link->ring.get(), std::memory_order_release);
  completion_counter_.store(link->completion_counter.get(),
                            std::memory_order_release);
  fast_.store(link->fast.get(), std::memory_order_release);
  // Release values go on counting across links, and the new word starts
  // at what the old one had passed: a fenced free whose value was handed
  // out before the reconnect is then neither held back for good (the new
  // word would count from 0) nor released before its stream's work (the
  // value passes on the new word once it has passed on the old, or once a
  // later value of the same stream passes on the new). The old word stays
  // mapped with its link.
  const ReleaseWordWriter* old_writer =
      release_writer_.load(std::memory_order_relaxed);
  if (old_writer != nullptr && link->fast != nullptr &&
      link->release_writer != nullptr) {
    link->fast->codec().release_word()->store(old_writer->Read(),
                                              std::memory_order_release);
  }
  release_writer_.store(link->release_writer.get(), std::memory_order_release);
  release_writer_status_ = link->release_writer_status;
  // A new ring and a new completion counter: their positions and values
  // start again.
  release_up_to_ = 0;
  last_completion_value_.store(0, std::memory_order_relaxed);
  fast_abandoned_ = false;
  link_epoch_.store(link->epoch, std::memory_order_release);
  links_.push_back(std::move(link));
  reconnecting_ = false;
  link_changed_.SignalAll();
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

namespace {

// Whether the daemon's end of a memory socket connection has closed without
// a message (the daemon died): a message waiting is a session's end the
// daemon announced, read by the watcher.
bool DaemonHungUp(int connection) {
  if (connection < 0) return false;
  char byte;
  return recv(connection, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

// Marks a call's failure as the daemon's restart under it (Tagged sends
// such a call again).
constexpr absl::string_view kRestartedPayload = "pagealloc.v1/restarted";

absl::Status Restarted(const absl::Status& seen) {
  absl::Status status = absl::UnavailableError(absl::StrFormat(
      "the daemon restarted during this call; whether it took effect is "
      "unknown (%s)",
      seen.ok() ? "the daemon went away" : seen.ToString()));
  status.SetPayload(kRestartedPayload, absl::Cord("1"));
  return status;
}

bool IsRestarted(const absl::Status& status) {
  return status.GetPayload(kRestartedPayload).has_value();
}

}  // namespace

void Client::WatchDaemon() {
  while (true) {
    int connection;
    {
      absl::MutexLock lock(&mu_);
      connection = links_.back()->memory_connection.get();
    }
    if (connection < 0) return;
    pollfd watched[2] = {{connection, POLLIN | POLLRDHUP, 0},
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
    bool went_away = false;
    const absl::Status ended =
        memory_socket::ReadSessionEnd(connection, &went_away);
    FastChannelClient* const fast = fast_.load(std::memory_order_acquire);
    bool reconnect = false;
    {
      absl::MutexLock lock(&mu_);
      reconnect = went_away && reconnect_timeout_ > absl::ZeroDuration() &&
                  !closed_ && session_status_.ok();
      if (reconnect) {
        reconnecting_ = true;
        link_changed_.SignalAll();
        // The KeepAlive stream has no daemon now; it waits for the new link.
        if (keepalive_context_ != nullptr) keepalive_context_->TryCancel();
      }
      links_.back()->memory_connection.reset();
    }
    if (!reconnect) {
      MarkGone(ended);
      if (fast != nullptr) fast->WakeWaiter();
      StopKeepAlive();
      return;
    }
    // A fast call waiting for its answer looks at the link again (and fails:
    // its daemon died with it).
    if (fast != nullptr) fast->WakeWaiter();
    if (absl::Status back = Reconnect(); !back.ok()) {
      MarkGone(back);
      StopKeepAlive();
      return;
    }
  }
}

absl::Status Client::Reconnect() {
  const absl::Time give_up = absl::Now() + reconnect_timeout_;
  // The daemon releases pending fenced frees at Resume: let this process's
  // queued work on those pages finish first.
  WaitForReleases();
  absl::Duration backoff =
      std::max(options_.reconnect_initial_backoff, absl::Milliseconds(1));
  absl::Status last;
  while (true) {
    bool retry = false;
    last = ReconnectOnce(give_up, &retry);
    if (last.ok()) return last;
    if (!retry) return last;
    const absl::Duration left = give_up - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    if (!SleepUnlessStopped(std::min(backoff, left))) {
      return absl::CancelledError(
          "the client stopped while it was reconnecting to its daemon");
    }
    backoff = std::min(backoff * 2, std::max(options_.reconnect_max_backoff,
                                             absl::Milliseconds(1)));
  }
  return absl::UnavailableError(absl::StrFormat(
      "the daemon went away and session %d could not be resumed within the "
      "%s reconnect timeout (last attempt: %s): the session and its slots "
      "are gone",
      session_id_, absl::FormatDuration(reconnect_timeout_), last.ToString()));
}

absl::Status Client::ReconnectOnce(absl::Time give_up, bool* retry) {
  *retry = false;
  if (stopping_watch_.load()) {
    return absl::CancelledError(
        "the client stopped while it was reconnecting to its daemon");
  }
  const absl::Time now = absl::Now();
  // The last attempt may run a little past the timeout rather than not at
  // all.
  const absl::Time deadline =
      std::min(now + options_.call_timeout,
               std::max(give_up, now + absl::Milliseconds(100)));
  // A fresh channel per attempt: an old one waits out gRPC's own backoff
  // before it dials again.
  std::shared_ptr<grpc::Channel> channel = Dial(/*own_subchannels=*/true);
  std::shared_ptr<v1::PageAllocator::Stub> stub =
      v1::PageAllocator::NewStub(channel);
  v1::ResumeRequest request;
  *request.mutable_session() = Ref();
  request.set_ring_capacity_slots(options_.ring_capacity_slots);
  request.set_fast_channel(options_.fast_channel);
  request.set_register_secret(options_.register_secret);
  v1::RegisterResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  {
    absl::MutexLock lock(&mu_);
    if (stopping_watch_.load()) {
      return absl::CancelledError(
          "the client stopped while it was reconnecting to its daemon");
    }
    reconnect_context_ = &context;
  }
  const absl::Status resumed =
      FromGrpcStatus(stub->Resume(&context, request, &response));
  {
    absl::MutexLock lock(&mu_);
    reconnect_context_ = nullptr;
  }
  const bool answered = !absl::IsUnavailable(resumed) &&
                        !absl::IsDeadlineExceeded(resumed) &&
                        !absl::IsCancelled(resumed);
  if (answered && !resumed.ok()) {
    // A daemon serves the target again: the calls that need no session
    // (GetStats) go to it, whatever becomes of this one.
    absl::MutexLock lock(&mu_);
    channel_ = channel;
    stub_ = stub;
  }
  if (!resumed.ok()) {
    switch (resumed.code()) {
      case absl::StatusCode::kUnavailable:
      case absl::StatusCode::kDeadlineExceeded:
      // A daemon that is stopping cancels the calls it has not answered
      // when its gRPC server shuts down (a clean stop's Resume races it);
      // our own stop cancels too, and the loop then sees stopping_watch_.
      case absl::StatusCode::kCancelled:
        *retry = true;  // not serving yet
        return resumed;
      case absl::StatusCode::kNotFound:
        return absl::NotFoundError(absl::StrFormat(
            "session gone: the daemon restarted without this session's "
            "state (session %d: %s); its pages and slots are gone, register "
            "again",
            session_id_, resumed.message()));
      default:
        return absl::Status(
            resumed.code(),
            absl::StrFormat("session gone: the daemon restarted and refused "
                            "to resume session %d: %s",
                            session_id_, resumed.message()));
    }
  }
  // The same pool, and the same KV memory, or nothing this client holds
  // means what it meant.
  const v1::PoolInfo& pool = response.pool();
  std::string lost;
  if (pool.page_size() != pool_.page_size() ||
      pool.num_pages() != pool_.num_pages() ||
      pool.backend() != pool_.backend() ||
      pool.device_uuid() != pool_.device_uuid() ||
      pool.kv_slab().layout() != pool_.kv_slab().layout()) {
    lost = absl::StrFormat(
        "the restarted daemon serves another pool (%d pages of %d tokens, "
        "KV layout \"%s\"; this client's: %d pages of %d, \"%s\")",
        pool.num_pages(), pool.page_size(), pool.kv_slab().layout(),
        pool_.num_pages(), pool_.page_size(), pool_.kv_slab().layout());
  } else if (pool_.has_kv_slab() &&
             pool.kv_slab().slab_id() != pool_.kv_slab().slab_id()) {
    lost = absl::StrFormat(
        "the restarted daemon's KV slab (slab_id %016x) is not the memory "
        "this client mapped (slab_id %016x)",
        pool.kv_slab().slab_id(), pool_.kv_slab().slab_id());
  }
  if (!lost.empty()) {
    // The session's KV is lost to it: give its pages back now.
    grpc::ClientContext closing;
    closing.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    auto stream = stub->KeepAlive(&closing);
    v1::KeepAliveRequest goodbye;
    *goodbye.mutable_session() = Ref();
    goodbye.set_close(true);
    stream->Write(goodbye);
    stream->WritesDone();
    (void)stream->Finish();
    return absl::DataLossError(absl::StrFormat(
        "session gone: %s: session %d's KV is lost; the client closed it, "
        "register again",
        lost, session_id_));
  }
  absl::StatusOr<std::unique_ptr<Link>> link =
      MapLink(response, /*map_kv_slab=*/false, deadline - absl::Now());
  if (!link.ok()) {
    // The daemon answered: the session waits for its Hello, and another
    // Resume may yet take it.
    *retry = absl::IsUnavailable(link.status()) ||
             absl::IsDeadlineExceeded(link.status());
    return absl::Status(
        link.status().code(),
        absl::StrFormat("reconnecting: session %d was resumed but its memory "
                        "could not be mapped: %s",
                        session_id_, link.status().message()));
  }
  {
    absl::MutexLock lock(&mu_);
    channel_ = std::move(channel);
    stub_ = std::move(stub);
  }
  NoteCalls(response);
  Install(*std::move(link));
  return absl::OkStatus();
}

void Client::NoteCalls(const v1::RegisterResponse& response) {
  retries_kept_.store(response.retries_kept(), std::memory_order_release);
  // Ids go on after the latest the daemon kept (another process's, for a
  // session resumed from elsewhere), never back.
  uint64_t next = next_call_id_.load(std::memory_order_relaxed);
  while (
      next <= response.last_call_id() &&
      !next_call_id_.compare_exchange_weak(next, response.last_call_id() + 1)) {
  }
}

template <typename T, typename Attempt>
absl::StatusOr<T> Client::Tagged(Attempt attempt) {
  CallTag tag{next_call_id_.fetch_add(1, std::memory_order_relaxed), false};
  for (int sent = 1;; ++sent) {
    const uint64_t epoch = link_epoch();
    absl::StatusOr<T> answer = attempt(tag);
    if (answer.ok() || !IsRestarted(answer.status()) || sent == kMaxCallSends ||
        !WaitForLinkAfter(epoch) ||
        !retries_kept_.load(std::memory_order_acquire)) {
      return answer;
    }
    tag.retry = true;
    calls_sent_again_.fetch_add(1, std::memory_order_relaxed);
  }
}

bool Client::WaitForLinkAfter(uint64_t epoch) {
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  absl::MutexLock lock(&mu_);
  while (
      session_status_.ok() && !closed_ &&
      (reconnecting_ || link_epoch_.load(std::memory_order_relaxed) <= epoch)) {
    if (link_changed_.WaitWithDeadline(&mu_, deadline)) return false;
  }
  return session_status_.ok() && !closed_;
}

v1::SessionRef Client::TaggedRef(CallTag tag) const {
  v1::SessionRef ref = Ref();
  ref.set_call_id(tag.id);
  ref.set_retry(tag.retry);
  return ref;
}

bool Client::SleepUnlessStopped(absl::Duration wait) {
  pollfd stop = {stop_watching_.get(), POLLIN, 0};
  const absl::Time until = absl::Now() + wait;
  while (true) {
    const int64_t ms = absl::ToInt64Milliseconds(until - absl::Now());
    if (ms <= 0) return !stopping_watch_.load();
    const int ready =
        poll(&stop, 1, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (ready > 0) return false;
    if (ready < 0 && errno != EINTR) return false;
  }
}

void Client::StopWatching() {
  stopping_watch_.store(true);
  {
    absl::MutexLock lock(&mu_);
    if (reconnect_context_ != nullptr) reconnect_context_->TryCancel();
  }
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
  link_changed_.SignalAll();
}

std::unique_ptr<grpc::ClientContext> Client::NewContext(
    absl::Time deadline) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(deadline));
  return context;
}

v1::SessionRef Client::Ref() const {
  v1::SessionRef ref;
  ref.set_session_id(session_id_);
  ref.set_session_token(session_token_);
  return ref;
}

std::shared_ptr<v1::PageAllocator::Stub> Client::stub() const {
  absl::MutexLock lock(&mu_);
  return stub_;
}

absl::StatusOr<Client::CallStart> Client::Begin(bool grpc) const {
  absl::MutexLock lock(&mu_);
  CallStart start;
  start.deadline = absl::Now() + options_.call_timeout;
  // Calls wait for a reconnect under way, and then run on the new link.
  while (reconnecting_ && session_status_.ok() && !closed_) {
    if (link_changed_.WaitWithDeadline(&mu_, start.deadline) && reconnecting_) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "the daemon went away and the client was still reconnecting "
          "after the call's %s timeout",
          absl::FormatDuration(options_.call_timeout)));
    }
  }
  if (closed_) return closed_status_;
  if (!session_status_.ok()) return session_status_;
  start.epoch = link_epoch_.load(std::memory_order_relaxed);
  start.ring = ring_.load(std::memory_order_relaxed);
  start.release_up_to = release_up_to_;
  if (grpc) start.stub = stub_;
  return start;
}

bool Client::LinkLost(uint64_t epoch) const {
  if (reconnect_timeout_ <= absl::ZeroDuration()) return false;
  absl::MutexLock lock(&mu_);
  if (reconnecting_ || epoch != link_epoch_.load(std::memory_order_relaxed)) {
    return true;
  }
  // The watcher may not have looked yet.
  return !links_.empty() &&
         DaemonHungUp(links_.back()->memory_connection.get());
}

absl::Status Client::LinkAlive(uint64_t epoch) const {
  absl::MutexLock lock(&mu_);
  if (closed_) return closed_status_;
  if (!session_status_.ok()) return session_status_;
  if (reconnecting_ || epoch != link_epoch_.load(std::memory_order_relaxed)) {
    return Restarted(absl::OkStatus());
  }
  return absl::OkStatus();
}

void Client::KeepAliveLoop() {
  const absl::Duration interval =
      options_.keepalive_interval > absl::ZeroDuration()
          ? options_.keepalive_interval
          : absl::Milliseconds(std::max<int64_t>(lease_ms_ / 3, 1));
  absl::Time renewed = absl::Now();
  uint64_t renewed_epoch = 0;
  while (!stop_keepalive_.HasBeenNotified()) {
    grpc::ClientContext context;
    std::shared_ptr<v1::PageAllocator::Stub> stub;
    uint64_t epoch;
    {
      absl::MutexLock lock(&mu_);
      // While reconnecting there is no daemon to renew with; the reconnect
      // decides what becomes of the session.
      while (reconnecting_ && !stop_keepalive_.HasBeenNotified()) {
        link_changed_.Wait(&mu_);
      }
      if (stop_keepalive_.HasBeenNotified() || !session_status_.ok()) return;
      keepalive_context_ = &context;
      stub = stub_;
      epoch = link_epoch_.load(std::memory_order_relaxed);
    }
    // A new link's Resume renewed the lease.
    if (epoch != renewed_epoch) {
      renewed = absl::Now();
      renewed_epoch = epoch;
    }
    // Unpublishes the context before it goes out of scope, on every path.
    struct Unpublish {
      Client* client;
      ~Unpublish() {
        absl::MutexLock lock(&client->mu_);
        client->keepalive_context_ = nullptr;
      }
    } unpublish{this};
    auto stream = stub->KeepAlive(&context);
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
    // The daemon died under the stream: the watcher reconnects (or ends the
    // session), and the loop waits for it at the top.
    if (LinkLost(epoch)) continue;
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

absl::Status Client::Observe(absl::Status status, const CallStart& start) {
  if (status.ok()) return status;
  if (LinkLost(start.epoch)) {
    // The daemon died under the call; the watcher is reconnecting. A
    // session end it has recorded meanwhile says more.
    if (absl::Status gone = session_status(); !gone.ok()) return gone;
    return Restarted(status);
  }
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
  reconnecting_ = false;
  link_changed_.SignalAll();
}

absl::Status Client::Fence() {
  FastChannelClient* const fast = fast_.load(std::memory_order_acquire);
  if (fast == nullptr) return absl::OkStatus();
  // Loaded after the answer was read: clear, the answer was read while the
  // session still owned its pages (the daemon sets the flag before it
  // frees any).
  absl::Status live = fast->SessionLive(session_id_);
  if (!live.ok()) MarkGone(live);
  return live;
}

absl::Status Client::session_status() const {
  absl::MutexLock lock(&mu_);
  if (closed_) return closed_status_;
  return session_status_;
}

bool Client::reconnecting() const {
  absl::MutexLock lock(&mu_);
  return reconnecting_;
}

template <typename Request, typename Method>
absl::StatusOr<Allocation> Client::CallAlloc(Request& request,
                                             const CallOptions& options,
                                             Method method, CallTag tag) {
  ASSIGN_OR_RETURN(const CallStart start, Begin(/*grpc=*/true));
  *request.mutable_session() = TaggedRef(tag);
  v1::AllocOptions* wire = request.mutable_options();
  wire->set_return_inline(options.return_inline);
  wire->set_async_completion(options.async_completion);
  wire->set_packed_results(true);
  wire->mutable_free_pages_first()->Add(options.free_pages_first.begin(),
                                        options.free_pages_first.end());
  wire->set_checkpoint_first(options.checkpoint_first);
  wire->set_all_or_nothing(options.all_or_nothing);
  wire->set_release_ring_up_to(start.release_up_to);
  v1::AllocResponse response;
  auto context = NewContext(start.deadline);
  absl::Status status = Observe(FromGrpcStatus((start.stub.get()->*method)(
                                    context.get(), request, &response)),
                                start);
  if (!status.ok()) return status;
  // An answer in ring positions is only read in the ring of the daemon that
  // wrote it: after the daemon's death the call's channel may have reached
  // its successor, whose ring for the session is another.
  if (!options.return_inline && LinkLost(start.epoch)) {
    return Restarted(absl::OkStatus());
  }
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
  return Fenced(ToAllocation(answer, options, start));
}

absl::StatusOr<Allocation> Client::ToAllocation(const AnswerArrays& answer,
                                                const CallOptions& options,
                                                const CallStart& start) const {
  // The ring of the link the call ran on (still mapped: links stay).
  const RingView& ring = *start.ring;
  Allocation allocation;
  allocation.ring_end_ = answer.ring_end;
  allocation.pages_freed_first_ = answer.pages_freed_first;
  allocation.batch_requests_ = answer.batch_requests;
  allocation.completion_value_ = answer.completion_value;
  allocation.link_epoch_ = start.epoch;
  allocation.on_device_ = !options.return_inline && ring.on_device();
  // The counter only grows: keep the largest value for
  // OrderAfterCompletion (the current link's counter's only).
  if (start.epoch == link_epoch_.load(std::memory_order_acquire)) {
    uint64_t seen = last_completion_value_.load(std::memory_order_relaxed);
    while (seen < answer.completion_value &&
           !last_completion_value_.compare_exchange_weak(
               seen, answer.completion_value, std::memory_order_relaxed)) {
    }
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
      if (offset < 0 || count < 0 || offset + count > ring.capacity_slots()) {
        return absl::InternalError(absl::StrFormat(
            "the daemon answered request %d with ring range [%d, %d) outside "
            "the %d-slot ring",
            i, offset, offset + count, ring.capacity_slots()));
      }
      slots = ring.slots() + offset;
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
  return Tagged<Allocation>([&](CallTag tag) {
    return AllocExtendOnce(prefix_lens, seq_lens, last_locs, options, tag);
  });
}

absl::StatusOr<Allocation> Client::AllocExtendOnce(
    absl::Span<const int64_t> prefix_lens, absl::Span<const int64_t> seq_lens,
    absl::Span<const int64_t> last_locs, const CallOptions& options,
    CallTag tag) {
  if (auto fast = FastCall(fast_channel::CallKind::kExtend, prefix_lens,
                           seq_lens, last_locs, options, tag)) {
    return *std::move(fast);
  }
  v1::AllocExtendRequest request;
  request.mutable_prefix_lens()->Add(prefix_lens.begin(), prefix_lens.end());
  request.mutable_seq_lens()->Add(seq_lens.begin(), seq_lens.end());
  request.mutable_last_locs()->Add(last_locs.begin(), last_locs.end());
  return CallAlloc(request, options, &v1::PageAllocator::Stub::AllocExtend,
                   tag);
}

absl::StatusOr<Allocation> Client::AllocDecode(
    absl::Span<const int64_t> seq_lens, absl::Span<const int64_t> last_locs,
    const CallOptions& options) {
  return Tagged<Allocation>([&](CallTag tag) {
    return AllocDecodeOnce(seq_lens, last_locs, options, tag);
  });
}

absl::StatusOr<Allocation> Client::AllocDecodeOnce(
    absl::Span<const int64_t> seq_lens, absl::Span<const int64_t> last_locs,
    const CallOptions& options, CallTag tag) {
  if (auto fast = FastCall(fast_channel::CallKind::kDecode, {}, seq_lens,
                           last_locs, options, tag)) {
    return *std::move(fast);
  }
  v1::AllocDecodeRequest request;
  request.mutable_seq_lens()->Add(seq_lens.begin(), seq_lens.end());
  request.mutable_last_locs()->Add(last_locs.begin(), last_locs.end());
  return CallAlloc(request, options, &v1::PageAllocator::Stub::AllocDecode,
                   tag);
}

absl::StatusOr<Allocation> Client::Alloc(absl::Span<const int64_t> num_tokens,
                                         const CallOptions& options) {
  return Tagged<Allocation>(
      [&](CallTag tag) { return AllocOnce(num_tokens, options, tag); });
}

absl::StatusOr<Allocation> Client::AllocOnce(
    absl::Span<const int64_t> num_tokens, const CallOptions& options,
    CallTag tag) {
  if (auto fast = FastCall(fast_channel::CallKind::kAlloc, {}, num_tokens, {},
                           options, tag)) {
    return *std::move(fast);
  }
  v1::AllocRequest request;
  request.mutable_num_tokens()->Add(num_tokens.begin(), num_tokens.end());
  return CallAlloc(request, options, &v1::PageAllocator::Stub::Alloc, tag);
}

FastChannelClient* Client::BeginFast(absl::StatusOr<CallStart>* start) {
  if (!start->ok() || fast_abandoned_) return nullptr;
  // Under fast_mu_ the link cannot change (Install takes it): a call begun
  // on an earlier link, or one that finds a reconnect under way, goes
  // through gRPC, whose Begin waits for the new link.
  if ((*start)->epoch != link_epoch_.load(std::memory_order_acquire) ||
      !LinkAlive((*start)->epoch).ok()) {
    return nullptr;
  }
  return fast_.load(std::memory_order_acquire);
}

absl::Status Client::PostFastCall(FastChannelClient& fast,
                                  const CallStart& start,
                                  const fast_channel::CallView& posted) {
  // A channel whose session ended is answered no more: fail at once.
  RETURN_IF_ERROR(Fence());
  fast_channel::CallView call = posted;
  call.release_ring_up_to = start.release_up_to;
  const absl::Status answered =
      fast.Call(call, options_.fast_channel_spin, start.deadline,
                [this, epoch = start.epoch] { return LinkAlive(epoch); });
  if (!answered.ok()) {
    fast_abandoned_ = true;
    return answered;
  }
  return Observe(fast.codec().CallStatus(), start);
}

std::optional<absl::StatusOr<int64_t>> Client::FastOp(
    fast_channel::CallKind kind, absl::Span<const int64_t> values,
    uint32_t option_bits, uint64_t release_value, CallTag tag) {
  const FastChannelClient* seen = fast_.load(std::memory_order_acquire);
  if (seen == nullptr ||
      values.size() > static_cast<size_t>(seen->max_requests())) {
    return std::nullopt;
  }
  absl::StatusOr<CallStart> start = Begin(/*grpc=*/false);
  if (!start.ok()) return start.status();
  absl::MutexLock fast_lock(&fast_mu_);
  FastChannelClient* fast = BeginFast(&start);
  if (fast == nullptr ||
      values.size() > static_cast<size_t>(fast->max_requests())) {
    return std::nullopt;
  }
  fast_channel::CallView call;
  call.kind = kind;
  call.options = option_bits | (tag.retry ? fast_channel::kRetry : 0);
  call.in1 = values;
  call.release_value = release_value;
  call.call_id = tag.id;
  if (absl::Status posted = PostFastCall(*fast, *start, call); !posted.ok()) {
    return posted;
  }
  return Fenced<int64_t>(fast->codec().OpValue());
}

std::optional<absl::StatusOr<std::vector<int64_t>>> Client::FastMatch(
    absl::string_view keys, bool adopt) {
  const size_t num_keys = keys.size() / fast_channel::kKeyBytes;
  const FastChannelClient* seen = fast_.load(std::memory_order_acquire);
  if (seen == nullptr || num_keys > static_cast<size_t>(seen->max_requests())) {
    return std::nullopt;
  }
  absl::StatusOr<CallStart> start = Begin(/*grpc=*/false);
  if (!start.ok()) return start.status();
  absl::MutexLock fast_lock(&fast_mu_);
  FastChannelClient* fast = BeginFast(&start);
  if (fast == nullptr || num_keys > static_cast<size_t>(fast->max_requests())) {
    return std::nullopt;
  }
  fast_channel::CallView call;
  call.kind = fast_channel::CallKind::kMatchPrefix;
  call.options = adopt ? fast_channel::kAdopt : 0;
  call.keys = keys;
  if (absl::Status posted = PostFastCall(*fast, *start, call); !posted.ok()) {
    return posted;
  }
  absl::StatusOr<absl::Span<const int64_t>> pages =
      fast->codec().ReadMatchedPages(static_cast<int32_t>(num_keys));
  if (!pages.ok()) return pages.status();
  return Fenced<std::vector<int64_t>>(
      std::vector<int64_t>(pages->begin(), pages->end()));
}

std::optional<absl::StatusOr<Allocation>> Client::FastCall(
    fast_channel::CallKind kind, absl::Span<const int64_t> in0,
    absl::Span<const int64_t> in1, absl::Span<const int64_t> in2,
    const CallOptions& options, CallTag tag) {
  const FastChannelClient* seen = fast_.load(std::memory_order_acquire);
  if (seen == nullptr || options.return_inline) return std::nullopt;
  // Parallel arrays of different lengths are the daemon's to refuse, with
  // its message; gRPC carries them as they are.
  const size_t n = std::max({in0.size(), in1.size(), in2.size()});
  auto fits = [&](const FastChannelClient& fast) {
    const size_t capacity = fast.max_requests();
    return !(n > capacity || options.free_pages_first.size() > capacity ||
             (!in0.empty() && in0.size() != n) || in1.size() != n ||
             (!in2.empty() && in2.size() != n) ||
             (kind == fast_channel::CallKind::kExtend && in0.size() != n) ||
             (kind != fast_channel::CallKind::kAlloc && in2.size() != n));
  };
  if (!fits(*seen)) return std::nullopt;
  absl::StatusOr<CallStart> start = Begin(/*grpc=*/false);
  if (!start.ok()) return start.status();
  absl::MutexLock fast_lock(&fast_mu_);
  FastChannelClient* fast = BeginFast(&start);
  if (fast == nullptr || !fits(*fast)) return std::nullopt;
  const uint32_t option_bits =
      (options.async_completion ? fast_channel::kAsyncCompletion : 0) |
      (options.checkpoint_first ? fast_channel::kCheckpointFirst : 0) |
      (options.all_or_nothing ? fast_channel::kAllOrNothing : 0) |
      (tag.retry ? fast_channel::kRetry : 0);
  fast_channel::CallView call;
  call.kind = kind;
  call.options = option_bits;
  call.call_id = tag.id;
  call.in0 = in0;
  call.in1 = in1;
  call.in2 = in2;
  call.free_first = options.free_pages_first;
  if (absl::Status posted = PostFastCall(*fast, *start, call); !posted.ok()) {
    return posted;
  }
  fast_channel::AllocAnswerView view;
  if (absl::Status read = fast->codec().ReadAllocAnswer(n, &view); !read.ok()) {
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
  return Fenced(ToAllocation(answer, options, *start));
}

absl::StatusOr<int64_t> Client::SendFree(v1::FreeRequest& request,
                                         CallTag tag) {
  ASSIGN_OR_RETURN(const CallStart start, Begin(/*grpc=*/true));
  *request.mutable_session() = TaggedRef(tag);
  v1::FreeResponse response;
  auto context = NewContext(start.deadline);
  absl::Status status = Observe(
      FromGrpcStatus(start.stub->Free(context.get(), request, &response)),
      start);
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
  return Tagged<int64_t>([&](CallTag tag) {
    return FreeOnce(slots, values, order, release_value, tag);
  });
}

absl::StatusOr<int64_t> Client::FreeOnce(bool slots,
                                         absl::Span<const int64_t> values,
                                         v1::FreeOrder order,
                                         uint64_t release_value, CallTag tag) {
  if (auto fast = FastOp(slots ? fast_channel::CallKind::kFreeSlots
                               : fast_channel::CallKind::kFreePages,
                         values, FreeOrderBits(order), release_value, tag)) {
    return *std::move(fast);
  }
  v1::FreeRequest request;
  (slots ? request.mutable_slots() : request.mutable_pages())
      ->Add(values.begin(), values.end());
  request.set_order(order);
  request.set_release_value(release_value);
  return SendFree(request, tag);
}

absl::StatusOr<uint64_t> Client::QueueRelease(void* cuda_stream) {
  RETURN_IF_ERROR(Begin(/*grpc=*/false).status());
  // Values reach the stream in the order they are handed out.
  absl::MutexLock lock(&release_mu_);
  const ReleaseWordWriter* writer =
      release_writer_.load(std::memory_order_acquire);
  if (writer == nullptr) return release_writer_status_;
  const uint64_t value =
      last_release_value_.load(std::memory_order_relaxed) + 1;
  RETURN_IF_ERROR(writer->Write(value, cuda_stream));
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
  absl::MutexLock lock(&release_mu_);
  const ReleaseWordWriter* writer =
      release_writer_.load(std::memory_order_acquire);
  if (writer == nullptr) return;
  const uint64_t last = last_release_value_.load(std::memory_order_relaxed);
  if (last == 0) return;
  // The stream passes its writes on its own; a host poll of a few
  // microseconds at a time, once, at close.
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  while (writer->Read() < last && absl::Now() < deadline) {
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
  return Tagged<uint64_t>([this](CallTag tag) { return CheckpointOnce(tag); });
}

absl::StatusOr<uint64_t> Client::CheckpointOnce(CallTag tag) {
  if (auto fast = FastOp(fast_channel::CallKind::kCheckpoint, {}, 0, 0, tag)) {
    if (!fast->ok()) return fast->status();
    return static_cast<uint64_t>(**fast);
  }
  ASSIGN_OR_RETURN(const CallStart start, Begin(/*grpc=*/true));
  v1::CheckpointRequest request;
  *request.mutable_session() = TaggedRef(tag);
  v1::CheckpointResponse response;
  auto context = NewContext(start.deadline);
  const absl::Status status = Observe(
      FromGrpcStatus(start.stub->Checkpoint(context.get(), request, &response)),
      start);
  if (!status.ok()) return status;
  RETURN_IF_ERROR(Fence());
  return response.checkpoint_id();
}

absl::StatusOr<int64_t> Client::Rollback() { return Rollback(uint64_t{0}); }

absl::StatusOr<int64_t> Client::Rollback(uint64_t checkpoint_id) {
  return Tagged<int64_t>(
      [&](CallTag tag) { return RollbackOnce(checkpoint_id, tag); });
}

absl::StatusOr<int64_t> Client::RollbackOnce(uint64_t checkpoint_id,
                                             CallTag tag) {
  const int64_t id = static_cast<int64_t>(checkpoint_id);
  if (auto fast = FastOp(fast_channel::CallKind::kRollback,
                         checkpoint_id == 0 ? absl::Span<const int64_t>()
                                            : absl::MakeConstSpan(&id, 1),
                         0, 0, tag)) {
    return *std::move(fast);
  }
  ASSIGN_OR_RETURN(const CallStart start, Begin(/*grpc=*/true));
  v1::RollbackRequest request;
  *request.mutable_session() = TaggedRef(tag);
  request.set_checkpoint_id(checkpoint_id);
  v1::RollbackResponse response;
  auto context = NewContext(start.deadline);
  absl::Status status = Observe(
      FromGrpcStatus(start.stub->Rollback(context.get(), request, &response)),
      start);
  if (!status.ok()) return status;
  return Fenced<int64_t>(response.pages_returned());
}

absl::StatusOr<int64_t> Client::ClearSession() {
  return Tagged<int64_t>([this](CallTag tag) { return ClearSessionOnce(tag); });
}

absl::StatusOr<int64_t> Client::ClearSessionOnce(CallTag tag) {
  ASSIGN_OR_RETURN(const CallStart start, Begin(/*grpc=*/true));
  v1::ClearSessionRequest request;
  *request.mutable_session() = TaggedRef(tag);
  v1::ClearSessionResponse response;
  auto context = NewContext(start.deadline);
  absl::Status status = Observe(FromGrpcStatus(start.stub->ClearSession(
                                    context.get(), request, &response)),
                                start);
  if (!status.ok()) return status;
  return response.pages_freed();
}

absl::StatusOr<std::vector<int64_t>> Client::ListPages() {
  ASSIGN_OR_RETURN(const CallStart start, Begin(/*grpc=*/true));
  v1::ListPagesRequest request;
  *request.mutable_session() = Ref();
  v1::ListPagesResponse response;
  auto context = NewContext(start.deadline);
  absl::Status status = Observe(
      FromGrpcStatus(start.stub->ListPages(context.get(), request, &response)),
      start);
  if (!status.ok()) return status;
  return Fenced<std::vector<int64_t>>(
      std::vector<int64_t>(response.pages().begin(), response.pages().end()));
}

absl::StatusOr<Client::PublishResult> Client::Publish(
    absl::Span<const int64_t> pages, absl::Span<const std::string> keys,
    absl::string_view parent_key, bool pin) {
  ASSIGN_OR_RETURN(const CallStart start, Begin(/*grpc=*/true));
  v1::PublishRequest request;
  *request.mutable_session() = Ref();
  request.mutable_pages()->Add(pages.begin(), pages.end());
  for (const std::string& key : keys) request.add_keys(key);
  request.set_parent_key(std::string(parent_key));
  request.set_pin(pin);
  v1::PublishResponse response;
  auto context = NewContext(start.deadline);
  absl::Status status = Observe(
      FromGrpcStatus(start.stub->Publish(context.get(), request, &response)),
      start);
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
  // A key of another size goes over gRPC to the daemon as it is, for its
  // refusal; so does every chain of a session without a fast channel.
  const auto whole = [](const std::string& key) {
    return key.size() == static_cast<size_t>(fast_channel::kKeyBytes);
  };
  if (uses_fast_channel() && std::all_of(keys.begin(), keys.end(), whole)) {
    std::string packed;
    packed.reserve(keys.size() * fast_channel::kKeyBytes);
    for (const std::string& key : keys) packed += key;
    if (auto fast = FastMatch(packed, adopt)) return *std::move(fast);
  }
  return GrpcMatch(keys, adopt);
}

absl::StatusOr<std::vector<int64_t>> Client::MatchPrefixPacked(
    absl::string_view keys, bool adopt) {
  constexpr size_t kKeyBytes = fast_channel::kKeyBytes;
  if (keys.size() % kKeyBytes != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the chain's keys are %d bytes, not a whole number of %d-byte keys",
        keys.size(), kKeyBytes));
  }
  if (auto fast = FastMatch(keys, adopt)) return *std::move(fast);
  std::vector<std::string> split(keys.size() / kKeyBytes);
  for (size_t i = 0; i < split.size(); ++i) {
    split[i] = std::string(keys.substr(i * kKeyBytes, kKeyBytes));
  }
  return GrpcMatch(split, adopt);
}

absl::StatusOr<std::vector<int64_t>> Client::GrpcMatch(
    absl::Span<const std::string> keys, bool adopt) {
  ASSIGN_OR_RETURN(const CallStart start, Begin(/*grpc=*/true));
  v1::MatchPrefixRequest request;
  *request.mutable_session() = Ref();
  for (const std::string& key : keys) request.add_keys(key);
  request.set_adopt(adopt);
  v1::MatchPrefixResponse response;
  auto context = NewContext(start.deadline);
  absl::Status status = Observe(FromGrpcStatus(start.stub->MatchPrefix(
                                    context.get(), request, &response)),
                                start);
  if (!status.ok()) return status;
  return Fenced<std::vector<int64_t>>(
      std::vector<int64_t>(response.pages().begin(), response.pages().end()));
}

absl::StatusOr<int64_t> Client::UnpinPrefix(absl::Span<const int64_t> pages) {
  ASSIGN_OR_RETURN(const CallStart start, Begin(/*grpc=*/true));
  v1::UnpinPrefixRequest request;
  *request.mutable_session() = Ref();
  request.mutable_pages()->Add(pages.begin(), pages.end());
  v1::UnpinPrefixResponse response;
  auto context = NewContext(start.deadline);
  absl::Status status = Observe(FromGrpcStatus(start.stub->UnpinPrefix(
                                    context.get(), request, &response)),
                                start);
  if (!status.ok()) return status;
  return response.pages_unpinned();
}

void Client::Release(const Allocation& allocation) {
  absl::MutexLock lock(&mu_);
  // An earlier link's ring went with that link: nothing to release.
  if (allocation.link_epoch() != link_epoch_.load(std::memory_order_relaxed)) {
    return;
  }
  release_up_to_ = std::max(release_up_to_, allocation.ring_end());
}

absl::Status Client::FlushRelease() {
  ASSIGN_OR_RETURN(const CallStart start, Begin(/*grpc=*/true));
  v1::ReleaseRingRequest request;
  *request.mutable_session() = Ref();
  request.set_up_to(start.release_up_to);
  v1::ReleaseRingResponse response;
  auto context = NewContext(start.deadline);
  return Observe(FromGrpcStatus(start.stub->ReleaseRing(context.get(), request,
                                                        &response)),
                 start);
}

absl::StatusOr<v1::GetStatsResponse> Client::GetStats(bool include_sessions) {
  v1::GetStatsRequest request;
  request.set_include_sessions(include_sessions);
  // GetStats needs no session and changes nothing: one that fails because
  // the daemon died under it is tried again once, on the new link.
  for (int attempt = 0;; ++attempt) {
    const absl::Time deadline = absl::Now() + options_.call_timeout;
    std::shared_ptr<v1::PageAllocator::Stub> current;
    uint64_t epoch;
    {
      absl::MutexLock lock(&mu_);
      while (reconnecting_ && session_status_.ok()) {
        if (link_changed_.WaitWithDeadline(&mu_, deadline)) break;
      }
      current = stub_;
      epoch = link_epoch_.load(std::memory_order_relaxed);
    }
    v1::GetStatsResponse response;
    auto context = NewContext(deadline);
    absl::Status status =
        FromGrpcStatus(current->GetStats(context.get(), request, &response));
    if (status.ok()) return response;
    if (attempt == 0 && absl::IsUnavailable(status) && LinkLost(epoch)) {
      continue;
    }
    return status;
  }
}

absl::Status Client::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::OkStatus();
    closed_ = true;
    closed_status_ = absl::FailedPreconditionError("the session was closed");
    link_changed_.SignalAll();
    if (!session_status_.ok()) return absl::OkStatus();  // already gone
  }
  // A Connect that failed before Register succeeded has nothing to close
  // (and, without a target, no stub to close it with).
  if (session_token_.empty()) return absl::OkStatus();
  // A reconnect under way stops here; the session is closed on the link
  // there is.
  StopWatching();
  // The daemon reclaims pages still waiting for the release fence with the
  // session: first let this process's queued work on them finish.
  WaitForReleases();
  StopKeepAlive();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  auto stream = stub()->KeepAlive(&context);
  v1::KeepAliveRequest goodbye;
  *goodbye.mutable_session() = Ref();
  goodbye.set_close(true);
  stream->Write(goodbye);
  stream->WritesDone();
  return FromGrpcStatus(stream->Finish());
}

absl::Status Client::Detach() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return closed_status_;
    if (!session_status_.ok()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("session %d cannot be detached: it is gone (%s)",
                          session_id_, session_status_.ToString()));
    }
    if (!resumable_) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "session %d is not resumable (ClientOptions.resumable): the daemon "
          "would reclaim it when this client lets go; Close it instead",
          session_id_));
    }
  }
  // The daemon releases the pages of pending fenced frees at the Resume:
  // first let this process's queued work on them finish.
  WaitForReleases();
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    closed_status_ = absl::FailedPreconditionError(absl::StrFormat(
        "session %d was detached (Client::Detach): it waits for a Resume "
        "until its lease runs out",
        session_id_));
    link_changed_.SignalAll();
  }
  // No more renewals, then the connection closes: the daemon keeps the
  // session, detached, for its lease.
  StopKeepAlive();
  if (keepalive_.joinable()) keepalive_.join();
  StopWatching();
  {
    absl::MutexLock lock(&mu_);
    for (const std::unique_ptr<Link>& link : links_) {
      link->memory_connection.reset();
    }
  }
  // Done once the daemon has seen the close, so that a Resume from now on
  // finds the session detached rather than still connected.
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  absl::Duration wait = absl::Milliseconds(1);
  absl::Status last;
  while (true) {
    absl::StatusOr<v1::GetStatsResponse> stats =
        GetStats(/*include_sessions=*/true);
    if (stats.ok()) {
      bool connected = false;
      for (const v1::SessionStats& session : stats->sessions()) {
        connected |= session.session_id() == session_id_ && session.connected();
      }
      if (!connected) return absl::OkStatus();
    } else {
      last = stats.status();
    }
    if (absl::Now() + wait > deadline) break;
    absl::SleepFor(wait);
    wait = std::min(wait * 2, absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrFormat(
      "session %d was let go, but the daemon did not show it detached "
      "within the call's %s timeout%s",
      session_id_, absl::FormatDuration(options_.call_timeout),
      last.ok() ? "" : " (last GetStats: " + last.ToString() + ")"));
}

absl::Status Client::OrderAfter(const Allocation& allocation,
                                void* cuda_stream) const {
  const CompletionCounter* counter =
      completion_counter_.load(std::memory_order_acquire);
  if (counter == nullptr || !allocation.on_device()) return absl::OkStatus();
  if (allocation.link_epoch() != link_epoch()) {
    return absl::FailedPreconditionError(
        "the allocation was answered by the daemon before it restarted: its "
        "launch's completion counter will not move again (its slots stay "
        "readable until the client is destroyed)");
  }
  return counter->OrderAfter(allocation.completion_value(), cuda_stream);
}

absl::Status Client::OrderAfterCompletion(void* cuda_stream) const {
  const CompletionCounter* counter =
      completion_counter_.load(std::memory_order_acquire);
  if (counter == nullptr) return absl::OkStatus();
  return counter->OrderAfter(
      last_completion_value_.load(std::memory_order_relaxed), cuda_stream);
}

const int64_t* Client::ring_slots() const {
  return ring_.load(std::memory_order_acquire)->slots();
}

int64_t Client::ring_capacity_slots() const {
  return ring_.load(std::memory_order_acquire)->capacity_slots();
}

bool Client::ring_on_device() const {
  return ring_.load(std::memory_order_acquire)->on_device();
}

const fast_channel::ChannelCodec* Client::reserve_channel() const {
  const FastChannelClient* fast = fast_.load(std::memory_order_acquire);
  return fast != nullptr ? &fast->codec() : nullptr;
}

absl::Status Client::CopyToHost(const int64_t* slots, int64_t count,
                                int64_t* out) const {
  // The ring the slots lie in: the current one, or an earlier link's (they
  // stay mapped while the client lives).
  const RingView* in = nullptr;
  {
    absl::MutexLock lock(&mu_);
    for (auto link = links_.rbegin(); link != links_.rend(); ++link) {
      const RingView& ring = *(*link)->ring;
      if (slots >= ring.slots() &&
          slots + count <= ring.slots() + ring.capacity_slots()) {
        in = &ring;
        break;
      }
    }
  }
  if (in != nullptr) return in->CopyToHost(slots, count, out);
  // Inline results are host memory already.
  std::copy(slots, slots + count, out);
  return absl::OkStatus();
}

}  // namespace pagealloc
