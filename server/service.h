// PageAllocatorService: the gRPC handlers of pagealloc.v1.PageAllocator
// (callback API). Handlers validate, reserve ring space, queue work on the
// batcher and return; the batcher completes the RPC. No handler blocks on the
// device or on a lock held for long. absl::Status becomes grpc::Status in
// ToGrpcStatus only.

#ifndef PAGEALLOC_SERVER_SERVICE_H_
#define PAGEALLOC_SERVER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "allocator/page_pool.h"
#include "common/grpc_status.h"
#include "proto/pagealloc.grpc.pb.h"
#include "server/backend.h"
#include "server/batcher.h"
#include "server/request_decoding.h"
#include "server/rpc_metrics.h"
#include "server/session.h"
#include "spdlog/spdlog.h"

namespace pagealloc {

// Counters the service keeps for logs, stats and metrics.
struct ServiceCounters {
  std::atomic<int64_t> sessions_opened{0};
  std::atomic<int64_t> sessions_closed{0};
  std::atomic<int64_t> sessions_reclaimed{0};
  std::atomic<int64_t> pages_reclaimed{0};
};

// Receives one unary call's answer. PendingReply (below) is for a handler
// that waits; the fast channel (server/fast_channel_server.h) writes the
// answer into shared memory instead.
class Reply {
 public:
  virtual ~Reply() = default;
  // The call is over (for an allocation call, after Deliver when it ran);
  // `status` is the call's status.
  virtual void Complete(const absl::Status& status) = 0;
};

// One unary call's answer, for a handler that waits for it: whoever
// completes the work (the batcher thread, or the handler's own thread when
// it drives the batcher) calls Complete once; the handler returns Wait().
// When the handler's own thread completed it, Wait does not block.
class PendingReply final : public Reply {
 public:
  void Complete(const absl::Status& status) override {
    status_ = status;
    done_.Notify();
  }
  grpc::Status Wait() {
    done_.WaitForNotification();
    return ToGrpcStatus(status_);
  }

 private:
  absl::Notification done_;
  absl::Status status_;  // written once, before done_ is notified
};

// An allocation call's results once its launch is done, as the transport
// writes them into its answer. The spans live until Deliver returns.
struct AllocAnswer {
  absl::Span<const AllocResult> results;  // one per request
  // Each request's first slot in the session's ring (by the request's shape,
  // so that offsets stay prefix sums across refused requests); empty when
  // the slots go inline.
  absl::Span<const int64_t> ring_offsets;
  // return_inline: the accepted requests' slots, concatenated in order.
  absl::Span<const int64_t> inline_slots;
  bool inline_results = false;
  int64_t ring_end = 0;  // 0 when inline
  int64_t pages_freed_first = 0;
  const LaunchInfo* launch = nullptr;
};

// Receives an allocation call's answer: Deliver, then Complete(OK) when the
// call ran; only Complete(error) when it was refused as a whole.
class AllocReply : public Reply {
 public:
  virtual void Deliver(const AllocAnswer& answer) = 0;

  // What PrepareAlloc builds for the call: its requests and their ring
  // offsets. It must live until the call completes, which the reply's own
  // lifetime ensures; a reply that serves one call after another (a fast
  // channel's) reuses it, storage and all, so it stays warm in cache.
  struct CallStorage {
    DecodedCall decoded;
    std::vector<int64_t> ring_offsets;
    int64_t pages_freed_first = 0;  // by AllocOptions.free_pages_first
  };
  CallStorage& storage() { return storage_; }

 private:
  CallStorage storage_;
};

// Writes the answer into an AllocResponse (one RequestResult per request,
// or PackedResults when `packed`) and waits like PendingReply.
class ResponseReply final : public AllocReply {
 public:
  ResponseReply(v1::AllocResponse* response, bool packed)
      : response_(response), packed_(packed) {}
  void Deliver(const AllocAnswer& answer) override;
  void Complete(const absl::Status& status) override {
    pending_.Complete(status);
  }
  grpc::Status Wait() { return pending_.Wait(); }

 private:
  v1::AllocResponse* const response_;
  const bool packed_;
  PendingReply pending_;
};

// One allocation call as it arrived, from either transport.
struct AllocCallInput {
  Rpc rpc = Rpc::kAllocDecode;
  uint64_t session_id = 0;
  absl::string_view session_token;
  CallArrays arrays;  // must stay valid during PrepareAlloc only
  int64_t release_ring_up_to = 0;
  bool return_inline = false;
  bool async_completion = false;
  // AllocOptions.free_pages_first and checkpoint_first. The pages must stay
  // valid until the reply completes.
  absl::Span<const int64_t> free_pages_first;
  bool checkpoint_first = false;
};

// The service's threading. Session calls (allocations, Free, Checkpoint,
// Rollback, ReleaseRing) are synchronous handlers: gRPC's sync server runs
// a call on the thread that read it, and that thread usually drives the
// batcher itself (server/batcher.h), so an answer is computed and written
// with no thread hand-off. Register and GetStats are callback handlers, and
// KeepAlive a callback stream, so that a session's open stream holds no
// thread.
using PageAllocatorBase = v1::PageAllocator::WithCallbackMethod_Register<
    v1::PageAllocator::WithCallbackMethod_KeepAlive<
        v1::PageAllocator::WithCallbackMethod_GetStats<
            v1::PageAllocator::Service>>>;

class FastChannelServer;  // server/fast_channel_server.h

// This class is thread-safe.
class PageAllocatorService final : public PageAllocatorBase {
 public:
  struct Options {
    // Most requests and slots in one call (a call must fit one launch).
    int64_t max_call_requests = 8192;
    int64_t max_call_tokens = 1 << 21;
  };

