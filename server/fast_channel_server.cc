#include "server/fast_channel_server.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <type_traits>
#include <utility>

#include "absl/strings/str_format.h"
#include "allocator/prefix_index.h"
#include "common/adaptive_spin.h"
#include "common/cpu_relax.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace pagealloc {
namespace {

// The call's tag as the pool keeps it (SessionRef.call_id, retry).
CallTag TagOf(const fast_channel::TakenCall& call) {
  return CallTag{call.call_id, (call.options & fast_channel::kRetry) != 0};
}

}  // namespace

namespace {

// epoll data of a poller's own wake-up eventfd; channels' doorbells carry
// their session id, which is never 0.
constexpr uint64_t kWakeTag = 0;

void Ring(int eventfd_fd) {
  const uint64_t one = 1;
  // Only fails when the counter is full (2^64 - 2 rings not yet read).
  (void)!write(eventfd_fd, &one, sizeof(one));
}

// Reads and resets an eventfd's counter: how many times it was written
// since the last read (0 when never).
uint64_t Drain(int eventfd_fd) {
  uint64_t count = 0;
  if (read(eventfd_fd, &count, sizeof(count)) != sizeof(count)) return 0;
  return count;
}

constexpr absl::string_view kShuttingDown = "the daemon is shutting down";

absl::StatusOr<UniqueFd> NewEventFd() {
  UniqueFd fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!fd.valid()) {
    return absl::InternalError(
        absl::StrFormat("eventfd failed: %s", std::strerror(errno)));
  }
  return fd;
}

absl::StatusOr<UniqueFd> Duplicate(int fd) {
  UniqueFd copy(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!copy.valid()) {
    return absl::InternalError(
        absl::StrFormat("dup failed: %s", std::strerror(errno)));
  }
  return copy;
}

}  // namespace

using fast_channel::CallKind;
using fast_channel::Capacity;
using fast_channel::ChannelCodec;
using fast_channel::ChannelLayout;

struct FastChannelServer::Channel {
  Channel(uint64_t id, std::string session_token, MemoryBudget::Charge charged,
          std::unique_ptr<SharedRegion> shared, UniqueFd bell,
          const Capacity& capacity,
          std::shared_ptr<RetiredChannelHeaders> retired)
      : session_id(id),
        token(std::move(session_token)),
        charge(std::move(charged)),
        region(std::move(shared)),
        doorbell(std::move(bell)),
        codec(region->base(), capacity),
        retired_headers(std::move(retired)) {}

  // Frees the memory even where the client still maps it, before the
  // charge is given back: all but the header, whose session_ended word
  // and end_reason the client reads after the end (the stale-answer
  // fence), which waits among the retired headers until their bounds free
  // it too. Not the channel of a session kept for a successor (Stop with
  // kKeep): its client reads this header until it learns that the daemon
  // went, and zeros there would read as its session's end; the memory
  // goes when the client, resumed, unmaps it.
  ~Channel() {
    if (kept_for_successor.load(std::memory_order_acquire)) return;
    retired_headers->Retire(std::move(region),
                            sizeof(fast_channel::ChannelHeader), absl::Now());
  }

  const uint64_t session_id;
  const std::string token;
  // The region's memory in the sessions' budget; declared first, so that
  // it is given back last.
  MemoryBudget::Charge charge;
  // Moved to the retired headers when the channel goes.
  std::unique_ptr<SharedRegion> region;
  // The eventfd its client writes when the poller sleeps.
  const UniqueFd doorbell;
  // The capacity is the daemon's own record, never the header's.
  ChannelCodec codec;
  const std::shared_ptr<RetiredChannelHeaders> retired_headers;
  int poller = 0;  // the poller that serves this channel
  // Poller only: the last request_seq taken, and the call copied out of
  // shared memory (its arrays reused from call to call).
  uint32_t taken_seq = 0;
  fast_channel::TakenCall taken;
  // A call of this channel is being answered; the poller takes no other
  // (a client that posts again before its answer is not believed).
  std::atomic<bool> in_flight{false};
  std::unique_ptr<ChannelReply> reply;
  // A kMatchPrefix's answer (the core answers a match through a
  // PrefixReply).
  std::unique_ptr<MatchReply> match_reply;
  // Its session_ended word is set (Close or Stop; under mu_).
  bool ended = false;
  // Its session outlives this daemon (Stop with kKeep): ~Channel leaves
  // its memory to the client's mapping.
  std::atomic<bool> kept_for_successor{false};
  // The reserve's reclaim (AskForReserves): when the daemon last
  // asked this channel for its reserve, and that ask while unanswered by a
  // return call (absl::ToUnixNanos; 0: none).
  std::atomic<int64_t> last_ask_ns{0};
  std::atomic<int64_t> pending_ask_ns{0};

