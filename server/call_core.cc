#include "server/call_core.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kept_state/session_record.h"

namespace pagealloc {
namespace {

absl::Status DrainingError() {
  return absl::UnavailableError(
      "the daemon is draining; reconnect to its successor");
}

}  // namespace

const char* ResumeOutcomeName(ResumeOutcome outcome) {
  static constexpr const char* kNames[kNumResumeOutcomes] = {
      "resumed",         "taken_over",      "not_found",
      "unauthenticated", "still_connected", "refused"};
  return kNames[static_cast<int>(outcome)];
}

// What the pool keeps of a session as its owner's metadata: the kept
// state's record of it, from which a restarted daemon restores it.
std::string SessionRecordOf(const Session& session) {
  KeptSession kept;
  kept.token_digest = session.token_digest();
  kept.client_name = session.client_name();
  kept.quota_pages = session.quota_pages();
  kept.resumable = session.resumable();
  return EncodeKeptSession(kept);
}

CallCore::CallCore(const Options& options, PagePool* pool, Backend* backend,
                   SessionRegistry* sessions, Batcher* batcher)
    : options_(options),
      limits_{options.max_call_requests, options.max_call_tokens},
      pool_(pool),
      backend_(backend),
      sessions_(sessions),
      batcher_(batcher),
      log_(Logger("session")) {
  batcher_->SetBeforeLaunch([this] { ReleasePassed(); });
}

absl::StatusOr<std::shared_ptr<Session>> CallCore::OpenSession(
    const SessionRequest& request, absl::string_view peer) {
  if (draining_) return DrainingError();
  if (!options_.register_secret.empty() &&
      !ConstantTimeEquals(options_.register_secret, request.register_secret)) {
    log_->warn("Register from {} refused: wrong or missing register_secret",
               std::string(peer));
    return absl::UnauthenticatedError(
        "Register: wrong or missing register_secret (this pool runs with "
        "--register_secret_file; its sessions share one KV slab)");
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<Session> session,
      sessions_->Open(request.client_name, request.ring_capacity_slots,
                      request.quota_pages, request.resumable));
  const absl::Status added = pool_->AddOwner(
      session->id(), session->quota_pages(), SessionRecordOf(*session));
  if (!added.ok()) {
    sessions_->Remove(session->id());
    return added;
  }
  counters_.sessions_opened++;
  log_->info("session {} ({}) opened from {}: ring {} slots, quota {} pages{}",
             session->id(), session->client_name(), std::string(peer),
             session->ring_capacity_slots(), session->quota_pages(),
             session->resumable() ? ", resumable" : "");
  return session;
}

absl::StatusOr<std::shared_ptr<Session>> CallCore::CountResume(
    absl::StatusOr<std::shared_ptr<Session>> answer, bool was_connected) {
  ResumeOutcome outcome = ResumeOutcome::kRefused;
  if (answer.ok()) {
    outcome =
        was_connected ? ResumeOutcome::kTakenOver : ResumeOutcome::kResumed;
  } else if (absl::IsNotFound(answer.status())) {
    outcome = ResumeOutcome::kNotFound;
  } else if (absl::IsUnauthenticated(answer.status())) {
    outcome = ResumeOutcome::kUnauthenticated;
  } else if (absl::IsFailedPrecondition(answer.status())) {
    outcome = ResumeOutcome::kStillConnected;
  }
  counters_.resumes[static_cast<int>(outcome)].fetch_add(
      1, std::memory_order_relaxed);
  return answer;
}

absl::StatusOr<std::shared_ptr<Session>> CallCore::ResumeSession(
    const ResumeRequestInput& request, absl::string_view peer) {
  if (draining_) return CountResume(DrainingError(), false);
  if (!options_.register_secret.empty() &&
      !ConstantTimeEquals(options_.register_secret, request.register_secret)) {
    log_->warn("Resume from {} refused: wrong or missing register_secret",
               std::string(peer));
    return CountResume(
        absl::UnauthenticatedError(
            "Resume: wrong or missing register_secret (this pool runs with "
            "--register_secret_file; its sessions share one KV slab)"),
        false);
  }
  absl::StatusOr<std::shared_ptr<Session>> found =
      sessions_->Authenticate(request.session_id, request.session_token);
  if (!found.ok()) return CountResume(found.status(), false);
  std::shared_ptr<Session> session = *std::move(found);
  // Refused before a ring is made for nothing (ReplaceRing checks again,
  // under the session's lock).
  if (session->link() == SessionLink::kConnected && !request.take_over) {
    return CountResume(
        absl::FailedPreconditionError(absl::StrFormat(
            "session %d is still connected (a process holds its memory "
            "socket connection); pass take_over to take it from that process",
            session->id())),
        false);
  }
  absl::StatusOr<SessionRegistry::NewRing> ring =
      sessions_->MakeRing(session->id(), request.ring_capacity_slots);
  if (!ring.ok()) return CountResume(ring.status(), false);
  const int64_t capacity = ring->memory->capacity_slots();
  absl::StatusOr<Session::Relinked> relinked = session->ReplaceRing(
      std::move(ring->memory), std::move(ring->charge), request.take_over);
  if (!relinked.ok()) return CountResume(relinked.status(), false);
  const bool was_connected = relinked->was == SessionLink::kConnected;
  // Frees waiting on the old fast channel's release word: its writer was
  // the process that held the session. They go in order with the
  // session's work, ahead of anything the resuming client sends.
  std::vector<ReleaseQueues::Released> released =
      releases_.Detach(session->id(), absl::Now());
  // And the pages the pool still marks as awaiting release: those of a
  // daemon that restarted with the session, whose queue was not kept.
  const uint64_t owner = session->id();
  batcher_
      ->SubmitOp(owner,
                 [this, owner, released = std::move(released)] {
                   for (const ReleaseQueues::Released& r : released) {
                     FreeAwaited(owner, r.pages);
                   }
                   FreeStillAwaited(owner);
                 })
      .IgnoreError();  // refused only while the batcher stops
  for (SessionObserver* observer : observers_) {
    observer->SessionResumed(session->id(), relinked->old_generation,
                             was_connected);
  }
  log_->info("session {} ({}) resumed from {}: ring {} slots{}", session->id(),
             session->client_name(), std::string(peer), capacity,
             was_connected ? ", taken over from its connected client" : "");
  return CountResume(std::move(session), was_connected);
}

absl::StatusOr<CallTag> CallCore::KeptTag(CallTag call) const {
  if (call.retry && call.id == 0) {
    return absl::InvalidArgumentError(
        "session.retry is set without a session.call_id");
  }
  if (options_.call_tags_kept) return call;
  if (call.retry) {
    return absl::AbortedError(absl::StrFormat(
        "call %d was sent again after the daemon restarted, but this daemon "
        "keeps its state in a format from an older release, which holds no "
        "call ids: whether the call took effect is unknown (ListPages gives "
        "the session's pages)",
        call.id));
  }
  return CallTag{};
}

absl::StatusOr<std::shared_ptr<Session>> CallCore::Authenticate(
    uint64_t session_id, absl::string_view token) {
  if (draining_) return DrainingError();
  return sessions_->Authenticate(session_id, token);
}

void CallCore::FreeSessionPages(std::shared_ptr<Session> session,
                                bool reclaimed, std::string reason,
                                std::function<void()> freed_callback) {
  // The session's queued work runs first; the session object (and its ring)
  // lives until the last piece of it is done.
  auto free_pages = [this, session, reclaimed, reason,
                     freed_callback = std::move(freed_callback)] {
    // Pages waiting for the session's release fence go with its others:
    // its client's queued work is gone with its process (death, lost
    // lease) or was fenced by its library before it closed
    // (docs/design.md, "The release fence").
    releases_.Forget(session->id());
    absl::StatusOr<int64_t> freed = pool_->RemoveOwner(session->id());
    const int64_t pages = freed.ok() ? *freed : 0;
    if (reclaimed) {
      counters_.pages_reclaimed += pages;
      log_->warn("session {} ({}) {}: {} {} reclaimed, ring released",
                 session->id(), session->client_name(), reason, pages,
                 pages == 1 ? "page" : "pages");
    } else {
      log_->info("session {} ({}) {}: {} {} freed", session->id(),
                 session->client_name(), reason, pages,
                 pages == 1 ? "page" : "pages");
    }
    if (freed_callback) freed_callback();
  };
  for (SessionObserver* observer : observers_) {
    observer->SessionClosed(session->id(), reason);
  }
  if (!batcher_->SubmitOp(session->id(), free_pages).ok()) free_pages();
  counters_.sessions_closed++;
}

bool CallCore::CloseSession(uint64_t session_id, const std::string& reason,
                            std::function<void()> freed) {
  std::shared_ptr<Session> session = sessions_->Remove(session_id);
  if (session == nullptr) return false;
  FreeSessionPages(std::move(session), /*reclaimed=*/false, reason,
                   std::move(freed));
  return true;
}

bool CallCore::ReclaimSession(uint64_t session_id, const std::string& reason) {
  std::shared_ptr<Session> session = sessions_->Remove(session_id);
  if (session == nullptr) return false;
  counters_.sessions_reclaimed++;
  FreeSessionPages(std::move(session), /*reclaimed=*/true, reason);
  return true;
}

bool CallCore::DisconnectSession(uint64_t session_id, uint64_t generation,
                                 bool keep_if_resumable,
                                 const std::string& reason) {
  std::shared_ptr<Session> session = sessions_->Find(session_id);
  if (session == nullptr) return false;
  switch (session->Disconnected(generation)) {
    case Session::Disconnect::kStale:
      return false;
    case Session::Disconnect::kDetached:
      if (keep_if_resumable) {
        counters_.sessions_detached++;
        log_->info(
            "session {} ({}) {}: kept for a Resume until its lease runs out "
            "(resumable)",
            session_id, session->client_name(), reason);
        return false;
      }
      break;
    case Session::Disconnect::kEnded:
      break;
  }
  return ReclaimSession(session_id, reason);
}

int CallCore::ReclaimExpired(absl::Time now) {
  int reclaimed = 0;
  for (std::shared_ptr<Session>& session : sessions_->TakeExpired(now)) {
    ++reclaimed;
    counters_.sessions_reclaimed++;
    FreeSessionPages(std::move(session), /*reclaimed=*/true, "lost its lease");
  }
  return reclaimed;
}

bool CallCore::PrepareAlloc(const AllocCallInput& input, AllocReply* reply,
                            AllocCall* call) {
  const absl::Time start = absl::Now();
  const Method method = input.method;
  const Transport transport = input.transport;
  auto refuse = [this, reply, method, transport,
                 start](const absl::Status& status) {
    Answer(reply, method, transport, start, status);
    return false;
  };
  if (draining_) return refuse(DrainingError());
  absl::StatusOr<std::shared_ptr<Session>> authenticated =
      sessions_->Authenticate(input.session_id, input.session_token);
  if (!authenticated.ok()) return refuse(authenticated.status());
  Session& session = **authenticated;
  absl::StatusOr<CallTag> tag = KeptTag(input.call);
  if (!tag.ok()) return refuse(tag.status());
  {
    const absl::Status valid =
        DecodeCall(input.arrays, session.id(), pool_->geometry(), limits_,
                   &reply->decoded_);
    if (!valid.ok()) return refuse(valid);
  }
  if (input.release_ring_up_to != 0) {
    absl::Status released = session.ReleaseRing(input.release_ring_up_to);
    if (!released.ok()) {
      return refuse(absl::InvalidArgumentError(absl::StrFormat(
          "options.release_ring_up_to: %s", released.message())));
    }
  }
  const int64_t num_slots = reply->decoded_.num_slots;
  int64_t ring_start = 0;
  reply->ring_.reset();
  if (!input.return_inline) {
    absl::StatusOr<int64_t> reserved =
        session.ReserveRing(num_slots, &reply->ring_);
    if (!reserved.ok()) return refuse(reserved.status());
    ring_start = *reserved;
  }
  absl::Span<AllocRequest> requests = absl::MakeSpan(reply->decoded_.requests);
  // Where each request's slots start in the ring (by its shape, so that a
  // refused request keeps its place and offsets stay prefix sums), and,
  // unless the slots go inline, the destination the executor writes.
  std::vector<int64_t>& ring_offsets = reply->ring_offsets_;
  ring_offsets.clear();
  if (!input.return_inline) {
    ring_offsets.resize(requests.size());
    RingMemory& ring = *reply->ring_;
    const int64_t first = ring_start % ring.capacity_slots();
    int64_t* const base = ring.slots() + first;
    int64_t offset = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      ring_offsets[i] = first + offset;
      requests[i].destination = base + offset;
      offset += ToExtendShape(requests[i]).num_slots();
    }
  }
  reply->core_ = this;
  reply->method_ = method;
  reply->transport_ = transport;
  reply->start_ = start;
  reply->session_ = *std::move(authenticated);
  reply->ring_start_ = ring_start;
  reply->ring_reserved_ = !input.return_inline;
  reply->ring_end_ = input.return_inline ? 0 : ring_start + num_slots;
  reply->inline_results_ = input.return_inline;
  reply->free_pages_first_ = input.free_pages_first;
  reply->checkpoint_first_ = input.checkpoint_first;
  reply->call_ = *tag;
  reply->pages_freed_first_ = 0;

