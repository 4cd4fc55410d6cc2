// The expand kernel's parameters and the body of each of its threads, in
// plain C++ marked __host__ __device__, so that the GPU runs exactly the code
// that the host-side tests run (kernels/plan_packing_test.cc emulates every
// block and thread of a launch with these functions).
//
// A small batch plan is packed into the kernel's parameters (InlinePlanHeader
// below). A larger one is packed on the host (kernels/plan_packing.h) into
// one uploaded block of struct-of-arrays, one entry per request that writes at
// least one slot:
//   slot_begin[r]     first slot index of request r within the batch
//                     (an exclusive prefix sum; slot_begin[n] = num_slots)
//   partial_slots[r]  slots that continue the prefix's partial last page
//   first_slot[r]     last_loc + 1: the first of those slots
//   ring_start[r]     ring position of the request's first new page
//   destination[r]    where request r's slots go
// plus, for the tiled kernel, tile_first_request[m]: the request that holds
// batch slot m * kExpandTileSlots (and a last entry, the last request).
// Requests with no slots are dropped while packing, so every packed request
// owns at least one slot and a tile of kExpandTileSlots slots spans at most
// kExpandTileSlots + 1 requests.

#ifndef PAGEALLOC_KERNELS_EXPAND_PLAN_H_
#define PAGEALLOC_KERNELS_EXPAND_PLAN_H_

#include <cstddef>
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
// the request's fields, then its pages, then the stores; no search. Larger ones
// run tiles of slots, one thread per slot.
inline constexpr int64_t kPerRequestMaxSlots = 16;

// Returns whether the per-request kernel (not the tiled one) expands a
// packed plan whose largest request writes max_request_slots slots.
inline constexpr bool UsesPerRequestKernel(int64_t max_request_slots) {
  return max_request_slots <= kPerRequestMaxSlots;
}

// Above this many slots the tiled kernel gives each thread kManySlotsPerThread
// slots: a launch then already has ~512 blocks of one slot per thread, about
// a wave on an H200, and more slots per thread put more independent ring
// reads and stores behind each thread's chain of dependent reads rather than
// running more waves of that chain. 8 slots per thread run a 1M-slot plan
// in 512 blocks, one wave at 4 blocks per SM (<= 64 registers). Page sizes
// that are not powers of two take 4: their 64-bit divisions need registers
// that 8 slots would spill.
inline constexpr int64_t kOneSlotPerThreadMaxSlots = kExpandTileSlots * 512;
inline constexpr int kManySlotsPerThread = 8;
inline constexpr int kManySlotsPerThreadAnyPageSize = 4;

// Returns the slots per thread the tiled kernel uses for num_slots slots.
inline constexpr int TileSlotsPerThread(int64_t num_slots,
                                        bool pow2_page_size) {
  return num_slots <= kOneSlotPerThreadMaxSlots ? 1
         : pow2_page_size                       ? kManySlotsPerThread
                          : kManySlotsPerThreadAnyPageSize;
}

// Long extends run the chunk kernel: block (c, r) of a two-dimensional grid
// writes chunk c, kChunkSlots consecutive slots, of packed request r. The
// block reads its request's fields once (the same index for every thread:
// no search, one round of loads), each thread reads the pages of its
// kChunkVectorsPerThread pairs of slots, all before its first store, and
// stores each pair as one aligned 16-byte vector. A thread's chain is then
// two dependent reads (plan, ring) before its stores, against a search
// among the plan's requests and then the ring in the tiled kernel. Two pairs
// a thread, measured on the H200 against four and eight: the bulk case's
// 1024 blocks (all resident at once) took 8.1 us against 9.1 and 9.7 us
// (docs/performance.md).
inline constexpr int kChunkVectorsPerThread = 2;
inline constexpr int64_t kChunkSlots =
    2 * kChunkVectorsPerThread * kExpandThreads;  // 1024
// gridDim.y holds the request; slot indices within a request are 32-bit
// (fewer registers), with room for head + 2 * pairs + 1.
inline constexpr int64_t kChunkMaxRequests = 65535;
inline constexpr int64_t kChunkMaxRequestSlots = int64_t{1} << 30;
// The chunk kernel serves plans of more slots than this: the plans the tiled
// kernel runs at kManySlotsPerThread slots per thread, whose one wave of long
// per-thread chains is latency bound.
inline constexpr int64_t kChunkMinSlots = kOneSlotPerThreadMaxSlots;