  // Abuse (poller only, but early_posts, which replies count). The ring
  // balance is the rings drained minus the calls taken since the last ring
  // strike. An honest client rings at most once per call and posts a call
  // only after the previous one was taken and answered, so its rings never
  // outnumber its calls taken by more than one (a ring may be drained
  // before its call is taken). No floor: the doorbell's counter is drained
  // lazily (only when the poller sleeps), so rings of many calls may come
  // in one read, long after the calls were taken.
  int64_t ring_balance = 0;
  int64_t ring_strikes = 0;
  // Calls taken whose sequence number skipped one or more: the client
  // posted more than once since its last call was taken, so at least once
  // before that call's answer.
  int64_t skipped_posts = 0;
  // Answers published after the client had already posted its next call.
  std::atomic<int64_t> early_posts{0};
  int64_t forgiven = 0;      // strikes forgiven when a throttle was lifted
  int64_t seen_strikes = 0;  // strikes at the last Police
  absl::Time last_strike = absl::InfinitePast();
  bool throttled = false;
  absl::Time next_service = absl::InfinitePast();  // while throttled
  bool dropped = false;

  int64_t flood_strikes() const {
    return skipped_posts + early_posts.load(std::memory_order_relaxed);
  }
  int64_t strikes() const { return ring_strikes + flood_strikes() - forgiven; }
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
                        answer.launch->batch_requests, answer.launch->launch_id,
                        answer.launch->completion_value);
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
    FastChannelServer::PublishAnswer(*channel_, seq);
  }

 private:
  Channel* const channel_;
  std::shared_ptr<Channel> self_;
  uint32_t seq_ = 0;
  bool delivered_ = false;
};

// Answers a kMatchPrefix into its channel: the pages found into new_pages,
// their number into op_value (or the refusal); then publishes the answer.
class FastChannelServer::MatchReply final : public PrefixReply {
 public:
  explicit MatchReply(Channel* channel) : channel_(channel) {}

  // Starts a call: keeps the channel alive until Complete.
  void Begin(std::shared_ptr<Channel> self, uint32_t seq) {
    self_ = std::move(self);
    seq_ = seq;
    pages.clear();
    set_value(0);
  }

  void Complete(const absl::Status& status) override {
    // Copies first, as ChannelReply's.
    const std::shared_ptr<Channel> keep = std::move(self_);
    const uint32_t seq = seq_;
    ChannelCodec& codec = channel_->codec;
    absl::Status answer = status;
    if (answer.ok()) answer = codec.WriteMatchedPages(pages);
    if (!answer.ok()) codec.WriteRefusal(answer);
    FastChannelServer::PublishAnswer(*channel_, seq);
  }

 private:
  Channel* const channel_;
  std::shared_ptr<Channel> self_;
  uint32_t seq_ = 0;
};

absl::StatusOr<std::unique_ptr<FastChannelServer>> FastChannelServer::Create(
    const Options& options, CallCore* core) {
  RETURN_IF_ERROR(fast_channel::ValidateCapacity(
      {options.max_requests, options.message_bytes}));
  std::vector<std::unique_ptr<Poller>> pollers;
  for (int i = 0; i < std::max(1, options.pollers); ++i) {
    auto poller = std::make_unique<Poller>();
    poller->spin_budget_ns.store(absl::ToInt64Nanoseconds(options.spin));
    poller->epoll.reset(epoll_create1(EPOLL_CLOEXEC));
    if (!poller->epoll.valid()) {
      return absl::InternalError(
          absl::StrFormat("epoll_create1 failed: %s", std::strerror(errno)));
    }
    ASSIGN_OR_RETURN(poller->wake, NewEventFd());
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = kWakeTag;
    if (epoll_ctl(poller->epoll.get(), EPOLL_CTL_ADD, poller->wake.get(),
                  &event) != 0) {
      return absl::InternalError(
          absl::StrFormat("epoll_ctl failed: %s", std::strerror(errno)));
    }
    pollers.push_back(std::move(poller));
  }
  auto server = std::unique_ptr<FastChannelServer>(
      new FastChannelServer(options, core, std::move(pollers)));
  core->AddSessionObserver(server.get());
  return server;
}

