// KvEventsService: pagealloc.v1.KvEvents, the KV-event publisher's batches
// as a gRPC server stream. SubscribeKvEvents sends the window's batches
// from the requested sequence number, then each new batch as it joins the
// window, as protobuf messages carrying the same sequence numbers as the
// ZMQ wire. A stream holds no thread and no queue of its own: it writes one
// message at a time from the publisher's window, so a stream that falls
// behind the window skips to its oldest batch (a gap in the numbers it
// sees) and costs the daemon nothing more.
//
// This class is thread-safe.

#ifndef PAGEALLOC_KV_EVENTS_GRPC_STREAM_H_
#define PAGEALLOC_KV_EVENTS_GRPC_STREAM_H_

#include "kv_events/event.h"
#include "kv_events/publisher.h"
#include "proto/pagealloc.grpc.pb.h"

namespace pagealloc {

// Writes `batch` into `message` (block hashes as the keys' bytes).
void KvEventBatchToProto(const KvEventBatch& batch,
                         const KvEventWireOptions& wire,
                         v1::KvEventBatch* message);

class KvEventsService final : public v1::KvEvents::CallbackService {
 public:
  // `publisher` must outlive the service and every stream it opened; null
  // when the daemon publishes no KV events (every call is then
  // FAILED_PRECONDITION).
  explicit KvEventsService(KvEventPublisher* publisher)
      : publisher_(publisher) {}

  // Refuses a from_sequence below -1 (INVALID_ARGUMENT) or past the next
  // sequence number (OUT_OF_RANGE), naming both numbers.
  grpc::ServerWriteReactor<v1::KvEventBatch>* SubscribeKvEvents(
      grpc::CallbackServerContext* context,
      const v1::SubscribeKvEventsRequest* request) override;

 private:
  KvEventPublisher* const publisher_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_KV_EVENTS_GRPC_STREAM_H_