// Returns the chunks (gridDim.x) of the chunk kernel: the largest request's.
inline constexpr int64_t ChunksPerRequest(int64_t max_request_slots) {
  return (max_request_slots + kChunkSlots - 1) / kChunkSlots;
}

// Returns whether the chunk kernel expands a packed plan (that the
// per-request kernel does not): one of more than kChunkMinSlots slots whose
// grid of num_requests x ChunksPerRequest blocks is at most twice the
// chunks its slots fill, plus one per request for its partial last chunk. A
// block past its request's end returns at once, but a plan of a few long
// and many short requests would launch mostly such blocks; the tiled kernel
// takes it.
inline constexpr bool UsesChunkKernel(int64_t num_requests, int64_t num_slots,
                                      int64_t max_request_slots) {
  return num_slots > kChunkMinSlots && num_requests <= kChunkMaxRequests &&
         max_request_slots <= kChunkMaxRequestSlots &&
         num_requests * ChunksPerRequest(max_request_slots) <=
             2 * ((num_slots + kChunkSlots - 1) / kChunkSlots) + num_requests;
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
  const int64_t* free_ring;   // [ring_capacity]: the device mirror
  int64_t ring_capacity;      // >= 1
  int64_t page_size;          // >= 1
  int64_t num_requests;       // packed requests, each with >= 1 slot
  int64_t num_slots;          // slot_begin[num_requests]
  int64_t max_request_slots;  // the largest request's slot count
};

// A small plan passed by value in the kernel's parameters (a
// __grid_constant__ struct, read through the constant cache) rather than
// uploaded: no copy before the launch and one dependent global read less in
// the kernel. CUDA 12.1+ allows 32764 bytes of parameters on sm_70 and newer;
// the launcher passes only the first kInlineTierWords[t] words of `words`
// (kernels/alloc_kernels.cu), so a small plan costs a small launch.
//
// Two layouts of `words`, chosen by the packer:
//  - decode (every request writes exactly one slot, kind kInlineDecode):
//      words[r]      the slot itself (last_loc + 1, >= 0) when it continues
//                    the prefix's page, else -(ring position + 1) of its page
//      words[n + r]  the destination of request r (a pointer, as an integer)
//  - general (kind kInlineGeneral):
//      words[r]      first_slot (last_loc + 1)
//      words[n + r]  destination
//      then 32-bit values two to a word (low half first), from word 2n:
//      [0, n]        slot_begin (slot_begin[n] = num_slots)
//      [n+1, 2n]     ring_start
//      [2n+1, 3n]    partial_slots
// 32-bit values need num_slots, ring_capacity and page_size below 2^31,
// which the packer checks. The tiled kernel finds a slot's request by a
// binary search over slot_begin (no tile marks: they would cost parameter
// bytes, and the search's reads hit the constant cache after the first).
inline constexpr int64_t kInlineDecode = 1;
inline constexpr int64_t kInlineGeneral = 2;

struct InlinePlanHeader {
  const int64_t* free_ring;   // [ring_capacity]: the device mirror
  int64_t ring_capacity;      // in [1, 2^31)
  int64_t page_size;          // in [1, 2^31)
  int64_t page_shift;         // log2(page_size), or -1 if not a power of two
  int64_t num_requests;       // packed requests, each with >= 1 slot
  int64_t num_slots;          // in [num_requests, 2^31)
  int64_t max_request_slots;  // the largest request's slot count
  int64_t kind;               // kInlineDecode or kInlineGeneral
  int64_t narrow_base;        // first word of the 32-bit values (general)
  int64_t words_used;         // words of `words` the plan fills
};

template <int kWords>
struct InlineExpandParams {
  InlinePlanHeader header;
  int64_t words[kWords];
};

// Parameter sizes the launcher picks from (words of `words`): 2 KB and 8 KB.
// Parameters are not free: on the H200 (docs/performance.md) an empty
// kernel takes 3.2 us flushed, 4.1 us with 2 KB of parameters, 4.3 us with
// 8 KB and 6.2 us with 32 KB. So the packer passes a plan inline only where
// that measured cheaper than uploading it (InlineWordsLimit), and the
// 32764-byte parameter limit goes unused.
inline constexpr int kInlineTierWords[2] = {244, 1012};
inline constexpr int kMaxInlineWords = kInlineTierWords[1];
using MaxInlineExpandParams = InlineExpandParams<kMaxInlineWords>;
static_assert(sizeof(MaxInlineExpandParams) <= 32764,
              "kernel parameters are limited to 32764 bytes");