FastChannelServer::FastChannelServer(
    const Options& options, CallCore* core,
    std::vector<std::unique_ptr<Poller>> pollers)
    : options_(options),
      core_(core),
      retired_headers_(std::make_shared<RetiredChannelHeaders>(
          RetiredChannelHeaders::Options{options.retired_headers_max,
                                         options.retired_header_life,
                                         options.budget})),
      pollers_(std::move(pollers)) {
  // The first poller frees the retired headers when due: a first one kept
  // wakes it to learn when.
  retired_headers_->SetFirstKept([this] { Wake(0); });
  for (size_t i = 0; i < pollers_.size(); ++i) {
    pollers_[i]->thread = std::thread([this, i] { Poll(i); });
  }
}

FastChannelServer::~FastChannelServer() { Stop(); }

const char* FastChannelServer::AbuseName(Abuse abuse) {
  switch (abuse) {
    case Abuse::kDoorbell:
      return "doorbell";
    case Abuse::kFlood:
      return "flood";
  }
  return "unknown";
}

void FastChannelServer::Wake(int index) { Ring(pollers_[index]->wake.get()); }

void FastChannelServer::Stop(SessionsAtStop sessions) {
  // A channel that outlives the server (a reply holding it) retires its
  // header with no poller to wake.
  retired_headers_->SetFirstKept(nullptr);
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_) {
      stopped_ = true;
      // The daemon goes away with every session, unless a successor takes
      // them over: then the answers given so far hold (the state journal
      // has them), and the client moves to a new channel when it resumes.
      for (const auto& [id, channel] : channels_) {
        if (sessions == SessionsAtStop::kKeep) {
          if (!channel->ended) {
            channel->kept_for_successor.store(true, std::memory_order_release);
          }
          continue;
        }
        if (channel->ended) continue;
        channel->ended = true;
        channel->codec.EndSession(kShuttingDown);
      }
      // Why each session ended stays readable after the daemon exits: a
      // client that had not looked yet learns it from its header.
      if (sessions != SessionsAtStop::kKeep) retired_headers_->LeaveToClients();
    }
  }
  stop_.store(true);
  for (size_t i = 0; i < pollers_.size(); ++i) Wake(i);
  for (const std::unique_ptr<Poller>& poller : pollers_) {
    if (poller->thread.joinable()) poller->thread.join();
  }
}

absl::StatusOr<ChannelCapacity> FastChannelServer::SessionOpened(
    uint64_t session_id, const std::string& session_token) {
  const Capacity capacity{options_.max_requests, options_.message_bytes};
  const ChannelLayout layout(capacity.max_requests, capacity.message_bytes);
  MemoryBudget::Charge charge;
  if (options_.budget != nullptr) {
    const int64_t page = sysconf(_SC_PAGESIZE);
    ASSIGN_OR_RETURN(
        charge,
        options_.budget->Take(
            (static_cast<int64_t>(layout.total_bytes) + page - 1) / page * page,
            "a fast channel"));
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<SharedRegion> region,
      SharedRegion::Create(absl::StrFormat("pagealloc-channel.%d", session_id),
                           layout.total_bytes));
  ASSIGN_OR_RETURN(UniqueFd doorbell, NewEventFd());
  auto channel = std::make_shared<Channel>(
      session_id, session_token, std::move(charge), std::move(region),
      std::move(doorbell), capacity, retired_headers_);
  channel->codec.Initialize();
  channel->reply = std::make_unique<ChannelReply>(channel.get());
  channel->match_reply = std::make_unique<MatchReply>(channel.get());
  absl::MutexLock lock(&mu_);
  channel->poller = next_poller_++ % static_cast<int>(pollers_.size());
  // The poller may be asleep: its epoll set takes the doorbell now, and the
  // channel starts with poller_sleeping set (codec), so the client's first
  // call rings and the poller wakes to find the channel.
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = session_id;
  if (epoll_ctl(pollers_[channel->poller]->epoll.get(), EPOLL_CTL_ADD,
                channel->doorbell.get(), &event) != 0) {
    return absl::InternalError(
        absl::StrFormat("epoll_ctl failed: %s", std::strerror(errno)));
  }
  // The session's release word lives in its channel's header (the release
  // fence, fast_channel/layout.h); the core's pointer keeps the channel
  // mapped until the session ends.
  RETURN_IF_ERROR(core_->AttachReleaseWord(
      session_id, ReleaseQueues::Word(channel, channel->codec.release_word())));
  channels_[session_id] = std::move(channel);
  generation_.fetch_add(1);
  return ChannelCapacity{capacity.max_requests, capacity.message_bytes};
}

