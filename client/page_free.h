// FreeWholePages: the step's free in the scheduler's process. A finished
// request's slots that name whole pages of the session's PageReserve go
// back into it in one call:
//   - the slots are read where the caller has them: a host array, or CUDA
//     memory copied to the host on the caller's stream (kDevice);
//   - they must be whole pages: page_size slots a page, each page's in
//     order from its first slot (SGLang's page-aligned free);
//   - the pages go on the reserve's top, the first page named the next one
//     a Take hands out (SGLang's paged free puts freed pages before its
//     free list), with PageReserve::Put's checks: every page handed out by
//     this reserve and named once.
//
//   ASSIGN_OR_RETURN(int64_t freed, FreeWholePages(
//       *reserve, {ExpansionMemory::kDevice, stream}, slots, n, staging,
//       absl::MakeSpan(pages)));
//
// Why one call: a scheduler's free in Python was a device-to-host copy, a
// whole-page check of a dozen NumPy operations and a put, each an
// interpreter round of its own, run cold after the step's wait on the GPU;
// here it is one crossing into the library (docs/performance.md, "A
// scheduler's decode loop").
//
// The release fence (docs/design.md, "The release fence"). A kDevice free
// synchronizes the caller's stream before it reads the slots, so the work
// queued there before the free is done when the pages are put: they are
// put untagged. A kHost free with `fence` set is put on `stream`
// (PageReserve::Put(pages, stream)): a return of its pages to the daemon
// waits for the work queued there before.
//
// Thread-safe as the reserve is; `staging` and `pages` are the caller's.

#ifndef PAGEALLOC_CLIENT_PAGE_FREE_H_
#define PAGEALLOC_CLIENT_PAGE_FREE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/local_expansion.h"
#include "client/page_reserve.h"

namespace pagealloc {

// Where the slots of a free are, and the stream it is ordered on.
struct FreeSource {
  ExpansionMemory memory = ExpansionMemory::kHost;
  // A cudaStream_t (null: the legacy default stream): kDevice copies the
  // slots on it; kHost fences the put on it when `fence` is set.
  void* stream = nullptr;
  bool fence = false;
};

// Frees `slots[0..n)` (in `source.memory`) into `reserve`, as above.
// Writes the pages' ids in the order named to pages[0..n / page_size) and
// returns their number. kDevice copies the slots to `staging[0..n)` before
// it checks anything (host memory, pinned for an asynchronous copy), where
// they stay for the caller. INVALID_ARGUMENT, and nothing is put, when the
// slots are not
// whole pages, `pages` is too short, or the reserve refuses a page (its
// message names the page); the caller then decides what the free means
// (a free of pages not all the reserve's goes through the daemon).
// FAILED_PRECONDITION for kDevice in a library built without CUDA.
absl::StatusOr<int64_t> FreeWholePages(PageReserve& reserve,
                                       const FreeSource& source,
                                       const int64_t* slots, int64_t n,
                                       int64_t* staging,
                                       absl::Span<int64_t> pages);

// The first half of a free that does not wait for the GPU (the token
// allocator's free of CUDA slots: python/pagealloc/_unread_frees.py).
// Queues on `stream` (a cudaStream_t; null: the legacy default stream) the
// copy of `bytes` bytes of CUDA memory at `device` to `host`, and returns
// without waiting: `host` holds them once the stream has run the copy,
// which the caller learns from an event it records on the stream after
// this call. `host` should be pinned (CUDA finishes a copy to pageable
// memory before it returns). One CUDA call: a tensor library's copy of
// the same bytes builds and dispatches an operation first, which costs a
// scheduler's free more than the copy. INVALID_ARGUMENT for a null pointer
// with bytes > 0; FAILED_PRECONDITION in a library built without CUDA.
absl::Status QueueCopyToHost(const void* device, size_t bytes, void* host,
                             void* stream);

}  // namespace pagealloc

#endif  // PAGEALLOC_CLIENT_PAGE_FREE_H_