// Returns the most words an inline plan of this kind may use: the decode and
// per-request kernels save one global read (~0.3 us) by reading the plan
// from the parameters, which pays for the 2 KB tier only; the tiled kernel
// saves two (tile mark, then request), which pays for 8 KB too.
inline constexpr int64_t InlineWordsLimit(bool decode,
                                          int64_t max_request_slots) {
  return decode || UsesPerRequestKernel(max_request_slots)
             ? kInlineTierWords[0]
             : kInlineTierWords[1];
}

// Returns the words the general / decode inline layout of n requests needs.
inline constexpr int64_t InlineGeneralWords(int64_t n) {
  return 2 * n + (3 * n + 2) / 2;
}
inline constexpr int64_t InlineDecodeWords(int64_t n) { return 2 * n; }

// Reads of a plan, whichever way it reaches the kernel: UploadedPlan from
// the copied struct-of-arrays block, InlinePlan from the kernel parameters.
// The thread bodies below are templates over these two.
class UploadedPlan {
 public:
  PAGEALLOC_HOST_DEVICE explicit UploadedPlan(const ExpandParams& p) : p_(p) {}
  PAGEALLOC_HOST_DEVICE int64_t num_requests() const { return p_.num_requests; }
  PAGEALLOC_HOST_DEVICE int64_t num_slots() const { return p_.num_slots; }
  PAGEALLOC_HOST_DEVICE int64_t slot_begin(int64_t r) const {
    return p_.slot_begin[r];
  }
  PAGEALLOC_HOST_DEVICE int64_t partial_slots(int64_t r) const {
    return p_.partial_slots[r];
  }
  PAGEALLOC_HOST_DEVICE int64_t first_slot(int64_t r) const {
    return p_.first_slot[r];
  }
  PAGEALLOC_HOST_DEVICE int64_t ring_start(int64_t r) const {
    return p_.ring_start[r];
  }
  PAGEALLOC_HOST_DEVICE int64_t* destination(int64_t r) const {
    return p_.destination[r];
  }
  PAGEALLOC_HOST_DEVICE const int64_t* free_ring() const {
    return p_.free_ring;
  }
  PAGEALLOC_HOST_DEVICE int64_t ring_capacity() const {
    return p_.ring_capacity;
  }
  PAGEALLOC_HOST_DEVICE int64_t page_size() const { return p_.page_size; }
  // Sets [*lo, *hi] to the requests that can hold slots of tile `block` of
  // kTileMarks marks (the tiled kernel's search range).
  PAGEALLOC_HOST_DEVICE void TileRequests(int64_t block, int64_t tile_marks,
                                          int64_t* lo, int64_t* hi) const {
    const int64_t last_mark =
        (p_.num_slots + kExpandTileSlots - 1) / kExpandTileSlots;
    const int64_t first_mark = block * tile_marks;
    const int64_t end_mark = first_mark + tile_marks < last_mark
                                 ? first_mark + tile_marks
                                 : last_mark;
    *lo = p_.tile_first_request[first_mark];
    *hi = p_.tile_first_request[end_mark];
  }

 private:
  const ExpandParams& p_;
};