bool FastChannelServer::HasChannel(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  return channels_.contains(session_id);
}

absl::StatusOr<FastChannelServer::ChannelFds> FastChannelServer::ExportFds(
    uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(session_id);
  if (it == channels_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("session %d has no fast channel", session_id));
  }
  const Channel& channel = *it->second;
  if (channel.region->fd() < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "session %d's fast channel was handed over already", session_id));
  }
  ChannelFds fds;
  ASSIGN_OR_RETURN(fds.memory, Duplicate(channel.region->fd()));
  fds.bytes = channel.region->bytes();
  ASSIGN_OR_RETURN(fds.doorbell, Duplicate(channel.doorbell.get()));
  return fds;
}

void FastChannelServer::CloseMemoryDescriptor(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(session_id);
  if (it != channels_.end()) it->second->region->CloseFd();
}

void FastChannelServer::Close(uint64_t session_id, absl::string_view reason) {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(session_id);
  if (it == channels_.end()) return;
  // The fence first: the core frees the session's pages only after this
  // returns, so a client that reads an answer and then finds the word clear
  // read it while the session still owned them.
  if (!it->second->ended) {
    it->second->ended = true;
    it->second->codec.EndSession(reason);
  }
  const int poller = it->second->poller;
  epoll_ctl(pollers_[poller]->epoll.get(), EPOLL_CTL_DEL,
            it->second->doorbell.get(), nullptr);
  // The memory goes when the poller and any call in flight let go of the
  // channel (and the client unmaps it): wake the poller to let go now.
  channels_.erase(it);
  generation_.fetch_add(1);
  Wake(poller);
}

void FastChannelServer::Take(const std::shared_ptr<Channel>& channel,
                             uint32_t seq, std::vector<AllocCall>* prepared) {
  Channel& c = *channel;
  ChannelReply& reply = *c.reply;
  fast_channel::TakenCall& call = c.taken;
  c.taken_seq = seq;
  --c.ring_balance;
  c.in_flight.store(true, std::memory_order_relaxed);
  const absl::Status taken = c.codec.TakeCall(&call);
  if (!taken.ok()) {
    reply.Begin(channel, seq);
    reply.Complete(taken);
    return;
  }
  calls_.fetch_add(1, std::memory_order_relaxed);
  if (call.kind == CallKind::kMatchPrefix) {
    c.match_reply->Begin(channel, seq);
    SubmitTakenMatch(c);
    return;
  }
  reply.Begin(channel, seq);
  const int32_t n = call.num_requests;
  switch (call.kind) {
    case CallKind::kExtend:
      PrepareTakenAlloc(c, Method::kAllocExtend,
                        {RequestKind::kExtend, n, call.in0.data(),
                         call.in1.data(), call.in2.data()},
                        prepared);
      return;
    case CallKind::kDecode:
      PrepareTakenAlloc(
          c, Method::kAllocDecode,
          {RequestKind::kDecode, n, nullptr, call.in1.data(), call.in2.data()},
          prepared);
      return;
    case CallKind::kAlloc:
      PrepareTakenAlloc(
          c, Method::kAlloc,
          {RequestKind::kAlloc, n, nullptr, call.in1.data(), nullptr},
          prepared);
      return;
    case CallKind::kFreeSlots:
    case CallKind::kFreePages:
      SubmitTakenFree(c);
      return;
    case CallKind::kCheckpoint:
      core_->SubmitCheckpoint(c.session_id, c.token, Transport::kFastChannel,
                              &reply, TagOf(call));
      return;
    case CallKind::kRollback:
      if (call.in1.size() > 1) {
        reply.Complete(absl::InvalidArgumentError(absl::StrFormat(
            "fast channel: a rollback carries at most one checkpoint id, "
            "not %d",
            call.in1.size())));
        return;
      }
      core_->SubmitRollback(
          c.session_id, c.token, Transport::kFastChannel, &reply,
          call.in1.empty() ? 0 : static_cast<uint64_t>(call.in1[0]),
          TagOf(call));
      return;
    case CallKind::kMatchPrefix:  // answered above, through its own reply
      return;
  }
}

