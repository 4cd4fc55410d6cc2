#include "server/service.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/fast_channel_server.h"

namespace pagealloc {
namespace {

absl::Status DrainingError() {
  return absl::UnavailableError(
      "the daemon is draining; reconnect to its successor");
}

}  // namespace

PageAllocatorService::PageAllocatorService(const Options& options,
                                           PagePool* pool, Backend* backend,
                                           SessionRegistry* sessions,
                                           Batcher* batcher)
    : options_(options),
      limits_{options.max_call_requests, options.max_call_tokens},
      pool_(pool),
      backend_(backend),
      sessions_(sessions),
      batcher_(batcher),
      log_(Logger("session")) {}

absl::StatusOr<std::shared_ptr<Session>> PageAllocatorService::Authenticate(
    const v1::SessionRef& ref) {
  if (draining_) return DrainingError();
  return sessions_->Authenticate(ref.session_id(), ref.session_token());
}

void PageAllocatorService::FreeSessionPages(std::shared_ptr<Session> session,
                                            bool lease_lost,
                                            std::string reason) {
  // The session's queued work runs first; the session object (and its ring)
  // lives until the last piece of it is done.
  auto free_pages = [this, session, lease_lost, reason] {
    absl::StatusOr<int64_t> freed = pool_->RemoveOwner(session->id());
    const int64_t pages = freed.ok() ? *freed : 0;
    if (lease_lost) {
      counters_.pages_reclaimed += pages;
      log_->warn("session {} ({}) {}: {} pages reclaimed, ring released",
                 session->id(), session->client_name(), reason, pages);
    } else {
      log_->info("session {} ({}) {}: {} pages freed", session->id(),
                 session->client_name(), reason, pages);
    }
  };
  if (fast_channels_ != nullptr) fast_channels_->Close(session->id());
  if (!batcher_->SubmitOp(session->id(), free_pages).ok()) free_pages();
  counters_.sessions_closed++;
}

bool PageAllocatorService::CloseSession(uint64_t session_id,
                                        const std::string& reason) {
  std::shared_ptr<Session> session = sessions_->Remove(session_id);
  if (session == nullptr) return false;
  FreeSessionPages(std::move(session), /*lease_lost=*/false, reason);
  return true;
}

int PageAllocatorService::ReclaimExpired(absl::Time now) {
  int reclaimed = 0;
  for (std::shared_ptr<Session>& session : sessions_->TakeExpired(now)) {
    ++reclaimed;
    counters_.sessions_reclaimed++;
    FreeSessionPages(std::move(session), /*lease_lost=*/true, "lost its lease");
  }
  return reclaimed;
}

grpc::ServerUnaryReactor* PageAllocatorService::Register(
    grpc::CallbackServerContext* context, const v1::RegisterRequest* request,
    v1::RegisterResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  if (draining_) {
    Finish(reactor, Rpc::kRegister, start, DrainingError());
    return reactor;
  }
  absl::StatusOr<std::shared_ptr<Session>> session =
      sessions_->Open(request->client_name(), request->ring_capacity_slots(),
                      request->quota_pages());
  if (!session.ok()) {
    Finish(reactor, Rpc::kRegister, start, session.status());
    return reactor;
  }
  const absl::Status added =
      pool_->AddOwner((*session)->id(), (*session)->quota_pages());
  if (!added.ok()) {
    sessions_->Remove((*session)->id());
    Finish(reactor, Rpc::kRegister, start, added);
    return reactor;
  }
  counters_.sessions_opened++;
  response->set_session_id((*session)->id());
  response->set_session_token((*session)->token());
  v1::PoolInfo* pool = response->mutable_pool();
  pool->set_page_size(pool_->geometry().page_size);
  pool->set_num_pages(pool_->geometry().num_pages);
  pool->set_free_policy(std::string(FreePolicyName(pool_->free_policy())));
  backend_->DescribeDevice(pool);
  (*session)->ring_memory().Describe(response->mutable_ring());
  response->set_lease_ms(absl::ToInt64Milliseconds(lease()));
  response->set_quota_pages((*session)->quota_pages());
  if (request->fast_channel() && fast_channels_ != nullptr) {
    const absl::Status opened =
        fast_channels_->Open((*session)->id(), (*session)->token(),
                             response->mutable_fast_channel());
    if (!opened.ok()) {
      // The session works without one (over gRPC); say why in the log.
      response->clear_fast_channel();
      log_->warn("session {}: no fast channel: {}", (*session)->id(),
                 std::string(opened.message()));
    }
  }
  log_->info("session {} ({}) opened from {}: ring {} slots, quota {} pages",
             (*session)->id(), (*session)->client_name(), context->peer(),
             (*session)->ring_memory().capacity_slots(),
             (*session)->quota_pages());
  Finish(reactor, Rpc::kRegister, start, absl::OkStatus());
  return reactor;
}

namespace {

// Holds one client's KeepAlive stream: every message renews the lease.
class KeepAliveReactor final
    : public grpc::ServerBidiReactor<v1::KeepAliveRequest,
                                     v1::KeepAliveResponse> {
 public:
  explicit KeepAliveReactor(PageAllocatorService* service)
      : service_(service), opened_(absl::Now()) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client went away without saying goodbye, or the stream broke:
      // the lease runs out on its own unless the client comes back.
      End(absl::OkStatus());
      return;
    }
    absl::StatusOr<std::shared_ptr<Session>> session =
        service_->Authenticate(request_.session());
    if (!session.ok()) {
      End(session.status());
      return;
    }
    if (request_.close()) {
      service_->CloseSession((*session)->id(), "closed by client");
      End(absl::OkStatus());
      return;
    }
    response_.set_lease_remaining_ms(
        absl::ToInt64Milliseconds(service_->lease()));
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(absl::OkStatus());
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  void End(const absl::Status& status) {
    service_->RecordKeepAlive(status.code(), absl::Now() - opened_);
    Finish(ToGrpcStatus(status));
  }

