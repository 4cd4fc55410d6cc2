// The pool's KV buffers as a client sees them: the daemon owns one slab per
// pool (docs/design.md, section 11) and hands every session its file
// descriptor over the memory socket; Client maps it once, at Register, and
// exposes each buffer as a KvBuffer. Slot s of a buffer (a slot the session
// was given by an allocation call) is at data + s * stride_bytes, an
// element of element_shape values of dtype; attention kernels read and
// write it in place.
//
//   for (const pagealloc::KvBuffer& k : client->kv_buffers()) {
//     // k.name "k.0", k.data (device pointer on a GPU daemon),
//     // k.num_slots, k.element_shape {kv_heads, head_dim}, k.dtype
//   }

#ifndef PAGEALLOC_CLIENT_KV_BUFFERS_H_
#define PAGEALLOC_CLIENT_KV_BUFFERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "memory/kv_layout.h"
#include "memory/unique_fd.h"
#include "proto/pagealloc.pb.h"

namespace pagealloc {

// One KV buffer of the slab, mapped in this process: a [num_slots,
// element_shape...] array of dtype, contiguous, slot-major. A plain view:
// valid while the Client that made it lives.
struct KvBuffer {
  std::string name;  // "k.0", "v.0", "kv.3", or a custom layout's name
  KvDtype dtype = KvDtype::kBf16;
  std::vector<int64_t> element_shape;  // one slot's element
  int64_t num_slots = 0;     // (num_pages + 1) * page_size, page 0 included
  int64_t stride_bytes = 0;  // bytes from one slot to the next
  // Slot 0: a device pointer (CUDA backend, on `device`) or a host pointer
  // (CPU backend).
  void* data = nullptr;
  bool on_device = false;
  int device = -1;  // CUDA ordinal in this process; -1 on the CPU backend

  // Slot `slot`'s element. REQUIRES: 0 <= slot < num_slots.
  void* slot(int64_t slot) const {
    return static_cast<char*>(data) + slot * stride_bytes;
  }
};

// The slab mapped in this process: one mapping, every buffer a view into
// it. Unmapped on destruction (the memory lives on in the daemon and the
// other sessions).
//
// This class is thread-safe (it is immutable once mapped).
class KvSlabView {
 public:
  // Maps the slab `pool` describes (PoolInfo.kv_slab) from `fd`, the
  // slab's memory as the memory socket handed it over, `fd_bytes` long.
  // The description is the daemon's and is checked, not trusted: its
  // layout must parse, and the buffers, offsets, strides and size that
  // follow from it, the pool's pages and the alignment must be the ones
  // it lists. INTERNAL when they differ, FAILED_PRECONDITION when the
  // memory is missing or not what it should be, the mapping's own errors
  // otherwise (on the CUDA backend: the daemon's GPU not visible here,
  // import or map failures; a client built without CUDA cannot map a GPU
  // slab).
  static absl::StatusOr<std::unique_ptr<KvSlabView>> Map(
      const v1::PoolInfo& pool, UniqueFd fd, uint64_t fd_bytes);

  ~KvSlabView();
  KvSlabView(const KvSlabView&) = delete;
  KvSlabView& operator=(const KvSlabView&) = delete;

  const std::vector<KvBuffer>& buffers() const { return buffers_; }
  // The buffer named `name`, or null.
  const KvBuffer* Find(absl::string_view name) const;
  const KvLayout& layout() const { return layout_; }
  const KvSlabGeometry& geometry() const { return geometry_; }
  // The slab's first byte and size (every buffer lies inside).
  void* data() const { return data_; }
  int64_t bytes() const { return geometry_.total_bytes; }
  bool on_device() const { return on_device_; }

  // Copies `bytes` from host memory `src` into the slab at `dst` (inside
  // it, e.g. a KvBuffer::slot), or out of the slab at `src` into host
  // memory `dst`: memcpy on the CPU backend, a synchronous cudaMemcpy on
  // the CUDA backend. For tests, examples and tools; kernels use the
  // buffers in place. INVALID_ARGUMENT for a range outside the slab.
  absl::Status CopyToSlab(void* dst, const void* src, int64_t bytes) const;
  absl::Status CopyFromSlab(void* dst, const void* src, int64_t bytes) const;

 private:
  absl::Status CheckRange(const void* at, int64_t bytes) const;

  class Mapping;  // kv_buffers.cc: a memfd or a CUDA VMM mapping
  KvSlabView() = default;

  KvLayout layout_;
  KvSlabGeometry geometry_;
  std::unique_ptr<Mapping> mapping_;
  void* data_ = nullptr;
  bool on_device_ = false;
  std::vector<KvBuffer> buffers_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_CLIENT_KV_BUFFERS_H_