  *call = AllocCall();
  call->session_id = reply->session_->id();
  call->requests = requests;
  call->num_slots = num_slots;
  call->return_inline = input.return_inline;
  call->async_completion = input.async_completion;
  call->all_or_nothing = input.all_or_nothing;
  call->call = *tag;
  call->has_before = !input.free_pages_first.empty() || input.checkpoint_first;
  call->completion = reply;
  return true;
}

absl::Status AllocReply::Before() {
  const uint64_t owner = session_->id();
  if (!free_pages_first_.empty()) {
    const absl::Status none_pending =
        core_->releases_.any_pending()
            ? core_->releases_.CheckNotPending(owner, free_pages_first_)
            : absl::OkStatus();
    // Tagged, the free is a part of the call: a retry of a call whose
    // free took effect is answered with what it freed.
    absl::StatusOr<int64_t> freed =
        none_pending.ok() ? core_->pool_->FreePages(owner, free_pages_first_,
                                                    FreeOrder::kDefault, call_)
                          : absl::StatusOr<int64_t>(none_pending);
    if (!freed.ok()) {
      // Free's message names pages[i]; here they are these pages.
      return absl::Status(
          freed.status().code(),
          absl::StrCat("options.free_pages_first: ", freed.status().message()));
    }
    pages_freed_first_ = *freed;
  }
  if (checkpoint_first_) {
    return core_->pool_->Checkpoint(owner, call_).status();
  }
  return absl::OkStatus();
}