  PageAllocatorService* const service_;
  const absl::Time opened_;
  v1::KeepAliveRequest request_;
  v1::KeepAliveResponse response_;
};

}  // namespace

grpc::ServerBidiReactor<v1::KeepAliveRequest, v1::KeepAliveResponse>*
PageAllocatorService::KeepAlive(grpc::CallbackServerContext*) {
  return new KeepAliveReactor(this);
}

namespace {

// One RequestResult per request (the default answer form).
void FillRequestResults(const AllocAnswer& answer,
                        v1::AllocResponse* response) {
  response->mutable_results()->Reserve(answer.results.size());
  size_t inline_at = 0;
  for (size_t i = 0; i < answer.results.size(); ++i) {
    const AllocResult& result = answer.results[i];
    v1::RequestResult* out = response->add_results();
    out->set_code(static_cast<int>(result.status.code()));
    if (!result.status.ok()) {
      out->set_message(std::string(result.status.message()));
      continue;
    }
    out->set_count(result.num_slots);
    out->set_new_pages(result.num_new_pages);
    if (answer.inline_results) {
      out->mutable_slots()->Add(
          answer.inline_slots.begin() + inline_at,
          answer.inline_slots.begin() + inline_at + result.num_slots);
      inline_at += result.num_slots;
    } else {
      out->set_ring_offset(answer.ring_offsets[i]);
    }
  }
}

// The same content as parallel packed arrays (AllocOptions.packed_results),
// written through raw pointers after one Resize each (no per-element
// capacity checks: this runs for every request of every call).
void FillPackedResults(const AllocAnswer& answer, v1::PackedResults* packed) {
  const int n = answer.results.size();
  packed->mutable_codes()->Resize(n, 0);
  packed->mutable_ring_offsets()->Resize(n, 0);
  packed->mutable_counts()->Resize(n, 0);
  packed->mutable_new_pages()->Resize(n, 0);
  int32_t* codes = packed->mutable_codes()->mutable_data();
  int64_t* offsets = packed->mutable_ring_offsets()->mutable_data();
  int64_t* counts = packed->mutable_counts()->mutable_data();
  int64_t* new_pages = packed->mutable_new_pages()->mutable_data();
  for (int i = 0; i < n; ++i) {
    const AllocResult& result = answer.results[i];
    if (!result.status.ok()) {
      codes[i] = static_cast<int>(result.status.code());
      packed->add_messages(std::string(result.status.message()));
      continue;
    }
    offsets[i] = answer.inline_results ? 0 : answer.ring_offsets[i];
    counts[i] = result.num_slots;
    new_pages[i] = result.num_new_pages;
  }
  // inline_slots holds exactly the accepted requests' slots, in order.
  if (answer.inline_results) {
    packed->mutable_slots()->Add(answer.inline_slots.begin(),
                                 answer.inline_slots.end());
  }
}

}  // namespace