void FastChannelServer::PrepareTakenAlloc(Channel& c, Method method,
                                          const CallArrays& arrays,
                                          std::vector<AllocCall>* prepared) {
  const fast_channel::TakenCall& call = c.taken;
  AllocCallInput input;
  input.method = method;
  input.transport = Transport::kFastChannel;
  input.session_id = c.session_id;
  input.session_token = c.token;
  input.arrays = arrays;
  input.release_ring_up_to = call.release_ring_up_to;
  input.async_completion = (call.options & fast_channel::kAsyncCompletion) != 0;
  input.checkpoint_first = (call.options & fast_channel::kCheckpointFirst) != 0;
  input.free_pages_first = call.free_first;
  input.all_or_nothing = (call.options & fast_channel::kAllOrNothing) != 0;
  input.call = TagOf(call);
  AllocCall prepared_call;
  if (core_->PrepareAlloc(input, c.reply.get(), &prepared_call)) {
    // This poller serves its channels for good (see AllocCall).
    prepared_call.submitter_is_dedicated = true;
    prepared->push_back(prepared_call);
  }
}

void FastChannelServer::SubmitTakenFree(Channel& c) {
  const fast_channel::TakenCall& call = c.taken;
  ChannelReply& reply = *c.reply;
  NoteReturn(c);
  const uint32_t order_bits =
      call.options &
      (fast_channel::kFreeAscending | fast_channel::kFreeFirstAppearance);
  if (order_bits ==
      (fast_channel::kFreeAscending | fast_channel::kFreeFirstAppearance)) {
    reply.Complete(absl::InvalidArgumentError(
        "fast channel: a free asks for both orders"));
    return;
  }
  const FreeOrder order = order_bits == fast_channel::kFreeAscending
                              ? FreeOrder::kAscending
                          : order_bits == fast_channel::kFreeFirstAppearance
                              ? FreeOrder::kFirstAppearance
                              : FreeOrder::kDefault;
  // Runs as soon as the batcher takes it (possibly right here); the values
  // live in the channel's TakenCall until it completes.
  core_->SubmitFree(
      c.session_id, c.token,
      call.kind == CallKind::kFreeSlots ? FreeUnit::kSlots : FreeUnit::kPages,
      call.in1, Transport::kFastChannel, &reply, order, call.release_value,
      TagOf(call));
}

void FastChannelServer::PublishAnswer(Channel& c, uint32_t seq) {
  // Before the answer is out an honest client cannot have posted again: it
  // waits for response_seq == seq.
  if (c.codec.PostedSeq() != seq) {
    c.early_posts.fetch_add(1, std::memory_order_relaxed);
  }
  c.in_flight.store(false, std::memory_order_release);
  c.codec.Publish(seq);
}

void FastChannelServer::SubmitTakenMatch(Channel& c) {
  const fast_channel::TakenCall& call = c.taken;
  // The gRPC handler's path: the core authenticates the session before it
  // returns, then queues the match (and adopt) of the taken copy's keys on
  // the batcher as an operation of the session (the pool checks the
  // chain's length there).
  // Why not answer it here, straight from the pool: a match must apply in
  // order with the session's other work (a free or rollback queued behind
  // a running launch, a gRPC call of the same session, the release fence's
  // frees), and only the batcher's queue orders them; and through the core
  // the authentication, the chain's checks, the adopt's quota, its atomicity
  // with the match (one PagePool::MatchPrefix under the pool's lock) and the
  // metrics are the gRPC call's own code. What it costs: when a launch is
  // running the match waits for it; otherwise this thread runs it at once
  // (server/batcher.h, "Who drives"). It joins no launch: it is not an
  // allocation.
  // The taken copy stays as it is until the answer is out: the poller
  // takes no other call of the channel while this one is in flight, and
  // the reply holds the channel.
  static_assert(std::is_same_v<fast_channel::Key, PrefixKey>);
  core_->SubmitTakenMatchPrefix(c.session_id, c.token, call.keys,
                                (call.options & fast_channel::kAdopt) != 0,
                                Transport::kFastChannel, c.match_reply.get());
}

