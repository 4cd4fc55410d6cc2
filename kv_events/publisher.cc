#include "kv_events/publisher.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace pagealloc {
namespace {

// vLLM's replay end marker: -1 as 8 bytes, big-endian.
constexpr char kEndOfReplay[8] = {'\xff', '\xff', '\xff', '\xff',
                                  '\xff', '\xff', '\xff', '\xff'};

std::string BigEndian8(int64_t value) {
  std::string bytes(8, '\0');
  const uint64_t u = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<char>((u >> (56 - 8 * i)) & 0xff);
  }
  return bytes;
}

uint64_t ReadBigEndian8(const zmq::message_t& frame) {
  const auto* bytes = static_cast<const unsigned char*>(frame.data());
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | bytes[i];
  return value;
}

// A request's answers may all be queued before the client reads any: the
// ROUTER socket drops what passes its high-water mark, so it holds a whole
// window and the end marker.
int ReplayHighWaterMark(int64_t replay_batches) {
  return static_cast<int>(std::min<int64_t>(replay_batches + 2, 1 << 30));
}

}  // namespace

struct KvEventPublisher::Sockets {
  zmq::context_t context;
  zmq::socket_t pub;     // null without an endpoint
  zmq::socket_t router;  // null without a replay endpoint
};

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(
    const KvEventPublisherOptions& options) {
  if (options.queue_events < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv events queue_events (", options.queue_events, ") must be >= 1"));
  }
  if (options.replay_batches < 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv events replay_batches (",
                                                   options.replay_batches,
                                                   ") must be >= 0"));
  }
  if (options.max_batch_events < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv events max_batch_events (", options.max_batch_events,
                     ") must be >= 1"));
  }
  if (options.max_batch_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv events max_batch_delay (",
        absl::FormatDuration(options.max_batch_delay), ") must be >= 0"));
  }
  if (options.send_high_water_mark < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv events send_high_water_mark (",
                     options.send_high_water_mark, ") must be >= 0"));
  }
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot create the KV-event publisher's eventfd: ",
                     std::strerror(errno)));
  }
  std::unique_ptr<KvEventPublisher> publisher(
      new KvEventPublisher(options, wake_fd));
  // ZeroMQ reports failures as exceptions; they stop here.
  Sockets& sockets = *publisher->sockets_;
  std::string binding;
  try {
    if (!options.endpoint.empty()) {
      binding = options.endpoint;
      sockets.pub = zmq::socket_t(sockets.context, zmq::socket_type::pub);
      sockets.pub.set(zmq::sockopt::linger, 0);
      sockets.pub.set(zmq::sockopt::sndhwm, options.send_high_water_mark);
      sockets.pub.bind(options.endpoint);
      publisher->pub_endpoint_ = sockets.pub.get(zmq::sockopt::last_endpoint);
    }
    if (!options.replay_endpoint.empty()) {
      binding = options.replay_endpoint;
      sockets.router = zmq::socket_t(sockets.context, zmq::socket_type::router);
      sockets.router.set(zmq::sockopt::linger, 0);
      sockets.router.set(zmq::sockopt::sndhwm,
                         ReplayHighWaterMark(options.replay_batches));
      // A request is 8 bytes: a peer that sends more is cut off by ZeroMQ
      // before we buffer it.
      sockets.router.set(zmq::sockopt::maxmsgsize, int64_t{64});
      sockets.router.bind(options.replay_endpoint);
      publisher->replay_endpoint_ =
          sockets.router.get(zmq::sockopt::last_endpoint);
    }
  } catch (const zmq::error_t& e) {
    const std::string message = absl::StrCat(
        "cannot bind a KV-event socket to ", binding, ": ", e.what());
    // An address in use is a failure at run time; others are the
    // endpoint's fault.
    if (e.num() == EADDRINUSE) return absl::UnavailableError(message);
    return absl::InvalidArgumentError(message);
  }
  publisher->AllBlocksCleared();
  return publisher;
}

KvEventPublisher::KvEventPublisher(const KvEventPublisherOptions& options,
                                   int wake_fd)
    : options_(options),
      wake_fd_(wake_fd),
      sockets_(std::make_unique<Sockets>()) {}

KvEventPublisher::~KvEventPublisher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  Wake();
  if (thread_.joinable()) thread_.join();
  sockets_->pub.close();
  sockets_->router.close();
  sockets_->context.close();
  close(wake_fd_);
}

void KvEventPublisher::Start() {
  thread_ = std::thread([this] { Run(); });
}

void KvEventPublisher::BlocksStored(const StoredBlocks& blocks) {
  KvEvent event;
  event.kind = KvEventKind::kBlockStored;
  event.stored = blocks;
  Push(std::move(event));
}

void KvEventPublisher::BlocksRemoved(absl::Span<const std::string> keys) {
  KvEvent event;
  event.kind = KvEventKind::kBlockRemoved;
  event.removed_keys.assign(keys.begin(), keys.end());
  Push(std::move(event));
}

