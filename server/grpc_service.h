// GrpcService: the gRPC adapter of pagealloc.v1.PageAllocator over the call
// core (server/call_core.h). Each handler turns its message into the core's
// plain input, lets the core run the call, and writes the answer back;
// absl::Status becomes grpc::Status in ToGrpcStatus only.
//
// Malformed messages. Bytes that do not parse as the method's request are
// INVALID_ARGUMENT on every method: the unary methods through
// MalformedRequestInterceptors (gRPC would answer INTERNAL from a sync
// handler and UNIMPLEMENTED from a callback one), KeepAlive by parsing its
// messages itself (a raw stream: a message that does not parse ends it
// with INVALID_ARGUMENT, where gRPC would report it as the stream's end).
//
// Threading. Every method is a callback handler (KeepAlive a callback
// stream, so that a session's open stream holds no thread). gRPC reads a
// call's bytes on one of its callback threads and runs the handler there.
// gRPC's callback threads take turns (one call here, the next on another),
// and a launch's CUDA calls and its walk over the pool cost about twice as
// much on a thread that has not launched lately (docs/performance.md, "The
// gRPC path on the H200"). So where the batcher thread spins (machines with
// 8 or more CPUs), an allocation handler only queues its call and returns,
// and the batcher thread runs the launch and finishes the call
// (AllocCall.submitter_is_dedicated stays false). Sending the answers of a
// launch that carried several calls (serialising each answer, writing it,
// posting its completion: about 20 us a call there) is handed to the
// `answer_senders` threads, in turn, so that the batcher thread goes on to
// the next launch and the answers of one launch leave at the same time
// rather than one after the other; a lone call's answer leaves from the
// batcher thread, with no hand-off. Where the batcher thread does not spin,
// a handler that finds the batcher idle drives the launch itself
// (server/batcher.h) and the answer is computed and written with no thread
// hand-off; that is bounded (Batcher::kMaxInlineRounds launches), and other
// calls are read by gRPC's other callback threads meanwhile. A synchronous
// handler would cost a hand-off every time: the callback thread that read
// the call wakes a sync-server thread to run it (a futex wake-up, tens of
// microseconds on a virtual machine).
//
// This class is thread-safe.

#ifndef PAGEALLOC_SERVER_GRPC_SERVICE_H_
#define PAGEALLOC_SERVER_GRPC_SERVICE_H_

#include <memory>
#include <string>
#include <utility>

#include "common/handoff_thread.h"
#include "grpcpp/support/server_interceptor.h"
#include "proto/pagealloc.grpc.pb.h"
#include "server/call_core.h"
#include "server/session_hooks.h"

