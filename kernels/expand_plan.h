// The expand kernel's parameters and the body of each of its threads, in
// plain C++ marked __host__ __device__, so that the GPU runs exactly the code
// that the host-side tests run (kernels/plan_packing_test.cc emulates every
// block and thread of a launch with these functions).
//
// A batch plan is packed on the host (kernels/plan_packing.h) into one block
// of struct-of-arrays, one entry per request that writes at least one slot:
//   slot_begin[r]     first slot index of request r within the batch
//                     (an exclusive prefix sum; slot_begin[n] = num_slots)
//   partial_slots[r]  slots that continue the prefix's partial last page
//   first_slot[r]     last_loc + 1: the first of those slots
//   ring_start[r]     ring position of the request's first new page
//   destination[r]    where request r's slots go
// plus, for the tiled kernel, tile_first_request[m]: the request that holds
// batch slot m * kExpandTileSlots (and a last entry, the last request). Requests with no slots are dropped while
// packing, so every packed request owns at least one slot and a tile of
// kExpandTileSlots slots spans at most kExpandTileSlots + 1 requests.

#ifndef PAGEALLOC_KERNELS_EXPAND_PLAN_H_
#define PAGEALLOC_KERNELS_EXPAND_PLAN_H_

#include <cstdint>

#if defined(__CUDACC__)
#define PAGEALLOC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define PAGEALLOC_HOST_DEVICE inline
#endif

