#include "server/batcher.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "common/cpu_relax.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace pagealloc {

absl::StatusOr<std::unique_ptr<Batcher>> Batcher::Create(const Options& options,
                                                         PagePool* pool,
                                                         Backend* backend) {
  if (options.max_batch_requests < 1 || options.max_batch_tokens < 1) {
    return absl::InvalidArgumentError(
        "max_batch_requests and max_batch_tokens must be >= 1");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<RingMemory> scratch,
                   backend->CreateRing(0, options.max_batch_tokens));
  return std::unique_ptr<Batcher>(
      new Batcher(options, pool, backend, std::move(scratch)));
}

Batcher::Batcher(const Options& options, PagePool* pool, Backend* backend,
                 std::unique_ptr<RingMemory> scratch)
    : options_(options),
      pool_(pool),
      backend_(backend),
      scratch_(std::move(scratch)),
      spin_(options.spin),
      spin_budget_ns_(absl::ToInt64Nanoseconds(spin_.budget())) {
  thread_ = std::thread([this] { Run(); });
}

Batcher::~Batcher() { Stop(); }

absl::Status Batcher::SubmitAlloc(AllocCall call) {
  std::vector<AllocCall> calls;
  calls.push_back(std::move(call));
  return SubmitAllocs(std::move(calls));
}

absl::Status Batcher::SubmitAllocs(std::vector<AllocCall> calls) {
  const absl::Time now = absl::Now();
  std::vector<Work> works(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    works[i].session_id = calls[i].session_id;
    works[i].queued_at = now;
    works[i].alloc = std::make_unique<AllocCall>(std::move(calls[i]));
  }
  return Submit(std::move(works));
}

absl::Status Batcher::SubmitOp(uint64_t session_id, std::function<void()> op) {
  std::vector<Work> works(1);
  works[0].session_id = session_id;
  works[0].queued_at = absl::Now();
  works[0].op = std::move(op);
  return Submit(std::move(works));
}

absl::Status Batcher::Submit(std::vector<Work> works) {
  std::vector<Work> batch;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the daemon is draining");
    if (queue_.empty() && !works.empty()) {
      oldest_queued_ns_.store(absl::ToUnixNanos(works.front().queued_at),
                              std::memory_order_relaxed);
    }
    // Operations run no launch: any thread may drive them.
    bool dedicated = true;
    for (Work& work : works) {
      if (work.alloc != nullptr) {
        dedicated = dedicated && work.alloc->submitter_is_dedicated;
        ++queued_calls_locked_;
        if (TracksActiveSessions()) {
          last_alloc_[work.session_id] = work.queued_at;
        }
      }
      queue_.push_back(std::move(work));
    }
    if (driving_ || !SubmitterDrives(works.size(), dedicated)) {
      // The batcher thread drives, or a launch in progress picks this work
      // up when it ends.
      queued_calls_.store(queued_calls_locked_, std::memory_order_relaxed);
      queued_.store(queue_.size(), std::memory_order_release);
      return absl::OkStatus();
    }
    // TakeBatch publishes the counts: a spinning batcher thread never sees
    // this work queued.
    driving_ = true;
    TakeBatch(&batch);
  }
  for (int round = 1;; ++round) {
    RunBatch(&batch);
    batch.clear();
    absl::MutexLock lock(&mu_);
    if (queue_.empty() || round == kMaxInlineRounds) {
      // Leftover work (past the round limit) wakes the batcher thread,
      // which waits for exactly this: work queued and no driver.
      driving_ = false;
      return absl::OkStatus();
    }
    TakeBatch(&batch);
  }
}