void AllocReply::Cancel(const absl::Status& status) {
  if (ring_reserved_) {
    session_->UnreserveRing(ring_start_, decoded_.num_slots, ring_.get());
  }
  session_.reset();
  ring_.reset();
  core_->Answer(this, method_, transport_, start_, status);
}

void AllocReply::Done(absl::Span<const AllocResult> results,
                      absl::Span<const int64_t> inline_slots,
                      const LaunchInfo& launch) {
  AllocAnswer answer;
  answer.results = results;
  answer.ring_offsets = ring_offsets_;
  answer.inline_slots = inline_slots;
  answer.inline_results = inline_results_;
  answer.ring_end = ring_end_;
  answer.pages_freed_first = pages_freed_first_;
  answer.launch = &launch;
  core_->NotePoolShort(session_->id(), results);
  Deliver(answer);
  session_.reset();
  ring_.reset();
  core_->Answer(this, method_, transport_, start_, absl::OkStatus());
}

void CallCore::NotePoolShort(uint64_t session_id,
                             absl::Span<const AllocResult> results) {
  int64_t exhausted = 0;
  for (const AllocResult& result : results) {
    exhausted += result.status.code() == absl::StatusCode::kResourceExhausted;
  }
  if (exhausted == 0) return;
  for (SessionObserver* observer : observers_) {
    observer->PoolShort(session_id, exhausted);
  }
}