void FastChannelServer::CountRings(Channel& c) {
  const uint64_t rings = Drain(c.doorbell.get());
  if (rings == 0) return;
  c.ring_balance += static_cast<int64_t>(std::min<uint64_t>(rings, 1 << 30));
  if (c.ring_balance > 1) {
    ++c.ring_strikes;
    c.ring_balance = 0;
  }
}

void FastChannelServer::LogThrottle(const Channel& c, Abuse abuse,
                                    int64_t strikes) {
  int64_t unlogged = 0;
  {
    absl::MutexLock lock(&log_mu_);
    const absl::Time now = absl::Now();
    if (now - last_throttle_log_ < absl::Seconds(1)) {
      ++unlogged_throttles_;
      return;
    }
    last_throttle_log_ = now;
    unlogged = unlogged_throttles_;
    unlogged_throttles_ = 0;
  }
  Logger("session")->warn(
      "session {} throttled on its fast channel ({}: {} strikes; {} more "
      "throttles in the last second not logged)",
      c.session_id,
      abuse == Abuse::kDoorbell ? "doorbell rung without calls"
                                : "calls posted before their answers",
      strikes, unlogged);
}

void FastChannelServer::SetThrottled(Channel& c, bool throttled) {
  if (c.throttled == throttled) return;
  c.throttled = throttled;
  const int delta = throttled ? 1 : -1;
  pollers_[c.poller]->throttled += delta;
  throttled_now_.fetch_add(delta, std::memory_order_relaxed);
}

void FastChannelServer::Police(Channel& c, absl::Time now) {
  const int64_t strikes = c.strikes();
  if (strikes == c.seen_strikes) {
    if (c.throttled && now - c.last_strike >= options_.throttle_time) {
      // Behaved for throttle_time: forgiven, and its doorbell heard again
      // (unless the channel was closed meanwhile).
      SetThrottled(c, false);
      c.forgiven += strikes;
      c.seen_strikes = 0;
      absl::MutexLock lock(&mu_);
      auto it = channels_.find(c.session_id);
      if (it != channels_.end() && it->second.get() == &c) {
        epoll_event event{};
        event.events = EPOLLIN;
        event.data.u64 = c.session_id;
        epoll_ctl(pollers_[c.poller]->epoll.get(), EPOLL_CTL_ADD,
                  c.doorbell.get(), &event);
      }
    }
    return;
  }
  c.seen_strikes = strikes;
  c.last_strike = now;
  const Abuse abuse =
      c.ring_strikes >= c.flood_strikes() ? Abuse::kDoorbell : Abuse::kFlood;
  if (options_.drop_strikes > 0 && strikes >= options_.drop_strikes) {
    c.dropped = true;
    SetThrottled(c, false);
    // The core ends the session like any other (Close sets the fence, the
    // memory socket tells the client why, the pages are reclaimed) and
    // logs it once.
    const std::string reason = absl::StrFormat(
        "dropped: %s on its fast channel (%d strikes)",
        abuse == Abuse::kDoorbell ? "rang its doorbell without calls"
                                  : "posted calls before their answers",
        strikes);
    if (core_->ReclaimSession(c.session_id, reason)) {
      dropped_[static_cast<int>(abuse)].fetch_add(1, std::memory_order_relaxed);
    }
    return;
  }
  if (options_.throttle_strikes > 0 && strikes >= options_.throttle_strikes &&
      !c.throttled) {
    SetThrottled(c, true);
    c.next_service = now + options_.throttled_interval;
    throttled_[static_cast<int>(abuse)].fetch_add(1, std::memory_order_relaxed);
    // Its rings wake nobody now; they are read (and counted) when its turn
    // comes.
    epoll_ctl(pollers_[c.poller]->epoll.get(), EPOLL_CTL_DEL, c.doorbell.get(),
              nullptr);
    LogThrottle(c, abuse, strikes);
  }
}

