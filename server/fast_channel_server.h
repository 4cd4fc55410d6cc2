// The daemon's side of the fast channel (proto/fast_channel.h): one shared
// memory channel per session that asked for one, a doorbell, and poller
// threads that take the calls posted in their channels, run them through
// the service's own preparation (authentication, validation, ring space)
// and submits them to the batcher together, so that calls posted at the
// same time share a launch.
//
// A poller spins for `spin` after the last call it saw, so that a client
// issuing calls back to back never waits for a wake-up; then it sleeps on
// the doorbell (a futex) and uses no CPU until a client rings it. A poller
// submitting while another drives the batcher only queues: the driver
// takes those calls into its next launch (server/batcher.h).
//
// This class is thread-safe.

#ifndef PAGEALLOC_SERVER_FAST_CHANNEL_SERVER_H_
#define PAGEALLOC_SERVER_FAST_CHANNEL_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/fast_channel.h"
#include "proto/pagealloc.pb.h"
#include "server/service.h"

namespace pagealloc {

class FastChannelServer {
 public:
  struct Options {
    // Shared memory names start with this (e.g. "/pagealloc-gpu0.1234").
    std::string shm_prefix;
    // File mode of the shared memory objects (the rings' mode).
    int mode = 0660;
    // Most requests in one call (the daemon's per-call limit).
    int32_t max_requests = 8192;
    int32_t message_bytes = 64 << 10;
    // How long a poller keeps spinning after the last call it saw.
    absl::Duration spin = absl::Microseconds(200);
    // Poller threads; channels are dealt to them in turn. More than one
    // lets taking and checking calls (per-request work) run in parallel
    // with the launch another poller drives.
    int pollers = 1;
  };

  // Creates the doorbell and starts the poller. `service` must outlive this.
  static absl::StatusOr<std::unique_ptr<FastChannelServer>> Create(
      const Options& options, PageAllocatorService* service);
  // Stops the poller (Stop) and unlinks every channel.
  ~FastChannelServer();

  // Opens a channel for a session and describes it in `out`.
  absl::Status Open(uint64_t session_id, const std::string& session_token,
                    v1::FastChannel* out) ABSL_LOCKS_EXCLUDED(mu_);
  // Unlinks a session's channel (calls in flight still complete).
  void Close(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the poller: calls posted afterwards are never answered (the
  // daemon is going away; clients see their deadline, then gRPC's error).
  void Stop();

  // Calls taken from channels since start, and poller sleeps.
  int64_t calls() const { return calls_.load(std::memory_order_relaxed); }
  int64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }

 private:
  struct Channel;
  class ChannelReply;

  FastChannelServer(const Options& options, PageAllocatorService* service,
                    std::unique_ptr<fast_channel::SharedRegion> doorbell);
  // Poller `index`: serves the channels dealt to it.
  void Poll(int index);
  // Copies the call posted in `channel`. An allocation call is prepared
  // into `prepared` (true); an operation (Free, Checkpoint, Rollback) is
  // submitted at once, and a refused call answered at once (false).
  bool Take(const std::shared_ptr<Channel>& channel, uint32_t seq,
            std::vector<PageAllocatorService::PreparedCall>* prepared);

  const Options options_;
  PageAllocatorService* const service_;
  const std::unique_ptr<fast_channel::SharedRegion> doorbell_region_;
  fast_channel::Doorbell* const doorbell_;

  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Channel>> channels_
      ABSL_GUARDED_BY(mu_);
  // Bumped on every Open / Close so the poller refreshes its list.
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> sleeps_{0};
  int next_poller_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> pollers_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_FAST_CHANNEL_SERVER_H_
