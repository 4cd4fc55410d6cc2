// KvEventPublisher: the KvEventSink behind which the pool's prefix cache
// reports what it stores and removes. It numbers the events' batches,
// sends them on a ZeroMQ PUB socket in vLLM's shape, keeps the last batches
// for late subscribers (a ROUTER socket that answers vLLM's replay
// requests, and in-process followers such as the gRPC stream), and counts
// what it sends and drops.
//
// The producer never waits: an event goes into a bounded queue, or, when
// the queue is full, is dropped and counted. A thread of the publisher
// takes the queue in batches (up to max_batch_events events, or what came
// within max_batch_delay of the oldest), and numbers each batch one more
// than the last; where events were dropped it skips one number, so that a
// subscriber sees the gap. The first batch (sequence 0) starts with
// AllBlocksCleared: a daemon that starts, or restarts, has no cached pages,
// and a router must forget what it knew of this pool.
//
// The ZMQ wire is vLLM's (vllm/distributed/kv_events.py, ZmqEventPublisher):
//   PUB:    [topic, sequence (8 bytes, big-endian), payload]
//           (payload: kv_events/msgpack_codec.h)
//   ROUTER: a request [start (8 bytes, big-endian)] from a REQ or DEALER
//           socket is answered with [sequence, payload] for each batch of
//           the window with sequence >= start, then [-1 (8 bytes), ""].
//           A malformed request gets the end marker alone.
//
// This class is thread-safe.

#ifndef PAGEALLOC_KV_EVENTS_PUBLISHER_H_
#define PAGEALLOC_KV_EVENTS_PUBLISHER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kv_events/event.h"
#include "kv_events/msgpack_codec.h"
#include "kv_events/sink.h"

namespace pagealloc {

struct KvEventPublisherOptions {
  // Where the PUB socket binds: tcp://HOST:PORT (PORT * for one the system
  // picks; pub_endpoint() names it) or ipc://PATH. Empty: no PUB socket
  // (in-process followers only).
  std::string endpoint;
  // Where the ROUTER socket for replay requests binds; empty: none.
  std::string replay_endpoint;
  // The first frame of every PUB message (vLLM's `topic`).
  std::string topic;
  // Events the queue holds before it drops (vLLM's max_queue_size).
  int64_t queue_events = 100000;
  // Batches kept for replay (vLLM's buffer_steps).
  int64_t replay_batches = 10000;
  // A batch's most events, and the longest an event waits for others to
  // join its batch.
  int64_t max_batch_events = 1024;
  absl::Duration max_batch_delay = absl::Milliseconds(1);
  // The PUB socket's send high-water mark, in messages (vLLM's hwm): a
  // subscriber that falls this far behind loses messages.
  int send_high_water_mark = 100000;
  KvEventWireOptions wire;
};

// A snapshot of the publisher's counters.
struct KvEventPublisherStats {
  // Events sent, in batches.
  int64_t events_published = 0;
  int64_t batches_published = 0;
  // Events refused on a full queue.
  int64_t events_dropped = 0;
  // Sequence numbers skipped for dropped events (one a run of drops),
  // counted at the first drop of the run.
  int64_t sequence_gaps = 0;
  // Replay requests answered, those malformed (answered with the end marker
  // alone), and the batches replayed.
  int64_t replay_requests = 0;
  int64_t replay_requests_rejected = 0;
  int64_t replay_batches_sent = 0;
  // In-process followers (gRPC streams) now.
  int64_t followers = 0;
  // Events waiting in the queue.
  int64_t queued_events = 0;
  // The oldest batch the window holds (-1: none yet) and the number the
  // next batch gets.
  int64_t oldest_sequence = -1;
  int64_t next_sequence = 0;
};

// A published batch as the window keeps it: the events and their msgpack
// payload (what the PUB and ROUTER sockets sent).
struct PublishedKvEventBatch {
  KvEventBatch batch;
  std::string payload;
};

class KvEventPublisher final : public KvEventSink {
 public:
  // Binds the sockets and queues the first batch's AllBlocksCleared; the
  // thread that publishes starts with Start(). Returns INVALID_ARGUMENT
  // for options out of range and for an endpoint ZeroMQ cannot bind
  // (naming it and ZeroMQ's reason), UNAVAILABLE for an address in use.
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Create(
      const KvEventPublisherOptions& options);