template <int kWords>
class InlinePlan {
 public:
  PAGEALLOC_HOST_DEVICE explicit InlinePlan(const InlineExpandParams<kWords>& p)
      : p_(p) {}
  PAGEALLOC_HOST_DEVICE int64_t num_requests() const {
    return p_.header.num_requests;
  }
  PAGEALLOC_HOST_DEVICE int64_t num_slots() const {
    return p_.header.num_slots;
  }
  PAGEALLOC_HOST_DEVICE int64_t slot_begin(int64_t r) const {
    return Narrow(r);
  }
  PAGEALLOC_HOST_DEVICE int64_t ring_start(int64_t r) const {
    return Narrow(p_.header.num_requests + 1 + r);
  }
  PAGEALLOC_HOST_DEVICE int64_t partial_slots(int64_t r) const {
    return Narrow(2 * p_.header.num_requests + 1 + r);
  }
  PAGEALLOC_HOST_DEVICE int64_t first_slot(int64_t r) const {
    return p_.words[r];
  }
  PAGEALLOC_HOST_DEVICE int64_t* destination(int64_t r) const {
    return reinterpret_cast<int64_t*>(
        static_cast<uintptr_t>(p_.words[p_.header.num_requests + r]));
  }
  PAGEALLOC_HOST_DEVICE const int64_t* free_ring() const {
    return p_.header.free_ring;
  }
  PAGEALLOC_HOST_DEVICE int64_t ring_capacity() const {
    return p_.header.ring_capacity;
  }
  PAGEALLOC_HOST_DEVICE int64_t page_size() const {
    return p_.header.page_size;
  }
  // Every request: the search starts from the whole (small) plan.
  PAGEALLOC_HOST_DEVICE void TileRequests(int64_t, int64_t, int64_t* lo,
                                          int64_t* hi) const {
    *lo = 0;
    *hi = p_.header.num_requests - 1;
  }

 private:
  // The i-th 32-bit value (all are in [0, 2^31)).
  PAGEALLOC_HOST_DEVICE int64_t Narrow(int64_t i) const {
    const uint64_t word =
        static_cast<uint64_t>(p_.words[p_.header.narrow_base + (i >> 1)]);
    return static_cast<int64_t>((word >> ((i & 1) * 32)) & 0xffffffffu);
  }

  const InlineExpandParams<kWords>& p_;
};

// --- Plans whose last_loc stays on the device (client/local_expansion.h) ---
//
// The client library expands a session's batch on the caller's stream from
// the caller's host lengths and its device last_loc, which the host never
// reads. Such a plan is packed as any uploaded one, except that first_slot[r]
// holds the request's index in the caller's batch plus one (the planner puts
// the index where last_loc goes); LastLocPlan reads the request's last_loc
// from the caller's array through it and checks it there.

// The caller's last_loc array and what a refused value is reported to.
struct DeviceLastLoc {
  const int64_t* last_loc;  // [batch requests], in device memory
  int64_t slot_limit;       // (num_pages + 1) * page_size: the slab's end
  // [2], host-mapped, zero until a request is refused: then the first
  // refused request's batch index plus one, and its last_loc.
  unsigned long long* error;  // NOLINT(runtime/int): atomicCAS's type
};

// Records request `index`'s refused last_loc `value` in `error`, unless a
// refusal is recorded already (the first one stays).
PAGEALLOC_HOST_DEVICE void ReportBadLastLoc(unsigned long long* error,
                                            int64_t index, int64_t value) {
  const auto word = static_cast<unsigned long long>(index + 1);
#if defined(__CUDA_ARCH__)
  if (atomicCAS(error, 0ull, word) == 0ull) {
    error[1] = static_cast<unsigned long long>(value);
  }
#else
  if (error[0] == 0) {
    error[0] = word;
    error[1] = static_cast<unsigned long long>(value);
  }
#endif
}

// An uploaded plan whose first_slot(r) is last_loc[index] + 1 from the
// caller's device array. A request that continues its prefix's page
// (partial_slots(r) > 0) needs a last_loc in a page of the slab other than
// page 0 whose page has room for those slots: loc >= page_size, loc <
// slot_limit, loc % page_size + partial_slots(r) < page_size. Any other
// value is recorded (ReportBadLastLoc) and the request's prefix-page slots
// go to page 0, the padding page that is never handed out, so that no slot
// of the batch points outside the slab or past the page the caller named.
// Whether that page is the session's is the caller's to know (one slab is
// one trust domain: docs/design.md, "Slots expanded on the caller's
// stream").
class LastLocPlan : public UploadedPlan {
 public:
  PAGEALLOC_HOST_DEVICE LastLocPlan(const ExpandParams& p,
                                    const DeviceLastLoc& d)
      : UploadedPlan(p), d_(d) {}
  PAGEALLOC_HOST_DEVICE int64_t first_slot(int64_t r) const {
    const int64_t partial = partial_slots(r);
    if (partial == 0) return 0;  // not used
    const int64_t index = UploadedPlan::first_slot(r) - 1;
    const int64_t loc = d_.last_loc[index];
    const int64_t ps = page_size();
    if (loc >= ps && loc < d_.slot_limit && loc % ps + partial < ps) {
      return loc + 1;
    }
    ReportBadLastLoc(d_.error, index, loc);
    return 0;
  }

