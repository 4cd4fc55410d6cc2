// scheduler_example: how an inference scheduler uses the pagealloc client
// library, step by step (docs/integration.md walks through it).
//
//   scheduler_example --target=unix:///run/pagealloc/gpu0.sock
//
// It registers a session, prefills three requests, decodes them, runs one
// speculative-decoding step (checkpoint, draft, rollback, keep the accepted
// tokens), finishes a request, admits a request too large for the free pool
// by evicting running requests and retrying, and finally frees everything.
// It keeps each request's slots on the host, as an engine keeps its block
// table. It exits 0 when every step behaved as documented, 1 otherwise,
// against a pool of any size. tests/scheduler_example_test runs it against
// real daemons, a small pool and a large one.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"

ABSL_FLAG(std::string, target, "unix:///run/pagealloc/gpu0.sock",
          "The daemon's gRPC address.");
ABSL_FLAG(int64_t, decode_steps, 20, "Decode steps to run.");
ABSL_FLAG(int64_t, max_batch_tokens, 1 << 21,
          "The daemon's --max_batch_tokens (its default here): the most slots "
          "one call may ask for.");

namespace pagealloc::example {
namespace {

// One sequence the scheduler runs: its token slots, in order. The last one
// is the `last_loc` the next extend or decode continues from.
struct Sequence {
  std::string name;
  std::vector<int64_t> slots;
  int64_t seq_len() const { return static_cast<int64_t>(slots.size()); }
  int64_t last_loc() const { return slots.empty() ? -1 : slots.back(); }
  // One slot of each of its pages: what a Free needs (any slot of a page
  // frees the page), a page_size-th of the slots. Token i of a sequence
  // that started on a fresh page lies in its (i / page_size)-th page.
  std::vector<int64_t> PageSlots(int64_t page_size) const {
    std::vector<int64_t> out;
    for (size_t i = 0; i < slots.size(); i += page_size) {
      out.push_back(slots[i]);
    }
    return out;
  }
};

#define EXAMPLE_RETURN_IF_ERROR(expr)  \
  do {                                 \
    absl::Status status_ = (expr);     \
    if (!status_.ok()) return status_; \
  } while (0)

class Scheduler {
 public:
  explicit Scheduler(std::unique_ptr<Client> client)
      : client_(std::move(client)) {}

  // Extends each of `batch` by `new_tokens[i]` tokens in one call (prefill
  // when the sequence is empty). Returns the call's status; a request
  // refused alone (out of pages) leaves its sequence unchanged and its
  // status in `refused`.
  absl::Status Extend(const std::vector<Sequence*>& batch,
                      const std::vector<int64_t>& new_tokens,
                      std::vector<absl::Status>* refused = nullptr) {
    std::vector<int64_t> prefix_lens, seq_lens, last_locs;
    for (size_t i = 0; i < batch.size(); ++i) {
      prefix_lens.push_back(batch[i]->seq_len());
      seq_lens.push_back(batch[i]->seq_len() + new_tokens[i]);
      last_locs.push_back(batch[i]->last_loc());
    }
    absl::StatusOr<Allocation> a =
        client_->AllocExtend(prefix_lens, seq_lens, last_locs);
    if (!a.ok()) return a.status();
    return Consume(batch, *a, refused);
  }

  // One decode step: one new token for each of `batch`.
  absl::Status Decode(const std::vector<Sequence*>& batch) {
    std::vector<int64_t> seq_lens, last_locs;
    for (Sequence* s : batch) {
      seq_lens.push_back(s->seq_len() + 1);
      last_locs.push_back(s->last_loc());
    }
    absl::StatusOr<Allocation> a = client_->AllocDecode(seq_lens, last_locs);
    if (!a.ok()) return a.status();
    return Consume(batch, *a, nullptr);
  }

  // Frees every page of `s` (a finished or evicted request).
  absl::StatusOr<int64_t> Finish(Sequence& s) {
    absl::StatusOr<int64_t> freed =
        client_->FreeSlots(s.PageSlots(client_->pool().page_size()));
    if (freed.ok()) s.slots.clear();
    return freed;
  }

  Client& client() { return *client_; }

 private:
  // Copies each request's slots out of the ring (they are device pointers
  // on a GPU daemon), appends them to its sequence, then releases the ring
  // space: the slots are ours until freed, the ring region is not.
  absl::Status Consume(const std::vector<Sequence*>& batch, const Allocation& a,
                       std::vector<absl::Status>* refused) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (refused != nullptr) refused->push_back(a[i].status);
      if (!a[i].status.ok()) {
        if (refused == nullptr) return a[i].status;
        continue;
      }
      std::vector<int64_t> slots(a[i].count);
      EXAMPLE_RETURN_IF_ERROR(
          client_->CopyToHost(a[i].slots, a[i].count, slots.data()));
      batch[i]->slots.insert(batch[i]->slots.end(), slots.begin(), slots.end());
    }
    client_->Release(a);
    return absl::OkStatus();
  }