void FastChannelServer::Poll(int index) {
  Poller& me = *pollers_[index];
  std::vector<std::shared_ptr<Channel>> channels;
  absl::flat_hash_map<uint64_t, Channel*> by_session;
  uint64_t seen_generation = ~uint64_t{0};
  std::vector<AllocCall> prepared;
  absl::Time last_call = absl::Now();
  // Options.spin is the cap; the budget follows the gaps between calls.
  AdaptiveSpin spin(options_.spin);
  // Whether the poller slept since the last call it took.
  bool slept = false;
  size_t first = 0;  // where this round starts: one further each round
  while (!stop_.load(std::memory_order_relaxed)) {
    const uint64_t generation = generation_.load();
    if (generation != seen_generation) {
      CollectChannels(index, &channels, &by_session);
      seen_generation = generation;
    }
    // Throttled channels are looked at once per throttled_interval; with
    // none (the usual case) a round reads no clock.
    const absl::Time now =
        me.throttled > 0 ? absl::Now() : absl::InfinitePast();
    bool took = false;
    const size_t n = channels.size();
    for (size_t k = 0; k < n; ++k) {
      const std::shared_ptr<Channel>& channel = channels[(first + k) % n];
      Channel& c = *channel;
      if (c.dropped) continue;
      if (c.throttled) {
        if (now < c.next_service) continue;
        c.next_service = now + options_.throttled_interval;
        CountRings(c);
        Police(c, now);
        if (c.dropped) continue;
      }
      if (!Posted(c)) continue;
      // An honest client posts once per answer: call seq follows the last
      // one taken. (Unsigned: wraps like the client's counter.)
      const uint32_t seq = c.codec.PostedSeq();
      if (seq - c.taken_seq > 1) ++c.skipped_posts;
      // Its previous answer may also have gone out after it posted this
      // call. Policed before the call is taken: a session dropped here has
      // nothing of it left to submit.
      if (c.strikes() != c.seen_strikes) {
        Police(c, absl::Now());
        if (c.dropped) continue;
      }
      took = true;
      Take(channel, seq, &prepared);
    }
    if (n > 0) first = (first + 1) % n;
    if (took) {
      const absl::Duration gap = absl::Now() - last_call;
      if (slept) {
        spin.Slept(gap);
      } else {
        spin.Caught(gap);
      }
      slept = false;
      me.spin_budget_ns.store(absl::ToInt64Nanoseconds(spin.budget()),
                              std::memory_order_relaxed);
      // Every call posted by now shares one launch (unless one is running).
      core_->SubmitPrepared(std::move(prepared));
      prepared.clear();
      last_call = absl::Now();
      continue;
    }
    if (!slept && absl::Now() - last_call < spin.budget()) {
      CpuRelax();
      continue;
    }
    slept =
        SleepOnDoorbells(me, channels, by_session, seen_generation) || slept;
    // last_call stays, and `slept` keeps the poller from spinning again
    // until it takes a call: a wake-up that finds no call (a doorbell rung
    // for nothing) goes back to sleep.
  }
}

bool FastChannelServer::Posted(const Channel& c) {
  return !c.in_flight.load(std::memory_order_acquire) &&
         c.codec.PostedSeq() != c.taken_seq;
}

void FastChannelServer::CollectChannels(
    int index, std::vector<std::shared_ptr<Channel>>* channels,
    absl::flat_hash_map<uint64_t, Channel*>* by_session) {
  absl::MutexLock lock(&mu_);
  // A throttled channel that was closed is throttled no more.
  for (const std::shared_ptr<Channel>& channel : *channels) {
    if (!channels_.contains(channel->session_id)) {
      SetThrottled(*channel, false);
    }
  }
  channels->clear();
  by_session->clear();
  for (const auto& [id, channel] : channels_) {
    if (channel->poller != index) continue;
    channels->push_back(channel);
    (*by_session)[id] = channel.get();
    // Awake: its client need not ring.
    channel->codec.SetPollerSleeping(false);
  }
}