 private:
  const DeviceLastLoc& d_;
};

// How an uploaded kernel reads its plan: as packed (UploadedSource), or with
// first_slot from the caller's last_loc (DeviceLastLoc).
struct UploadedSource {
  PAGEALLOC_HOST_DEVICE UploadedPlan MakePlan(const ExpandParams& p) const {
    return UploadedPlan(p);
  }
};
struct LastLocSource {
  DeviceLastLoc last_loc;
  PAGEALLOC_HOST_DEVICE LastLocPlan MakePlan(const ExpandParams& p) const {
    return LastLocPlan(p, last_loc);
  }
};

// --- A local decode passed whole in the kernel's parameters ---
//
// The client library's alloc_decode on the caller's stream
// (client/local_expansion.h) for a batch of up to kMaxLocalDecodeRequests:
// every request writes one slot, out[r]: the first slot of the new page the
// host took for it, or, when it continues its prefix's page, the slot after
// its last_loc, read and checked on the device as LastLocPlan does (a
// refused value is reported and the slot is 0, in the padding page). The
// page ids travel in the parameters, two 32-bit ids a word (low half
// first), 0 for a request that continues its page: page 0 is never handed
// out. Nothing is uploaded: one launch, with no copy before it and no
// staging buffer to wait for.
struct LocalDecodeHeader {
  DeviceLastLoc last_loc;
  int64_t* out;          // [num_requests], device memory
  int64_t page_size;     // >= 1
  int64_t num_requests;  // in [1, kMaxLocalDecodeRequests]
};

template <int kWords>
struct LocalDecodeParams {
  LocalDecodeHeader header;
  int64_t words[kWords];
};

// Parameter sizes the launcher picks from: 2 KB (500 requests) and 8 KB,
// the sizes that measured cheaper than an upload for the daemon's inline
// plans (above).
inline constexpr int kLocalDecodeTierWords[2] = {250, 1018};
inline constexpr int64_t kMaxLocalDecodeRequests =
    2 * int64_t{kLocalDecodeTierWords[1]};
using MaxLocalDecodeParams = LocalDecodeParams<kLocalDecodeTierWords[1]>;
static_assert(sizeof(LocalDecodeParams<kLocalDecodeTierWords[0]>) == 2048,
              "the small tier is 2 KB");
static_assert(sizeof(MaxLocalDecodeParams) == 8192, "the large tier is 8 KB");

// Returns the words a local decode of n requests fills.
inline constexpr int64_t LocalDecodeWords(int64_t n) { return (n + 1) / 2; }

// Returns request r's new page in `words` (0: it continues its page).
PAGEALLOC_HOST_DEVICE int64_t LocalDecodePage(const int64_t* words, int64_t r) {
  const auto word = static_cast<uint64_t>(words[r >> 1]);
  return static_cast<int64_t>((word >> ((r & 1) * 32)) & 0xffffffffu);
}

// One thread of the local decode kernel (grid: ceil(num_requests /
// kExpandThreads) blocks of kExpandThreads): writes request r's slot.
template <int kWords>
PAGEALLOC_HOST_DEVICE void ExpandLocalDecodeThread(
    const LocalDecodeParams<kWords>& p, int64_t r) {
  const LocalDecodeHeader& h = p.header;
  if (r >= h.num_requests) return;
  const int64_t page = LocalDecodePage(p.words, r);
  const int64_t ps = h.page_size;
  if (page != 0) {
    h.out[r] = page * ps;
    return;
  }
  const int64_t loc = h.last_loc.last_loc[r];
  if (loc >= ps && loc < h.last_loc.slot_limit && loc % ps + 1 < ps) {
    h.out[r] = loc + 1;
    return;
  }
  ReportBadLastLoc(h.last_loc.error, r, loc);
  h.out[r] = 0;
}

