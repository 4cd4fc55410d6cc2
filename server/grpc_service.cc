#include "server/grpc_service.h"

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "google/protobuf/descriptor.h"
#include "server/grpc_decoding.h"

namespace pagealloc {
namespace {

// The call's tag as the pool keeps it (SessionRef.call_id, retry).
CallTag TagOf(const v1::SessionRef& session) {
  return CallTag{session.call_id(), session.retry()};
}

v1::Backend ToWire(BackendKind kind) {
  return kind == BackendKind::kCuda ? v1::BACKEND_CUDA : v1::BACKEND_CPU;
}

FreeOrder FromWire(v1::FreeOrder order) {
  switch (order) {
    case v1::FREE_ORDER_ASCENDING:
      return FreeOrder::kAscending;
    case v1::FREE_ORDER_FIRST_APPEARANCE:
      return FreeOrder::kFirstAppearance;
    default:
      return FreeOrder::kDefault;
  }
}

void FillPoolInfo(const PoolDescription& pool, v1::PoolInfo* out) {
  out->set_page_size(pool.page_size);
  out->set_num_pages(pool.num_pages);
  out->set_free_policy(std::string(FreePolicyName(pool.free_policy)));
  out->set_semantics(std::string(SemanticsName(pool.semantics)));
  out->set_backend(ToWire(pool.device.kind));
  out->set_gpu(pool.device.gpu);
  out->set_device_uuid(pool.device.device_uuid);
  out->set_cuda_mps(pool.device.cuda_mps);
  out->set_state_kept(pool.state_kept);
  if (pool.kv_slab != nullptr) {
    const KvSlab& slab = *pool.kv_slab;
    v1::KvSlab* kv = out->mutable_kv_slab();
    kv->set_layout(slab.layout.text);
    kv->set_num_slots(slab.geometry.num_slots);
    kv->set_bytes(slab.geometry.total_bytes);
    kv->set_alignment(slab.geometry.alignment);
    kv->set_bytes_per_page(slab.geometry.bytes_per_page);
    kv->set_scrub(slab.scrub);
    kv->set_slab_id(slab.slab_id);
    for (size_t b = 0; b < slab.layout.buffers.size(); ++b) {
      const KvBufferSpec& spec = slab.layout.buffers[b];
      const KvBufferPlacement& placement = slab.geometry.placements[b];
      v1::KvBuffer* buffer = kv->add_buffers();
      buffer->set_name(spec.name);
      buffer->set_dtype(std::string(KvDtypeName(spec.dtype)));
      buffer->mutable_element_shape()->Add(spec.element_shape.begin(),
                                           spec.element_shape.end());
      buffer->set_offset(placement.offset);
      buffer->set_stride_bytes(placement.stride_bytes);
      buffer->set_bytes(placement.bytes);
    }
  }
}

// The ring's memory (and the CUDA backend's completion counter) goes over
// the memory socket as descriptors; only its capacity travels here.
void FillRing(const RingDescription& ring, v1::OutputRing* out) {
  out->set_capacity_slots(ring.capacity_slots);
}

// Holds one client's KeepAlive stream: every message renews the lease.
// The stream is raw (ByteBuffers) so that a message that does not parse is
// told apart from the stream's end.
class KeepAliveReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit KeepAliveReactor(CallCore* core)
      : core_(core), opened_(absl::Now()) {
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client went away without saying goodbye, or the stream broke:
      // the lease runs out on its own unless the client comes back.
      End(absl::OkStatus());
      return;
    }
    v1::KeepAliveRequest request;
    if (!grpc::SerializationTraits<v1::KeepAliveRequest>::Deserialize(
             &incoming_, &request)
             .ok()) {
      End(absl::InvalidArgumentError(
          "a KeepAlive message is not a valid pagealloc.v1.KeepAliveRequest "
          "message"));
      return;
    }
    absl::StatusOr<std::shared_ptr<Session>> session = core_->Authenticate(
        request.session().session_id(), request.session().session_token());
    if (!session.ok()) {
      End(session.status());
      return;
    }
    if (request.close()) {
      // The stream ends once the pages are free, so that a client whose
      // Close returned finds them back in the pool.
      if (!core_->CloseSession((*session)->id(), "closed by client",
                               [this] { End(absl::OkStatus()); })) {
        End(absl::OkStatus());  // closed meanwhile by another stream
      }
      return;
    }
    v1::KeepAliveResponse response;
    response.set_lease_remaining_ms(absl::ToInt64Milliseconds(core_->lease()));
    bool own_buffer = false;
    if (!grpc::SerializationTraits<v1::KeepAliveResponse>::Serialize(
             response, &outgoing_, &own_buffer)
             .ok()) {
      End(absl::InternalError("cannot serialize a KeepAliveResponse"));
      return;
    }
    StartWrite(&outgoing_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(absl::OkStatus());
      return;
    }
    StartRead(&incoming_);
  }