void Batcher::Stop() {
  stop_requested_.store(true);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t Batcher::launches() const {
  absl::MutexLock lock(&mu_);
  return launches_;
}

int64_t Batcher::CallsToWaitFor() const {
  if (options_.min_batch_calls <= 0) return options_.max_batch_requests;
  // Half the active sessions, rounded up: calls from the other half are
  // still being answered or prepared by their clients, and waiting for all
  // of them would make the clients step in lockstep.
  const int64_t active = active_sessions_.load(std::memory_order_relaxed);
  return std::max<int64_t>(
      1, std::min<int64_t>(options_.min_batch_calls, (active + 1) / 2));
}

void Batcher::SpinForCompany() {
  const int64_t want = CallsToWaitFor();
  // Only allocation calls are worth waiting for (operations run alone).
  // The queue is scanned for operations only when it has changed since the
  // last scan that found none to run (one queued behind its session's call
  // stays there until the launch).
  int64_t scanned_at = -1;
  while (queued_calls_.load(std::memory_order_relaxed) > 0 &&
         queued_calls_.load(std::memory_order_relaxed) < want &&
         !stop_requested_.load(std::memory_order_relaxed) &&
         absl::GetCurrentTimeNanos() <
             oldest_queued_ns_.load(std::memory_order_relaxed) +
                 absl::ToInt64Nanoseconds(options_.batch_window)) {
    const int64_t queued = queued_.load(std::memory_order_acquire);
    if (queued > queued_calls_.load(std::memory_order_relaxed) &&
        queued != scanned_at) {
      scanned_at = RunOpsWhileGathering() ? -1 : queued;
    }
    CpuRelax();
  }
}

bool Batcher::RunOpsWhileGathering() {
  std::vector<Work> ops;
  {
    absl::MutexLock lock(&mu_);
    if (driving_) return false;
    // An operation queued behind an allocation call of its own session
    // stays in order behind it.
    absl::flat_hash_set<uint64_t> sessions_with_calls;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->alloc != nullptr) {
        sessions_with_calls.insert(it->session_id);
        ++it;
      } else if (sessions_with_calls.contains(it->session_id)) {
        ++it;
      } else {
        ops.push_back(std::move(*it));
        it = queue_.erase(it);
      }
    }
    if (ops.empty()) return false;
    if (!queue_.empty()) {
      oldest_queued_ns_.store(absl::ToUnixNanos(queue_.front().queued_at),
                              std::memory_order_relaxed);
    }
    queued_.store(queue_.size(), std::memory_order_release);
    driving_ = true;
  }
  for (Work& op : ops) op.op();
  absl::MutexLock lock(&mu_);
  driving_ = false;
  return true;
}

void Batcher::TakeBatch(std::vector<Work>* batch) {
  if (options_.batch_window > absl::ZeroDuration() && !stopping_ &&
      options_.spin == absl::ZeroDuration()) {
    // Give other sessions a moment to join this launch.
    const int64_t want = CallsToWaitFor();
    auto full = [this, want]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || queued_calls_locked_ == 0 ||
             queued_calls_locked_ >= want;
    };
    const absl::Time deadline =
        absl::FromUnixNanos(oldest_queued_ns_.load(std::memory_order_relaxed)) +
        options_.batch_window;
    mu_.AwaitWithDeadline(absl::Condition(&full), deadline);
  }
  if (TracksActiveSessions()) {
    // Forget sessions that have gone quiet.
    const absl::Time quiet_since = absl::Now() - options_.active_session_window;
    absl::erase_if(last_alloc_, [quiet_since](const auto& entry) {
      return entry.second < quiet_since;
    });
    active_sessions_.store(last_alloc_.size(), std::memory_order_relaxed);
  }
  int64_t requests = 0;
  int64_t tokens = 0;
  while (!queue_.empty()) {
    Work& next = queue_.front();
    if (next.alloc != nullptr) {
      const int64_t r = next.alloc->requests.size();
      const int64_t t = next.alloc->num_slots;
      if (!batch->empty() && (requests + r > options_.max_batch_requests ||
                              tokens + t > options_.max_batch_tokens)) {
        break;
      }
      requests += r;
      tokens += t;
    }
    if (next.alloc != nullptr) --queued_calls_locked_;
    batch->push_back(std::move(next));
    queue_.pop_front();
  }
  queued_calls_.store(queued_calls_locked_, std::memory_order_relaxed);
  if (!queue_.empty()) {
    oldest_queued_ns_.store(absl::ToUnixNanos(queue_.front().queued_at),
                            std::memory_order_relaxed);
  }
  queued_.store(queue_.size(), std::memory_order_release);
}

bool Batcher::SubmitterDrives(size_t submitted, bool dedicated) const {
  const bool thread_drives = options_.batch_window > absl::ZeroDuration() ||
                             options_.spin > absl::ZeroDuration();
  if (!thread_drives) return true;
  // A lone client's call, with nothing else queued: no company will join
  // its launch (CallsToWaitFor is 1), so a hand-off to the batcher thread
  // would only add latency, and a thread spinning for one client's next
  // call would cost a core. Unless the submitter is one of a pool of
  // threads taking turns: on one of those the launch itself costs more
  // than the hand-off (AllocCall.submitter_is_dedicated).
  return options_.spin > absl::ZeroDuration() && options_.lone_client_drives &&
         dedicated && TracksActiveSessions() && last_alloc_.size() <= 1 &&
         queue_.size() == submitted;
}