void CallCore::SubmitPrepared(std::vector<AllocCall> calls) {
  if (calls.empty()) return;
  // Kept for the refusal below: SubmitAllocs takes the calls.
  std::vector<AllocCompletion*> completions;
  completions.reserve(calls.size());
  for (const AllocCall& call : calls) completions.push_back(call.completion);
  const absl::Status submitted = batcher_->SubmitAllocs(std::move(calls));
  if (submitted.ok()) return;
  // Refused as a whole (draining): give the ring space back, answer each.
  for (AllocCompletion* completion : completions) {
    completion->Cancel(submitted);
  }
}

void CallCore::SubmitOp(Reply* reply, Method method, Transport transport,
                        absl::Time start, uint64_t session_id,
                        std::function<absl::Status()> op) {
  absl::Status submitted = batcher_->SubmitOp(
      session_id, [this, reply, method, transport, start, op = std::move(op)] {
        Answer(reply, method, transport, start, op());
      });
  if (!submitted.ok()) Answer(reply, method, transport, start, submitted);
}

void CallCore::Answer(Reply* reply, Method method, Transport transport,
                      absl::Time start, const absl::Status& status) {
  rpc_metrics_.Record(method, transport, status.code(), absl::Now() - start);
  reply->Complete(status);
}

void CallCore::SubmitFree(uint64_t session_id, absl::string_view token,
                          FreeUnit unit, absl::Span<const int64_t> values,
                          Transport transport, Reply* reply, FreeOrder order,
                          uint64_t release_value, CallTag call) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Session>> session =
      Authenticate(session_id, token);
  if (!session.ok()) {
    return Answer(reply, Method::kFree, transport, start, session.status());
  }
  absl::StatusOr<CallTag> tag = KeptTag(call);
  if (!tag.ok())
    return Answer(reply, Method::kFree, transport, start, tag.status());
  const uint64_t owner = (*session)->id();
  reply->set_value(0);
  SubmitOp(reply, Method::kFree, transport, start, owner,
           [this, owner, unit, values, reply, order, release_value,
            call = *tag]() -> absl::Status {
             if (release_value != 0 || releases_.any_pending()) {
               return FreeFenced(owner, unit, values, order, release_value,
                                 call, reply);
             }
             ASSIGN_OR_RETURN(
                 const int64_t freed,
                 unit == FreeUnit::kSlots
                     ? pool_->FreeSlots(owner, values, order, call)
                     : pool_->FreePages(owner, values, order, call));
             reply->set_value(freed);
             return absl::OkStatus();
           });
}

