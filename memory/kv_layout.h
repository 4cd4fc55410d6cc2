// KvLayout: the geometry of a pool's KV memory, as the daemon is told it
// (--kv_layout) and as every session gets it back (PoolInfo.kv_slab), and
// KvSlabGeometry: where each buffer sits in the one slab that holds them.
//
// A layout is a list of named buffers; each holds one element per slot, an
// array of `element_shape` values of one dtype. Three spellings:
//
//   mha:layers=32,kv_heads=8,head_dim=128,dtype=bf16[,v_head_dim=128]
//       SGLang's MHATokenToKVPool: per layer a K and a V buffer, each
//       [num_slots, kv_heads, head_dim] (V: v_head_dim when given). Buffers
//       "k.0", "v.0", "k.1", "v.1", ... (layer-major).
//   mla:layers=61,kv_lora_rank=512,rope_dim=64,dtype=bf16
//       SGLang's MLATokenToKVPool: per layer one buffer
//       [num_slots, 1, kv_lora_rank + rope_dim]. Buffers "kv.0", "kv.1", ...
//   custom:[layers=N,]NAME=DTYPE:D0xD1x...[,NAME=DTYPE:...]
//       Any named buffers, each an element shape (dimensions joined by "x")
//       and a dtype, e.g. custom:layers=4,k=fp8_e4m3:8x128,k_scale=fp32:8.
//       With layers=N every buffer is repeated per layer ("k.0", "k_scale.0",
//       "k.1", ...); without it the names are used as given.
//
// Dtypes: bf16, fp16, fp32, fp8_e4m3, fp8_e5m2, int8, uint8, int32.
//
// The slab holds slots 0 .. num_slots - 1, num_slots = (num_pages + 1) *
// page_size (page 0 included: engines point padding at it). Its buffers lie
// one after another, each starting at a multiple of the allocation
// granularity (the device's for CUDA VMM, the host page on the CPU), so
// each buffer is one contiguous [num_slots, element...] array: slot s of
// buffer b is at offset_b + s * stride_b, stride_b being the element's
// bytes.
//
// Shared by the daemon (which parses the flag and sizes the slab) and the
// client (which rebuilds the buffers from what Register returns).

#ifndef PAGEALLOC_MEMORY_KV_LAYOUT_H_
#define PAGEALLOC_MEMORY_KV_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pagealloc {

enum class KvDtype : uint8_t {
  kBf16,
  kFp16,
  kFp32,
  kFp8E4m3,
  kFp8E5m2,
  kInt8,
  kUint8,
  kInt32,
};

// "bf16", ...; INVALID_ARGUMENT naming the accepted names otherwise.
absl::StatusOr<KvDtype> ParseKvDtype(absl::string_view name);
absl::string_view KvDtypeName(KvDtype dtype);
int64_t KvDtypeBytes(KvDtype dtype);

struct KvBufferSpec {
  std::string name;
  KvDtype dtype = KvDtype::kBf16;
  // One slot's element, e.g. {kv_heads, head_dim}. Every dimension >= 1.
  std::vector<int64_t> element_shape;

  // Bytes of one slot's element (the buffer's stride).
  int64_t element_bytes() const;
};

struct KvLayout {
  // The layout as given, in canonical form (ParseKvLayout(text) == *this).
  std::string text;
  std::vector<KvBufferSpec> buffers;

  // Bytes of one slot across every buffer.
  int64_t slot_bytes() const;
};

// Parses a --kv_layout value (the spellings above). INVALID_ARGUMENT naming
// the key and value at fault; at most kMaxKvBuffers buffers, each element
// at most 2^32 bytes.
absl::StatusOr<KvLayout> ParseKvLayout(absl::string_view text);

inline constexpr int kMaxKvBuffers = 4096;

// Where one buffer lies in the slab.
struct KvBufferPlacement {
  int64_t offset = 0;        // from the slab's start; a multiple of alignment
  int64_t stride_bytes = 0;  // bytes per slot (the element's bytes)
  int64_t bytes = 0;         // num_slots * stride_bytes
};

struct KvSlabGeometry {
  int64_t page_size = 0;
  int64_t num_pages = 0;    // usable pages: ids 1..num_pages
  int64_t num_slots = 0;    // (num_pages + 1) * page_size
  int64_t alignment = 0;    // each buffer's offset is a multiple of it
  int64_t total_bytes = 0;  // the slab: last buffer's end, rounded up
  std::vector<KvBufferPlacement> placements;  // one per layout buffer

  // Bytes one page takes across every buffer (page_size * slot_bytes).
  int64_t bytes_per_page = 0;
};

// The slab's size in bytes for `num_pages` usable pages.
absl::StatusOr<KvSlabGeometry> PlaceKvSlab(const KvLayout& layout,
                                           int64_t page_size, int64_t num_pages,
                                           int64_t alignment);

// The most usable pages whose slab fits in `budget_bytes`, and its
// placement. INVALID_ARGUMENT naming the numbers when not even one usable
// page (besides page 0) fits, or when alignment is not a power of two.
absl::StatusOr<KvSlabGeometry> FitKvSlab(const KvLayout& layout,
                                         int64_t page_size,
                                         int64_t budget_bytes,
                                         int64_t alignment);

// A --kv_memory value: bytes ("80GiB", "512MiB", "1.5TiB", "1000000000",
// suffixes B, KiB, MiB, GiB, TiB and KB, MB, GB, TB) or a fraction of the
// memory available ("0.9": 0 < f <= 1, no suffix).
struct KvMemoryBudget {
  int64_t bytes = 0;      // when > 0: an absolute budget
  double fraction = 0.0;  // else: this share of what is available

  // The budget in bytes given what is available.
  int64_t Resolve(int64_t available_bytes) const;
};
absl::StatusOr<KvMemoryBudget> ParseKvMemory(absl::string_view text);

// "80.0 GiB", "512.0 MiB", "4.0 KiB", "12 B": for messages and logs.
std::string FormatBytes(int64_t bytes);

}  // namespace pagealloc

#endif  // PAGEALLOC_MEMORY_KV_LAYOUT_H_