namespace pagealloc {

// Threads per block of the expand kernel, and the slots one block-row of
// threads covers; tile_first_request has one entry per kExpandTileSlots.
inline constexpr int kExpandThreads = 256;
inline constexpr int64_t kExpandTileSlots = kExpandThreads;

// Batches whose largest request writes at most this many slots run one
// thread per request (decode, speculative drafts, small mixed batches):
// two dependent memory reads per slot and no search. Larger ones run tiles
// of slots, one thread per slot.
inline constexpr int64_t kPerRequestMaxSlots = 16;

// Returns whether the per-request kernel (not the tiled one) expands a
// packed plan whose largest request writes max_request_slots slots.
inline constexpr bool UsesPerRequestKernel(int64_t max_request_slots) {
  return max_request_slots <= kPerRequestMaxSlots;
}

struct ExpandParams {
  // Packed per-request arrays (device pointers), num_requests >= 1 entries.
  const int64_t* slot_begin;     // [num_requests + 1]
  const int64_t* partial_slots;  // [num_requests]
  const int64_t* first_slot;     // [num_requests]
  const int64_t* ring_start;     // [num_requests], each in [0, capacity)
  int64_t* const* destination;   // [num_requests]
  // [ceil(num_slots / kExpandTileSlots) + 1]; the last entry is
  // num_requests - 1. Read by the tiled kernel only.
  const int64_t* tile_first_request;
  const int64_t* free_ring;  // [ring_capacity]: the device mirror
  int64_t ring_capacity;     // >= 1
  int64_t page_size;         // >= 1
  int64_t num_requests;      // packed requests, each with >= 1 slot
  int64_t num_slots;         // slot_begin[num_requests]
  int64_t max_request_slots;  // the largest request's slot count
};

// Returns the last request r in [lo, hi] with slot_begin[r] <= slot: the
// request that writes batch slot `slot`.
// REQUIRES: slot_begin[lo] <= slot < num_slots, lo <= hi < num_requests.
PAGEALLOC_HOST_DEVICE int64_t FindRequest(const int64_t* slot_begin,
                                          int64_t lo, int64_t hi,
                                          int64_t slot) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (slot_begin[mid] <= slot) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Locates the u-th slot (0-based) of a request: the rest of the prefix's
// partial page first, then its new pages, each filled from its start. Sets
// *ring_position to -1 and *value to the slot for a prefix-page slot; else
// sets *ring_position to the ring position of the slot's page and *value to
// the slot's offset in that page. page_shift is log2(page_size) when
// kPow2PageSize. The position stays in [0, capacity): ring_start < capacity
// and packing checks that a request's new pages never exceed the capacity.
template <bool kPow2PageSize>
PAGEALLOC_HOST_DEVICE void LocateSlot(int64_t u, int64_t partial_slots,
                                      int64_t first_slot, int64_t ring_start,
                                      int64_t ring_capacity,
                                      int64_t page_size, int page_shift,
                                      int64_t* ring_position,
                                      int64_t* value) {
  if (u < partial_slots) {
    *ring_position = -1;
    *value = first_slot + u;
    return;
  }
  u -= partial_slots;
  int64_t page;
  if (kPow2PageSize) {
    page = u >> page_shift;
    *value = u & (page_size - 1);
  } else {
    page = u / page_size;
    *value = u - page * page_size;
  }
  int64_t position = ring_start + page;
  if (position >= ring_capacity) position -= ring_capacity;
  *ring_position = position;
}

// Returns the u-th slot of a request (LocateSlot, then the ring read).
template <bool kPow2PageSize>
PAGEALLOC_HOST_DEVICE int64_t ExpandSlot(int64_t u, int64_t partial_slots,
                                         int64_t first_slot,
                                         int64_t ring_start,
                                         const int64_t* free_ring,
                                         int64_t ring_capacity,
                                         int64_t page_size, int page_shift) {
  int64_t position;
  int64_t value;
  LocateSlot<kPow2PageSize>(u, partial_slots, first_slot, ring_start,
                            ring_capacity, page_size, page_shift, &position,
                            &value);
  return position < 0 ? value : free_ring[position] * page_size + value;
}

// One thread of the per-request kernel: writes every slot of packed request
// r (grid: ceil(num_requests / kExpandThreads) blocks of kExpandThreads;
// r = block * kExpandThreads + thread). Threads past the last request return.
// Used when max_request_slots <= kPerRequestMaxSlots, so a thread writes at
// most that many slots.
template <bool kPow2PageSize>
PAGEALLOC_HOST_DEVICE void ExpandRequestThread(const ExpandParams& p,
                                               int page_shift, int64_t r) {
  if (r >= p.num_requests) return;
  const int64_t begin = p.slot_begin[r];
  const int64_t num_slots = p.slot_begin[r + 1] - begin;
  const int64_t partial_slots = p.partial_slots[r];
  const int64_t first_slot = p.first_slot[r];
  const int64_t ring_start = p.ring_start[r];
  int64_t* const out = p.destination[r];
  for (int64_t u = 0; u < num_slots; ++u) {
    out[u] = ExpandSlot<kPow2PageSize>(u, partial_slots, first_slot,
                                       ring_start, p.free_ring,
                                       p.ring_capacity, p.page_size,
                                       page_shift);
  }
}

// One thread of the tiled kernel (grid: ceil(num_slots / (kExpandTileSlots *
// kSlotsPerThread)) blocks of kExpandThreads). Block b covers batch slots
// [b * kExpandTileSlots * kSlotsPerThread, ...) in kSlotsPerThread rows of
// kExpandThreads; thread t takes slot row * kExpandThreads + t of each row,
// so a warp's stores to one request are contiguous. The block's requests
// lie between two entries of tile_first_request, so a thread searches only
// among them (no search at all inside one large request), and it searches
// from its previous request on, as its slots increase.
//
// Two phases: first every slot's source is located and its page read from
// the ring, then the values are stored, so a thread's ring reads are in
// flight together rather than one store apart.
template <bool kPow2PageSize, int kSlotsPerThread>
PAGEALLOC_HOST_DEVICE void ExpandTileThread(const ExpandParams& p,
                                            int page_shift, int64_t block,
                                            int thread) {
  constexpr int64_t kTileSlots = kExpandTileSlots * kSlotsPerThread;
  const int64_t tile_begin = block * kTileSlots;
  const int64_t tile_end = tile_begin + kTileSlots < p.num_slots
                               ? tile_begin + kTileSlots
                               : p.num_slots;
  const int64_t last_mark =
      (p.num_slots + kExpandTileSlots - 1) / kExpandTileSlots;
  const int64_t first_mark = block * kSlotsPerThread;
  const int64_t end_mark = first_mark + kSlotsPerThread < last_mark
                               ? first_mark + kSlotsPerThread
                               : last_mark;
  int64_t lo = p.tile_first_request[first_mark];
  const int64_t hi = p.tile_first_request[end_mark];

  int64_t r = -1;
  int64_t begin = 0;
  int64_t partial_slots = 0;
  int64_t first_slot = 0;
  int64_t ring_start = 0;
  int64_t* out = nullptr;
  // Per slot, between the phases: its target, and either its value (a
  // prefix-page slot) or its page id and offset (bit k of from_ring set).
  // Kept small: the kernel runs at <= 64 registers without spilling.
  int64_t* target[kSlotsPerThread];
  int64_t word[kSlotsPerThread];
  int32_t offset[kSlotsPerThread];
  uint32_t from_ring = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < kSlotsPerThread; ++k) {
    const int64_t slot = tile_begin + k * kExpandThreads + thread;
    target[k] = nullptr;
    word[k] = 0;
    offset[k] = 0;
    if (slot < tile_end) {
      const int64_t found = FindRequest(p.slot_begin, lo, hi, slot);
      if (found != r) {
        r = found;
        begin = p.slot_begin[r];
        partial_slots = p.partial_slots[r];
        first_slot = p.first_slot[r];
        ring_start = p.ring_start[r];
        out = p.destination[r];
        lo = r;
      }
      int64_t position;
      int64_t value;
      LocateSlot<kPow2PageSize>(slot - begin, partial_slots, first_slot,
                                ring_start, p.ring_capacity, p.page_size,
                                page_shift, &position, &value);
      if (position >= 0) {
        word[k] = p.free_ring[position];
        offset[k] = static_cast<int32_t>(value);  // < page_size < 2^31
        from_ring |= 1u << k;
      } else {
        word[k] = value;
      }
      target[k] = out + (slot - begin);
    }
  }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < kSlotsPerThread; ++k) {
    if (target[k] != nullptr) {
      *target[k] = (from_ring >> k) & 1u ? word[k] * p.page_size + offset[k]
                                         : word[k];
    }
  }
}

// Returns log2(page_size) when page_size is a power of two, else -1.
PAGEALLOC_HOST_DEVICE int PageShift(int64_t page_size) {
  if (page_size < 1 || (page_size & (page_size - 1)) != 0) return -1;
  int shift = 0;
  while ((int64_t{1} << shift) < page_size) ++shift;
  return shift;
}

}  // namespace pagealloc

#endif  // PAGEALLOC_KERNELS_EXPAND_PLAN_H_