  // Publishes what is queued, then closes the sockets.
  ~KvEventPublisher() override;

  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Starts the thread that batches and sends. Events queued before are
  // kept (up to queue_events). REQUIRES: called once.
  void Start() ABSL_LOCKS_EXCLUDED(mu_);

  // KvEventSink: queue the event, or drop and count it when the queue is
  // full. Never block on the sockets.
  void BlocksStored(const StoredBlocks& blocks) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void BlocksRemoved(absl::Span<const std::string> keys) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void AllBlocksCleared() override ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until every event queued before the call has been sent.
  // REQUIRES: Start() was called.
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);

  // Returns the window's batches with sequence >= `from`, oldest first, at
  // most `max`.
  std::vector<std::shared_ptr<const PublishedKvEventBatch>> BatchesFrom(
      int64_t from, size_t max) const ABSL_LOCKS_EXCLUDED(mu_);

  // Registers `wake`, run on the publisher's thread after each batch joins
  // the window (it must not block), and returns its id for
  // RemoveFollower; once that returns, `wake` is not running and never
  // runs again. A follower is counted in stats().followers.
  int64_t AddFollower(std::function<void()> wake)
      ABSL_LOCKS_EXCLUDED(followers_mu_);
  void RemoveFollower(int64_t id) ABSL_LOCKS_EXCLUDED(followers_mu_);

  KvEventPublisherStats stats() const ABSL_LOCKS_EXCLUDED(mu_, followers_mu_);
  const KvEventPublisherOptions& options() const { return options_; }

  // The endpoints as bound (a tcp port of * resolved); "" where none.
  const std::string& pub_endpoint() const { return pub_endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }

 private:
  struct Entry {
    // A marker where events were dropped: the batches before and after it
    // are numbered one apart more than usual.
    bool gap = false;
    KvEvent event;
    absl::Time queued;
  };

  KvEventPublisher(const KvEventPublisherOptions& options, int wake_fd);

  void Push(KvEvent event) ABSL_LOCKS_EXCLUDED(mu_);
  void Wake();
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a batch should leave now; if not, how long until it should.
  bool ReadyLocked(absl::Time now, absl::Duration* wait) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the next batch off the queue and numbers it.
  KvEventBatch TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Publish(KvEventBatch batch) ABSL_LOCKS_EXCLUDED(mu_);
  void ServeReplay() ABSL_LOCKS_EXCLUDED(mu_);

  const KvEventPublisherOptions options_;
  // An eventfd, written by producers when the thread may be asleep and
  // polled with the ROUTER socket; closed by the destructor.
  const int wake_fd_;
  // The ZeroMQ context and sockets (publisher.cc): used by the thread alone
  // once it runs (by Create before).
  struct Sockets;
  const std::unique_ptr<Sockets> sockets_;
  std::string pub_endpoint_;
  std::string replay_endpoint_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::deque<Entry> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_events_ ABSL_GUARDED_BY(mu_) = 0;
  // Events were dropped since the last one queued.
  bool gap_pending_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  // Events queued, and events sent or dropped: Flush waits for the second
  // to reach the first.
  int64_t accepted_events_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sent_events_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t flush_target_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::shared_ptr<const PublishedKvEventBatch>> window_
      ABSL_GUARDED_BY(mu_);
  KvEventPublisherStats stats_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex followers_mu_;
  std::map<int64_t, std::function<void()>> followers_
      ABSL_GUARDED_BY(followers_mu_);
  int64_t next_follower_ ABSL_GUARDED_BY(followers_mu_) = 0;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_KV_EVENTS_PUBLISHER_H_