// Returns the last request r in [lo, hi] with slot_begin(r) <= slot: the
// request that writes batch slot `slot`.
// REQUIRES: slot_begin(lo) <= slot < num_slots, lo <= hi < num_requests.
template <class Plan>
PAGEALLOC_HOST_DEVICE int64_t FindRequest(const Plan& plan, int64_t lo,
                                          int64_t hi, int64_t slot) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (plan.slot_begin(mid) <= slot) {
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
                                      int64_t ring_capacity, int64_t page_size,
                                      int page_shift, int64_t* ring_position,
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

// One thread of the per-request kernel: writes every slot of packed request
// r (grid: ceil(num_requests / kExpandThreads) blocks of kExpandThreads;
// r = block * kExpandThreads + thread). Threads past the last request return.
// Used when max_request_slots <= kPerRequestMaxSlots, so a thread writes at
// most that many slots.
//
// The ids of the request's first two new pages (all of them for page sizes
// >= 8) are read before any store: a load after a store to a pointer the
// compiler cannot tell apart from the ring would otherwise wait for it, one
// ring read per slot instead of one trip per request.
template <bool kPow2PageSize, class Plan>
PAGEALLOC_HOST_DEVICE void ExpandRequestThread(const Plan& plan, int page_shift,
                                               int64_t r) {
  if (r >= plan.num_requests()) return;
  const int64_t begin = plan.slot_begin(r);
  const int64_t num_slots = plan.slot_begin(r + 1) - begin;
  const int64_t partial_slots = plan.partial_slots(r);
  const int64_t first_slot = plan.first_slot(r);
  const int64_t ring_start = plan.ring_start(r);
  int64_t* const out = plan.destination(r);
  const int64_t* const ring = plan.free_ring();
  const int64_t capacity = plan.ring_capacity();
  const int64_t page_size = plan.page_size();
  const int64_t new_slots = num_slots - partial_slots;
  int64_t page0 = 0;
  int64_t page1 = 0;
  if (new_slots > 0) page0 = ring[ring_start];
  if (new_slots > page_size) {
    page1 = ring[ring_start + 1 < capacity ? ring_start + 1
                                           : ring_start + 1 - capacity];
  }
  for (int64_t u = 0; u < num_slots; ++u) {
    int64_t position;
    int64_t value;
    LocateSlot<kPow2PageSize>(u, partial_slots, first_slot, ring_start,
                              capacity, page_size, page_shift, &position,
                              &value);
    if (position >= 0) {
      const int64_t page = kPow2PageSize ? (u - partial_slots) >> page_shift
                                         : (u - partial_slots) / page_size;
      const int64_t id = page == 0 ? page0 : page == 1 ? page1 : ring[position];
      value += id * page_size;
    }
    out[u] = value;
  }
}

// One thread of the inline decode kernel: every request writes exactly one
// slot, so thread r reads its two words from the parameters, the ring only
// when its slot starts a page, and stores (grid as the per-request kernel).
template <int kWords>
PAGEALLOC_HOST_DEVICE void ExpandDecodeThread(
    const InlineExpandParams<kWords>& p, int64_t r) {
  const int64_t n = p.header.num_requests;
  if (r >= n) return;
  const int64_t source = p.words[r];
  int64_t* const out =
      reinterpret_cast<int64_t*>(static_cast<uintptr_t>(p.words[n + r]));
  *out = source >= 0 ? source
                     : p.header.free_ring[-source - 1] * p.header.page_size;
}

// One thread of the tiled kernel (grid: ceil(num_slots / (kExpandTileSlots *
// kSlotsPerThread)) blocks of kExpandThreads). Block b covers batch slots
// [b * kExpandTileSlots * kSlotsPerThread, ...) in kSlotsPerThread rows of
// kExpandThreads; thread t takes slot row * kExpandThreads + t of each row,
// so a warp's stores to one request are contiguous. A thread searches for
// its request only among the block's (Plan::TileRequests: between two tile
// marks, or the whole small inline plan), from its previous request on, and
// not at all while its slots stay inside the request it has.
//
// Two phases: first every slot's source is located and its page read from
// the ring, then the values are stored, so a thread's ring reads are in
// flight together rather than one store apart. Between the phases a slot
// keeps its page id (or value), and its offset and request index in 32
// bits each, not a 64-bit target pointer: phase 2 reads the destination
// once per request it meets (a cache hit: phase 1 read the same request's
// fields), so that 8 slots per thread fit in 64 registers.
template <bool kPow2PageSize, int kSlotsPerThread, class Plan>
PAGEALLOC_HOST_DEVICE void ExpandTileThread(const Plan& plan, int page_shift,
                                            int64_t block, int thread) {
  constexpr int64_t kTileSlots = kExpandTileSlots * kSlotsPerThread;
  const int64_t num_slots = plan.num_slots();
  const int64_t tile_begin = block * kTileSlots;
  const int64_t tile_end =
      tile_begin + kTileSlots < num_slots ? tile_begin + kTileSlots : num_slots;
  int64_t lo;
  int64_t hi;
  plan.TileRequests(block, kSlotsPerThread, &lo, &hi);
  const int64_t* const ring = plan.free_ring();
  const int64_t capacity = plan.ring_capacity();
  const int64_t page_size = plan.page_size();

  int64_t r = -1;
  int64_t begin = 0;
  int64_t end = 0;  // slot_begin(r + 1): no search while slot < end
  int64_t partial_slots = 0;
  int64_t first_slot = 0;
  int64_t ring_start = 0;
  int64_t word[kSlotsPerThread];     // page id, or the value itself
  int32_t offset[kSlotsPerThread];   // offset in the page; -1: word is it
  int32_t request[kSlotsPerThread];  // -1: no slot
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < kSlotsPerThread; ++k) {
    const int64_t slot = tile_begin + k * kExpandThreads + thread;
    word[k] = 0;
    offset[k] = -1;
    request[k] = -1;
    if (slot < tile_end) {
      if (slot >= end) {
        r = FindRequest(plan, lo, hi, slot);
        begin = plan.slot_begin(r);
        end = plan.slot_begin(r + 1);
        partial_slots = plan.partial_slots(r);
        first_slot = plan.first_slot(r);
        ring_start = plan.ring_start(r);
        lo = r;
      }
      int64_t position;
      int64_t value;
      LocateSlot<kPow2PageSize>(slot - begin, partial_slots, first_slot,
                                ring_start, capacity, page_size, page_shift,
                                &position, &value);
      if (position >= 0) {
        word[k] = ring[position];
        offset[k] = static_cast<int32_t>(value);  // < page_size < 2^31
      } else {
        word[k] = value;
      }
      request[k] = static_cast<int32_t>(r);  // packing: < 2^31 requests
    }
  }
  int64_t current = -1;
  int64_t* out = nullptr;
  int64_t out_begin = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < kSlotsPerThread; ++k) {
    if (request[k] < 0) continue;
    if (request[k] != current) {
      current = request[k];
      out = plan.destination(current);
      out_begin = plan.slot_begin(current);
    }
    out[tile_begin + k * kExpandThreads + thread - out_begin] =
        offset[k] >= 0 ? word[k] * page_size + offset[k] : word[k];
  }
}