void KvEventPublisher::AllBlocksCleared() {
  KvEvent event;
  event.kind = KvEventKind::kAllBlocksCleared;
  Push(std::move(event));
}

void KvEventPublisher::Push(KvEvent event) {
  bool wake = false;
  {
    absl::MutexLock lock(&mu_);
    if (queued_events_ >= options_.queue_events) {
      ++stats_.events_dropped;
      // One number is skipped for a run of drops, when the next batch is
      // numbered.
      if (!gap_pending_) ++stats_.sequence_gaps;
      gap_pending_ = true;
      return;
    }
    const absl::Time now = absl::Now();
    if (gap_pending_) {
      queue_.push_back(Entry{.gap = true, .event = {}, .queued = now});
      gap_pending_ = false;
    }
    // The thread sleeps without a deadline only on an empty queue, and with
    // one until the batch is full or its oldest event is due.
    wake =
        queued_events_ == 0 || queued_events_ + 1 == options_.max_batch_events;
    queue_.push_back(
        Entry{.gap = false, .event = std::move(event), .queued = now});
    ++queued_events_;
    ++accepted_events_;
  }
  if (wake) Wake();
}

void KvEventPublisher::Wake() {
  const uint64_t one = 1;
  // EAGAIN: the counter is already nonzero, the thread will wake anyway.
  (void)!write(wake_fd_, &one, sizeof(one));
}

void KvEventPublisher::Flush() {
  int64_t target;
  {
    absl::MutexLock lock(&mu_);
    target = accepted_events_;
    flush_target_ = std::max(flush_target_, target);
  }
  Wake();
  absl::MutexLock lock(&mu_);
  std::pair<const int64_t*, int64_t> sent_and_target(&sent_events_, target);
  mu_.Await(absl::Condition(
      +[](std::pair<const int64_t*, int64_t>* wait) {
        return *wait->first >= wait->second;
      },
      &sent_and_target));
}

bool KvEventPublisher::ReadyLocked(absl::Time now, absl::Duration* wait) const {
  if (queue_.empty()) return false;
  if (stopping_ || flush_target_ > sent_events_ ||
      queued_events_ >= options_.max_batch_events) {
    return true;
  }
  const absl::Duration age = now - queue_.front().queued;
  if (age >= options_.max_batch_delay) return true;
  *wait = options_.max_batch_delay - age;
  return false;
}

KvEventBatch KvEventPublisher::TakeLocked() {
  KvEventBatch batch;
  while (!queue_.empty() && static_cast<int64_t>(batch.events.size()) <
                                options_.max_batch_events) {
    Entry& entry = queue_.front();
    if (entry.gap) {
      // Events were dropped between the batch taken so far and the next.
      if (!batch.events.empty()) break;
      ++next_sequence_;
      queue_.pop_front();
      continue;
    }
    batch.events.push_back(std::move(entry.event));
    queue_.pop_front();
    --queued_events_;
  }
  batch.sequence = next_sequence_++;
  if (queue_.empty() && gap_pending_) {
    // The drops came after every event now taken: the next batch shows
    // them.
    gap_pending_ = false;
    ++next_sequence_;
  }
  batch.ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  return batch;
}

void KvEventPublisher::Run() {
  std::vector<zmq::pollitem_t> items;
  items.push_back(zmq::pollitem_t{nullptr, wake_fd_, ZMQ_POLLIN, 0});
  if (sockets_->router) {
    items.push_back(
        zmq::pollitem_t{sockets_->router.handle(), -1, ZMQ_POLLIN, 0});
  }
  while (true) {
    std::optional<KvEventBatch> batch;
    // -1: sleep until woken.
    int64_t timeout_ms = -1;
    {
      absl::MutexLock lock(&mu_);
      absl::Duration wait = absl::ZeroDuration();
      if (ReadyLocked(absl::Now(), &wait)) {
        batch = TakeLocked();
      } else if (stopping_ && queue_.empty()) {
        return;
      } else if (!queue_.empty()) {
        timeout_ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(absl::Ceil(
                                              wait, absl::Milliseconds(1))));
      }
    }
    if (batch.has_value()) {
      Publish(*std::move(batch));
      timeout_ms = 0;  // only a look at the sockets before the next batch
    }
    try {
      zmq::poll(items.data(), items.size(),
                std::chrono::milliseconds(timeout_ms));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) {
        Logger("kv_events")
            ->error("polling the KV-event sockets: {}", e.what());
      }
      continue;
    }
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t count;
      (void)!read(wake_fd_, &count, sizeof(count));
    }
    if (items.size() > 1 && (items[1].revents & ZMQ_POLLIN)) ServeReplay();
  }
}

