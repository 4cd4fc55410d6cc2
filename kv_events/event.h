// The KV events the publisher numbers, batches and sends (vLLM's
// BlockStored, BlockRemoved and AllBlocksCleared), and a batch of them, in
// plain C++: the msgpack codec (kv_events/msgpack_codec.h) and the gRPC
// stream (kv_events/grpc_stream.h) each turn them into their wire form.

#ifndef PAGEALLOC_KV_EVENTS_EVENT_H_
#define PAGEALLOC_KV_EVENTS_EVENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kv_events/sink.h"

namespace pagealloc {

// The version of the KV-event schema (docs/design.md, "KV events"): the
// events' fields, the batch's shape and the sequence numbers' meaning. It
// changes when any of them does.
inline constexpr int kKvEventsSchemaVersion = 1;

enum class KvEventKind { kBlockStored, kBlockRemoved, kAllBlocksCleared };

struct KvEvent {
  KvEventKind kind = KvEventKind::kAllBlocksCleared;
  // kBlockStored only.
  StoredBlocks stored;
  // kBlockRemoved only: the keys that left the cache.
  std::vector<std::string> removed_keys;
};

// One published batch: what the ZMQ PUB socket, the replay socket and the
// gRPC stream send under one sequence number.
struct KvEventBatch {
  int64_t sequence = 0;
  // When the batch was formed, seconds since the Unix epoch.
  double ts = 0;
  std::vector<KvEvent> events;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_KV_EVENTS_EVENT_H_