// Stores v0 and v1 to p[0] and p[1] with one 16-byte vector store.
// REQUIRES: p is 16-byte aligned. The host's emulation of the kernels
// (kernels/plan_packing_test.cc) stops the program when it is not, so the
// tests check the alignment the device relies on.
PAGEALLOC_HOST_DEVICE void StorePair(int64_t* p, int64_t v0, int64_t v1) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<longlong2*>(p) = make_longlong2(v0, v1);
#else
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) __builtin_trap();
  p[0] = v0;
  p[1] = v1;
#endif
}

// One thread of the chunk kernel (grid: ChunksPerRequest(max_request_slots)
// x num_requests blocks of kExpandThreads; UsesChunkKernel says when):
// block (chunk, r) writes request r's slots in chunk `chunk` of its
// kChunkSlots-slot chunks, or returns at once when the request ends before.
//
// Its stores are 16-byte vectors at 16-byte aligned addresses: the slots
// are taken in pairs from `head`, 1 when the destination is 8 mod 16 (its
// slot 0 is then stored alone, by thread 0 of chunk 0), else 0; pair j is
// slots head + 2j and head + 2j + 1, or only the first at the request's end.
// Chunk c holds kChunkVectorsPerThread rows of kExpandThreads pairs from pair
// c * kChunkVectorsPerThread * kExpandThreads; thread t takes pair t of each
// row, so a warp's store covers 512 consecutive bytes. A request of n slots
// has at most ceil(n / 2) pairs, so ChunksPerRequest(n) chunks hold them.
//
// Two phases. First each pair's two ring positions are computed (the page
// of its first slot; the page of its second, which is the next one when the
// first ends its page, and the request's first new page when the first is
// the prefix's last) and both are read, unconditionally and with no use in
// between, so all of a thread's ring reads are in flight together. A
// position no slot needs is ring_start, which is always inside the ring.
// Then the values are formed and stored.
template <bool kPow2PageSize, class Plan>
PAGEALLOC_HOST_DEVICE void ExpandChunkThread(const Plan& plan, int page_shift,
                                             int64_t chunk, int64_t r,
                                             int thread) {
  constexpr int32_t kChunkPairs = kChunkVectorsPerThread * kExpandThreads;
  const int64_t begin = plan.slot_begin(r);
  // In [1, kChunkMaxRequestSlots]: 32-bit slot math below.
  const int32_t num_slots =
      static_cast<int32_t>(plan.slot_begin(r + 1) - begin);
  int64_t* const out = plan.destination(r);
  const int32_t head =
      static_cast<int32_t>((reinterpret_cast<uintptr_t>(out) >> 3) & 1);
  const int32_t pairs = (num_slots - head + 1) >> 1;  // >= 0
  // chunk < ChunksPerRequest(max_request_slots): pairs fit in 32 bits.
  const int32_t first_pair = static_cast<int32_t>(chunk) * kChunkPairs;
  // Read with the fields above, before the return below: one round of
  // plan reads, not two.
  // partial_slots <= num_slots: 32 bits too.
  const int32_t partial_slots = static_cast<int32_t>(plan.partial_slots(r));
  const int64_t first_slot = plan.first_slot(r);
  const int64_t ring_start = plan.ring_start(r);  // in [0, capacity)
  const bool stores_head = head != 0 && chunk == 0 && thread == 0;
  if (first_pair >= pairs && !stores_head) return;
  const int64_t* const ring = plan.free_ring();
  const int64_t capacity = plan.ring_capacity();
  const int64_t page_size = plan.page_size();

  int64_t id0[kChunkVectorsPerThread];     // page id of the pair's first slot
  int64_t id1[kChunkVectorsPerThread];     // and of its second
  int32_t offset[kChunkVectorsPerThread];  // first slot's; -1: prefix page
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < kChunkVectorsPerThread; ++k) {
    const int32_t j = first_pair + k * kExpandThreads + thread;
    const int32_t w = head + 2 * j - partial_slots;  // first slot, new pages
    int64_t position0 = ring_start;
    int64_t position1 = ring_start;
    offset[k] = -1;
    if (j < pairs && w >= 0) {
      // The slot is below num_slots, so its page below the request's new
      // pages, which packing keeps within the capacity: one wrap suffices.
      int32_t page;
      int32_t in_page;
      if (kPow2PageSize) {
        // 64-bit shift: page_shift may be 32 or more (uploaded plans).
        page = static_cast<int32_t>(int64_t{w} >> page_shift);
        in_page = static_cast<int32_t>(w & (page_size - 1));
      } else {
        // page_size may be >= 2^31 (uploaded plans): divide in 64 bits.
        page = static_cast<int32_t>(w / page_size);
        in_page = static_cast<int32_t>(w - page * page_size);
      }
      position0 = ring_start + page;
      if (position0 >= capacity) position0 -= capacity;
      // Past the request's last page when the pair is its last slot alone:
      // then read (inside the ring) and not used.
      position1 = in_page + 1 < page_size    ? position0
                  : position0 + 1 < capacity ? position0 + 1
                                             : 0;
      offset[k] = in_page;
    }
    id0[k] = ring[position0];
    id1[k] = ring[position1];
  }
  int64_t head_id = 0;  // slot 0 is the prefix's next or new page 0's first
  if (stores_head) head_id = ring[ring_start];

  if (stores_head) {
    out[0] = partial_slots > 0 ? first_slot : head_id * page_size;
  }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < kChunkVectorsPerThread; ++k) {
    const int32_t j = first_pair + k * kExpandThreads + thread;
    if (j >= pairs) continue;
    const int32_t u = head + 2 * j;  // < num_slots
    int64_t v0;
    int64_t v1;
    if (offset[k] < 0) {  // u continues the prefix's page
      v0 = first_slot + u;
      v1 = u + 1 < partial_slots ? v0 + 1 : id1[k] * page_size;
    } else {
      v0 = id0[k] * page_size + offset[k];
      v1 = offset[k] + 1 < page_size ? v0 + 1 : id1[k] * page_size;
    }
    if (u + 1 < num_slots) {
      StorePair(out + u, v0, v1);  // out + head is 16-byte aligned
    } else {
      out[u] = v0;
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
