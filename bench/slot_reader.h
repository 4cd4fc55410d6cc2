// How a worker gets at the slots of its allocation calls (bench/workload.h,
// Workload::gpu_ordered).
//
// Copied to the host (gpu_ordered false): Read copies a call's slots into
// host memory at once, after ordering the default stream after the
// daemon's completion for async calls, so the host waits for the launch.
//
// Read on the GPU (gpu_ordered true): Order, part of the timed call, makes
// the reader's own stream wait for the call's launch (Client::OrderAfter:
// the host waits for nothing). Read then queues, behind it on that stream,
// a kernel that reads the slots (bench/consume_kernel.h), and the copy of
// what the kernel read to the host, for the benchmark's own bookkeeping;
// Wait(lane) waits for those copies only when the lane's sequences are
// stepped again. So the bookkeeping checks the slots the GPU read, and a
// read ordered too early would show as wrong slots. On the CPU backend the
// ring is host memory: the reading is a host copy and there is nothing to
// wait for.
//
// This class is thread-compatible.

#ifndef PAGEALLOC_BENCH_SLOT_READER_H_
#define PAGEALLOC_BENCH_SLOT_READER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/client.h"

namespace pagealloc::bench {

class SlotReader {
 public:
  // A reader for `client`'s ring and `lanes` lanes (1..8). `spin`: how long
  // Wait polls before it sleeps. INTERNAL (with CUDA's words) when a
  // stream, an event or memory cannot be had; FAILED_PRECONDITION for a
  // device ring in a build without CUDA. REQUIRES: `client` outlives the
  // reader.
  static absl::StatusOr<std::unique_ptr<SlotReader>> Create(
      Client* client, bool gpu_ordered, bool async_completion, int lanes,
      absl::Duration spin);
  ~SlotReader();
  SlotReader(const SlotReader&) = delete;
  SlotReader& operator=(const SlotReader&) = delete;

  // With gpu_ordered: makes the reader's stream wait, on the GPU, for the
  // launch that wrote `a`'s slots. A no-op otherwise (and on the CPU
  // backend). INTERNAL when CUDA refuses the wait.
  absl::Status Order(const Allocation& a);

  // Reads the slots of `a`'s accepted requests into host memory: now, or
  // (gpu_ordered) by the reader's stream for `lane`, to be waited for with
  // Wait(lane). REQUIRES: Order(a) was called first when gpu_ordered;
  // `a`'s ring space is not released until then.
  absl::Status Read(const Allocation& a, int lane);

  // Waits until every Read of `lane` so far is in host memory. INTERNAL
  // when the stream failed.
  absl::Status Wait(int lane);

  // Request `r`'s slots in host memory. REQUIRES: r belongs to an
  // allocation that was Read (and, gpu_ordered, waited for) and not
  // released.
  absl::Span<const int64_t> Slots(const RequestSlots& r) const;

 private:
  SlotReader(Client* client, bool gpu_ordered, bool async_completion,
             absl::Duration spin);
  // Sets up the stream, events and buffers of a device ring.
  absl::Status InitDevice(int lanes);

  Client* const client_;
  const bool gpu_ordered_;
  const bool async_completion_;
  const absl::Duration spin_;
  const int64_t* const ring_;  // the client's mapped ring
  const int64_t ring_slots_;
  // Host memory at the ring's offsets: a slot at ring_ + k is read into
  // host_[k]. Pinned (host_pinned_) when the ring is on the device.
  int64_t* host_ = nullptr;
  std::vector<int64_t> host_storage_;
  bool device_ = false;
  // Device ring, gpu_ordered: the stream (a cudaStream_t), what the kernel
  // read (device memory at the ring's offsets), and one event per lane
  // (cudaEvent_t) marking its last copy to the host.
  void* stream_ = nullptr;
  int64_t* consumed_ = nullptr;
  std::vector<void*> lane_events_;
};

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_SLOT_READER_H_
