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
#include "bench/slot_reader.h"
#include "client/client.h"
#include "common/status_macros.h"
#include "tests/workload.h"

namespace pagealloc::bench {
namespace {

using ::pagealloc::testing::CallArrays;
using ::pagealloc::testing::LiveSequence;
using ::pagealloc::testing::Prefill;
using ::pagealloc::testing::SequenceSet;

// One lane: `batch` live sequences of the client and the scheduler steps
// that grow them. Every allocation call is timed up to its return (and,
// gpu_ordered, up to the client's stream being ordered after it); its
// slots are read (SlotReader) and recorded into the sequences when the
// lane finishes the call: at once when slots are copied to the host, else
// at the lane's next step.
class Lane {
 public:
  Lane(Client* client, SlotReader* reader, const Workload& workload, int index,
       WorkloadRandom* random, WorkerReport* report,
       std::atomic<int64_t>* calls_counter)
      : client_(client),
        reader_(reader),
        w_(workload),
        index_(index),
        random_(*random),
        report_(*report),
        live_(client->pool().page_size()),
        calls_counter_(calls_counter) {
    options_.async_completion = workload.async_completion;
  }

  // Admits the first sequences (before the measured phase starts).
  absl::Status Warm() {
    RETURN_IF_ERROR(Admit());
    return Finish();
  }

  // One scheduler step: finish the lane's calls of its last step, admit
  // into empty places, then decode, prefill or speculate by the mix.
  absl::Status Step() {
    RETURN_IF_ERROR(Finish());
    RETURN_IF_ERROR(Admit());
    const int total = w_.decode_weight + w_.prefill_weight + w_.spec_weight;
    const int pick = random_.Uniform(0, std::max(total, 1) - 1);
    if (pick < w_.decode_weight || total == 0) return Decode();
    if (pick < w_.decode_weight + w_.prefill_weight) return PrefillChunk();
    return Speculate();
  }

 private:
  // An answered allocation call whose slots are not yet recorded.
  struct Pending {
    RpcKind kind = kDecode;
    // Admission: each request starts a new sequence of this target length.
    std::vector<int64_t> targets;
    bool admission = false;
    // Otherwise request k continues live_[places[k]] (none for a
    // speculative step, whose slots are read but not kept).
    std::vector<size_t> places;
    CallArrays call;
    Allocation allocation;
  };

  template <typename Call>
  auto Timed(RpcKind kind, Call call) {
    const int64_t start = NowNanos();
    auto result = call();
    report_.rpcs[kind].latency.Record(NowNanos() - start);
    calls_counter_->fetch_add(1, std::memory_order_relaxed);
    return result;
  }