bool FastChannelServer::SleepOnDoorbells(
    Poller& me, const std::vector<std::shared_ptr<Channel>>& channels,
    const absl::flat_hash_map<uint64_t, Channel*>& by_session,
    uint64_t seen_generation) {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  bool slept = false;
  // Sleep on the doorbells. A client bumps request_seq, then reads
  // poller_sleeping; the poller sets poller_sleeping, then looks at the
  // channels once more: one of the two sees the other (layout.h).
  for (const std::shared_ptr<Channel>& channel : channels) {
    channel->codec.SetPollerSleeping(true);
  }
  bool pending = generation_.load() != seen_generation;
  for (const std::shared_ptr<Channel>& channel : channels) {
    // A throttled channel's call waits for its turn (the timeout below).
    pending = pending ||
              (!channel->dropped && !channel->throttled && Posted(*channel));
  }
  if (!pending && !stop_.load()) {
    sleeps_.fetch_add(1, std::memory_order_relaxed);
    // Throttled channels are not in the epoll set: wake for their turn.
    int timeout_ms =
        me.throttled > 0
            ? std::max<int>(
                  1, absl::ToInt64Milliseconds(options_.throttled_interval))
            : -1;
    // The first poller frees the ended sessions' header pages when due.
    const bool first_poller = &me == pollers_[0].get();
    if (first_poller) {
      const absl::Time due = retired_headers_->next_expiry();
      if (due != absl::InfiniteFuture()) {
        const int until_due = static_cast<int>(std::clamp<int64_t>(
            absl::ToInt64Milliseconds(due - absl::Now()) + 1, 1, 60000));
        timeout_ms =
            timeout_ms < 0 ? until_due : std::min(timeout_ms, until_due);
      }
    }
    me.asleep.store(true, std::memory_order_relaxed);
    const int woken =
        epoll_wait(me.epoll.get(), events, kMaxEvents, timeout_ms);
    me.asleep.store(false, std::memory_order_relaxed);
    slept = true;
    for (int i = 0; i < woken; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) {
        Drain(me.wake.get());
        continue;
      }
      // A channel opened since the list was made stays readable until
      // the next round has it in the list.
      auto it = by_session.find(tag);
      if (it == by_session.end() || it->second->dropped) continue;
      CountRings(*it->second);
      Police(*it->second, absl::Now());
    }
    if (first_poller) retired_headers_->FreeExpired(absl::Now());
  }
  for (const std::shared_ptr<Channel>& channel : channels) {
    channel->codec.SetPollerSleeping(false);
  }
  return slept;
}

int FastChannelServer::pollers_asleep() const {
  int asleep = 0;
  for (const std::unique_ptr<Poller>& poller : pollers_) {
    asleep += poller->asleep.load(std::memory_order_relaxed) ? 1 : 0;
  }
  return asleep;
}

absl::Duration FastChannelServer::poller_spin_budget(int index) const {
  return absl::Nanoseconds(
      pollers_[index]->spin_budget_ns.load(std::memory_order_relaxed));
}

// ---- Session page reserves.

int FastChannelServer::AskForReserves(uint64_t starving, int64_t pages) {
  const int64_t now = absl::ToUnixNanos(absl::Now());
  const int64_t interval = absl::ToInt64Nanoseconds(kReclaimInterval);
  int asked = 0;
  absl::MutexLock lock(&mu_);
  for (auto& [session_id, channel] : channels_) {
    if (session_id == starving || channel->ended) continue;
    // The interval bounds what a starving session's retries cost the
    // others: one wake of each reserve thread per interval.
    int64_t last = channel->last_ask_ns.load(std::memory_order_relaxed);
    if (now - last < interval || !channel->last_ask_ns.compare_exchange_strong(
                                     last, now, std::memory_order_relaxed)) {
      continue;
    }
    int64_t unset = 0;
    channel->pending_ask_ns.compare_exchange_strong(unset, now,
                                                    std::memory_order_relaxed);
    channel->codec.AskForReserve(pages);
    ++asked;
  }
  reclaim_asks_.fetch_add(asked, std::memory_order_relaxed);
  return asked;
}

void FastChannelServer::NoteReturn(Channel& channel) {
  const int64_t asked =
      channel.pending_ask_ns.exchange(0, std::memory_order_relaxed);
  if (asked == 0) return;
  reclaim_returns_.fetch_add(1, std::memory_order_relaxed);
  reclaim_latency_.Observe(
      static_cast<double>(absl::ToUnixNanos(absl::Now()) - asked) * 1e-9);
}

std::vector<FastChannelServer::SessionReserve>
FastChannelServer::SessionReserves() const {
  std::vector<SessionReserve> reserves;
  absl::MutexLock lock(&mu_);
  reserves.reserve(channels_.size());
  for (const auto& [session_id, channel] : channels_) {
    const ChannelCodec::ReserveHints hints = channel->codec.ReadReserveHints();
    reserves.push_back({session_id, hints.pages, hints.refills, hints.returns});
  }
  return reserves;
}

}  // namespace pagealloc
