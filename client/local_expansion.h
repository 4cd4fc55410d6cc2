// LocalExpander: alloc_extend and alloc_decode in the scheduler's own
// process. It plans a batch on the host from the caller's host lengths
// exactly as the daemon's pool does (allocator/plan_builder.h), takes the
// batch's new pages from the session's PageReserve (no round trip while the
// reserve holds them), and writes the slots where the caller reads them:
//   - kDevice (CUDA): on the caller's stream, reading each request's
//     last_loc on the device where the caller has it. One async copy of the
//     pages and the packed plan from pinned staging, one launch of the
//     project's expand kernel (kernels/alloc_kernels.h,
//     LaunchExpandPlanLastLoc); no host sync, no device-to-host copy, no
//     launch in the daemon's context. A decode of up to
//     inline_decode_requests requests is one launch alone: its new pages
//     travel in the kernel's parameters (LaunchExpandLocalDecode), with no
//     plan built, no copy and no staging buffer.
//   - kHost: the same plan expanded on the host (allocator/plan_expansion.h)
//     from a host last_loc into a host array.
//
//   ASSIGN_OR_RETURN(auto expander,
//                    LocalExpander::Create(*client, reserve.get(), {}));
//   ASSIGN_OR_RETURN(int64_t slots, expander->AllocDecode(
//                        seq_lens_cpu, last_loc, out, stream));
//
// Slots. A batch's slots are those the daemon's plan and expansion give the
// same requests on a free list whose front is the pages the reserve's Take
// hands out, in that order: request k takes the next NewPagesNeeded pages,
// its slots first continue its prefix's page from last_loc + 1, then fill
// its new pages from their first slot. With one session whose reserve hands
// out the pages in the daemon's free-list order (docs/design.md, "Slots
// expanded on the caller's stream"), the slots equal the thin path's. Both
// semantics give the same slots; they differ in the free list's order only.
//
// Checks (docs/design.md, "Slots expanded on the caller's stream"). On the
// host, before anything is taken: every request's lengths as the daemon
// checks them (ValidateShape), and a sequence longer than the pool. kHost
// also checks each last_loc as the daemon does, and that a prefix ending
// inside a page ends in a page this reserve handed out. kDevice cannot
// read last_loc without a sync: the kernel checks that it lies in the slab,
// above page 0, with room in its page for the request's slots, and else
// writes the request's prefix-page slots into page 0 (the padding page) and
// records the request (TakeDeviceError).
//
// A refused call takes nothing from the reserve and writes nothing.
//
// This class is thread-compatible: one scheduler thread drives it.

#ifndef PAGEALLOC_CLIENT_LOCAL_EXPANSION_H_
#define PAGEALLOC_CLIENT_LOCAL_EXPANSION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "allocator/plan_builder.h"
#include "allocator/requests.h"
#include "client/client.h"
#include "client/page_reserve.h"

namespace pagealloc {

// Where a LocalExpander reads last_loc and writes slots.
enum class ExpansionMemory : uint8_t {
  kHost,    // host arrays; the expansion runs on the calling thread
  kDevice,  // CUDA device memory; the expansion runs on the caller's stream
};

struct LocalExpanderOptions {
  ExpansionMemory memory = ExpansionMemory::kHost;
  // kDevice: staging buffers, each with its event (256 KB each to begin
  // with, doubled for a batch that needs more). A call takes one whose
  // copy has run. When every one is still queued behind the stream's work
  // (a caller that queues its GPU work before each call and synchronizes
  // seldom) it adds one, up to max_staging_buffers, and only then waits on
  // the host for the oldest (>= 2; <= max_staging_buffers).
  int staging_buffers = 4;
  int max_staging_buffers = 32;
  // kDevice: decode batches of up to this many requests pass their new
  // pages in the kernel's parameters; larger ones are uploaded. 0: every
  // batch is uploaded. In [0, 2036] (kernels/expand_plan.h,
  // kMaxLocalDecodeRequests).
  int64_t inline_decode_requests = 2036;
};

// A snapshot of an expander's counts.
struct LocalExpanderStats {
  int64_t calls = 0;          // calls that wrote their slots
  int64_t refused = 0;        // calls refused (nothing taken)
  int64_t pages_taken = 0;    // pages taken from the reserve
  int64_t slots = 0;          // slots written
  int64_t staging_waits = 0;  // kDevice: calls that waited for a buffer
  int64_t staging_grows = 0;  // kDevice: buffers reallocated for a larger batch
  int64_t staging_adds = 0;   // kDevice: buffers added, every one being busy
  int64_t inline_decodes = 0;  // kDevice: decodes launched with no upload
};

class LocalExpander {
 public:
  // Makes an expander over `reserve`, a reserve of `client`'s session (its
  // pool's page size and pages). INVALID_ARGUMENT for options out of range;
  // FAILED_PRECONDITION for kDevice in a library built without CUDA; the
  // CUDA error when its staging cannot be had. `client` and `reserve` must
  // outlive it.
  static absl::StatusOr<std::unique_ptr<LocalExpander>> Create(
      const Client& client, PageReserve* reserve,
      const LocalExpanderOptions& options = {});

  // Waits for the copies of its staging buffers (their events) and frees
  // them.
  ~LocalExpander();

  LocalExpander(const LocalExpander&) = delete;
  LocalExpander& operator=(const LocalExpander&) = delete;

