#include "kv_events/grpc_stream.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace pagealloc {
namespace {

// Answers a refused call.
class RefusedReactor final : public grpc::ServerWriteReactor<v1::KvEventBatch> {
 public:
  explicit RefusedReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// One subscriber's stream: at most one write in flight, the next batch
// read from the window when it completes or when the publisher wakes us.
class SubscriberReactor final
    : public grpc::ServerWriteReactor<v1::KvEventBatch> {
 public:
  SubscriberReactor(KvEventPublisher* publisher, int64_t next_sequence)
      : publisher_(publisher), next_sequence_(next_sequence) {
    follower_ = publisher_->AddFollower([this] { WriteNext(); });
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok || cancelled_) {
        // The client went away, or the server is shutting down.
        FinishOnceLocked(grpc::Status::CANCELLED);
        return;
      }
    }
    WriteNext();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    // A write in flight finishes the stream when it completes.
    if (!writing_) FinishOnceLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    // Once RemoveFollower returns, the publisher never calls WriteNext.
    publisher_->RemoveFollower(follower_);
    delete this;
  }

 private:
  void WriteNext() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (writing_ || finished_ || cancelled_) return;
    std::vector<std::shared_ptr<const PublishedKvEventBatch>> next =
        publisher_->BatchesFrom(next_sequence_, 1);
    if (next.empty()) return;  // the publisher wakes us for the next one
    const KvEventBatch& batch = next.front()->batch;
    message_.Clear();
    KvEventBatchToProto(batch, publisher_->options().wire, &message_);
    next_sequence_ = batch.sequence + 1;
    writing_ = true;
    StartWrite(&message_);
  }

  void FinishOnceLocked(const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  KvEventPublisher* const publisher_;
  int64_t follower_ = -1;
  absl::Mutex mu_;
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // The message in flight (gRPC reads it until OnWriteDone).
  v1::KvEventBatch message_ ABSL_GUARDED_BY(mu_);
};

void SetKeys(const std::vector<std::string>& keys,
             google::protobuf::RepeatedPtrField<std::string>* out) {
  out->Reserve(static_cast<int>(keys.size()));
  for (const std::string& key : keys) *out->Add() = key;
}

}  // namespace

void KvEventBatchToProto(const KvEventBatch& batch,
                         const KvEventWireOptions& wire,
                         v1::KvEventBatch* message) {
  message->set_sequence(batch.sequence);
  message->set_ts(batch.ts);
  message->set_data_parallel_rank(wire.data_parallel_rank);
  message->set_schema_version(kKvEventsSchemaVersion);
  for (const KvEvent& event : batch.events) {
    v1::KvEvent* out = message->add_events();
    switch (event.kind) {
      case KvEventKind::kBlockStored: {
        v1::KvBlockStored* stored = out->mutable_block_stored();
        SetKeys(event.stored.keys, stored->mutable_block_hashes());
        stored->set_parent_block_hash(event.stored.parent_key);
        stored->mutable_token_ids()->Add(event.stored.token_ids.begin(),
                                         event.stored.token_ids.end());
        stored->set_block_size(event.stored.block_size);
        if (event.stored.lora_id.has_value()) {
          stored->set_lora_id(*event.stored.lora_id);
        }
        stored->set_medium(wire.medium);
        break;
      }
      case KvEventKind::kBlockRemoved: {
        v1::KvBlockRemoved* removed = out->mutable_block_removed();
        SetKeys(event.removed_keys, removed->mutable_block_hashes());
        removed->set_medium(wire.medium);
        break;
      }
      case KvEventKind::kAllBlocksCleared:
        out->mutable_all_blocks_cleared();
        break;
    }
  }
}

grpc::ServerWriteReactor<v1::KvEventBatch>* KvEventsService::SubscribeKvEvents(
    grpc::CallbackServerContext* context,
    const v1::SubscribeKvEventsRequest* request) {
  if (publisher_ == nullptr) {
    return new RefusedReactor(
        grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                     "this daemon publishes no KV events: start it with "
                     "--kv_events_endpoint"));
  }
  const int64_t from = request->from_sequence();
  const int64_t next = publisher_->stats().next_sequence;
  if (from < -1) {
    return new RefusedReactor(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("from_sequence (", from,
                     ") must be >= 0, or -1 for live batches only")));
  }
  if (from > next) {
    return new RefusedReactor(grpc::Status(
        grpc::StatusCode::OUT_OF_RANGE,
        absl::StrCat("from_sequence (", from,
                     ") is past the next sequence number (", next, ")")));
  }
  return new SubscriberReactor(publisher_, from == -1 ? next : from);
}

}  // namespace pagealloc
