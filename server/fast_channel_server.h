// The fast channel's adapter over the call core (fast_channel/layout.h): one
// shared-memory channel per session that asked for one, a doorbell, and
// poller threads that take the calls posted in their channels through the
// codec (fast_channel/codec.h), run them through the call core (the same
// authentication, validation and ring space as gRPC calls) and submit the
// allocation calls to the batcher together, so that calls posted at the
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
#include "fast_channel/codec.h"
#include "fast_channel/layout.h"
#include "memory/shared_region.h"
#include "proto/pagealloc.pb.h"
#include "server/call_core.h"

namespace pagealloc {

class FastChannelServer final : public SessionObserver {
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

  // Creates the doorbell and starts the pollers. `core` must outlive this.
  static absl::StatusOr<std::unique_ptr<FastChannelServer>> Create(
      const Options& options, CallCore* core);
  // Stops the pollers (Stop) and unlinks every channel.
  ~FastChannelServer() override;

  // Opens a channel for a session and describes it in `out`.
  absl::Status Open(uint64_t session_id, const std::string& session_token,
                    v1::FastChannel* out) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `session_id` has a channel (for GetStats).
  bool HasChannel(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Unlinks a session's channel (calls in flight still complete).
  void Close(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_);
  // SessionObserver: a session that ends loses its channel.
  void SessionClosed(uint64_t session_id) override { Close(session_id); }
  // Stops the poller: calls posted afterwards are never answered (the
  // daemon is going away; clients see their deadline, then gRPC's error).
  void Stop();

  // Calls taken from channels since start, and poller sleeps.
  int64_t calls() const { return calls_.load(std::memory_order_relaxed); }
  int64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }

 private:
  struct Channel;
  class ChannelReply;

  FastChannelServer(const Options& options, CallCore* core,
                    std::unique_ptr<SharedRegion> doorbell);
  // Poller `index`: serves the channels dealt to it.
  void Poll(int index);
  // Takes the call posted in `channel` through the codec. An allocation
  // call is prepared and appended to `prepared`; an operation (Free,
  // Checkpoint, Rollback) is submitted at once, and a refused call answered
  // at once.
  void Take(const std::shared_ptr<Channel>& channel, uint32_t seq,
            std::vector<AllocCall>* prepared);

  const Options options_;
  CallCore* const core_;
  const std::unique_ptr<SharedRegion> doorbell_region_;
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