  // Extends request i from prefix_lens[i] to seq_lens[i] tokens: writes
  // sum(seq_lens[i] - prefix_lens[i]) slots to `out`, request after request
  // (SGLang's alloc_extend), taking the new pages from the reserve, and
  // returns their number. `last_loc[i]` is the slot of request i's last
  // prefix token (-1 for an empty prefix). `last_loc` and `out` are on the
  // expander's side (options.memory); `stream` is a cudaStream_t for
  // kDevice (null: the legacy default stream), ignored for kHost; the host
  // lengths are read before this returns. Returns INVALID_ARGUMENT naming
  // the request and the values ("seq_lens[3] (12) < prefix_lens[3] (40)"),
  // RESOURCE_EXHAUSTED when a request can never fit or the reserve cannot
  // supply the pages, INTERNAL when CUDA refuses the copy or the launch
  // (the pages go back to the reserve); nothing is taken then.
  absl::StatusOr<int64_t> AllocExtend(absl::Span<const int64_t> prefix_lens,
                                      absl::Span<const int64_t> seq_lens,
                                      const int64_t* last_loc, int64_t* out,
                                      void* stream);

  // One new token for request i, whose sequence reaches seq_lens[i] tokens
  // with it (SGLang's alloc_decode): writes seq_lens.size() slots to `out`.
  // As AllocExtend with prefix_lens[i] = seq_lens[i] - 1.
  absl::StatusOr<int64_t> AllocDecode(absl::Span<const int64_t> seq_lens,
                                      const int64_t* last_loc, int64_t* out,
                                      void* stream);

  // kDevice: the first last_loc the kernel refused since the last call of
  // this, as INVALID_ARGUMENT naming the request's index in its batch and
  // the value; OK when none (always OK for kHost). Reads a host-mapped word
  // the kernel writes: it covers the calls whose streams the caller has
  // synchronized. Clears the record.
  absl::Status TakeDeviceError();

  // The pages the last call that wrote its slots took from the reserve, in
  // the order its plan uses them (request after request); empty when the
  // last call was refused. A caller whose slots went to the device keeps
  // its host record of the session's pages from these. Valid until the
  // next call.
  absl::Span<const int64_t> last_pages() const {
    return absl::MakeConstSpan(pages_.data(), last_num_pages_);
  }

  LocalExpanderStats stats() const { return stats_; }
  ExpansionMemory memory() const { return options_.memory; }

 private:
  struct Staging;       // a pinned host buffer, its device twin and its event
  struct InlineDecode;  // the parameters of an inline decode's launch

  LocalExpander(PageReserve* reserve, const PoolGeometry& geometry,
                const LocalExpanderOptions& options);
  absl::Status InitDevice();
  // Validates the batch, sizes its pages and takes them; then expands.
  absl::StatusOr<int64_t> Expand(RequestKind kind,
                                 absl::Span<const int64_t> prefix_lens,
                                 absl::Span<const int64_t> seq_lens,
                                 const int64_t* last_loc, int64_t* out,
                                 void* stream);
  // Plans the batch over the taken pages_ into storage_.plan, its slots to
  // `out` (request i's last_loc, or on the device its index, in the plan).
  void BuildPlan(int64_t* out);
  // kDevice: uploads pages_ and the plan on `stream` and launches the
  // kernel that reads `last_loc` there.
  absl::Status LaunchOnStream(const int64_t* last_loc, void* stream);
  // kDevice: launches the decode of shapes_ over the first `num_pages` of
  // pages_ on `stream` with
  // its pages in the kernel's parameters; false, launching nothing, when
  // the batch does not fit there (the caller uploads it).
  absl::StatusOr<bool> LaunchDecodeInline(const int64_t* last_loc, int64_t* out,
                                          int64_t num_pages, void* stream);
  // kDevice: a staging buffer whose copy has run, with room for `bytes`.
  absl::StatusOr<Staging*> FreeStaging(int64_t bytes);
  // kDevice: replaces `staging`'s buffers (unused: its event has completed)
  // with ones of `bytes`.
  absl::Status ResizeStaging(int64_t bytes, Staging* staging);
  // kDevice: a new staging buffer of `bytes`, its event never recorded,
  // inserted into the ring at index `at`.
  absl::StatusOr<Staging*> AddStaging(size_t at, int64_t bytes);

  PageReserve* const reserve_;
  const PoolGeometry geometry_;
  const LocalExpanderOptions options_;

  // The batch being planned, kept between calls for their storage.
  std::vector<ExtendShape> shapes_;
  std::vector<int64_t> new_pages_;
  std::vector<int64_t> prefix_pages_;  // kHost: pages last_loc must lie in
  std::vector<int64_t> prefix_requests_;
  std::vector<int64_t> pages_;
  size_t last_num_pages_ = 0;  // of pages_, for last_pages()
  PlanStorage storage_;
  LocalExpanderStats stats_;

  // kDevice.
  std::vector<std::unique_ptr<Staging>> staging_;
  size_t next_staging_ = 0;
  std::unique_ptr<InlineDecode> inline_decode_;
  // Two host-mapped words the kernel writes (DeviceLastLoc::error).
  unsigned long long* error_ = nullptr;         // NOLINT(runtime/int)
  unsigned long long* device_error_ = nullptr;  // NOLINT(runtime/int)
};

}  // namespace pagealloc

#endif  // PAGEALLOC_CLIENT_LOCAL_EXPANSION_H_
