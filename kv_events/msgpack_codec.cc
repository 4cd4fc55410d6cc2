#include "kv_events/msgpack_codec.h"

#include <cstdint>
#include <string>
#include <string_view>

#include "msgpack.hpp"

namespace pagealloc {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackString(Packer& packer, std::string_view s) {
  packer.pack_str(static_cast<uint32_t>(s.size()));
  packer.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackBlockHash(Packer& packer, std::string_view key,
                   BlockHashFormat format) {
  if (format == BlockHashFormat::kUint64) {
    // msgpack-c packs an integer in its shortest form, as msgspec does.
    packer.pack_uint64(BlockHashAsUint64(key));
    return;
  }
  packer.pack_bin(static_cast<uint32_t>(key.size()));
  packer.pack_bin_body(key.data(), static_cast<uint32_t>(key.size()));
}

void PackBlockHashes(Packer& packer, const std::vector<std::string>& keys,
                     BlockHashFormat format) {
  packer.pack_array(static_cast<uint32_t>(keys.size()));
  for (const std::string& key : keys) PackBlockHash(packer, key, format);
}

// Writes a field's name in the map encoding; nothing in the array one,
// where its position names it.
void PackName(Packer& packer, KvEventEncoding encoding, std::string_view name) {
  if (encoding == KvEventEncoding::kTaggedMap) PackString(packer, name);
}

// Opens an event of `fields` fields besides its tag, and writes the tag.
void PackTag(Packer& packer, KvEventEncoding encoding, std::string_view tag,
             uint32_t fields) {
  if (encoding == KvEventEncoding::kTaggedMap) {
    packer.pack_map(fields + 1);
    PackString(packer, "type");
  } else {
    packer.pack_array(fields + 1);
  }
  PackString(packer, tag);
}

void PackEvent(Packer& packer, const KvEvent& event,
               const KvEventWireOptions& options) {
  const KvEventEncoding encoding = options.encoding;
  switch (event.kind) {
    case KvEventKind::kBlockStored: {
      const StoredBlocks& stored = event.stored;
      PackTag(packer, encoding, "BlockStored", 7);
      PackName(packer, encoding, "block_hashes");
      PackBlockHashes(packer, stored.keys, options.block_hash);
      PackName(packer, encoding, "parent_block_hash");
      if (stored.parent_key.empty()) {
        packer.pack_nil();
      } else {
        PackBlockHash(packer, stored.parent_key, options.block_hash);
      }
      PackName(packer, encoding, "token_ids");
      packer.pack_array(static_cast<uint32_t>(stored.token_ids.size()));
      for (int64_t token : stored.token_ids) packer.pack_int64(token);
      PackName(packer, encoding, "block_size");
      packer.pack_int64(stored.block_size);
      PackName(packer, encoding, "lora_id");
      if (stored.lora_id.has_value()) {
        packer.pack_int64(*stored.lora_id);
      } else {
        packer.pack_nil();
      }
      PackName(packer, encoding, "medium");
      PackString(packer, options.medium);
      PackName(packer, encoding, "lora_name");
      packer.pack_nil();
      return;
    }
    case KvEventKind::kBlockRemoved:
      PackTag(packer, encoding, "BlockRemoved", 2);
      PackName(packer, encoding, "block_hashes");
      PackBlockHashes(packer, event.removed_keys, options.block_hash);
      PackName(packer, encoding, "medium");
      PackString(packer, options.medium);
      return;
    case KvEventKind::kAllBlocksCleared:
      PackTag(packer, encoding, "AllBlocksCleared", 0);
      return;
  }
}

}  // namespace

uint64_t BlockHashAsUint64(std::string_view key) {
  const std::string_view tail =
      key.size() > 8 ? key.substr(key.size() - 8) : key;
  uint64_t value = 0;
  for (unsigned char byte : tail) value = (value << 8) | byte;
  return value;
}

std::string EncodeKvEventBatch(const KvEventBatch& batch,
                               const KvEventWireOptions& options) {
  msgpack::sbuffer buffer;
  Packer packer(buffer);
  packer.pack_array(3);
  packer.pack_double(batch.ts);
  packer.pack_array(static_cast<uint32_t>(batch.events.size()));
  for (const KvEvent& event : batch.events) PackEvent(packer, event, options);
  packer.pack_int64(options.data_parallel_rank);
  return std::string(buffer.data(), buffer.size());
}

}  // namespace pagealloc