absl::Status CallCore::FreeFenced(uint64_t owner, FreeUnit unit,
                                  absl::Span<const int64_t> values,
                                  FreeOrder order, uint64_t release_value,
                                  CallTag call, Reply* reply) {
  if (call.retry) {
    // Answered before the checks: a free that took effect has changed
    // what they would find (its pages are free now, or awaiting).
    ASSIGN_OR_RETURN(std::optional<PoolKeptCall> kept,
                     pool_->RetriedCall(owner, call, kCallFree));
    if (kept.has_value()) {
      reply->set_value(kept->freed);
      return absl::OkStatus();
    }
  }
  // The pool's own checks (range, double free, another session's page),
  // with its messages; then none of the pages may be pending already.
  ASSIGN_OR_RETURN(
      std::vector<int64_t> pages,
      pool_->CheckFree(owner, values, unit == FreeUnit::kSlots, order));
  RETURN_IF_ERROR(releases_.CheckNotPending(owner, pages));
  const int64_t n = static_cast<int64_t>(pages.size());
  if (release_value == 0) {
    // A plain free while other pages are pending: as FreePages of the
    // checked pages, in the order the check resolved.
    ASSIGN_OR_RETURN(
        const int64_t freed,
        pool_->FreePages(owner, pages, FreeOrder::kFirstAppearance, call));
    reply->set_value(freed);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(releases_.Add(owner, release_value, pages, absl::Now()));
  // The pool marks them too, so that a kept state knows them: a daemon
  // restarted before the fence passed frees them when the session resumes
  // (its client waits for its fences first), not never.
  absl::Status marked = pool_->AwaitRelease(owner, pages, call);
  if (!marked.ok()) {
    log_->error(
        "session {}: {} pages freed with a fence are not marked as "
        "awaiting release in the pool: {}",
        owner, pages.size(), marked.ToString());
  }
  reply->set_value(n);
  // A fence that has passed already (the CPU backend's, whose client
  // writes its word before it posts the free) frees at once.
  ReleasePassed();
  if (releases_.any_pending()) {
    absl::MutexLock lock(&poller_mu_);
    poller_wake_.Signal();
  }
  return absl::OkStatus();
}

void CallCore::ReleasePassed() {
  for (ReleaseQueues::Released& released :
       releases_.TakeReleased(absl::Now())) {
    release_wait_.Observe(absl::ToDoubleSeconds(released.waited));
    // The pages were checked when the free arrived and have stayed the
    // session's since (pending pages leave the queue when a rollback or a
    // clear gives them back, and with their session).
    FreeAwaited(released.owner, released.pages);
  }
}

void CallCore::FreeAwaited(uint64_t owner, absl::Span<const int64_t> pages) {
  absl::StatusOr<int64_t> freed =
      pool_->FreePages(owner, pages, FreeOrder::kFirstAppearance);
  if (freed.ok()) {
    pages_released_.fetch_add(*freed, std::memory_order_relaxed);
  } else {
    log_->error(
        "session {}: {} pages whose release fence passed could not be "
        "freed: {}",
        owner, pages.size(), freed.status().ToString());
  }
}

void CallCore::FreeStillAwaited(uint64_t owner) {
  absl::StatusOr<std::vector<int64_t>> awaiting =
      pool_->PagesAwaitingRelease(owner);
  if (!awaiting.ok() || awaiting->empty()) return;
  log_->info(
      "session {}: {} pages freed with a fence before the daemon's restart "
      "are freed now that the session resumed",
      owner, awaiting->size());
  FreeAwaited(owner, *awaiting);
}

void CallCore::PollReleases() {
  if (!releases_.any_pending()) return;
  // Ordered with the sessions' work on the batcher; refused only while it
  // stops, when the sessions' pages are reclaimed anyway.
  batcher_->SubmitOp(0, [this] { ReleasePassed(); }).IgnoreError();
}

void CallCore::RunReleasePoller() {
  poller_mu_.Lock();
  while (!poller_stop_) {
    if (!releases_.any_pending()) {
      // A fenced free that leaves pages pending signals after they count.
      poller_wake_.Wait(&poller_mu_);
      continue;
    }
    poller_wake_.WaitWithTimeout(&poller_mu_, kReleasePollInterval);
    if (poller_stop_) break;
    poller_mu_.Unlock();
    PollReleases();
    poller_mu_.Lock();
  }
  poller_mu_.Unlock();
}

int64_t CallCore::WaitForReleases(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // The release poller looks every interval while pages are pending (it
  // stops after the batcher); this only waits for it.
  while (releases_.any_pending() && absl::Now() < deadline) {
    absl::SleepFor(kReleasePollInterval);
  }
  return releases_.pending_pages();
}

void CallCore::StopReleasePoller() {
  absl::MutexLock lock(&poller_mu_);
  poller_stop_ = true;
  poller_wake_.Signal();
}

absl::Status CallCore::AttachReleaseWord(uint64_t session_id,
                                         ReleaseQueues::Word word) {
  return releases_.Attach(session_id, std::move(word));
}

void CallCore::SubmitCheckpoint(uint64_t session_id, absl::string_view token,
                                Transport transport, Reply* reply,
                                CallTag call) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Session>> session =
      Authenticate(session_id, token);
  absl::StatusOr<CallTag> tag = session.ok() ? KeptTag(call) : session.status();
  if (!tag.ok()) {
    return Answer(reply, Method::kCheckpoint, transport, start, tag.status());
  }
  const uint64_t owner = (*session)->id();
  reply->set_value(0);
  SubmitOp(reply, Method::kCheckpoint, transport, start, owner,
           [this, owner, reply, call = *tag]() -> absl::Status {
             ASSIGN_OR_RETURN(const uint64_t id,
                              pool_->Checkpoint(owner, call));
             reply->set_value(static_cast<int64_t>(id));
             return absl::OkStatus();
           });
}