void ResponseReply::Deliver(const AllocAnswer& answer) {
  if (packed_) {
    FillPackedResults(answer, response_->mutable_packed());
  } else {
    FillRequestResults(answer, response_);
  }
  response_->set_ring_end(answer.ring_end);
  response_->set_pages_freed_first(answer.pages_freed_first);
  response_->set_batch_requests(answer.launch->batch_requests);
  response_->set_launch_id(answer.launch->launch_id);
}

std::optional<PageAllocatorService::PreparedCall>
PageAllocatorService::PrepareAlloc(const AllocCallInput& input,
                                   AllocReply* reply) {
  const absl::Time start = absl::Now();
  const Rpc rpc = input.rpc;
  auto refuse = [this, reply, rpc, start](const absl::Status& status) {
    Answer(reply, rpc, start, status);
    return std::nullopt;
  };
  if (draining_) return refuse(DrainingError());
  absl::StatusOr<std::shared_ptr<Session>> authenticated =
      sessions_->Authenticate(input.session_id, input.session_token);
  if (!authenticated.ok()) return refuse(authenticated.status());
  std::shared_ptr<Session> session = *std::move(authenticated);
  PreparedCall prepared;
  AllocCall& call = prepared.call;
  AllocReply::CallStorage& storage = reply->storage();
  storage.pages_freed_first = 0;
  {
    const absl::Status valid =
        DecodeCall(input.arrays, session->id(), pool_->geometry(), limits_,
                   &storage.decoded);
    if (!valid.ok()) return refuse(valid);
    call.requests = absl::MakeSpan(storage.decoded.requests);
    call.num_slots = storage.decoded.num_slots;
  }
  if (input.release_ring_up_to > 0) {
    absl::Status released = session->ReleaseRing(input.release_ring_up_to);
    if (!released.ok()) {
      return refuse(absl::InvalidArgumentError(absl::StrFormat(
          "options.release_ring_up_to: %s", released.message())));
    }
  }
  if (!input.return_inline) {
    absl::StatusOr<int64_t> ring_start = session->ReserveRing(call.num_slots);
    if (!ring_start.ok()) return refuse(ring_start.status());
    prepared.ring_start = *ring_start;
    prepared.ring_reserved = true;
  }
  // Where each request's slots start in the ring (by its shape, so that a
  // refused request keeps its place and offsets stay prefix sums), and,
  // unless the slots go inline, the destination the executor writes.
  std::vector<int64_t>& ring_offsets = storage.ring_offsets;
  ring_offsets.clear();
  if (prepared.ring_reserved) {
    ring_offsets.resize(call.requests.size());
    const int64_t first =
        prepared.ring_start % session->ring_memory().capacity_slots();
    int64_t* const base = session->ring_memory().slots() + first;
    int64_t offset = 0;
    for (size_t i = 0; i < call.requests.size(); ++i) {
      ring_offsets[i] = first + offset;
      call.requests[i].destination = base + offset;
      offset += ToExtendShape(call.requests[i]).num_slots();
    }
  }
  call.session_id = session->id();
  call.return_inline = input.return_inline;
  call.async_completion = input.async_completion;
  const int64_t ring_end =
      input.return_inline ? 0 : prepared.ring_start + call.num_slots;
  const bool inline_results = input.return_inline;
  if (!input.free_pages_first.empty() || input.checkpoint_first) {
    const uint64_t owner = session->id();
    const absl::Span<const int64_t> pages = input.free_pages_first;
    const bool checkpoint = input.checkpoint_first;
    call.before = [this, owner, pages, checkpoint, reply]() -> absl::Status {
      if (!pages.empty()) {
        absl::StatusOr<int64_t> freed = pool_->FreePages(owner, pages);
        if (!freed.ok()) {
          // Free's message names pages[i]; here they are these pages.
          return absl::Status(freed.status().code(),
                              absl::StrCat("options.free_pages_first: ",
                                           freed.status().message()));
        }
        reply->storage().pages_freed_first = *freed;
      }
      if (checkpoint) return pool_->Checkpoint(owner);
      return absl::OkStatus();
    };
    call.cancel = [this, reply, rpc, start, session,
                   ring_start = prepared.ring_start,
                   reserved = prepared.ring_reserved,
                   num_slots = call.num_slots](const absl::Status& status) {
      if (reserved) session->UnreserveRing(ring_start, num_slots);
      Answer(reply, rpc, start, status);
    };
  }
  call.done = [this, reply, rpc, start, ring_end, inline_results](
                  absl::Span<const AllocResult> results,
                  absl::Span<const int64_t> inline_slots,
                  const LaunchInfo& launch) {
    AllocAnswer answer;
    answer.results = results;
    answer.ring_offsets = reply->storage().ring_offsets;
    answer.inline_slots = inline_slots;
    answer.inline_results = inline_results;
    answer.ring_end = ring_end;
    answer.pages_freed_first = reply->storage().pages_freed_first;
    answer.launch = &launch;
    reply->Deliver(answer);
    Answer(reply, rpc, start, absl::OkStatus());
  };
  prepared.session = std::move(session);
  prepared.reply = reply;
  prepared.rpc = rpc;
  prepared.start = start;
  return prepared;
}

