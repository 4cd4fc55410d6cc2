#include "bench/worker.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "bench/clock.h"
#include "bench/control.h"
#include "bench/rpc_stats.h"
#include "client/client.h"
#include "common/status_macros.h"
#include "tests/workload.h"

namespace pagealloc::bench {
namespace {

using ::pagealloc::testing::CallArrays;
using ::pagealloc::testing::LiveSequence;
using ::pagealloc::testing::Prefill;
using ::pagealloc::testing::SequenceSet;

class Worker {
 public:
  Worker(Client* client, const Workload& workload, uint64_t seed,
         std::atomic<int64_t>* calls_counter)
      : client_(client),
        w_(workload),
        random_(seed),
        live_(client->pool().page_size()),
        calls_counter_(calls_counter) {
    options_.async_completion = workload.async_completion;
  }

  // Admits the first sequences (before the measured phase starts).
  absl::Status Warm() { return Admit(); }

  // One scheduler step: admit into empty places, then decode, prefill or
  // speculate by the mix.
  absl::Status Step() {
    RETURN_IF_ERROR(Admit());
    const int total = w_.decode_weight + w_.prefill_weight + w_.spec_weight;
    const int pick = random_.Uniform(0, std::max(total, 1) - 1);
    if (pick < w_.decode_weight || total == 0) return Decode();
    if (pick < w_.decode_weight + w_.prefill_weight) return PrefillChunk();
    return Speculate();
  }

  const WorkerReport& report() const { return report_; }

 private:
  template <typename Call>
  auto Timed(RpcKind kind, Call call) {
    const int64_t start = NowNanos();
    auto result = call();
    report_.rpcs[kind].latency.Record(NowNanos() - start);
    calls_counter_->store(++calls_, std::memory_order_relaxed);
    return result;
  }

