// KvEventSink: where the pool's prefix cache reports what it stores and
// removes, for routers that follow a GPU's cache (vLLM's KV events:
// BlockStored, BlockRemoved, AllBlocksCleared).
//
// The prefix index (the producer) calls a sink with each change in the order
// the changes happen; the publisher (the consumer, kv_events/publisher.h)
// numbers, batches and sends them. Keys are the opaque, fixed-size content
// keys sessions publish pages under; the daemon never hashes tokens itself.
//
// Implementations must be thread-safe and must not block: they are called
// on the allocation path (an eviction inside a launch), so a slow
// subscriber may cost events (a gap the sequence numbers show), never time.

#ifndef PAGEALLOC_KV_EVENTS_SINK_H_
#define PAGEALLOC_KV_EVENTS_SINK_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace pagealloc {

// Pages published under `keys`, in chain order: keys[0]'s parent is
// `parent_key` (empty at the start of a chain), keys[i]'s is keys[i - 1].
struct StoredBlocks {
  std::vector<std::string> keys;
  std::string parent_key;
  // The pages' tokens when the publisher sent them (empty otherwise):
  // block_size tokens per key.
  std::vector<int64_t> token_ids;
  int64_t block_size = 0;
  std::optional<int64_t> lora_id;
};

class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  virtual void BlocksStored(const StoredBlocks& blocks) = 0;
  // Keys whose pages left the cache (evicted, or cleared one by one).
  virtual void BlocksRemoved(absl::Span<const std::string> keys) = 0;
  // Every cached page is gone (a reset, or a pool that starts fresh).
  virtual void AllBlocksCleared() = 0;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_KV_EVENTS_SINK_H_
