// Golden bytes for the KV events' msgpack wire, written by hand from vLLM's
// schema (vllm/distributed/kv_events.py: EventBatch array_like, events
// tagged under "type"; msgspec packs integers in their shortest form and
// floats as float 64), not produced by the codec under test.

#include "kv_events/msgpack_codec.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "kv_events/event.h"

namespace pagealloc {
namespace {

// A key whose last 8 bytes are `value`, big-endian, after `prefix_bytes`
// bytes of 0xAA (content keys are longer than 8 bytes).
std::string Key(uint64_t value, int prefix_bytes = 24) {
  std::string key(prefix_bytes, '\xaa');
  for (int shift = 56; shift >= 0; shift -= 8) {
    key.push_back(static_cast<char>((value >> shift) & 0xff));
  }
  return key;
}

KvEvent Stored(std::vector<std::string> keys, std::string parent,
               std::vector<int64_t> tokens, int64_t block_size,
               std::optional<int64_t> lora_id = std::nullopt) {
  KvEvent event;
  event.kind = KvEventKind::kBlockStored;
  event.stored.keys = std::move(keys);
  event.stored.parent_key = std::move(parent);
  event.stored.token_ids = std::move(tokens);
  event.stored.block_size = block_size;
  event.stored.lora_id = lora_id;
  return event;
}

KvEvent Removed(std::vector<std::string> keys) {
  KvEvent event;
  event.kind = KvEventKind::kBlockRemoved;
  event.removed_keys = std::move(keys);
  return event;
}

KvEvent Cleared() { return KvEvent{}; }

std::string Hex(const std::string& bytes) {
  return absl::BytesToHexString(bytes);
}

KvEventBatch Batch(std::vector<KvEvent> events) {
  return KvEventBatch{.sequence = 7, .ts = 1.5, .events = std::move(events)};
}

// [1.5, [...], 0]: fixarray(3), float 64 1.5, fixarray(n) ..., dp rank 0.
constexpr char kHead[] =
    "93"
    "cb3ff8000000000000"
    "91";

TEST(MsgpackCodecTest, BlockStoredIsATaggedMapWithVllmsFields) {
  const std::string bytes = EncodeKvEventBatch(
      Batch({Stored({Key(256)}, "", {1, 2}, 2)}), KvEventWireOptions{});
  EXPECT_EQ(Hex(bytes), std::string(kHead) +
                            "88"                          // map(8)
                            "a474797065"                  // "type"
                            "ab426c6f636b53746f726564"    // "BlockStored"
                            "ac626c6f636b5f686173686573"  // "block_hashes"
                            "91cd0100"                    // [256]
                            "b1706172656e745f626c6f636b5f68617368"  // parent
                            "c0"                                    // nil
                            "a9746f6b656e5f696473"    // "token_ids"
                            "920102"                  // [1, 2]
                            "aa626c6f636b5f73697a65"  // "block_size"
                            "02"                      // 2
                            "a76c6f72615f6964"        // "lora_id"
                            "c0"                      // nil
                            "a66d656469756d"          // "medium"
                            "a3475055"                // "GPU"
                            "a96c6f72615f6e616d65"    // "lora_name"
                            "c0"                      // nil
                            "00");                    // dp rank 0
}

TEST(MsgpackCodecTest, BlockStoredCarriesParentLoraAndWideIntegers) {
  const std::string bytes = EncodeKvEventBatch(
      Batch(
          {Stored({Key(0xfffffffffffffffe), Key(3)}, Key(7), {-1, 300}, 1, 5)}),
      KvEventWireOptions{});
  EXPECT_EQ(Hex(bytes),
            std::string(kHead) +
                "88a474797065ab426c6f636b53746f726564"
                "ac626c6f636b5f686173686573"
                "92"
                "cffffffffffffffffe"
                "03"  // [uint 64, fixint 3]
                "b1706172656e745f626c6f636b5f68617368"
                "07"
                "a9746f6b656e5f696473"
                "92"
                "ff"
                "cd012c"  // [-1, 300]
                "aa626c6f636b5f73697a65"
                "01"
                "a76c6f72615f6964"
                "05"
                "a66d656469756da3475055"
                "a96c6f72615f6e616d65c0"
                "00");
}

TEST(MsgpackCodecTest, BlockRemovedAndTheDataParallelRank) {
  KvEventWireOptions options;
  options.data_parallel_rank = 3;
  const std::string bytes =
      EncodeKvEventBatch(Batch({Removed({Key(1), Key(2)})}), options);
  EXPECT_EQ(Hex(bytes), std::string(kHead) +
                            "83a474797065"
                            "ac426c6f636b52656d6f766564"  // "BlockRemoved"
                            "ac626c6f636b5f686173686573"
                            "920102"
                            "a66d656469756da3475055"
                            "03");  // dp rank 3
}

TEST(MsgpackCodecTest, AllBlocksClearedHasOnlyItsTag) {
  const std::string bytes =
      EncodeKvEventBatch(Batch({Cleared()}), KvEventWireOptions{});
  EXPECT_EQ(Hex(bytes), std::string(kHead) +
                            "81a474797065"
                            "b0416c6c426c6f636b73436c6561726564"  // name
                            "00");
}

TEST(MsgpackCodecTest, TaggedArraysPutTheTagFirstAndFieldsInOrder) {
  KvEventWireOptions options;
  options.encoding = KvEventEncoding::kTaggedArray;
  const std::string bytes = EncodeKvEventBatch(
      Batch({Stored({Key(256)}, "", {1, 2}, 2), Removed({Key(1)}), Cleared()}),
      options);
  EXPECT_EQ(Hex(bytes),
            "93cb3ff8000000000000"
            "93"                          // three events
            "98ab426c6f636b53746f726564"  // [ "BlockStored",
            "91cd0100"
            "c0"
            "920102"
            "02"
            "c0"
            "a3475055"
            "c0"
            "93ac426c6f636b52656d6f766564"
            "9101"
            "a3475055"
            "91b0416c6c426c6f636b73436c6561726564"
            "00");
}

TEST(MsgpackCodecTest, BytesBlockHashesAreBin) {
  KvEventWireOptions options;
  options.encoding = KvEventEncoding::kTaggedArray;
  options.block_hash = BlockHashFormat::kBytes;
  const std::string bytes = EncodeKvEventBatch(
      Batch({Stored({std::string("\x01\x02", 2)}, "\x09", {}, 2)}), options);
  EXPECT_EQ(Hex(bytes), std::string(kHead) +
                            "98ab426c6f636b53746f726564"
                            "91c4020102"  // [bin 01 02]
                            "c40109"      // bin 09
                            "90"
                            "02"
                            "c0"
                            "a3475055"
                            "c0"
                            "00");
}

TEST(MsgpackCodecTest, IntegerBlockHashIsTheKeysLast8BytesBigEndian) {
  EXPECT_EQ(BlockHashAsUint64(Key(0x0102030405060708)), 0x0102030405060708u);
  EXPECT_EQ(BlockHashAsUint64(std::string("\x01\x02", 2)), 0x0102u);
  EXPECT_EQ(BlockHashAsUint64(""), 0u);
}

}  // namespace
}  // namespace pagealloc