void PageAllocatorService::SubmitPrepared(std::vector<PreparedCall> calls) {
  if (calls.empty()) return;
  std::vector<AllocCall> batch;
  batch.reserve(calls.size());
  for (PreparedCall& prepared : calls) {
    batch.push_back(std::move(prepared.call));
  }
  const absl::Status submitted = batcher_->SubmitAllocs(std::move(batch));
  if (submitted.ok()) return;
  // Refused as a whole (draining): give the ring space back, answer each.
  for (PreparedCall& prepared : calls) {
    if (prepared.ring_reserved) {
      prepared.session->UnreserveRing(prepared.ring_start,
                                      prepared.call.num_slots);
    }
    Answer(prepared.reply, prepared.rpc, prepared.start, submitted);
  }
}

void PageAllocatorService::SubmitOp(Reply* reply, Rpc rpc, absl::Time start,
                                    uint64_t session_id,
                                    std::function<absl::Status()> op) {
  absl::Status submitted = batcher_->SubmitOp(
      session_id, [this, reply, rpc, start, op = std::move(op)] {
        Answer(reply, rpc, start, op());
      });
  if (!submitted.ok()) Answer(reply, rpc, start, submitted);
}

void PageAllocatorService::Finish(grpc::ServerUnaryReactor* reactor, Rpc rpc,
                                  absl::Time start,
                                  const absl::Status& status) {
  rpc_metrics_.Record(rpc, status.code(), absl::Now() - start);
  reactor->Finish(ToGrpcStatus(status));
}