void Batcher::Run() {
  std::vector<Work> batch;
  // Work for this thread: queued and nobody driving. When stopping, it
  // waits for the driver to finish, then drains what is left.
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !driving_ && (!queue_.empty() || stopping_);
  };
  const bool spins = options_.spin > absl::ZeroDuration();
  absl::Time idle_since = absl::Now();
  while (true) {
    bool caught = false;
    const absl::Duration budget = spin_.budget();
    if (budget > absl::ZeroDuration()) {
      // Poll for more work before sleeping on the mutex (Options.spin).
      const absl::Time until = idle_since + budget;
      while (queued_.load(std::memory_order_acquire) == 0 &&
             !stop_requested_.load(std::memory_order_relaxed) &&
             absl::Now() < until) {
        CpuRelax();
      }
      caught = queued_.load(std::memory_order_acquire) > 0;
    }
    {
      absl::MutexLock lock(&mu_);
      if (!ready()) {
        caught = false;
        thread_asleep_ = true;
        thread_sleeps_.fetch_add(1, std::memory_order_relaxed);
        mu_.Await(absl::Condition(&ready));
        thread_asleep_ = false;
      }
      if (queue_.empty()) return;  // stopping, nothing left
      if (spins) {
        const absl::Duration gap = absl::Now() - idle_since;
        if (caught) {
          spin_.Caught(gap);
        } else {
          spin_.Slept(gap);
        }
        spin_budget_ns_.store(absl::ToInt64Nanoseconds(spin_.budget()),
                              std::memory_order_relaxed);
      }
    }
    if (spins && options_.batch_window > absl::ZeroDuration()) {
      // Gather, whether the work was found spinning or woke the thread.
      SpinForCompany();
    }
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, nothing left
      driving_ = true;
      TakeBatch(&batch);
    }
    RunBatch(&batch);
    batch.clear();
    {
      absl::MutexLock lock(&mu_);
      driving_ = false;
    }
    idle_since = absl::Now();
  }
}

bool Batcher::thread_asleep() const {
  absl::MutexLock lock(&mu_);
  return thread_asleep_;
}

void Batcher::RunBatch(std::vector<Work>* batch) {
  std::vector<Work> pending;  // allocation calls waiting for the launch
  absl::flat_hash_set<uint64_t> pending_sessions;
  for (Work& work : *batch) {
    if (work.alloc != nullptr) {
      if (work.alloc->has_before) {
        // The call's own operations come first: after the session's
        // earlier calls, before this one's allocation.
        if (pending_sessions.contains(work.session_id)) {
          Launch(&pending);
          pending_sessions.clear();
        }
        const absl::Status ready = work.alloc->completion->Before();
        if (!ready.ok()) {
          work.alloc->completion->Cancel(ready);
          continue;
        }
      }
      pending_sessions.insert(work.session_id);
      pending.push_back(std::move(work));
      continue;
    }
    if (pending_sessions.contains(work.session_id)) {
      Launch(&pending);
      pending_sessions.clear();
    }
    work.op();
  }
  Launch(&pending);
  if (options_.debug_checks) {
    const absl::Status invariants = pool_->CheckInvariants();
    if (!invariants.ok()) {
      Logger("batcher")->critical("pool invariant broken: {}",
                                  std::string(invariants.message()));
      std::abort();
    }
  }
}

void Batcher::Launch(std::vector<Work>* pending) {
  if (pending->empty()) return;
  if (!pool_->scrubs()) {
    // The return_inline calls are answered on the host: the pool writes
    // their slots itself (Expansion::kPool), so they wait for no launch and
    // no copy back. They are admitted before the launch, so a session with
    // calls of both kinds in the batch keeps them all in the launch, in
    // order: no session's calls are reordered.
    launch_sessions_.clear();
    for (const Work& work : *pending) {
      if (!work.alloc->return_inline) launch_sessions_.insert(work.session_id);
    }
    const auto on_host = std::stable_partition(
        pending->begin(), pending->end(), [this](const Work& work) {
          return !work.alloc->return_inline ||
                 launch_sessions_.contains(work.session_id);
        });
    if (on_host != pending->end()) {
      host_pending_.assign(std::make_move_iterator(on_host),
                           std::make_move_iterator(pending->end()));
      pending->erase(on_host, pending->end());
      LaunchCalls(&host_pending_, Expansion::kPool);
      host_pending_.clear();
    }
  }
  LaunchCalls(pending, Expansion::kExecutor);
}

void Batcher::LaunchCalls(std::vector<Work>* pending, Expansion expansion) {
  if (pending->empty()) return;
  if (before_launch_) before_launch_();
  const absl::Time start = absl::Now();
  GatherRequests(pending, expansion);
  pool_->Allocate(launch_requests_, launch_calls_, &launch_results_, expansion);
  LaunchInfo launch;
  launch.batch_calls = pending->size();
  launch.batch_requests = launch_requests_.size();
  const absl::Status completion =
      CompleteLaunch(*pending, start, expansion, &launch);
  size_t first = 0;
  for (Work& work : *pending) {
    FinishCall(work, first, completion, start, expansion, &launch);
    first += work.alloc->requests.size();
  }
  pending->clear();
}

