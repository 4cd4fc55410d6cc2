// kv_writer: one scheduler-like process for the KV slab's multi-process
// tests. It registers, allocates --pages pages over --calls allocation
// calls (answered as soon as their launch is queued: async completion),
// writes KvPattern(its session, slot, buffer) into every slot of them in
// every KV buffer through its own mapping of the slab, then prints
//   SESSION <id>
//   PAGES <p> <p> ...
//   READY
// and holds its session (and pages) until it is killed or --hold_ms runs
// out. Exits 1 on any error, naming it on stderr.
//
// On a GPU daemon's slab it writes as a scheduler's attention kernel does:
// after each call, Client::OrderAfter and then a kernel on the writer's own
// stream that reads the call's slots straight from the mapped ring
// (tests/gpu/kv_pattern_kernel.h), with no host synchronisation between
// the allocation and the write; the ring is poisoned first, so a kernel
// that ran before the daemon's launch wrote its slots reads slot -1 and is
// counted. The host waits once, after the last call, to report the pages.
// On a CPU daemon's slab it writes with memcpy.
//
// --expect_zero: every slot must read zero before this writer writes it
// (the pages are new to this session: under --kv_scrub, zeroed in the
// allocation's launch). The writer fails, naming the count, when one does
// not.

#include <algorithm>
#include <cstdio>
#include <set>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/status_macros.h"
#include "tests/kv_pattern.h"

#ifdef PAGEALLOC_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "common/cuda_status.h"
#include "tests/gpu/kv_pattern_kernel.h"
#endif

ABSL_FLAG(std::string, target, "", "Daemon address.");
ABSL_FLAG(std::string, register_secret, "", "The pool's Register secret.");
ABSL_FLAG(int64_t, pages, 8, "Pages to allocate and fill.");
ABSL_FLAG(int64_t, calls, 4,
          "Allocation calls the pages are spread over (at most --pages).");
ABSL_FLAG(bool, expect_zero, false,
          "Fail unless every slot reads zero before it is written.");
ABSL_FLAG(int64_t, hold_ms, 60000, "How long to hold the pages.");

namespace pagealloc {
namespace {

int Fail(const absl::Status& status, const char* what) {
  std::fprintf(stderr, "kv_writer: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

// Writes this session's pattern into `slots` (host memory) of every buffer
// of a host-mapped slab; with `expect_zero`, first adds the bytes that are
// not zero to *nonzero_bytes.
absl::Status WriteOnHost(const KvSlabView& slab, uint64_t session,
                         const int64_t* slots, int64_t count, bool expect_zero,
                         int64_t* nonzero_bytes) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t slot = slots[i];
    if (slot < slab.geometry().page_size ||
        slot >= slab.buffers()[0].num_slots) {
      return absl::InternalError(
          absl::StrFormat("the daemon handed out slot %d", slot));
    }
    for (size_t b = 0; b < slab.buffers().size(); ++b) {
      const KvBuffer& buffer = slab.buffers()[b];
      if (expect_zero) {
        std::vector<uint8_t> held(buffer.stride_bytes);
        if (absl::Status read = slab.CopyFromSlab(
                held.data(), buffer.slot(slot), buffer.stride_bytes);
            !read.ok()) {
          return read;
        }
        for (uint8_t byte : held) *nonzero_bytes += byte != 0;
      }
      const std::vector<uint8_t> pattern = testing::KvPattern(
          session, slot, static_cast<int>(b), buffer.stride_bytes);
      if (absl::Status copied = slab.CopyToSlab(
              buffer.slot(slot), pattern.data(), buffer.stride_bytes);
          !copied.ok()) {
        return copied;
      }
    }
  }
  return absl::OkStatus();
}

#ifdef PAGEALLOC_HAVE_CUDA
// The GPU side of the writer: the buffer table and the kernel's counters in
// device memory, and the writer's own stream. Set up before the first
// allocation call, so that nothing between a call and its write waits on
// the host.
//
// This class is not thread-safe.
class DeviceWriter {
 public:
  DeviceWriter() = default;
  DeviceWriter(const DeviceWriter&) = delete;
  DeviceWriter& operator=(const DeviceWriter&) = delete;
  // Touches CUDA only if Init did (a CPU slab needs no CUDA context).
  ~DeviceWriter() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (buffers_ != nullptr) cudaFree(buffers_);
    if (counters_ != nullptr) cudaFree(counters_);
  }

