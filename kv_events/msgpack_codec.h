// The one codec of the KV events' ZMQ wire: a batch -> the msgpack bytes
// vLLM's publisher sends (vllm/distributed/kv_events.py, encoded by
// msgspec), so that routers which follow vLLM (llm-d's KV-cache manager,
// Dynamo's KV router, vLLM's production stack) decode ours unchanged.
//
// The batch is a 3-element array [ts, events, data_parallel_rank]
// (EventBatch, array_like). Each event is, by default, a map tagged under
// "type" ({"type": "BlockStored", "block_hashes": [...], ...}), vLLM's
// encoding since it dropped array_like from its event structs; with
// KvEventEncoding::kTaggedArray it is the positional array vLLM sent before
// (["BlockStored", [...], ...]), for consumers that decode only that.
//
//   BlockStored:      block_hashes, parent_block_hash (nil at a chain's
//                     start), token_ids, block_size, lora_id (nil when
//                     none), medium, lora_name (always nil: keys are
//                     opaque, the daemon knows no adapter names)
//   BlockRemoved:     block_hashes, medium
//   AllBlocksCleared: no fields
//
// vLLM's fields with defaults (extra_keys, group_idx, kv_cache_spec_*) are
// omitted, as msgspec's omit_defaults omits them when unset.

#ifndef PAGEALLOC_KV_EVENTS_MSGPACK_CODEC_H_
#define PAGEALLOC_KV_EVENTS_MSGPACK_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "kv_events/event.h"

namespace pagealloc {

enum class KvEventEncoding {
  kTaggedMap,    // vLLM's current events: {"type": name, field: value...}
  kTaggedArray,  // vLLM's earlier events: [name, value...]
};

// How a content key goes on the wire as a block hash.
enum class BlockHashFormat {
  // An unsigned 64-bit integer: the key's last 8 bytes, big-endian (the
  // whole key when shorter). vLLM's default
  // (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1: the hash's low 64 bits).
  kUint64,
  // The key's bytes as msgpack bin (vLLM with
  // VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
  kBytes,
};

struct KvEventWireOptions {
  KvEventEncoding encoding = KvEventEncoding::kTaggedMap;
  BlockHashFormat block_hash = BlockHashFormat::kUint64;
  // The batch's third element (vLLM's data_parallel_rank).
  int64_t data_parallel_rank = 0;
  // Every event's medium (vLLM's MEDIUM_GPU).
  std::string medium = "GPU";
};

// Returns the key as vLLM's integer block hash (BlockHashFormat::kUint64).
uint64_t BlockHashAsUint64(std::string_view key);

// Encodes `batch` (its events and ts; the sequence number travels in its
// own ZMQ frame) as the msgpack payload of one ZMQ message.
std::string EncodeKvEventBatch(const KvEventBatch& batch,
                               const KvEventWireOptions& options);

}  // namespace pagealloc

#endif  // PAGEALLOC_KV_EVENTS_MSGPACK_CODEC_H_