  // Every pointer must outlive the service.
  PageAllocatorService(const Options& options, PagePool* pool, Backend* backend,
                       SessionRegistry* sessions, Batcher* batcher);

  // Where Register opens fast channels (null: none offered). Set once,
  // before serving; must outlive the service's calls.
  void set_fast_channels(FastChannelServer* fast_channels) {
    fast_channels_ = fast_channels;
  }

  // From now on every call but GetStats gets UNAVAILABLE.
  void StartDraining() { draining_ = true; }
  bool draining() const { return draining_; }

  // Ends a session: forgets it and frees its pages (in order with its queued
  // work). `reason` goes to the log. Returns false when it was already gone.
  bool CloseSession(uint64_t session_id, const std::string& reason);

  // Frees the pages of sessions whose lease has run out; returns how many
  // sessions were reclaimed. Called periodically by the server.
  int ReclaimExpired(absl::Time now);

  const ServiceCounters& counters() const { return counters_; }
  const RpcMetrics& rpc_metrics() const { return rpc_metrics_; }
  // Records a KeepAlive stream's end (the stream reactor is not unary).
  void RecordKeepAlive(absl::StatusCode code, absl::Duration open_for) {
    rpc_metrics_.Record(Rpc::kKeepAlive, code, open_for);
  }

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override;
  grpc::ServerBidiReactor<v1::KeepAliveRequest, v1::KeepAliveResponse>*
  KeepAlive(grpc::CallbackServerContext* context) override;
  grpc::Status AllocExtend(grpc::ServerContext* context,
                           const v1::AllocExtendRequest* request,
                           v1::AllocResponse* response) override;
  grpc::Status AllocDecode(grpc::ServerContext* context,
                           const v1::AllocDecodeRequest* request,
                           v1::AllocResponse* response) override;
  grpc::Status Alloc(grpc::ServerContext* context,
                     const v1::AllocRequest* request,
                     v1::AllocResponse* response) override;
  grpc::Status Free(grpc::ServerContext* context,
                    const v1::FreeRequest* request,
                    v1::FreeResponse* response) override;
  grpc::Status Checkpoint(grpc::ServerContext* context,
                          const v1::CheckpointRequest* request,
                          v1::CheckpointResponse* response) override;
  grpc::Status Rollback(grpc::ServerContext* context,
                        const v1::RollbackRequest* request,
                        v1::RollbackResponse* response) override;
  grpc::Status ReleaseRing(grpc::ServerContext* context,
                           const v1::ReleaseRingRequest* request,
                           v1::ReleaseRingResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::GetStatsResponse* response) override;

  // An allocation call that has been authenticated, decoded and given its
  // ring region, ready for SubmitPrepared.
  struct PreparedCall {
    AllocCall call;
    std::shared_ptr<Session> session;
    int64_t ring_start = 0;
    bool ring_reserved = false;
    AllocReply* reply = nullptr;
    Rpc rpc = Rpc::kAllocDecode;
    absl::Time start;
  };
  // Prepares an allocation call from either transport: authenticates,
  // decodes and validates, releases and reserves ring space. `reply` must
  // live until it completes. On refusal the reply is completed (and the
  // call counted) at once and nothing is returned.
  std::optional<PreparedCall> PrepareAlloc(const AllocCallInput& input,
                                           AllocReply* reply);
  // Queues prepared calls together (they share a launch unless one is
  // running); each reply completes when its launch is done.
  void SubmitPrepared(std::vector<PreparedCall> calls);

  // Free, Checkpoint and Rollback without waiting: as the gRPC handlers do,
  // but `reply` completes once the operation ran (or was refused).
  // `request` and `response` must live until then.
  void SubmitFree(const v1::FreeRequest& request, v1::FreeResponse* response,
                  Reply* reply);
  void SubmitCheckpoint(const v1::CheckpointRequest& request, Reply* reply);
  void SubmitRollback(const v1::RollbackRequest& request,
                      v1::RollbackResponse* response, Reply* reply);

  // Authenticates `ref` (UNAVAILABLE while draining).
  absl::StatusOr<std::shared_ptr<Session>> Authenticate(
      const v1::SessionRef& ref);
  absl::Duration lease() const { return sessions_->options().lease; }

 private:
  // The shared body of AllocExtend, AllocDecode and Alloc: prepare, submit,
  // wait for the answer.
  template <typename Request>
  grpc::Status HandleAlloc(const Request& request, v1::AllocResponse* response,
                           Rpc rpc);
  // Frees a removed session's pages after its queued work; counts and logs.
  void FreeSessionPages(std::shared_ptr<Session> session, bool lease_lost,
                        std::string reason);
  // Queues `op` for `session` on the batcher, in order with the session's
  // other work; `reply` completes with its status.
  void SubmitOp(Reply* reply, Rpc rpc, absl::Time start, uint64_t session_id,
                std::function<absl::Status()> op);
  // Each records the call's code and latency, then answers: a callback
  // reactor, a waiting handler, or the returned status.
  void Finish(grpc::ServerUnaryReactor* reactor, Rpc rpc, absl::Time start,
              const absl::Status& status);
  void Answer(Reply* reply, Rpc rpc, absl::Time start,
              const absl::Status& status);
  grpc::Status Answer(Rpc rpc, absl::Time start, const absl::Status& status);

  const Options options_;
  const CallLimits limits_;
  PagePool* const pool_;
  Backend* const backend_;
  SessionRegistry* const sessions_;
  Batcher* const batcher_;
  FastChannelServer* fast_channels_ = nullptr;
  std::atomic<bool> draining_{false};
  ServiceCounters counters_;
  RpcMetrics rpc_metrics_;
  std::shared_ptr<spdlog::logger> log_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_SERVICE_H_