  void OnDone() override { delete this; }

 private:
  void End(const absl::Status& status) {
    core_->Record(Method::kKeepAlive, Transport::kGrpc, status.code(),
                  absl::Now() - opened_);
    Finish(ToGrpcStatus(status));
  }

  CallCore* const core_;
  const absl::Time opened_;
  grpc::ByteBuffer incoming_;
  grpc::ByteBuffer outgoing_;
};

// See GrpcService::MalformedRequestInterceptors. gRPC hands a server
// interceptor a null message at POST_RECV_MESSAGE when the request did not
// parse (or never came), and lets it rewrite the status before it is sent.
class MalformedRequestInterceptor final
    : public grpc::experimental::Interceptor {
 public:
  MalformedRequestInterceptor(CallCore* core, Method method,
                              const std::string* request_type)
      : core_(core), method_(method), request_type_(request_type) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    using Hook = grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(Hook::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      malformed_ = true;
    }
    if (malformed_ &&
        methods->QueryInterceptionHookPoint(Hook::PRE_SEND_STATUS)) {
      methods->ModifySendStatus(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       absl::StrFormat("the request is not a valid %s message",
                                       *request_type_)));
      core_->Record(method_, Transport::kGrpc,
                    absl::StatusCode::kInvalidArgument, absl::ZeroDuration());
    }
    methods->Proceed();
  }

 private:
  CallCore* const core_;
  const Method method_;
  const std::string* const request_type_;
  bool malformed_ = false;
};

class MalformedRequestInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MalformedRequestInterceptorFactory(CallCore* core) : core_(core) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            v1::PageAllocator::service_full_name());
    if (service == nullptr) return;  // not linked in: no interceptor
    for (int m = 0; m < kNumMethods; ++m) {
      const Method method = static_cast<Method>(m);
      const google::protobuf::MethodDescriptor* descriptor =
          service->FindMethodByName(MethodName(method));
      if (descriptor == nullptr) continue;
      methods_.push_back(
          {absl::StrFormat("/%s/%s", service->full_name(), descriptor->name()),
           method, &descriptor->input_type()->full_name()});
    }
  }

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    if (info->type() != grpc::experimental::ServerRpcInfo::Type::UNARY) {
      return nullptr;
    }
    for (const Entry& entry : methods_) {
      if (entry.path == info->method()) {
        return new MalformedRequestInterceptor(core_, entry.method,
                                               entry.request_type);
      }
    }
    return nullptr;  // another service's method (health, reflection)
  }

 private:
  struct Entry {
    std::string path;  // "/pagealloc.v1.PageAllocator/Free"
    Method method;
    const std::string* request_type;  // "pagealloc.v1.FreeRequest"
  };
  CallCore* const core_;
  std::vector<Entry> methods_;
};

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

// Answers one allocation call: writes the answer into its AllocResponse
// (one RequestResult per request, or PackedResults when `packed`), then
// finishes the call and deletes itself. The thread that completes the call
// finishes it, unless the call shared its launch with others and there is
// `answer_senders`: then the next of those threads does (see GrpcService).
class AllocCallReply final : public AllocReply {
 public:
  AllocCallReply(grpc::ServerUnaryReactor* reactor, v1::AllocResponse* response,
                 bool packed, HandoffThreads* answer_senders)
      : reactor_(reactor),
        response_(response),
        packed_(packed),
        answer_senders_(answer_senders) {}

  void Deliver(const AllocAnswer& answer) override {
    shared_launch_ = answer.launch->batch_calls > 1;
    if (packed_) {
      FillPackedResults(answer, response_->mutable_packed());
    } else {
      FillRequestResults(answer, response_);
    }
    response_->set_ring_end(answer.ring_end);
    response_->set_pages_freed_first(answer.pages_freed_first);
    response_->set_batch_requests(answer.launch->batch_requests);
    response_->set_launch_id(answer.launch->launch_id);
    response_->set_completion_value(answer.launch->completion_value);
  }
  void Complete(const absl::Status& status) override {
    if (shared_launch_ && answer_senders_ != nullptr) {
      // The response lives in the call until it is finished.
      answer_senders_->Run([reactor = reactor_, finish = ToGrpcStatus(status)] {
        reactor->Finish(finish);
      });
    } else {
      reactor_->Finish(ToGrpcStatus(status));
    }
    delete this;
  }

