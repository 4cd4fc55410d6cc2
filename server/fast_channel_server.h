// The fast channel's adapter over the call core (fast_channel/layout.h): one
// channel per session that asked for one (anonymous shared memory and an
// eventfd doorbell of its own, handed to the client by the memory socket,
// server/memory_socket_server.h), and poller threads that take the calls
// posted in their channels through the codec (fast_channel/codec.h), run
// them through the call core (the same authentication, validation and ring
// space as gRPC calls) and submit the allocation calls to the batcher
// together, so that calls posted at the same time share a launch.
//
// A poller spins for `spin` after the last call it saw, so that a client
// issuing calls back to back never waits for a wake-up; then it sleeps in
// epoll_wait on its channels' doorbells and uses no CPU until a client
// rings one. A doorbell wakes only the poller of its own channel, and a
// wake-up that finds no call sends the poller back to sleep without
// spinning. A poller submitting while another drives the batcher only
// queues: the driver takes those calls into its next launch
// (server/batcher.h).
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
#include "memory/unique_fd.h"
#include "proto/pagealloc.pb.h"
#include "server/call_core.h"

namespace pagealloc {

class FastChannelServer final : public SessionObserver {
 public:
  struct Options {
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

  // Starts the pollers. `core` must outlive this.
  static absl::StatusOr<std::unique_ptr<FastChannelServer>> Create(
      const Options& options, CallCore* core);
  // Stops the pollers (Stop); every channel's memory goes with the last
  // process that maps it.
  ~FastChannelServer() override;

  // Opens a channel for a session (its memory, reserved, and its doorbell)
  // and describes its capacity in `out`. RESOURCE_EXHAUSTED when the memory
  // cannot be had, INTERNAL for other system errors.
  absl::Status Open(uint64_t session_id, const std::string& session_token,
                    v1::FastChannel* out) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `session_id` has a channel (for GetStats).
  bool HasChannel(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_);

  // What a session's client needs to use its channel: descriptors of the
  // channel's memory and of its doorbell (duplicates: the caller's to hand
  // over and close).
  struct ChannelFds {
    UniqueFd memory;
    uint64_t bytes = 0;
    UniqueFd doorbell;
  };
  // NOT_FOUND when the session has no channel; INTERNAL when a descriptor
  // cannot be duplicated (out of descriptors).
  absl::StatusOr<ChannelFds> ExportFds(uint64_t session_id)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Drops a session's channel (calls in flight still complete).
  void Close(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_);
  // SessionObserver: a session that ends loses its channel.
  void SessionClosed(uint64_t session_id, absl::string_view) override {
    Close(session_id);
  }
  // Stops the poller: calls posted afterwards are never answered (the
  // daemon is going away; clients see their deadline, then gRPC's error).
  void Stop();

  // Calls taken from channels since start, and poller sleeps.
  int64_t calls() const { return calls_.load(std::memory_order_relaxed); }
  int64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }

 private:
  struct Channel;
  class ChannelReply;
  // One poller thread, and what it sleeps on: an epoll set holding its
  // channels' doorbells and its own wake-up eventfd (Stop, Close).
  struct Poller {
    UniqueFd epoll;
    UniqueFd wake;
    std::thread thread;
  };

  FastChannelServer(const Options& options, CallCore* core,
                    std::vector<std::unique_ptr<Poller>> pollers);
  // Poller `index`: serves the channels dealt to it.
  void Poll(int index);
  // Wakes poller `index` (it looks at its channel list again).
  void Wake(int index);
  // Takes the call posted in `channel` through the codec. An allocation
  // call is prepared and appended to `prepared`; an operation (Free,
  // Checkpoint, Rollback) is submitted at once, and a refused call answered
  // at once.
  void Take(const std::shared_ptr<Channel>& channel, uint32_t seq,
            std::vector<AllocCall>* prepared);

  const Options options_;
  CallCore* const core_;

  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Channel>> channels_
      ABSL_GUARDED_BY(mu_);
  // Bumped on every Open / Close so the poller refreshes its list.
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> sleeps_{0};
  int next_poller_ ABSL_GUARDED_BY(mu_) = 0;
  // Fixed at construction; each thread is started by the constructor.
  std::vector<std::unique_ptr<Poller>> pollers_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_FAST_CHANNEL_SERVER_H_