grpc::Status PageAllocatorService::Answer(Rpc rpc, absl::Time start,
                                          const absl::Status& status) {
  rpc_metrics_.Record(rpc, status.code(), absl::Now() - start);
  return ToGrpcStatus(status);
}

void PageAllocatorService::Answer(Reply* reply, Rpc rpc, absl::Time start,
                                  const absl::Status& status) {
  rpc_metrics_.Record(rpc, status.code(), absl::Now() - start);
  reply->Complete(status);
}

template <typename Request>
grpc::Status PageAllocatorService::HandleAlloc(const Request& request,
                                               v1::AllocResponse* response,
                                               Rpc rpc) {
  const v1::AllocOptions& options = request.options();
  ResponseReply reply(response, options.packed_results());
  absl::StatusOr<CallArrays> arrays = ArraysOf(request);
  if (!arrays.ok()) {
    // Authentication comes first, as in PrepareAlloc.
    absl::StatusOr<std::shared_ptr<Session>> session =
        Authenticate(request.session());
    return Answer(rpc, absl::Now(),
                  session.ok() ? arrays.status() : session.status());
  }
  AllocCallInput input;
  input.rpc = rpc;
  input.session_id = request.session().session_id();
  input.session_token = request.session().session_token();
  input.arrays = *arrays;
  input.release_ring_up_to = options.release_ring_up_to();
  input.return_inline = options.return_inline();
  input.async_completion = options.async_completion();
  input.free_pages_first = options.free_pages_first();
  input.checkpoint_first = options.checkpoint_first();
  std::optional<PreparedCall> prepared = PrepareAlloc(input, &reply);
  if (prepared.has_value()) {
    std::vector<PreparedCall> calls;
    calls.push_back(*std::move(prepared));
    SubmitPrepared(std::move(calls));
  }
  return reply.Wait();
}

grpc::Status PageAllocatorService::AllocExtend(
    grpc::ServerContext*, const v1::AllocExtendRequest* request,
    v1::AllocResponse* response) {
  return HandleAlloc(*request, response, Rpc::kAllocExtend);
}

grpc::Status PageAllocatorService::AllocDecode(
    grpc::ServerContext*, const v1::AllocDecodeRequest* request,
    v1::AllocResponse* response) {
  return HandleAlloc(*request, response, Rpc::kAllocDecode);
}

grpc::Status PageAllocatorService::Alloc(grpc::ServerContext*,
                                         const v1::AllocRequest* request,
                                         v1::AllocResponse* response) {
  return HandleAlloc(*request, response, Rpc::kAlloc);
}

void PageAllocatorService::SubmitFree(const v1::FreeRequest& request,
                                      v1::FreeResponse* response,
                                      Reply* reply) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Session>> session =
      Authenticate(request.session());
  absl::Status status = session.status();
  if (status.ok()) status = ValidateFree(request);
  if (!status.ok()) return Answer(reply, Rpc::kFree, start, status);
  const uint64_t owner = (*session)->id();
  SubmitOp(reply, Rpc::kFree, start, owner,
           [this, owner, &request, response]() -> absl::Status {
             absl::StatusOr<int64_t> freed =
                 request.slots_size() > 0
                     ? pool_->FreeSlots(owner, request.slots())
                     : pool_->FreePages(owner, request.pages());
             RETURN_IF_ERROR(freed.status());
             response->set_pages_freed(*freed);
             return absl::OkStatus();
           });
}

void PageAllocatorService::SubmitCheckpoint(
    const v1::CheckpointRequest& request, Reply* reply) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Session>> session =
      Authenticate(request.session());
  if (!session.ok()) {
    return Answer(reply, Rpc::kCheckpoint, start, session.status());
  }
  const uint64_t owner = (*session)->id();
  SubmitOp(reply, Rpc::kCheckpoint, start, owner,
           [this, owner] { return pool_->Checkpoint(owner); });
}