 private:
  grpc::ServerUnaryReactor* const reactor_;
  v1::AllocResponse* const response_;
  const bool packed_;
  HandoffThreads* const answer_senders_;
  // Set by Deliver: the launch carried other calls too.
  bool shared_launch_ = false;
};

// Answers one operation: on OK, `fill` writes the reply's value into the
// response; then finishes the call and deletes itself.
class OpReply final : public Reply {
 public:
  OpReply(grpc::ServerUnaryReactor* reactor, std::function<void(int64_t)> fill)
      : reactor_(reactor), fill_(std::move(fill)) {}

  void Complete(const absl::Status& status) override {
    if (status.ok()) fill_(value());
    reactor_->Finish(ToGrpcStatus(status));
    delete this;
  }

 private:
  grpc::ServerUnaryReactor* const reactor_;
  const std::function<void(int64_t)> fill_;
};

// Answers a Publish or MatchPrefix call: on OK, `fill` writes the reply's
// pages (and what else it holds) into the response; then finishes the call
// and deletes itself.
class PrefixCallReply final : public PrefixReply {
 public:
  PrefixCallReply(grpc::ServerUnaryReactor* reactor,
                  std::function<void(const PrefixReply&)> fill)
      : reactor_(reactor), fill_(std::move(fill)) {}

  void Complete(const absl::Status& status) override {
    if (status.ok()) fill_(*this);
    reactor_->Finish(ToGrpcStatus(status));
    delete this;
  }

 private:
  grpc::ServerUnaryReactor* const reactor_;
  const std::function<void(const PrefixReply&)> fill_;
};

// The request's keys as views into it (it lives until the call finishes).
std::vector<absl::string_view> KeyViews(
    const google::protobuf::RepeatedPtrField<std::string>& keys) {
  return std::vector<absl::string_view>(keys.begin(), keys.end());
}

}  // namespace