  std::unique_ptr<Client> client_;
};

absl::Status Expect(bool condition, const std::string& what) {
  return condition ? absl::OkStatus() : absl::InternalError(what);
}

absl::StatusOr<int64_t> UsedPages(Client& client) {
  absl::StatusOr<v1::GetStatsResponse> stats = client.GetStats();
  if (!stats.ok()) return stats.status();
  return stats->used_pages();
}

absl::Status Run() {
  // 1. Register: one session per scheduler process. The library maps the
  //    session's output ring and renews its lease in the background.
  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.client_name = "scheduler-example";
  absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(options);
  if (!connected.ok()) return connected.status();
  Scheduler scheduler(*std::move(connected));
  Client& client = scheduler.client();
  const int64_t page_size = client.pool().page_size();
  std::printf("registered: session %llu, %lld pages of %lld tokens\n",
              static_cast<unsigned long long>(client.session_id()),
              static_cast<long long>(client.pool().num_pages()),
              static_cast<long long>(page_size));

  // 2. Prefill: one AllocExtend for the whole batch.
  std::vector<Sequence> running = {{"a", {}}, {"b", {}}, {"c", {}}};
  std::vector<Sequence*> batch = {&running[0], &running[1], &running[2]};
  EXAMPLE_RETURN_IF_ERROR(scheduler.Extend(batch, {100, 200, 37}));
  std::printf("prefill: %lld, %lld, %lld tokens\n",
              static_cast<long long>(running[0].seq_len()),
              static_cast<long long>(running[1].seq_len()),
              static_cast<long long>(running[2].seq_len()));
  // The slots of a page are consecutive: token 1 follows token 0.
  EXAMPLE_RETURN_IF_ERROR(Expect(running[0].slots[1] == running[0].slots[0] + 1,
                                 "prefill slots are not page-contiguous"));

  // 3. Decode: one AllocDecode per step, one token per running request.
  const int64_t steps = absl::GetFlag(FLAGS_decode_steps);
  for (int64_t step = 0; step < steps; ++step) {
    EXAMPLE_RETURN_IF_ERROR(scheduler.Decode(batch));
  }
  std::printf("decode: %lld steps, request a at %lld tokens\n",
              static_cast<long long>(steps),
              static_cast<long long>(running[0].seq_len()));

  // 4. Speculative decoding: checkpoint, allocate 5 draft tokens per
  //    request, verify (here: 2 accepted), roll back, and extend by what was
  //    accepted. Rollback returns the pages taken since the checkpoint; the
  //    re-extend from the same last_loc gives the accepted tokens the same
  //    slots they had as drafts.
  std::vector<Sequence> before = running;
  EXAMPLE_RETURN_IF_ERROR(client.Checkpoint());
  EXAMPLE_RETURN_IF_ERROR(scheduler.Extend(batch, {5, 5, 5}));
  std::vector<Sequence> drafted = running;
  absl::StatusOr<int64_t> returned = client.Rollback();
  if (!returned.ok()) return returned.status();
  running = before;
  EXAMPLE_RETURN_IF_ERROR(scheduler.Extend(batch, {2, 2, 2}));
  for (size_t i = 0; i < running.size(); ++i) {
    const size_t n = running[i].slots.size();
    EXAMPLE_RETURN_IF_ERROR(
        Expect(std::equal(running[i].slots.begin(), running[i].slots.end(),
                          drafted[i].slots.begin()) &&
                   n == before[i].slots.size() + 2,
               "accepted tokens did not keep their draft slots"));
  }
  std::printf("speculative: rollback returned %lld pages, kept 2 tokens each\n",
              static_cast<long long>(*returned));

  // 5. Finish: a request that is done frees its pages (all of them, by its
  //    slots) so that others can use them.
  absl::StatusOr<int64_t> freed = scheduler.Finish(running[2]);
  if (!freed.ok()) return freed.status();
  std::printf("finished c: %lld pages freed\n", static_cast<long long>(*freed));
  batch = {&running[0], &running[1]};

  // 6. Admission under pressure: a new request larger than the free pool is
  //    refused alone with RESOURCE_EXHAUSTED, changing nothing. The
  //    scheduler evicts (preempts) running requests, newest first, freeing
  //    their pages, and retries; an evicted request is recomputed later.
  //
  //    A call larger than the daemon takes at once (--max_batch_tokens
  //    slots) is refused as a whole with INVALID_ARGUMENT before the pool
  //    is looked at, and one larger than the session's ring has room for
  //    is refused as "output ring full" (half the ring always has room
  //    once earlier results are released: a call's slots are contiguous).
  //    So a request can be short of pages only when the free pool is
  //    smaller than one call. On a large pool that is when other running
  //    requests hold the rest: here we admit such requests first
  //    (prefills of at most one call each), as a busy engine would have
  //    them.
  absl::StatusOr<v1::GetStatsResponse> stats = client.GetStats(true);
  if (!stats.ok()) return stats.status();
  int64_t ring_slots = 0;
  for (const v1::SessionStats& session : stats->sessions()) {
    if (session.session_id() == client.session_id()) {
      ring_slots = session.ring_capacity_slots();
    }
  }
  const int64_t call_pages =
      std::min(absl::GetFlag(FLAGS_max_batch_tokens), ring_slots / 2) /
      page_size;
  EXAMPLE_RETURN_IF_ERROR(Expect(
      call_pages >= 8, absl::StrFormat("one call carries %d pages, too few "
                                       "for this example",
                                       call_pages)));
  std::deque<Sequence> busy;  // stable addresses for `batch`
  while (stats->free_pages() > call_pages / 2) {
    const int64_t pages =
        std::min(stats->free_pages() - call_pages / 2, call_pages);
    busy.push_back({absl::StrCat("e", busy.size() + 1), {}});
    EXAMPLE_RETURN_IF_ERROR(
        scheduler.Extend({&busy.back()}, {pages * page_size}));
    batch.push_back(&busy.back());
    stats = client.GetStats();
    if (!stats.ok()) return stats.status();
  }
  if (!busy.empty()) {
    std::printf("busy: %zu more requests running, %lld pages free\n",
                busy.size(), static_cast<long long>(stats->free_pages()));
  }
  Sequence big{"d", {}};
  const int64_t big_tokens = (stats->free_pages() + 4) * page_size;
  int evictions = 0;
  while (true) {
    std::vector<absl::Status> refused;
    EXAMPLE_RETURN_IF_ERROR(scheduler.Extend({&big}, {big_tokens}, &refused));
    if (refused[0].ok()) break;
    if (!absl::IsResourceExhausted(refused[0]) || batch.empty()) {
      return refused[0];
    }
    std::printf("admit d (%lld tokens): %s\n",
                static_cast<long long>(big_tokens),
                std::string(refused[0].message()).c_str());
    Sequence* victim = batch.back();
    batch.pop_back();
    absl::StatusOr<int64_t> evicted = scheduler.Finish(*victim);
    if (!evicted.ok()) return evicted.status();
    ++evictions;
    std::printf("evicted %s: %lld pages freed\n", victim->name.c_str(),
                static_cast<long long>(*evicted));
  }
  std::printf("admitted d after %d eviction(s)\n", evictions);

  // 7. Shutdown: free what is left in one call per step (a FreeGroup),
  //    then close the session. (Closing alone would free the pages too.)
  Client::FreeGroup group = client.BeginFreeGroup();
  group.Add(big.PageSlots(page_size));
  for (Sequence* s : batch) group.Add(s->PageSlots(page_size));
  absl::StatusOr<int64_t> last = group.End();
  if (!last.ok()) return last.status();
  absl::StatusOr<int64_t> used = UsedPages(client);
  if (!used.ok()) return used.status();
  EXAMPLE_RETURN_IF_ERROR(
      Expect(*used == 0, absl::StrFormat("%d pages still used", *used)));
  EXAMPLE_RETURN_IF_ERROR(client.Close());
  std::printf("done: %lld pages freed, pool empty\n",
              static_cast<long long>(*last));
  return absl::OkStatus();
}

}  // namespace
}  // namespace pagealloc::example

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As docs/integration.md says: Debian's Abseil is built with Mutex
  // deadlock detection on, a global lock in every absl::Mutex::Lock (the
  // client library's included); a scheduler turns it off before its
  // threads start.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::Status status = pagealloc::example::Run();
  if (!status.ok()) {
    // A lost session (NOT_FOUND, or UNAVAILABLE once the daemon is gone)
    // means every slot we hold is void: a real scheduler drops its KV state
    // and registers again (docs/integration.md, "Session loss").
    std::fprintf(stderr, "scheduler_example: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