void PageAllocatorService::SubmitRollback(const v1::RollbackRequest& request,
                                          v1::RollbackResponse* response,
                                          Reply* reply) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Session>> session =
      Authenticate(request.session());
  if (!session.ok()) {
    return Answer(reply, Rpc::kRollback, start, session.status());
  }
  const uint64_t owner = (*session)->id();
  SubmitOp(reply, Rpc::kRollback, start, owner,
           [this, owner, response]() -> absl::Status {
             ASSIGN_OR_RETURN(int64_t returned, pool_->Rollback(owner));
             response->set_pages_returned(returned);
             return absl::OkStatus();
           });
}

grpc::Status PageAllocatorService::Free(grpc::ServerContext*,
                                        const v1::FreeRequest* request,
                                        v1::FreeResponse* response) {
  PendingReply reply;
  SubmitFree(*request, response, &reply);
  return reply.Wait();
}

grpc::Status PageAllocatorService::Checkpoint(
    grpc::ServerContext*, const v1::CheckpointRequest* request,
    v1::CheckpointResponse*) {
  PendingReply reply;
  SubmitCheckpoint(*request, &reply);
  return reply.Wait();
}

grpc::Status PageAllocatorService::Rollback(grpc::ServerContext*,
                                            const v1::RollbackRequest* request,
                                            v1::RollbackResponse* response) {
  PendingReply reply;
  SubmitRollback(*request, response, &reply);
  return reply.Wait();
}

grpc::Status PageAllocatorService::ReleaseRing(
    grpc::ServerContext*, const v1::ReleaseRingRequest* request,
    v1::ReleaseRingResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Session>> session =
      Authenticate(request->session());
  absl::Status status = session.status();
  if (status.ok()) {
    status = (*session)->ReleaseRing(request->up_to());
    if (!status.ok()) {
      status = absl::InvalidArgumentError(
          absl::StrFormat("up_to: %s", status.message()));
    }
  }
  if (status.ok()) response->set_reserved_slots((*session)->ring_reserved());
  return Answer(Rpc::kReleaseRing, start, status);
}

grpc::ServerUnaryReactor* PageAllocatorService::GetStats(
    grpc::CallbackServerContext* context, const v1::GetStatsRequest* request,
    v1::GetStatsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  const PoolStats stats = pool_->Stats();
  v1::PoolInfo* pool = response->mutable_pool();
  pool->set_page_size(stats.page_size);
  pool->set_num_pages(stats.total_pages);
  pool->set_free_policy(std::string(FreePolicyName(pool_->free_policy())));
  backend_->DescribeDevice(pool);
  response->set_free_pages(stats.free_pages);
  response->set_parked_pages(stats.parked_pages);
  response->set_used_pages(stats.used_pages);
  response->set_slots_allocated_total(stats.slots_allocated);
  response->set_pages_allocated_total(stats.pages_allocated);
  response->set_pages_freed_total(stats.pages_freed);
  response->set_out_of_pages_total(stats.out_of_pages_refusals);
  response->set_free_list_sorts_total(stats.free_list_sorts);
  response->set_launches_total(batcher_->launches());
  const std::vector<std::shared_ptr<Session>> sessions = sessions_->List();
  response->set_sessions_active(sessions.size());
  if (request->include_sessions()) {
    for (const std::shared_ptr<Session>& session : sessions) {
      v1::SessionStats* out = response->add_sessions();
      out->set_session_id(session->id());
      out->set_client_name(session->client_name());
      auto it = stats.owners.find(session->id());
      if (it != stats.owners.end()) {
        out->set_pages_owned(it->second.pages_owned);
        out->set_checkpoint_active(it->second.checkpoint_active);
      }
      out->set_quota_pages(session->quota_pages());
      out->set_ring_capacity_slots(session->ring_memory().capacity_slots());
      out->set_ring_reserved_slots(session->ring_reserved());
    }
  }
  Finish(reactor, Rpc::kGetStats, start, absl::OkStatus());
  return reactor;
}

}  // namespace pagealloc