void CallCore::SubmitRollback(uint64_t session_id, absl::string_view token,
                              Transport transport, Reply* reply,
                              uint64_t checkpoint_id, CallTag call) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Session>> session =
      Authenticate(session_id, token);
  absl::StatusOr<CallTag> tag = session.ok() ? KeptTag(call) : session.status();
  if (!tag.ok()) {
    return Answer(reply, Method::kRollback, transport, start, tag.status());
  }
  const uint64_t owner = (*session)->id();
  reply->set_value(0);
  SubmitOp(reply, Method::kRollback, transport, start, owner,
           [this, owner, reply, checkpoint_id, call = *tag]() -> absl::Status {
             ASSIGN_OR_RETURN(const int64_t returned,
                              pool_->Rollback(owner, checkpoint_id, call));
             // Pending pages the rollback gave back leave the queue.
             if (releases_.any_pending()) {
               releases_.Retain(owner, [this, owner](int64_t page) {
                 return pool_->OwnerOf(page) == owner;
               });
             }
             reply->set_value(returned);
             return absl::OkStatus();
           });
}

void CallCore::SubmitListPages(uint64_t session_id, absl::string_view token,
                               Transport transport, PrefixReply* reply) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Session>> session =
      Authenticate(session_id, token);
  if (!session.ok()) {
    return Answer(reply, Method::kListPages, transport, start,
                  session.status());
  }
  const uint64_t owner = (*session)->id();
  reply->set_value(0);
  SubmitOp(reply, Method::kListPages, transport, start, owner,
           [this, owner, reply]() -> absl::Status {
             ASSIGN_OR_RETURN(PagePool::OwnedPages pages,
                              pool_->PagesOwnedBy(owner));
             reply->pages = std::move(pages.owned);
             reply->shared = std::move(pages.shared);
             reply->set_value(reply->pages.size());
             return absl::OkStatus();
           });
}

void CallCore::SubmitClearSession(uint64_t session_id, absl::string_view token,
                                  Transport transport, Reply* reply,
                                  CallTag call) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Session>> session =
      Authenticate(session_id, token);
  absl::StatusOr<CallTag> tag = session.ok() ? KeptTag(call) : session.status();
  if (!tag.ok()) {
    return Answer(reply, Method::kClearSession, transport, start, tag.status());
  }
  const uint64_t owner = (*session)->id();
  reply->set_value(0);
  SubmitOp(reply, Method::kClearSession, transport, start, owner,
           [this, owner, reply, call = *tag]() -> absl::Status {
             ASSIGN_OR_RETURN(const int64_t freed,
                              pool_->ClearOwner(owner, call));
             // Its pending pages were among those cleared.
             releases_.Retain(owner, [](int64_t) { return false; });
             reply->set_value(freed);
             return absl::OkStatus();
           });
}