  // Copies the slots of `a` (one contiguous ring region) to host memory,
  // where Slots finds each request's.
  absl::Status ReadSlots(const Allocation& a) {
    const int64_t* lo = nullptr;
    const int64_t* hi = nullptr;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].status.ok() || a[i].count == 0) continue;
      if (lo == nullptr || a[i].slots < lo) lo = a[i].slots;
      if (hi == nullptr || a[i].slots + a[i].count > hi) {
        hi = a[i].slots + a[i].count;
      }
    }
    base_ = lo;
    if (lo == nullptr) return absl::OkStatus();
    if (w_.async_completion) {
      // The answer came right after the launch: order our read (on the
      // default stream) after the daemon's completion event.
      RETURN_IF_ERROR(client_->OrderAfterCompletion(nullptr));
    }
    host_.resize(hi - lo);
    return client_->CopyToHost(lo, hi - lo, host_.data());
  }
  // Request r's slots, in the host copy ReadSlots made.
  absl::Span<const int64_t> Slots(const RequestSlots& r) const {
    if (r.count == 0) return {};
    return absl::MakeConstSpan(host_.data() + (r.slots - base_), r.count);
  }

  // The options of the next allocation call: pages waiting to be freed go
  // with it (piggyback_ops), and so does a checkpoint when asked.
  CallOptions NextCallOptions(bool checkpoint) const {
    CallOptions options = options_;
    options.free_pages_first = pending_free_;
    options.checkpoint_first = checkpoint;
    return options;
  }

  // After an allocation call: the pages that went with it are freed.
  absl::Status Settle(const absl::StatusOr<Allocation>& a) {
    if (!a.ok() || pending_free_.empty()) return absl::OkStatus();
    if (a->pages_freed_first() != static_cast<int64_t>(pending_free_.size())) {
      return absl::InternalError(
          absl::StrFormat("freed %d pages first, expected %d",
                          a->pages_freed_first(), pending_free_.size()));
    }
    pending_free_.clear();
    return absl::OkStatus();
  }

  absl::Status FreePages(const std::vector<int64_t>& pages) {
    if (pages.empty()) return absl::OkStatus();
    if (w_.piggyback_ops) {
      pending_free_.insert(pending_free_.end(), pages.begin(), pages.end());
      return absl::OkStatus();
    }
    absl::StatusOr<int64_t> freed =
        Timed(kFree, [&] { return client_->FreePages(pages); });
    if (!freed.ok()) return freed.status();
    if (*freed != static_cast<int64_t>(pages.size())) {
      return absl::InternalError(
          absl::StrFormat("freed %d pages, expected %d", *freed, pages.size()));
    }
    return absl::OkStatus();
  }

  // Records a decode or extend call's answers for the sequences at
  // `places` (request k continues live_[places[k]] with call[k]). Finished
  // sequences leave, and so do sequences refused for lack of pages (a
  // scheduler would preempt them); their pages go back in one Free. Any
  // other refusal is a bug worth stopping for.
  absl::Status Consume(RpcKind kind, const absl::StatusOr<Allocation>& a,
                       const std::vector<size_t>& places,
                       const CallArrays& call) {
    if (!a.ok()) return a.status();
    RETURN_IF_ERROR(Settle(a));
    report_.rpcs[kind].requests += places.size();
    RETURN_IF_ERROR(ReadSlots(*a));
    std::vector<size_t> done;
    for (size_t k = 0; k < places.size(); ++k) {
      const RequestSlots& r = (*a)[k];
      if (!r.status.ok()) {
        if (r.status.code() != absl::StatusCode::kResourceExhausted) {
          return r.status;
        }
        ++report_.refused;
        done.push_back(places[k]);
        continue;
      }
      RETURN_IF_ERROR(live_.Record(places[k], call[k], Slots(r)));
      report_.rpcs[kind].slots += r.count;
      if (live_[places[k]].finished()) done.push_back(places[k]);
    }
    client_->Release(*a);
    std::vector<int64_t> pages;
    live_.RemoveAll(done, &pages);
    return FreePages(pages);
  }

  // New sequences for the empty places, each with a random prompt and
  // target length.
  absl::Status Admit() {
    CallArrays call;
    while (live_.size() + call.size() < static_cast<size_t>(w_.batch)) {
      call.Add(Prefill(random_.PromptLen(w_)));
    }
    if (call.empty()) return absl::OkStatus();
    absl::StatusOr<Allocation> a = Timed(kExtend, [&] {
      return client_->AllocExtend(call.prefix_lens, call.seq_lens,
                                  call.last_locs, NextCallOptions(false));
    });
    if (!a.ok()) return a.status();
    RETURN_IF_ERROR(Settle(a));
    report_.rpcs[kExtend].requests += call.size();
    RETURN_IF_ERROR(ReadSlots(*a));
    for (size_t k = 0; k < call.size(); ++k) {
      const RequestSlots& r = (*a)[k];
      if (!r.status.ok()) {
        ++report_.refused;
        continue;
      }
      const size_t i =
          live_.Add(kNoOwner, random_.TargetLen(w_, call[k].seq_len));
      RETURN_IF_ERROR(live_.Record(i, call[k], Slots(r)));
      report_.rpcs[kExtend].slots += r.count;
    }
    client_->Release(*a);
    return absl::OkStatus();
  }

  absl::Status Decode() {
    std::vector<size_t> places;
    CallArrays call;
    for (size_t i = 0; i < live_.size(); ++i) {
      places.push_back(i);
      call.Add(live_[i].Decode());
    }
    if (places.empty()) return absl::OkStatus();
    absl::StatusOr<Allocation> a = Timed(kDecode, [&] {
      return client_->AllocDecode(call.seq_lens, call.last_locs,
                                  NextCallOptions(false));
    });
    return Consume(kDecode, a, places, call);
  }

  // A prefill chunk for up to prefill_requests random unfinished sequences.
  absl::Status PrefillChunk() {
    std::vector<size_t> places;
    CallArrays call;
    for (size_t tries = 0;
         tries < live_.size() &&
         static_cast<int>(places.size()) < w_.prefill_requests;
         ++tries) {
      const size_t k = random_.Uniform(0, live_.size() - 1);
      const LiveSequence& s = live_[k];
      if (s.finished()) continue;
      if (std::find(places.begin(), places.end(), k) != places.end()) continue;
      places.push_back(k);
      call.Add(
          s.Extend(std::min<int64_t>(w_.prefill_chunk, s.target_len - s.len)));
    }
    if (places.empty()) return absl::OkStatus();
    absl::StatusOr<Allocation> a = Timed(kExtend, [&] {
      return client_->AllocExtend(call.prefix_lens, call.seq_lens,
                                  call.last_locs, NextCallOptions(false));
    });
    return Consume(kExtend, a, places, call);
  }

  // Speculative decoding: checkpoint, allocate draft slots for every
  // sequence, reject them all (Rollback). The sequences are as before, so
  // the slots need not be read.
  absl::Status Speculate() {
    CallArrays call;
    for (const LiveSequence& s : live_) call.Add(s.Extend(w_.draft_tokens));
    if (call.empty()) return absl::OkStatus();
    if (!w_.piggyback_ops) {
      RETURN_IF_ERROR(
          Timed(kCheckpoint, [&] { return client_->Checkpoint(); }));
    }
    absl::StatusOr<Allocation> a = Timed(kExtend, [&] {
      return client_->AllocExtend(call.prefix_lens, call.seq_lens,
                                  call.last_locs,
                                  NextCallOptions(w_.piggyback_ops));
    });
    if (!a.ok()) return a.status();
    RETURN_IF_ERROR(Settle(a));
    report_.rpcs[kExtend].requests += call.size();
    for (size_t k = 0; k < a->size(); ++k) {
      if ((*a)[k].status.ok()) {
        report_.rpcs[kExtend].slots += (*a)[k].count;
      } else if ((*a)[k].status.code() ==
                 absl::StatusCode::kResourceExhausted) {
        ++report_.refused;
      } else {
        return (*a)[k].status;
      }
    }
    client_->Release(*a);
    absl::StatusOr<int64_t> rolled =
        Timed(kRollback, [&] { return client_->Rollback(); });
    return rolled.status();
  }

  Client* const client_;
  const Workload w_;
  WorkloadRandom random_;
  SequenceSet live_;
  std::atomic<int64_t>* const calls_counter_;
  CallOptions options_;
  WorkerReport report_;
  int64_t calls_ = 0;
  std::vector<int64_t> host_;
  const int64_t* base_ = nullptr;
  // Pages of finished sequences, freed with the next allocation call.
  std::vector<int64_t> pending_free_;
};

}  // namespace

