#include "client/kv_buffers.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "memory/shared_region.h"
#ifdef PAGEALLOC_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "common/cuda_status.h"
#include "memory/cuda_vmm.h"
#endif

namespace pagealloc {

// Owns the slab's mapping in this process: a memfd mapping (CPU backend)
// or a CUDA VMM mapping (CUDA backend).
class KvSlabView::Mapping {
 public:
  explicit Mapping(std::unique_ptr<SharedRegion> region)
      : region_(std::move(region)) {}
#ifdef PAGEALLOC_HAVE_CUDA
  explicit Mapping(std::unique_ptr<cuda_vmm::Mapping> device)
      : device_(std::move(device)) {}
#endif

 private:
  std::unique_ptr<SharedRegion> region_;
#ifdef PAGEALLOC_HAVE_CUDA
  std::unique_ptr<cuda_vmm::Mapping> device_;
#endif
};

KvSlabView::~KvSlabView() = default;

const KvBuffer* KvSlabView::Find(absl::string_view name) const {
  for (const KvBuffer& buffer : buffers_) {
    if (buffer.name == name) return &buffer;
  }
  return nullptr;
}

absl::Status KvSlabView::CheckRange(const void* at, int64_t bytes) const {
  const char* begin = static_cast<const char*>(data_);
  const char* p = static_cast<const char*>(at);
  if (bytes < 0 || p < begin || p > begin + geometry_.total_bytes ||
      bytes > begin + geometry_.total_bytes - p) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d bytes at %p are not inside the KV slab [%p, +%d)",
                        bytes, at, data_, geometry_.total_bytes));
  }
  return absl::OkStatus();
}

absl::Status KvSlabView::CopyToSlab(void* dst, const void* src,
                                    int64_t bytes) const {
  RETURN_IF_ERROR(CheckRange(dst, bytes));
#ifdef PAGEALLOC_HAVE_CUDA
  if (on_device_) {
    RETURN_IF_ERROR(
        CudaStatus(cudaSetDevice(buffers_.front().device), "cudaSetDevice"));
    return CudaStatus(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice),
                      "cudaMemcpy (to the KV slab)");
  }
#endif
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status KvSlabView::CopyFromSlab(void* dst, const void* src,
                                      int64_t bytes) const {
  RETURN_IF_ERROR(CheckRange(src, bytes));
#ifdef PAGEALLOC_HAVE_CUDA
  if (on_device_) {
    RETURN_IF_ERROR(
        CudaStatus(cudaSetDevice(buffers_.front().device), "cudaSetDevice"));
    return CudaStatus(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost),
                      "cudaMemcpy (from the KV slab)");
  }
#endif
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvSlabView>> KvSlabView::Map(
    const v1::PoolInfo& pool, UniqueFd fd, uint64_t fd_bytes) {
  const v1::KvSlab& wire = pool.kv_slab();
  auto differs = [](const std::string& what) {
    return absl::InternalError(absl::StrCat(
        "the daemon's KV slab description is inconsistent: ", what));
  };
  std::unique_ptr<KvSlabView> view(new KvSlabView());
  absl::StatusOr<KvLayout> layout = ParseKvLayout(wire.layout());
  if (!layout.ok()) return differs(std::string(layout.status().message()));
  view->layout_ = *std::move(layout);
  absl::StatusOr<KvSlabGeometry> geometry = PlaceKvSlab(
      view->layout_, pool.page_size(), pool.num_pages(), wire.alignment());
  if (!geometry.ok()) {
    return differs(std::string(geometry.status().message()));
  }
  view->geometry_ = *std::move(geometry);
  const KvSlabGeometry& slab = view->geometry_;
  if (slab.total_bytes != wire.bytes() || slab.num_slots != wire.num_slots() ||
      slab.bytes_per_page != wire.bytes_per_page() ||
      static_cast<size_t>(wire.buffers_size()) != slab.placements.size()) {
    return differs(absl::StrFormat(
        "%s with %d pages of %d slots is %d bytes, %d slots, %d buffers; "
        "the daemon says %d bytes, %d slots, %d buffers",
        wire.layout(), pool.num_pages(), pool.page_size(), slab.total_bytes,
        slab.num_slots, slab.placements.size(), wire.bytes(), wire.num_slots(),
        wire.buffers_size()));
  }
  for (int b = 0; b < wire.buffers_size(); ++b) {
    const v1::KvBuffer& given = wire.buffers(b);
    const KvBufferSpec& spec = view->layout_.buffers[b];
    const KvBufferPlacement& placement = slab.placements[b];
    if (given.name() != spec.name || given.offset() != placement.offset ||
        given.stride_bytes() != placement.stride_bytes ||
        given.dtype() != KvDtypeName(spec.dtype)) {
      return differs(absl::StrFormat(
          "buffer %d is %s (%s) at %d, %d bytes a slot; the daemon says %s "
          "(%s) at %d, %d bytes a slot",
          b, spec.name, KvDtypeName(spec.dtype), placement.offset,
          placement.stride_bytes, given.name(), given.dtype(), given.offset(),
          given.stride_bytes()));
    }
  }
  if (!fd.valid()) {
    return absl::FailedPreconditionError(
        "the daemon owns the pool's KV memory but handed over no KV slab");
  }
  if (fd_bytes != static_cast<uint64_t>(slab.total_bytes)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the KV slab handed over is %d bytes; the pool's is %d",
                        fd_bytes, slab.total_bytes));
  }
  int device = -1;
  if (pool.backend() == v1::BACKEND_CUDA) {
#ifdef PAGEALLOC_HAVE_CUDA
    ASSIGN_OR_RETURN(device, cuda_vmm::DeviceByUuid(pool.device_uuid()));
    ASSIGN_OR_RETURN(
        std::unique_ptr<cuda_vmm::Mapping> mapped,
        cuda_vmm::Mapping::Import(std::move(fd), slab.total_bytes, device));
    view->data_ = mapped->data();
    view->on_device_ = true;
    view->mapping_ = std::make_unique<Mapping>(std::move(mapped));
#else
    return absl::FailedPreconditionError(
        "the daemon's KV slab is GPU memory and this client was built "
        "without CUDA");
#endif
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<SharedRegion> region,
                     SharedRegion::FromFd(std::move(fd), slab.total_bytes,
                                          SharedRegion::Access::kReadWrite));
    view->data_ = region->base();
    view->mapping_ = std::make_unique<Mapping>(std::move(region));
  }
  for (size_t b = 0; b < slab.placements.size(); ++b) {
    const KvBufferSpec& spec = view->layout_.buffers[b];
    const KvBufferPlacement& placement = slab.placements[b];
    KvBuffer buffer;
    buffer.name = spec.name;
    buffer.dtype = spec.dtype;
    buffer.element_shape = spec.element_shape;
    buffer.num_slots = slab.num_slots;
    buffer.stride_bytes = placement.stride_bytes;
    buffer.data = static_cast<char*>(view->data_) + placement.offset;
    buffer.on_device = view->on_device_;
    buffer.device = device;
    view->buffers_.push_back(std::move(buffer));
  }
  return view;
}

}  // namespace pagealloc