void Batcher::GatherRequests(std::vector<Work>* pending, Expansion expansion) {
  std::vector<AllocRequest>& requests = launch_requests_;
  requests.clear();
  // Each call's requests, so that the pool admits an all-or-nothing call
  // whole and (under SGLang's semantics) decides its merge per call.
  std::vector<CallSpan>& calls = launch_calls_;
  calls.clear();
  int64_t* inline_base = scratch_->slots();
  if (expansion == Expansion::kPool) {
    // Host memory for the pool to write into, sized before any destination
    // points into it.
    int64_t total = 0;
    for (const Work& work : *pending) {
      for (const AllocRequest& request : work.alloc->requests) {
        total += ToExtendShape(request).num_slots();
      }
    }
    host_slots_.resize(total);
    inline_base = host_slots_.data();
  }
  int64_t inline_used = 0;
  for (Work& work : *pending) {
    AllocCall& call = *work.alloc;
    calls.push_back({static_cast<int64_t>(call.requests.size()),
                     call.all_or_nothing, call.call});
    if (call.return_inline) {
      for (AllocRequest& request : call.requests) {
        request.destination = inline_base + inline_used;
        inline_used += ToExtendShape(request).num_slots();
      }
    }
    requests.insert(requests.end(), call.requests.begin(), call.requests.end());
  }
}

absl::Status Batcher::CompleteLaunch(const std::vector<Work>& pending,
                                     absl::Time start, Expansion expansion,
                                     LaunchInfo* launch) {
  bool any_sync = false;
  // The pool's own expansion issues nothing to wait for.
  bool launched = false;
  for (const AllocResult& result : launch_results_) {
    launched = launched || (result.status.ok() && result.num_slots > 0);
    launch->batch_slots += result.status.ok() ? result.num_slots : 0;
  }
  launched = launched && expansion == Expansion::kExecutor;
  for (const Work& work : pending) {
    any_sync =
        any_sync || !work.alloc->async_completion || work.alloc->return_inline;
  }
  {
    absl::MutexLock lock(&mu_);
    launch->launch_id = ++launches_;
  }
  absl::Status completion = absl::OkStatus();
  const absl::Time complete_start = absl::Now();
  if (launched) {
    absl::StatusOr<uint64_t> completed = backend_->CompleteLaunch(!any_sync);
    completion = completed.status();
    if (completed.ok()) launch->completion_value = *completed;
  }
  if (!launched || !completion.ok()) {
    launch->completion_value = backend_->completion_value();
  }
  const absl::Time end = absl::Now();
  launch->execute_time = end - start;
  if (launched) {
    metrics_.complete_seconds.Observe(
        absl::ToDoubleSeconds(end - complete_start));
  }
  metrics_.requests_per_batch.Observe(launch->batch_requests);
  metrics_.tokens_per_batch.Observe(launch->batch_slots);
  metrics_.execute_seconds.Observe(absl::ToDoubleSeconds(launch->execute_time));
  return completion;
}

void Batcher::FinishCall(const Work& work, size_t first,
                         const absl::Status& completion, absl::Time start,
                         Expansion expansion, LaunchInfo* launch) {
  AllocCall& call = *work.alloc;
  const size_t n = call.requests.size();
  std::vector<AllocResult>& results = launch_results_;
  std::vector<int64_t>& inline_slots = inline_slots_;
  inline_slots.clear();
  if (!completion.ok()) {
    // The launch ran but could not be completed: the slots are not
    // trustworthy. The pool has already committed them; report the
    // device failure.
    for (size_t i = first; i < first + n; ++i) {
      if (results[i].status.ok()) results[i].status = completion;
    }
  }
  if (call.return_inline) {
    for (size_t i = first; i < first + n; ++i) {
      AllocResult& result = results[i];
      if (!result.status.ok() || result.num_slots == 0) continue;
      const int64_t* written = launch_requests_[i].destination;
      if (expansion == Expansion::kPool) {
        inline_slots.insert(inline_slots.end(), written,
                            written + result.num_slots);
        continue;
      }
      const size_t at = inline_slots.size();
      inline_slots.resize(at + result.num_slots);
      const absl::Status copied = backend_->CopyToHost(
          written, result.num_slots, inline_slots.data() + at);
      if (!copied.ok()) {
        // inline_slots holds the accepted requests' slots only.
        result.status = copied;
        inline_slots.resize(at);
      }
    }
  }
  launch->queue_wait = start - work.queued_at;
  metrics_.queue_wait_seconds.Observe(
      absl::ToDoubleSeconds(launch->queue_wait));
  call.completion->Done(absl::MakeConstSpan(results.data() + first, n),
                        inline_slots, *launch);
}

}  // namespace pagealloc