namespace pagealloc {

// The shared prefix pages' methods.
using PrefixMethods = v1::PageAllocator::WithCallbackMethod_Publish<
    v1::PageAllocator::WithCallbackMethod_MatchPrefix<
        v1::PageAllocator::WithCallbackMethod_UnpinPrefix<
            v1::PageAllocator::WithCallbackMethod_ResetPrefixCache<
                v1::PageAllocator::Service>>>>;

// Resume (a session taken back by id and token).
using ResumeMethods =
    v1::PageAllocator::WithCallbackMethod_Resume<PrefixMethods>;
// ListPages (a session's pages, for a client reconciling after a restart).
using ListPagesMethods =
    v1::PageAllocator::WithCallbackMethod_ListPages<ResumeMethods>;

using PageAllocatorBase = v1::PageAllocator::WithCallbackMethod_Register<
    v1::PageAllocator::WithRawCallbackMethod_KeepAlive<
        v1::PageAllocator::WithCallbackMethod_AllocExtend<
            v1::PageAllocator::WithCallbackMethod_AllocDecode<
                v1::PageAllocator::WithCallbackMethod_Alloc<v1::PageAllocator::WithCallbackMethod_Free<
                    v1::PageAllocator::WithCallbackMethod_Checkpoint<
                        v1::PageAllocator::WithCallbackMethod_Rollback<
                            v1::PageAllocator::WithCallbackMethod_ReleaseRing<
                                v1::PageAllocator::WithCallbackMethod_GetStats<
                                    v1::PageAllocator::WithCallbackMethod_ClearSession<
                                        v1::PageAllocator::WithCallbackMethod_ClearPool<
                                            v1::PageAllocator::
                                                WithCallbackMethod_GetFreeLists<
                                                    ListPagesMethods>>>>>>>>>>>>>;

class GrpcService final : public PageAllocatorBase {
 public:
  // `core` must outlive the service; so must `channels`, the fast channel
  // the server wires in, told of each session that asks for one at Register
  // and asked by GetStats which have one (null: none offered), and
  // `answer_senders`, which send the answers of launches that carried
  // several calls (null: the thread that completes a call sends its
  // answer). `memory_socket` is the path of the daemon's memory socket,
  // which Register names ("" when the daemon has none: no Unix socket).
  GrpcService(CallCore* core, SessionChannels* channels,
              std::string memory_socket = "",
              HandoffThreads* answer_senders = nullptr)
      : core_(core),
        channels_(channels),
        memory_socket_(std::move(memory_socket)),
        answer_senders_(answer_senders) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Resume(grpc::CallbackServerContext* context,
                                   const v1::ResumeRequest* request,
                                   v1::RegisterResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* KeepAlive(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* AllocExtend(grpc::CallbackServerContext* context,
                                        const v1::AllocExtendRequest* request,
                                        v1::AllocResponse* response) override;
  grpc::ServerUnaryReactor* AllocDecode(grpc::CallbackServerContext* context,
                                        const v1::AllocDecodeRequest* request,
                                        v1::AllocResponse* response) override;
  grpc::ServerUnaryReactor* Alloc(grpc::CallbackServerContext* context,
                                  const v1::AllocRequest* request,
                                  v1::AllocResponse* response) override;
  grpc::ServerUnaryReactor* Free(grpc::CallbackServerContext* context,
                                 const v1::FreeRequest* request,
                                 v1::FreeResponse* response) override;
  grpc::ServerUnaryReactor* Checkpoint(
      grpc::CallbackServerContext* context,
      const v1::CheckpointRequest* request,
      v1::CheckpointResponse* response) override;
  grpc::ServerUnaryReactor* Rollback(grpc::CallbackServerContext* context,
                                     const v1::RollbackRequest* request,
                                     v1::RollbackResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseRing(
      grpc::CallbackServerContext* context,
      const v1::ReleaseRingRequest* request,
      v1::ReleaseRingResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::GetStatsResponse* response) override;
  grpc::ServerUnaryReactor* ListPages(grpc::CallbackServerContext* context,
                                      const v1::ListPagesRequest* request,
                                      v1::ListPagesResponse* response) override;
  grpc::ServerUnaryReactor* ClearSession(
      grpc::CallbackServerContext* context,
      const v1::ClearSessionRequest* request,
      v1::ClearSessionResponse* response) override;
  grpc::ServerUnaryReactor* ClearPool(grpc::CallbackServerContext* context,
                                      const v1::ClearPoolRequest* request,
                                      v1::ClearPoolResponse* response) override;
  grpc::ServerUnaryReactor* GetFreeLists(
      grpc::CallbackServerContext* context,
      const v1::GetFreeListsRequest* request,
      v1::GetFreeListsResponse* response) override;
  grpc::ServerUnaryReactor* Publish(grpc::CallbackServerContext* context,
                                    const v1::PublishRequest* request,
                                    v1::PublishResponse* response) override;
  grpc::ServerUnaryReactor* MatchPrefix(
      grpc::CallbackServerContext* context,
      const v1::MatchPrefixRequest* request,
      v1::MatchPrefixResponse* response) override;
  grpc::ServerUnaryReactor* UnpinPrefix(
      grpc::CallbackServerContext* context,
      const v1::UnpinPrefixRequest* request,
      v1::UnpinPrefixResponse* response) override;
  grpc::ServerUnaryReactor* ResetPrefixCache(
      grpc::CallbackServerContext* context,
      const v1::ResetPrefixCacheRequest* request,
      v1::ResetPrefixCacheResponse* response) override;

  // Interceptors for the server (ServerBuilder::experimental()) that turn
  // the answer to a unary call of this service whose request did not parse
  // into INVALID_ARGUMENT ("the request is not a valid
  // pagealloc.v1.FreeRequest message"), and count it in `core`'s metrics.
  // `core` must outlive the server.
  static std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  MalformedRequestInterceptors(CallCore* core);

 private:
  // The shared body of AllocExtend, AllocDecode and Alloc.
  template <typename Request>
  grpc::ServerUnaryReactor* HandleAlloc(grpc::CallbackServerContext* context,
                                        const Request& request,
                                        v1::AllocResponse* response,
                                        Method method);
  // Register's and Resume's answer for `session`: the pool, the ring, the
  // lease, and a fresh fast channel when `fast_channel` asks for one.
  void FillRegisterResponse(const Session& session, bool fast_channel,
                            v1::RegisterResponse* response);
  // Records the call's code and latency, then finishes the reactor.
  void Finish(grpc::ServerUnaryReactor* reactor, Method method,
              absl::Time start, const absl::Status& status);

  CallCore* const core_;
  SessionChannels* const channels_;
  const std::string memory_socket_;
  HandoffThreads* const answer_senders_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_GRPC_SERVICE_H_