  // Sets up on the slab's GPU and poisons the client's ring. Returns the
  // CUDA error of the call that failed.
  absl::Status Init(const Client& client, const KvSlabView& slab) {
    const std::vector<KvBuffer>& buffers = slab.buffers();
    RETURN_IF_ERROR(
        CudaStatus(cudaSetDevice(buffers[0].device), "cudaSetDevice"));
    RETURN_IF_ERROR(
        CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags"));
    std::vector<testing::KvPatternBuffer> table;
    for (const KvBuffer& buffer : buffers) {
      table.push_back({static_cast<char*>(buffer.data), buffer.stride_bytes});
    }
    num_buffers_ = static_cast<int32_t>(table.size());
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&buffers_),
                                          table.size() * sizeof(table[0])),
                               "cudaMalloc"));
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(buffers_, table.data(), table.size() * sizeof(table[0]),
                   cudaMemcpyHostToDevice),
        "cudaMemcpy"));
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&counters_),
                                          2 * sizeof(unsigned long long)),
                               "cudaMalloc"));
    RETURN_IF_ERROR(
        CudaStatus(cudaMemset(counters_, 0, 2 * sizeof(unsigned long long)),
                   "cudaMemset"));
    // Poison the whole ring (0xff..: slot -1) through this process's
    // mapping; the daemon writes a call's slots over it in the call's
    // launch.
    if (!client.ring_on_device()) {
      return absl::FailedPreconditionError(
          "the slab is on the GPU but the ring is not");
    }
    RETURN_IF_ERROR(
        CudaStatus(cudaMemset(const_cast<int64_t*>(client.ring_slots()), 0xff,
                              client.ring_capacity_slots() * sizeof(int64_t)),
                   "cudaMemset(ring)"));
    RETURN_IF_ERROR(
        CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    return absl::OkStatus();
  }

  // Queues, on the writer's stream, the wait for `allocation`'s launch and
  // the kernel that writes the pattern at its slots.
  absl::Status Write(const Client& client, const KvSlabView& slab,
                     const Allocation& allocation, bool expect_zero) {
    RETURN_IF_ERROR(client.OrderAfter(allocation, stream_));
    for (size_t r = 0; r < allocation.size(); ++r) {
      testing::KvPatternParams params;
      params.buffers = buffers_;
      params.num_buffers = num_buffers_;
      params.slots = allocation[r].slots;
      params.count = allocation[r].count;
      params.first_slot = slab.geometry().page_size;
      params.num_slots = slab.buffers()[0].num_slots;
      params.session = client.session_id();
      params.expect_zero = expect_zero;
      params.bad_slots = counters_;
      params.nonzero_bytes = counters_ + 1;
      RETURN_IF_ERROR(CudaStatus(testing::LaunchWriteKvPattern(params, stream_),
                                 "LaunchWriteKvPattern"));
    }
    return absl::OkStatus();
  }

  // Waits for every write; returns the slots read outside the usable range
  // and the bytes that were not zero before their write.
  absl::Status Finish(int64_t* bad_slots, int64_t* nonzero_bytes) {
    RETURN_IF_ERROR(
        CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
    unsigned long long counters[2] = {0, 0};
    RETURN_IF_ERROR(CudaStatus(cudaMemcpy(counters, counters_, sizeof(counters),
                                          cudaMemcpyDeviceToHost),
                               "cudaMemcpy"));
    *bad_slots = static_cast<int64_t>(counters[0]);
    *nonzero_bytes = static_cast<int64_t>(counters[1]);
    return absl::OkStatus();
  }

 private:
  cudaStream_t stream_ = nullptr;
  testing::KvPatternBuffer* buffers_ = nullptr;  // [num_buffers_]
  int32_t num_buffers_ = 0;
  unsigned long long* counters_ = nullptr;  // [2]: bad slots, nonzero bytes
};
#endif  // PAGEALLOC_HAVE_CUDA