void CallCore::SubmitClearPool(bool force, Transport transport, Reply* reply) {
  const absl::Time start = absl::Now();
  reply->set_value(0);
  if (draining_) {
    return Answer(reply, Method::kClearPool, transport, start, DrainingError());
  }
  if (force && !options_.allow_forced_clear) {
    return Answer(
        reply, Method::kClearPool, transport, start,
        absl::PermissionDeniedError(
            "a forced clear voids every session's slots; this daemon does "
            "not allow it (start it with --allow_forced_clear)"));
  }
  // Session 0 is nobody's: the clear runs in order with the work queued
  // before it, and waits for no session's launch.
  SubmitOp(reply, Method::kClearPool, transport, start, /*session_id=*/0,
           [this, reply, force]() -> absl::Status {
             ASSIGN_OR_RETURN(const int64_t freed, pool_->ClearPool(force));
             // A forced clear freed the pending pages too.
             for (const std::shared_ptr<Session>& session : sessions_->List()) {
               releases_.Retain(session->id(), [](int64_t) { return false; });
             }
             reply->set_value(freed);
             log_->warn("pool cleared{}: {} {} freed", force ? " (forced)" : "",
                        freed, freed == 1 ? "page" : "pages");
             return absl::OkStatus();
           });
}

void CallCore::SubmitPublish(const PublishInput& input, Transport transport,
                             PrefixReply* reply) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Session>> session =
      Authenticate(input.session_id, input.session_token);
  if (!session.ok()) {
    return Answer(reply, Method::kPublish, transport, start, session.status());
  }
  absl::StatusOr<std::vector<PrefixKey>> keys =
      ParsePrefixKeys(input.keys, "keys", pool_->geometry().num_pages);
  if (!keys.ok()) {
    return Answer(reply, Method::kPublish, transport, start, keys.status());
  }
  std::optional<PrefixKey> parent;
  if (!input.parent_key.empty()) {
    absl::StatusOr<PrefixKey> parsed =
        ParsePrefixKey(input.parent_key, "parent_key", 0);
    if (!parsed.ok()) {
      return Answer(reply, Method::kPublish, transport, start,
                    absl::InvalidArgumentError(absl::StrFormat(
                        "parent_key is %d bytes; a prefix key is %d bytes",
                        input.parent_key.size(), kPrefixKeyBytes)));
    }
    parent = *parsed;
  }
  const uint64_t owner = (*session)->id();
  reply->set_value(0);
  SubmitOp(reply, Method::kPublish, transport, start, owner,
           [this, owner, pages = input.pages, keys = *std::move(keys), parent,
            pin = input.pin, reply]() -> absl::Status {
             ASSIGN_OR_RETURN(
                 PublishOutcome outcome,
                 pool_->Publish(owner, pages, keys,
                                parent.has_value() ? &*parent : nullptr, pin));
             reply->pages = std::move(outcome.pages);
             reply->existing = std::move(outcome.existing);
             reply->set_value(outcome.newly_published);
             return absl::OkStatus();
           });
}

void CallCore::SubmitMatchPrefix(uint64_t session_id, absl::string_view token,
                                 absl::Span<const absl::string_view> keys,
                                 bool adopt, Transport transport,
                                 PrefixReply* reply) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<PrefixKey>> parsed =
      ParsePrefixKeys(keys, "keys", pool_->geometry().num_pages);
  absl::Status checked = parsed.status();
  std::vector<PrefixKey> storage;
  if (parsed.ok()) storage = *std::move(parsed);
  // The chain's span points into the vector's heap buffer, which moves
  // into the queued operation with it.
  const absl::Span<const PrefixKey> chain = storage;
  QueueMatch(session_id, token, start, std::move(checked), chain,
             std::move(storage), adopt, transport, reply);
}

void CallCore::SubmitTakenMatchPrefix(uint64_t session_id,
                                      absl::string_view token,
                                      absl::Span<const PrefixKey> keys,
                                      bool adopt, Transport transport,
                                      PrefixReply* reply) {
  // Taken keys are keys already: the chain's one other check, its length,
  // is the pool's (PagePool::MatchPrefix refuses as ParsePrefixKeys does).
  QueueMatch(session_id, token, absl::Now(), absl::OkStatus(), keys, {}, adopt,
             transport, reply);
}