grpc::ServerUnaryReactor* GrpcService::Register(
    grpc::CallbackServerContext* context, const v1::RegisterRequest* request,
    v1::RegisterResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  SessionRequest wanted;
  wanted.client_name = request->client_name();
  wanted.ring_capacity_slots = request->ring_capacity_slots();
  wanted.quota_pages = request->quota_pages();
  wanted.register_secret = request->register_secret();
  wanted.resumable = request->resumable();
  absl::StatusOr<std::shared_ptr<Session>> session =
      core_->OpenSession(wanted, context->peer());
  if (!session.ok()) {
    Finish(reactor, Method::kRegister, start, session.status());
    return reactor;
  }
  FillRegisterResponse(**session, request->fast_channel(), response);
  Finish(reactor, Method::kRegister, start, absl::OkStatus());
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::Resume(
    grpc::CallbackServerContext* context, const v1::ResumeRequest* request,
    v1::RegisterResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  ResumeRequestInput wanted;
  wanted.session_id = request->session().session_id();
  wanted.session_token = request->session().session_token();
  wanted.ring_capacity_slots = request->ring_capacity_slots();
  wanted.take_over = request->take_over();
  wanted.register_secret = request->register_secret();
  absl::StatusOr<std::shared_ptr<Session>> session =
      core_->ResumeSession(wanted, context->peer());
  if (!session.ok()) {
    Finish(reactor, Method::kResume, start, session.status());
    return reactor;
  }
  FillRegisterResponse(**session, request->fast_channel(), response);
  response->set_resumed(true);
  response->set_last_call_id(core_->LastCallId((*session)->id()));
  Finish(reactor, Method::kResume, start, absl::OkStatus());
  return reactor;
}

void GrpcService::FillRegisterResponse(const Session& session,
                                       bool fast_channel,
                                       v1::RegisterResponse* response) {
  response->set_session_id(session.id());
  response->set_session_token(session.token());
  FillPoolInfo(core_->DescribePool(), response->mutable_pool());
  FillRing(session.ring()->Describe(), response->mutable_ring());
  response->set_lease_ms(absl::ToInt64Milliseconds(core_->lease()));
  response->set_quota_pages(session.quota_pages());
  response->set_resumable(session.resumable());
  response->set_retries_kept(core_->call_tags_kept());
  response->set_memory_socket(memory_socket_);
  if (!fast_channel || channels_ == nullptr || memory_socket_.empty()) return;
  const absl::StatusOr<ChannelCapacity> opened =
      channels_->SessionOpened(session.id(), session.token());
  if (opened.ok()) {
    response->mutable_fast_channel()->set_max_requests(opened->max_requests);
    response->mutable_fast_channel()->set_message_bytes(opened->message_bytes);
  } else {
    // The session works without one (over gRPC); say why in the log.
    Logger("session")->warn("session {}: no fast channel: {}", session.id(),
                            std::string(opened.status().message()));
  }
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
GrpcService::KeepAlive(grpc::CallbackServerContext*) {
  return new KeepAliveReactor(core_);
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
GrpcService::MalformedRequestInterceptors(CallCore* core) {
  return std::make_unique<MalformedRequestInterceptorFactory>(core);
}

void GrpcService::Finish(grpc::ServerUnaryReactor* reactor, Method method,
                         absl::Time start, const absl::Status& status) {
  core_->Record(method, Transport::kGrpc, status.code(), absl::Now() - start);
  reactor->Finish(ToGrpcStatus(status));
}

template <typename Request>
grpc::ServerUnaryReactor* GrpcService::HandleAlloc(
    grpc::CallbackServerContext* context, const Request& request,
    v1::AllocResponse* response, Method method) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const v1::AllocOptions& options = request.options();
  absl::StatusOr<CallArrays> arrays = ArraysOf(request);
  if (!arrays.ok()) {
    // Authentication comes first, as in PrepareAlloc.
    const absl::Time start = absl::Now();
    absl::StatusOr<std::shared_ptr<Session>> session = core_->Authenticate(
        request.session().session_id(), request.session().session_token());
    Finish(reactor, method, start,
           session.ok() ? arrays.status() : session.status());
    return reactor;
  }
  AllocCallInput input;
  input.method = method;
  input.transport = Transport::kGrpc;
  input.session_id = request.session().session_id();
  input.session_token = request.session().session_token();
  input.arrays = *arrays;
  input.release_ring_up_to = options.release_ring_up_to();
  input.return_inline = options.return_inline();
  input.async_completion = options.async_completion();
  input.free_pages_first = options.free_pages_first();
  input.checkpoint_first = options.checkpoint_first();
  input.all_or_nothing = options.all_or_nothing();
  input.call = TagOf(request.session());
  // Deletes itself once it has finished the call, possibly before
  // SubmitPrepared returns.
  auto* reply = new AllocCallReply(reactor, response, options.packed_results(),
                                   answer_senders_);
  std::vector<AllocCall> calls(1);
  if (core_->PrepareAlloc(input, reply, &calls[0])) {
    core_->SubmitPrepared(std::move(calls));
  }
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::AllocExtend(
    grpc::CallbackServerContext* context, const v1::AllocExtendRequest* request,
    v1::AllocResponse* response) {
  return HandleAlloc(context, *request, response, Method::kAllocExtend);
}

grpc::ServerUnaryReactor* GrpcService::AllocDecode(
    grpc::CallbackServerContext* context, const v1::AllocDecodeRequest* request,
    v1::AllocResponse* response) {
  return HandleAlloc(context, *request, response, Method::kAllocDecode);
}

grpc::ServerUnaryReactor* GrpcService::Alloc(
    grpc::CallbackServerContext* context, const v1::AllocRequest* request,
    v1::AllocResponse* response) {
  return HandleAlloc(context, *request, response, Method::kAlloc);
}

grpc::ServerUnaryReactor* GrpcService::Free(
    grpc::CallbackServerContext* context, const v1::FreeRequest* request,
    v1::FreeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status valid = ValidateFree(*request);
  if (!valid.ok()) {
    // Authentication comes first, as for every call.
    const absl::Time start = absl::Now();
    absl::StatusOr<std::shared_ptr<Session>> session = core_->Authenticate(
        request->session().session_id(), request->session().session_token());
    Finish(reactor, Method::kFree, start,
           session.ok() ? valid : session.status());
    return reactor;
  }
  const bool slots = request->slots_size() > 0;
  // The values stay in the request, which lives until the call finishes.
  core_->SubmitFree(
      request->session().session_id(), request->session().session_token(),
      slots ? FreeUnit::kSlots : FreeUnit::kPages,
      slots ? absl::MakeConstSpan(request->slots())
            : absl::MakeConstSpan(request->pages()),
      Transport::kGrpc,
      new OpReply(
          reactor,
          [response](int64_t freed) { response->set_pages_freed(freed); }),
      FromWire(request->order()), request->release_value(),
      TagOf(request->session()));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::Checkpoint(
    grpc::CallbackServerContext* context, const v1::CheckpointRequest* request,
    v1::CheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  core_->SubmitCheckpoint(
      request->session().session_id(), request->session().session_token(),
      Transport::kGrpc,
      new OpReply(reactor,
                  [response](int64_t id) { response->set_checkpoint_id(id); }),
      TagOf(request->session()));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::Rollback(
    grpc::CallbackServerContext* context, const v1::RollbackRequest* request,
    v1::RollbackResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  core_->SubmitRollback(request->session().session_id(),
                        request->session().session_token(), Transport::kGrpc,
                        new OpReply(reactor,
                                    [response](int64_t returned) {
                                      response->set_pages_returned(returned);
                                    }),
                        request->checkpoint_id(), TagOf(request->session()));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::ReleaseRing(
    grpc::CallbackServerContext* context, const v1::ReleaseRingRequest* request,
    v1::ReleaseRingResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<int64_t> reserved = core_->ReleaseRing(
      request->session().session_id(), request->session().session_token(),
      request->up_to(), Transport::kGrpc);
  if (reserved.ok()) response->set_reserved_slots(*reserved);
  reactor->Finish(ToGrpcStatus(reserved.status()));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::GetStats(
    grpc::CallbackServerContext* context, const v1::GetStatsRequest* request,
    v1::GetStatsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  const PoolStats stats = core_->PoolStatsSnapshot();
  FillPoolInfo(core_->DescribePool(), response->mutable_pool());
  response->set_free_pages(stats.free_pages);
  response->set_parked_pages(stats.parked_pages);
  response->set_used_pages(stats.used_pages);
  response->set_slots_allocated_total(stats.slots_allocated);
  response->set_pages_allocated_total(stats.pages_allocated);
  response->set_pages_freed_total(stats.pages_freed);
  response->set_out_of_pages_total(stats.out_of_pages_refusals);
  response->set_free_list_sorts_total(stats.free_list_sorts);
  response->set_launches_total(core_->launches());
  response->set_kv_pages_scrubbed_total(stats.pages_scrubbed);
  response->set_release_pending_pages(core_->release_pending_pages());
  response->set_pages_released_total(core_->pages_released());
  v1::PrefixStats* prefix = response->mutable_prefix();
  prefix->set_published_pages(stats.published_pages);
  prefix->set_cached_pages(stats.cached_pages);
  prefix->set_pinned_pages(stats.pinned_pages);
  prefix->set_evictable_pages(stats.evictable_pages);
  prefix->set_published_total(stats.prefix_pages_published);
  prefix->set_publish_existing_total(stats.prefix_publish_existing);
  prefix->set_lookup_pages_total(stats.prefix_lookup_pages);
  prefix->set_hit_pages_total(stats.prefix_hit_pages);
  prefix->set_adopted_pages_total(stats.prefix_pages_adopted);
  prefix->set_evicted_for_allocation_total(stats.prefix_evicted_for_allocation);
  prefix->set_evicted_by_reset_total(stats.prefix_evicted_by_reset);
  prefix->set_max_pinned_pages_per_session(stats.max_pinned_pages_per_owner);
  const std::vector<std::shared_ptr<Session>> sessions = core_->Sessions();
  response->set_sessions_active(sessions.size());
  if (request->include_sessions()) {
    const absl::Time now = absl::Now();
    for (const std::shared_ptr<Session>& session : sessions) {
      v1::SessionStats* out = response->add_sessions();
      out->set_session_id(session->id());
      out->set_client_name(session->client_name());
      auto it = stats.owners.find(session->id());
      if (it != stats.owners.end()) {
        out->set_pages_owned(it->second.pages_owned);
        out->set_checkpoint_active(it->second.checkpoint_active);
        out->set_checkpoints(it->second.checkpoints);
        out->set_shared_pages(it->second.shared_pages);
        out->set_pinned_pages(it->second.pinned_pages);
      }
      out->set_quota_pages(session->quota_pages());
      out->set_ring_capacity_slots(session->ring_capacity_slots());
      out->set_ring_reserved_slots(session->ring_reserved());
      out->set_release_pending_pages(
          core_->release_pending_pages(session->id()));
      out->set_fast_channel(channels_ != nullptr &&
                            channels_->HasChannel(session->id()));
      out->set_resumable(session->resumable());
      out->set_connected(session->link() == SessionLink::kConnected);
      // Every renewal sets the deadline to renewal time + lease.
      out->set_lease_age_ms(std::max<int64_t>(
          0, absl::ToInt64Milliseconds(
                 now - (session->lease_deadline() - core_->lease()))));
    }
  }
  Finish(reactor, Method::kGetStats, start, absl::OkStatus());
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::ListPages(
    grpc::CallbackServerContext* context, const v1::ListPagesRequest* request,
    v1::ListPagesResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  core_->SubmitListPages(
      request->session().session_id(), request->session().session_token(),
      Transport::kGrpc,
      new PrefixCallReply(reactor, [response](const PrefixReply& reply) {
        response->mutable_pages()->Add(reply.pages.begin(), reply.pages.end());
        response->mutable_shared_pages()->Add(reply.shared.begin(),
                                              reply.shared.end());
      }));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::ClearSession(
    grpc::CallbackServerContext* context,
    const v1::ClearSessionRequest* request,
    v1::ClearSessionResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  core_->SubmitClearSession(
      request->session().session_id(), request->session().session_token(),
      Transport::kGrpc,
      new OpReply(
          reactor,
          [response](int64_t freed) { response->set_pages_freed(freed); }),
      TagOf(request->session()));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::ClearPool(
    grpc::CallbackServerContext* context, const v1::ClearPoolRequest* request,
    v1::ClearPoolResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  core_->SubmitClearPool(request->force(), Transport::kGrpc,
                         new OpReply(reactor, [response](int64_t freed) {
                           response->set_pages_freed(freed);
                         }));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::GetFreeLists(
    grpc::CallbackServerContext* context,
    const v1::GetFreeListsRequest* request,
    v1::GetFreeListsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<FreeListsView> view =
      core_->FreeLists(request->max_pages(), Transport::kGrpc);
  if (!view.ok()) {
    reactor->Finish(ToGrpcStatus(view.status()));
    return reactor;
  }
  response->mutable_free_pages()->Add(view->free_pages.begin(),
                                      view->free_pages.end());
  response->mutable_parked_pages()->Add(view->parked_pages.begin(),
                                        view->parked_pages.end());
  response->set_free_count(view->free_count);
  response->set_parked_count(view->parked_count);
  FillPoolInfo(core_->DescribePool(), response->mutable_pool());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::Publish(
    grpc::CallbackServerContext* context, const v1::PublishRequest* request,
    v1::PublishResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  PublishInput input;
  input.session_id = request->session().session_id();
  input.session_token = request->session().session_token();
  input.pages.assign(request->pages().begin(), request->pages().end());
  input.keys = KeyViews(request->keys());
  input.parent_key = request->parent_key();
  input.pin = request->pin();
  core_->SubmitPublish(
      input, Transport::kGrpc,
      new PrefixCallReply(reactor, [response](const PrefixReply& reply) {
        response->mutable_pages()->Add(reply.pages.begin(), reply.pages.end());
        for (bool existing : reply.existing) response->add_existing(existing);
        response->set_newly_published(reply.value());
      }));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::MatchPrefix(
    grpc::CallbackServerContext* context, const v1::MatchPrefixRequest* request,
    v1::MatchPrefixResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const std::vector<absl::string_view> keys = KeyViews(request->keys());
  core_->SubmitMatchPrefix(
      request->session().session_id(), request->session().session_token(), keys,
      request->adopt(), Transport::kGrpc,
      new PrefixCallReply(reactor, [response](const PrefixReply& reply) {
        response->mutable_pages()->Add(reply.pages.begin(), reply.pages.end());
      }));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::UnpinPrefix(
    grpc::CallbackServerContext* context, const v1::UnpinPrefixRequest* request,
    v1::UnpinPrefixResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  core_->SubmitUnpinPrefix(
      request->session().session_id(), request->session().session_token(),
      absl::MakeConstSpan(request->pages()), Transport::kGrpc,
      new OpReply(reactor, [response](int64_t unpinned) {
        response->set_pages_unpinned(unpinned);
      }));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::ResetPrefixCache(
    grpc::CallbackServerContext* context,
    const v1::ResetPrefixCacheRequest* request,
    v1::ResetPrefixCacheResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  core_->SubmitResetPrefixCache(
      Transport::kGrpc, new OpReply(reactor, [response](int64_t evicted) {
        response->set_pages_evicted(evicted);
      }));
  return reactor;
}

}  // namespace pagealloc