int Main() {
  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.client_name = "kv-writer";
  options.register_secret = absl::GetFlag(FLAGS_register_secret);
  absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(options);
  if (!connected.ok()) return Fail(connected.status(), "connect");
  Client& client = **connected;
  const KvSlabView* slab = client.kv_slab();
  if (slab == nullptr) {
    return Fail(absl::FailedPreconditionError("no KV slab"), "kv_slab");
  }
  const int64_t page_size = client.pool().page_size();
  const int64_t pages = absl::GetFlag(FLAGS_pages);
  const int64_t calls = std::min(absl::GetFlag(FLAGS_calls), pages);
  const bool expect_zero = absl::GetFlag(FLAGS_expect_zero);
  if (calls < 1) {
    return Fail(absl::InvalidArgumentError("--pages and --calls must be >= 1"),
                "flags");
  }
#ifdef PAGEALLOC_HAVE_CUDA
  DeviceWriter device;
  if (slab->on_device()) {
    if (absl::Status ready = device.Init(client, *slab); !ready.ok()) {
      return Fail(ready, "GPU setup");
    }
  }
#else
  if (slab->on_device()) {
    return Fail(absl::FailedPreconditionError(
                    "the slab is on the GPU and this kv_writer was built "
                    "without CUDA"),
                "kv_slab");
  }
#endif

  CallOptions async;
  async.async_completion = true;
  std::vector<Allocation> allocations;
  int64_t nonzero_bytes = 0;
  int64_t bad_slots = 0;
  for (int64_t call = 0; call < calls; ++call) {
    const int64_t call_pages = pages / calls + (call < pages % calls ? 1 : 0);
    absl::StatusOr<Allocation> allocation =
        client.Alloc({call_pages * page_size}, async);
    if (!allocation.ok()) return Fail(allocation.status(), "alloc");
    if (!allocation->status().ok()) return Fail(allocation->status(), "alloc");
    absl::Status written;
    if (slab->on_device()) {
#ifdef PAGEALLOC_HAVE_CUDA
      written = device.Write(client, *slab, *allocation, expect_zero);
#endif
    } else {
      const RequestSlots& slots = (*allocation)[0];
      written = WriteOnHost(*slab, client.session_id(), slots.slots,
                            slots.count, expect_zero, &nonzero_bytes);
    }
    if (!written.ok()) return Fail(written, "write");
    allocations.push_back(*std::move(allocation));
  }
#ifdef PAGEALLOC_HAVE_CUDA
  if (slab->on_device()) {
    if (absl::Status done = device.Finish(&bad_slots, &nonzero_bytes);
        !done.ok()) {
      return Fail(done, "write");
    }
  }
#endif
  if (bad_slots != 0) {
    return Fail(absl::InternalError(absl::StrFormat(
                    "the kernel read %d slots outside [%d, %d) from the ring: "
                    "it ran before the daemon's launch wrote them",
                    bad_slots, page_size, slab->buffers()[0].num_slots)),
                "write");
  }
  if (nonzero_bytes != 0) {
    return Fail(absl::DataLossError(absl::StrFormat(
                    "%d bytes of the slots handed to this session were not "
                    "zero before it wrote them",
                    nonzero_bytes)),
                "expect_zero");
  }

  // The pages, from the ring (the writes above are done, and so are the
  // launches they waited for).
  std::set<int64_t> owned;
  for (const Allocation& allocation : allocations) {
    const RequestSlots& slots = allocation[0];
    std::vector<int64_t> host(slots.count);
    if (absl::Status copied =
            client.CopyToHost(slots.slots, slots.count, host.data());
        !copied.ok()) {
      return Fail(copied, "read slots");
    }
    for (int64_t slot : host) owned.insert(slot / page_size);
  }
  const uint64_t session = client.session_id();
  std::printf("SESSION %llu\nPAGES %s\nREADY\n",
              static_cast<unsigned long long>(session),
              absl::StrJoin(owned, " ").c_str());
  std::fflush(stdout);
  const absl::Time until =
      absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_hold_ms));
  while (absl::Now() < until && client.session_status().ok()) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  return 0;
}

}  // namespace
}  // namespace pagealloc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pagealloc::Main();
}