  // An allocation call, timed until it returns and, gpu_ordered, the
  // reader's stream waits for it: when a kernel queued next may read the
  // slots.
  template <typename Call>
  absl::StatusOr<Allocation> TimedAlloc(RpcKind kind, Call call) {
    return Timed(kind, [&]() -> absl::StatusOr<Allocation> {
      absl::StatusOr<Allocation> a = call();
      if (a.ok()) RETURN_IF_ERROR(reader_->Order(*a));
      return a;
    });
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
  absl::Status Settle(const Allocation& a) {
    if (pending_free_.empty()) return absl::OkStatus();
    if (a.pages_freed_first() != static_cast<int64_t>(pending_free_.size())) {
      return absl::InternalError(
          absl::StrFormat("freed %d pages first, expected %d",
                          a.pages_freed_first(), pending_free_.size()));
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

  // Counts an answered call and has its slots read; it is finished now
  // when slots are copied to the host, else at the lane's next step.
  // Requests refused for lack of pages are counted (their sequences leave
  // when the call is finished); any other refusal is a bug worth stopping
  // for.
  absl::Status Issued(Pending p, bool read) {
    RETURN_IF_ERROR(Settle(p.allocation));
    const Allocation& a = p.allocation;
    report_.rpcs[p.kind].requests += a.size();
    for (size_t k = 0; k < a.size(); ++k) {
      if (a[k].status.ok()) {
        report_.rpcs[p.kind].slots += a[k].count;
      } else if (a[k].status.code() == absl::StatusCode::kResourceExhausted) {
        ++report_.refused;
      } else {
        return a[k].status;
      }
    }
    if (read) RETURN_IF_ERROR(reader_->Read(a, index_));
    pending_.push_back(std::move(p));
    return w_.gpu_ordered ? absl::OkStatus() : Finish();
  }

  // Records the slots of the lane's pending calls, in the order they were
  // made: admitted sequences join (at the end, so the places of a later
  // call still hold), continued ones grow. Finished sequences leave, and
  // so do sequences refused for lack of pages (a scheduler would preempt
  // them); their pages are freed with the next call. Then the calls' ring
  // space goes back.
  absl::Status Finish() {
    if (pending_.empty()) return absl::OkStatus();
    RETURN_IF_ERROR(reader_->Wait(index_));
    std::vector<size_t> done;
    for (const Pending& p : pending_) {
      const Allocation& a = p.allocation;
      for (size_t k = 0; k < a.size(); ++k) {
        const RequestSlots& r = a[k];
        if (p.admission) {
          if (!r.status.ok()) continue;
          const size_t i = live_.Add(kNoOwner, p.targets[k]);
          RETURN_IF_ERROR(live_.Record(i, p.call[k], reader_->Slots(r)));
          continue;
        }
        if (p.places.empty()) break;  // a speculative step's drafts
        if (!r.status.ok()) {
          done.push_back(p.places[k]);
          continue;
        }
        RETURN_IF_ERROR(
            live_.Record(p.places[k], p.call[k], reader_->Slots(r)));
        if (live_[p.places[k]].finished()) done.push_back(p.places[k]);
      }
    }
    client_->Release(pending_.back().allocation);
    pending_.clear();
    std::sort(done.begin(), done.end());
    done.erase(std::unique(done.begin(), done.end()), done.end());
    std::vector<int64_t> pages;
    live_.RemoveAll(done, &pages);
    return FreePages(pages);
  }

  // New sequences for the empty places, each with a random prompt and
  // target length.
  absl::Status Admit() {
    Pending p;
    p.kind = kAdmit;
    p.admission = true;
    while (live_.size() + p.call.size() < static_cast<size_t>(w_.batch)) {
      const int64_t prompt = random_.PromptLen(w_);
      p.call.Add(Prefill(prompt));
      p.targets.push_back(random_.TargetLen(w_, prompt));
    }
    if (p.call.empty()) return absl::OkStatus();
    ASSIGN_OR_RETURN(p.allocation, TimedAlloc(kAdmit, [&] {
                       return client_->AllocExtend(
                           p.call.prefix_lens, p.call.seq_lens,
                           p.call.last_locs, NextCallOptions(false));
                     }));
    return Issued(std::move(p), /*read=*/true);
  }

  absl::Status Decode() {
    Pending p;
    p.kind = kDecode;
    for (size_t i = 0; i < live_.size(); ++i) {
      p.places.push_back(i);
      p.call.Add(live_[i].Decode());
    }
    if (p.places.empty()) return absl::OkStatus();
    ASSIGN_OR_RETURN(p.allocation, TimedAlloc(kDecode, [&] {
                       return client_->AllocDecode(p.call.seq_lens,
                                                   p.call.last_locs,
                                                   NextCallOptions(false));
                     }));
    return Issued(std::move(p), /*read=*/true);
  }

  // A prefill chunk for up to prefill_requests distinct unfinished
  // sequences, picked at random.
  absl::Status PrefillChunk() {
    Pending p;
    p.kind = kExtend;
    std::vector<size_t> order(live_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    for (size_t n = 0; n < order.size() &&
                       static_cast<int>(p.places.size()) < w_.prefill_requests;
         ++n) {
      std::swap(order[n], order[random_.Uniform(n, order.size() - 1)]);
      const LiveSequence& s = live_[order[n]];
      if (s.finished()) continue;
      p.places.push_back(order[n]);
      p.call.Add(
          s.Extend(std::min<int64_t>(w_.prefill_chunk, s.target_len - s.len)));
    }
    if (p.places.empty()) return absl::OkStatus();
    ASSIGN_OR_RETURN(p.allocation, TimedAlloc(kExtend, [&] {
                       return client_->AllocExtend(
                           p.call.prefix_lens, p.call.seq_lens,
                           p.call.last_locs, NextCallOptions(false));
                     }));
    return Issued(std::move(p), /*read=*/true);
  }

  // Speculative decoding: checkpoint, allocate draft slots for every
  // sequence, reject them all (Rollback). The sequences are as before:
  // the drafts are read on the GPU when gpu_ordered (as a verification
  // would), never recorded.
  absl::Status Speculate() {
    Pending p;
    p.kind = kExtend;
    for (const LiveSequence& s : live_) p.call.Add(s.Extend(w_.draft_tokens));
    if (p.call.empty()) return absl::OkStatus();
    if (!w_.piggyback_ops) {
      RETURN_IF_ERROR(
          Timed(kCheckpoint, [&] { return client_->Checkpoint(); }));
    }
    ASSIGN_OR_RETURN(p.allocation, TimedAlloc(kExtend, [&] {
                       return client_->AllocExtend(
                           p.call.prefix_lens, p.call.seq_lens,
                           p.call.last_locs, NextCallOptions(w_.piggyback_ops));
                     }));
    RETURN_IF_ERROR(Issued(std::move(p), /*read=*/w_.gpu_ordered));
    absl::StatusOr<int64_t> rolled =
        Timed(kRollback, [&] { return client_->Rollback(); });
    return rolled.status();
  }

  Client* const client_;
  SlotReader* const reader_;
  const Workload w_;
  const int index_;
  WorkloadRandom& random_;
  WorkerReport& report_;
  SequenceSet live_;
  std::atomic<int64_t>* const calls_counter_;
  CallOptions options_;
  // Answered calls whose slots are not yet recorded, in call order.
  std::vector<Pending> pending_;
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
  // Room for the largest calls (a spec step over every sequence, or an
  // admission of every sequence) a few times over per lane: a lane's
  // regions go back when its calls are finished.
  const int lanes = workload.effective_lanes();
  client_options.ring_capacity_slots = std::max<int64_t>(
      1 << 16, 4 * int64_t{lanes} * workload.batch *
                   std::max(workload.prefill_chunk, workload.draft_tokens));
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(client_options);
  if (!client.ok()) return fail(client.status());
  absl::StatusOr<std::unique_ptr<SlotReader>> reader = SlotReader::Create(
      client->get(), workload.gpu_ordered, workload.async_completion, lanes,
      absl::Microseconds(options.client_spin_us));
  if (!reader.ok()) return fail(reader.status());
  WorkloadRandom random(options.seed + static_cast<uint64_t>(index));
  WorkerReport report;
  std::vector<std::unique_ptr<Lane>> lane;
  for (int i = 0; i < lanes; ++i) {
    lane.push_back(std::make_unique<Lane>(client->get(), reader->get(),
                                          workload, i, &random, &report,
                                          &me.calls));
    if (absl::Status s = lane.back()->Warm(); !s.ok()) return fail(s);
  }
  me.state.store(kReady);
  while ((*control)->go.load() == 0) absl::SleepFor(absl::Microseconds(100));
  for (int next = 0; (*control)->stop.load(std::memory_order_relaxed) == 0;
       next = (next + 1) % lanes) {
    if (absl::Status s = lane[next]->Step(); !s.ok()) return fail(s);
  }
  std::ofstream out(options.out_path);
  out << report.Serialize();
  out.close();
  if (!out) return fail(absl::InternalError("cannot write --worker_out"));
  // Done before the session closes: the coordinator's "after" snapshot must
  // not include our final frees.
  me.state.store(kDone);
  return 0;
}

}  // namespace pagealloc::bench