void KvEventPublisher::Publish(KvEventBatch batch) {
  auto published = std::make_shared<PublishedKvEventBatch>();
  published->payload = EncodeKvEventBatch(batch, options_.wire);
  const int64_t events = static_cast<int64_t>(batch.events.size());
  const int64_t sequence = batch.sequence;
  published->batch = std::move(batch);
  if (sockets_->pub) {
    const std::string sequence_bytes = BigEndian8(sequence);
    std::vector<zmq::const_buffer> frames = {zmq::buffer(options_.topic),
                                             zmq::buffer(sequence_bytes),
                                             zmq::buffer(published->payload)};
    try {
      // A PUB socket never blocks: past a subscriber's high-water mark it
      // drops that subscriber's copy.
      zmq::send_multipart(sockets_->pub, frames, zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      Logger("kv_events")
          ->error("sending KV-event batch {}: {}", sequence, e.what());
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (options_.replay_batches > 0) {
      window_.push_back(std::move(published));
      while (static_cast<int64_t>(window_.size()) > options_.replay_batches) {
        window_.pop_front();
      }
    }
    ++stats_.batches_published;
    stats_.events_published += events;
    sent_events_ += events;
  }
  absl::MutexLock lock(&followers_mu_);
  for (auto& [id, wake] : followers_) wake();
}

void KvEventPublisher::ServeReplay() {
  // Serve what is waiting now, then go back to the queue.
  for (int served = 0; served < 64; ++served) {
    std::vector<zmq::message_t> frames;
    std::optional<size_t> received;
    try {
      received =
          zmq::recv_multipart(sockets_->router, std::back_inserter(frames),
                              zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      Logger("kv_events")
          ->error("reading a KV-event replay request: {}", e.what());
      return;
    }
    if (!received.has_value() || frames.empty()) return;
    zmq::message_t& identity = frames[0];
    // [identity, "", start]: what a REQ socket sends (a DEALER sends the
    // empty delimiter itself).
    const bool well_formed =
        frames.size() == 3 && frames[1].size() == 0 && frames[2].size() == 8;
    std::vector<std::shared_ptr<const PublishedKvEventBatch>> batches;
    {
      absl::MutexLock lock(&mu_);
      ++stats_.replay_requests;
      if (!well_formed) {
        if (stats_.replay_requests_rejected++ == 0) {
          Logger("kv_events")
              ->warn(
                  "a KV-event replay request is not [\"\", 8-byte start "
                  "sequence] ({} frames); answered with the end marker "
                  "alone (later ones are only counted)",
                  frames.size() - 1);
        }
      } else {
        const uint64_t start = ReadBigEndian8(frames[2]);
        for (const auto& batch : window_) {
          if (static_cast<uint64_t>(batch->batch.sequence) >= start) {
            batches.push_back(batch);
          }
        }
        stats_.replay_batches_sent += static_cast<int64_t>(batches.size());
      }
    }
    try {
      for (const auto& batch : batches) {
        const std::string sequence_bytes = BigEndian8(batch->batch.sequence);
        std::vector<zmq::const_buffer> answer = {
            zmq::buffer(identity.data(), identity.size()), zmq::const_buffer(),
            zmq::buffer(sequence_bytes), zmq::buffer(batch->payload)};
        zmq::send_multipart(sockets_->router, answer,
                            zmq::send_flags::dontwait);
      }
      std::vector<zmq::const_buffer> end = {
          zmq::buffer(identity.data(), identity.size()), zmq::const_buffer(),
          zmq::buffer(kEndOfReplay, sizeof(kEndOfReplay)), zmq::const_buffer()};
      zmq::send_multipart(sockets_->router, end, zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      Logger("kv_events")
          ->warn("answering a KV-event replay request: {}", e.what());
    }
  }
}

std::vector<std::shared_ptr<const PublishedKvEventBatch>>
KvEventPublisher::BatchesFrom(int64_t from, size_t max) const {
  std::vector<std::shared_ptr<const PublishedKvEventBatch>> batches;
  absl::MutexLock lock(&mu_);
  // The window is in sequence order: skip to the first wanted.
  auto it = std::lower_bound(
      window_.begin(), window_.end(), from,
      [](const std::shared_ptr<const PublishedKvEventBatch>& batch,
         int64_t sequence) { return batch->batch.sequence < sequence; });
  for (; it != window_.end() && batches.size() < max; ++it) {
    batches.push_back(*it);
  }
  return batches;
}

int64_t KvEventPublisher::AddFollower(std::function<void()> wake) {
  absl::MutexLock lock(&followers_mu_);
  const int64_t id = next_follower_++;
  followers_.emplace(id, std::move(wake));
  return id;
}

void KvEventPublisher::RemoveFollower(int64_t id) {
  absl::MutexLock lock(&followers_mu_);
  followers_.erase(id);
}

KvEventPublisherStats KvEventPublisher::stats() const {
  KvEventPublisherStats stats;
  {
    absl::MutexLock lock(&mu_);
    stats = stats_;
    stats.queued_events = queued_events_;
    stats.next_sequence = next_sequence_;
    stats.oldest_sequence =
        window_.empty() ? -1 : window_.front()->batch.sequence;
  }
  absl::MutexLock lock(&followers_mu_);
  stats.followers = static_cast<int64_t>(followers_.size());
  return stats;
}

}  // namespace pagealloc