void CallCore::QueueMatch(uint64_t session_id, absl::string_view token,
                          absl::Time start, absl::Status checked,
                          absl::Span<const PrefixKey> chain,
                          std::vector<PrefixKey> storage, bool adopt,
                          Transport transport, PrefixReply* reply) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      Authenticate(session_id, token);
  if (!session.ok()) {
    return Answer(reply, Method::kMatchPrefix, transport, start,
                  session.status());
  }
  if (!checked.ok()) {
    return Answer(reply, Method::kMatchPrefix, transport, start, checked);
  }
  const uint64_t owner = (*session)->id();
  reply->set_value(0);
  SubmitOp(reply, Method::kMatchPrefix, transport, start, owner,
           [this, owner, chain, storage = std::move(storage), adopt,
            reply]() -> absl::Status {
             ASSIGN_OR_RETURN(reply->pages,
                              pool_->MatchPrefix(owner, chain, adopt));
             reply->set_value(reply->pages.size());
             return absl::OkStatus();
           });
}

void CallCore::SubmitUnpinPrefix(uint64_t session_id, absl::string_view token,
                                 absl::Span<const int64_t> pages,
                                 Transport transport, Reply* reply) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Session>> session =
      Authenticate(session_id, token);
  if (!session.ok()) {
    return Answer(reply, Method::kUnpinPrefix, transport, start,
                  session.status());
  }
  const uint64_t owner = (*session)->id();
  reply->set_value(0);
  SubmitOp(reply, Method::kUnpinPrefix, transport, start, owner,
           [this, owner, pages, reply]() -> absl::Status {
             ASSIGN_OR_RETURN(const int64_t unpinned,
                              pool_->Unpin(owner, pages));
             reply->set_value(unpinned);
             return absl::OkStatus();
           });
}

void CallCore::SubmitResetPrefixCache(Transport transport, Reply* reply) {
  const absl::Time start = absl::Now();
  reply->set_value(0);
  if (draining_) {
    return Answer(reply, Method::kResetPrefixCache, transport, start,
                  DrainingError());
  }
  // An operator's call, of no session (0): it runs in order with the work
  // queued before it, as ClearPool does.
  SubmitOp(reply, Method::kResetPrefixCache, transport, start,
           /*session_id=*/0, [this, reply]() -> absl::Status {
             ASSIGN_OR_RETURN(const int64_t evicted, pool_->ResetPrefixCache());
             reply->set_value(evicted);
             log_->info("prefix cache reset: {} {} evicted", evicted,
                        evicted == 1 ? "page" : "pages");
             return absl::OkStatus();
           });
}

absl::StatusOr<FreeListsView> CallCore::FreeLists(int64_t max_pages,
                                                  Transport transport) {
  const absl::Time start = absl::Now();
  absl::Status status = absl::OkStatus();
  if (max_pages < 0 || max_pages > kMaxFreeListPages) {
    status = absl::InvalidArgumentError(absl::StrFormat(
        "max_pages (%d) is outside [0, %d]", max_pages, kMaxFreeListPages));
  }
  FreeListsView view;
  if (status.ok()) {
    view = pool_->FreeLists(max_pages == 0 ? kDefaultFreeListPages : max_pages);
  }
  rpc_metrics_.Record(Method::kGetFreeLists, transport, status.code(),
                      absl::Now() - start);
  if (!status.ok()) return status;
  return view;
}

absl::StatusOr<int64_t> CallCore::ReleaseRing(uint64_t session_id,
                                              absl::string_view token,
                                              int64_t up_to,
                                              Transport transport) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Session>> session =
      Authenticate(session_id, token);
  absl::Status status = session.status();
  if (status.ok()) {
    status = (*session)->ReleaseRing(up_to);
    if (!status.ok()) {
      status = absl::InvalidArgumentError(
          absl::StrFormat("up_to: %s", status.message()));
    }
  }
  rpc_metrics_.Record(Method::kReleaseRing, transport, status.code(),
                      absl::Now() - start);
  if (!status.ok()) return status;
  return (*session)->ring_reserved();
}

PoolDescription CallCore::DescribePool() const {
  PoolDescription pool;
  pool.page_size = pool_->geometry().page_size;
  pool.num_pages = pool_->geometry().num_pages;
  pool.free_policy = pool_->free_policy();
  pool.semantics = pool_->semantics();
  pool.device = backend_->DescribeDevice();
  pool.kv_slab = backend_->kv_slab();
  pool.state_kept = options_.state_kept;
  return pool;
}

}  // namespace pagealloc