int RunWorker(const WorkerOptions& options) {
  const int index = options.index;
  absl::StatusOr<Control*> control =
      MapControl(options.control_file, /*create=*/false);
  if (!control.ok() || index < 0 || index >= kMaxClients) {
    std::fprintf(stderr, "worker %d: no control block\n", index);
    return 1;
  }
  Control::Worker& me = (*control)->workers[index];
  auto fail = [&](const absl::Status& status) {
    std::fprintf(stderr, "worker %d: %s\n", index, status.ToString().c_str());
    me.state.store(kFailed);
    return 1;
  };
  const Workload& workload = options.workload;
  ClientOptions client_options;
  client_options.target = options.target;
  client_options.client_name = absl::StrCat("bench-", index);
  client_options.fast_channel = options.fast_channel;
  client_options.fast_channel_spin = absl::Microseconds(options.client_spin_us);
  // Room for the largest call (a spec step over every sequence, or an
  // admission of every sequence) a few times over; we release each call's
  // region right after reading it.
  client_options.ring_capacity_slots = std::max<int64_t>(
      1 << 16, 4 * int64_t{workload.batch} *
                   std::max(workload.prefill_chunk, workload.draft_tokens));
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(client_options);
  if (!client.ok()) return fail(client.status());
  Worker worker(client->get(), workload,
                options.seed + static_cast<uint64_t>(index), &me.calls);
  if (absl::Status s = worker.Warm(); !s.ok()) return fail(s);
  me.state.store(kReady);
  while ((*control)->go.load() == 0) absl::SleepFor(absl::Microseconds(100));
  while ((*control)->stop.load(std::memory_order_relaxed) == 0) {
    if (absl::Status s = worker.Step(); !s.ok()) return fail(s);
  }
  std::ofstream out(options.out_path);
  out << worker.report().Serialize();
  out.close();
  if (!out) return fail(absl::InternalError("cannot write --worker_out"));
  // Done before the session closes: the coordinator's "after" snapshot must
  // not include our final frees.
  me.state.store(kDone);
  return 0;
}

}  // namespace pagealloc::bench
