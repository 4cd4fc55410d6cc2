// pagealloc-bench: the end-to-end load generator and benchmark.
//
// It starts a daemon (or drives --target), measures two floors on the same
// socket and machine (an empty unary gRPC call, grpc.health.v1.Health/Check,
// and the allocator called in-process with no RPC), then runs one phase per
// client count: K worker processes (this binary with --worker) behave like
// schedulers, each with --batch live sequences: decode steps, prefill chunks,
// speculative steps (checkpoint, draft, rollback), frees of finished
// sequences and admission of new ones. Every call's latency goes into a
// log-linear histogram per RPC; workers hand theirs to the coordinator, which
// merges them and adds what only the daemon knows: launches (GetStats), its
// CPU time (/proc/<pid>/stat) and its own stage histograms (/metrics).
//
// The benchmark reports; it fails only when something breaks (a worker's
// error, a daemon that does not start), never on a number.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "allocator/page_pool.h"
#include "bench/health.grpc.pb.h"
#include "bench/latency_histogram.h"
#include "client/client.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "httplib.h"
#include "kernels/cpu_executor.h"
#include "tests/daemon_process.h"
#include "tests/daemon_stats.h"
#include "tests/subprocess.h"
#ifdef PAGEALLOC_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda_executor.h"
#endif

ABSL_FLAG(std::string, target, "",
          "Daemon to drive (e.g. unix:///run/pagealloc/gpu0.sock); empty "
          "starts one on a private Unix socket.");
ABSL_FLAG(std::string, server_binary, "",
          "pagealloc-server to start (default: from this binary's runfiles).");
ABSL_FLAG(std::string, backend, "cpu",
          "cpu or cuda: the started daemon's --backend and the executor of "
          "the in-process floor.");
ABSL_FLAG(int64_t, num_pages, 1 << 20, "Pool size of the started daemon.");
ABSL_FLAG(int64_t, page_size, 16, "Page size of the started daemon.");
ABSL_FLAG(std::vector<std::string>, server_flags, {},
          "Extra flags for the started daemon, comma-separated.");
ABSL_FLAG(int, server_pid, 0,
          "With --target: the daemon's pid, to read its CPU time.");
ABSL_FLAG(std::string, metrics_address, "",
          "With --target: the daemon's metrics host:port.");
ABSL_FLAG(int, clients, 1, "Client processes.");
ABSL_FLAG(std::vector<std::string>, sweep_clients, {},
          "One phase per client count, e.g. 1,2,4,8,16 (overrides --clients).");
ABSL_FLAG(int, batch, 256,
          "Live sequences per client: the requests of one decode step.");
ABSL_FLAG(double, duration_s, 5, "Length of each phase, seconds.");
ABSL_FLAG(int, decode_weight, 80, "Share of steps that decode every sequence.");
ABSL_FLAG(int, prefill_weight, 10,
          "Share of steps that extend --prefill_requests sequences by a "
          "chunk.");
ABSL_FLAG(int, spec_weight, 10,
          "Share of steps that checkpoint, draft --draft_tokens per sequence "
          "and roll back.");
ABSL_FLAG(int, prefill_chunk, 256,
          "Tokens of a prefill chunk (and most tokens a new sequence starts "
          "with).");
ABSL_FLAG(int, prefill_requests, 4, "Sequences extended per prefill step.");
ABSL_FLAG(int, draft_tokens, 4, "Draft tokens per sequence per spec step.");
ABSL_FLAG(int, max_seq_len, 2048,
          "A sequence finishes (its pages are freed) at a random length up "
          "to this; a new one takes its place.");
ABSL_FLAG(bool, async_completion, false,
          "Allocation calls ask for async completion; the client orders its "
          "slot reads after the daemon's completion event.");
ABSL_FLAG(bool, fast_channel, true,
          "Clients send allocation calls through the daemon's fast channel "
          "(shared memory) when it offers one; false: through gRPC.");
ABSL_FLAG(bool, piggyback_ops, true,
          "Clients send the pages of finished sequences and the checkpoint "
          "before a spec step with their next allocation call "
          "(CallOptions.free_pages_first, checkpoint_first) instead of "
          "separate Free and Checkpoint calls.");
ABSL_FLAG(int, client_spin_us, 500,
          "How long a client spins for a fast-channel answer before it "
          "sleeps on a futex (ClientOptions.fast_channel_spin).");
ABSL_FLAG(double, floor_s, 2, "Length of each floor measurement, seconds.");
ABSL_FLAG(std::string, json, "", "Write the results here as JSON.");
ABSL_FLAG(bool, progress, true, "Show one refreshing progress line on stderr.");
ABSL_FLAG(uint64_t, seed, 1, "Random seed (each client adds its index).");
// Internal: the coordinator starts workers with these.
ABSL_FLAG(bool, worker, false, "Internal: run as one client process.");
ABSL_FLAG(int, worker_index, 0, "Internal: this worker's slot.");
ABSL_FLAG(std::string, control_file, "", "Internal: the shared control block.");
ABSL_FLAG(std::string, worker_out, "", "Internal: where to write results.");

namespace pagealloc {
namespace {

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The RPCs a worker makes. Admission and prefill chunks are both
// AllocExtend, as a scheduler sends them.
enum RpcKind { kDecode, kExtend, kFree, kCheckpoint, kRollback, kNumRpcKinds };
constexpr const char* kRpcNames[kNumRpcKinds] = {
    "AllocDecode", "AllocExtend", "Free", "Checkpoint", "Rollback"};

struct RpcStats {
  LatencyHistogram latency;
  int64_t slots = 0;
  int64_t requests = 0;  // batch entries sent (allocation calls)
};

// ---------------------------------------------------------------------------
// The coordinator and its workers share one small file, mapped by all: the
// start and stop flags and each worker's state and call count (for the
// progress line). Plain lock-free atomics in shared memory.

constexpr int kMaxClients = 256;
enum WorkerState : int64_t { kStarting = 0, kReady, kDone, kFailed };

struct Control {
  std::atomic<int64_t> go;
  std::atomic<int64_t> stop;
  struct Worker {
    std::atomic<int64_t> state;
    std::atomic<int64_t> calls;
  } workers[kMaxClients];
};
static_assert(std::atomic<int64_t>::is_always_lock_free,
              "the control block is shared between processes");

absl::StatusOr<Control*> MapControl(const std::string& path, bool create) {
  const int fd =
      open(path.c_str(), create ? O_RDWR | O_CREAT | O_TRUNC : O_RDWR, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path));
  if (create && ftruncate(fd, sizeof(Control)) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("ftruncate ", path));
  }
  void* base =
      mmap(nullptr, sizeof(Control), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED)
    return absl::InternalError(absl::StrCat("mmap ", path));
  return static_cast<Control*>(base);
}

// ---------------------------------------------------------------------------
// The scheduler model: `batch` sequences, each growing to a random target
// length, then freed and replaced. Shared by the workers and the in-process
// floor, so both allocate the same shapes.

struct Sequence {
  bool live = false;
  int64_t len = 0;
  int64_t last_loc = -1;
  int64_t target_len = 0;
  std::vector<int64_t> pages;
};

class SequenceTable {
 public:
  SequenceTable(int batch, int64_t page_size, uint64_t seed)
      : page_size_(page_size), rng_(seed), sequences_(batch) {}

  int size() const { return sequences_.size(); }
  Sequence& operator[](int i) { return sequences_[i]; }
  std::mt19937_64& rng() { return rng_; }
  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  // A new sequence's prompt length and target length.
  void Start(Sequence& s, int64_t prompt, int64_t max_len) {
    s = Sequence();
    s.live = true;
    s.target_len = Uniform(std::min(prompt + 1, max_len), max_len);
  }

  // Records `count` slots (host copies) given to `s` for tokens
  // [s.len, new_len): new pages start where a token opens a page.
  void Apply(Sequence& s, int64_t new_len, const int64_t* slots,
             int64_t count) {
    for (int64_t t = 0; t < count; ++t) {
      if ((s.len + t) % page_size_ == 0)
        s.pages.push_back(slots[t] / page_size_);
    }
    if (count > 0) s.last_loc = slots[count - 1];
    s.len = new_len;
  }

  // Ends `s`, moving its pages to `pages`.
  void Finish(Sequence& s, std::vector<int64_t>* pages) {
    pages->insert(pages->end(), s.pages.begin(), s.pages.end());
    s = Sequence();
  }

 private:
  const int64_t page_size_;
  std::mt19937_64 rng_;
  std::vector<Sequence> sequences_;
};

struct Workload {
  int batch = 256;
  int decode_weight = 80, prefill_weight = 10, spec_weight = 10;
  int prefill_chunk = 256;
  int prefill_requests = 4;
  int draft_tokens = 4;
  int max_seq_len = 2048;
  bool async_completion = false;
  bool piggyback_ops = true;

  static Workload FromFlags() {
    Workload w;
    w.batch = absl::GetFlag(FLAGS_batch);
    w.decode_weight = absl::GetFlag(FLAGS_decode_weight);
    w.prefill_weight = absl::GetFlag(FLAGS_prefill_weight);
    w.spec_weight = absl::GetFlag(FLAGS_spec_weight);
    w.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
    w.prefill_requests = absl::GetFlag(FLAGS_prefill_requests);
    w.draft_tokens = absl::GetFlag(FLAGS_draft_tokens);
    w.max_seq_len = absl::GetFlag(FLAGS_max_seq_len);
    w.async_completion = absl::GetFlag(FLAGS_async_completion);
    w.piggyback_ops = absl::GetFlag(FLAGS_piggyback_ops);
    return w;
  }
};

// ---------------------------------------------------------------------------
// Worker: one scheduler-like client process.

class Worker {
 public:
  Worker(Client* client, const Workload& workload, uint64_t seed,
         std::atomic<int64_t>* calls_counter)
      : client_(client),
        w_(workload),
        page_size_(client->pool().page_size()),
        table_(workload.batch, page_size_, seed),
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
    const int pick = table_.Uniform(0, std::max(total, 1) - 1);
    if (pick < w_.decode_weight || total == 0) return Decode();
    if (pick < w_.decode_weight + w_.prefill_weight) return PrefillChunk();
    return Speculate();
  }

  const RpcStats& stats(RpcKind kind) const { return stats_[kind]; }
  int64_t refused() const { return refused_; }

 private:
  template <typename Call>
  auto Timed(RpcKind kind, Call call) {
    const int64_t start = NowNanos();
    auto result = call();
    stats_[kind].latency.Record(NowNanos() - start);
    calls_counter_->store(++calls_, std::memory_order_relaxed);
    return result;
  }

  // Copies the slots of `a` (one contiguous ring region) to host memory;
  // returns a pointer to request i's first slot via `offsets`.
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
  const int64_t* HostSlots(const RequestSlots& r) const {
    return host_.data() + (r.slots - base_);
  }

  // A refusal for lack of pages ends that sequence (a scheduler would
  // preempt it); anything else is a bug worth stopping for.
  absl::Status Refused(const absl::Status& status, Sequence& s,
                       std::vector<int64_t>* pages) {
    if (status.code() != absl::StatusCode::kResourceExhausted) return status;
    ++refused_;
    table_.Finish(s, pages);
    return absl::OkStatus();
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

  // Applies a decode or extend call's slots to the sequences at `places`
  // (grown to `seq`); finished sequences leave and their pages, with those
  // of sequences refused for lack of pages, go back in one Free.
  absl::Status Consume(RpcKind kind, const absl::StatusOr<Allocation>& a,
                       const std::vector<int>& places,
                       const std::vector<int64_t>& seq) {
    if (!a.ok()) return a.status();
    RETURN_IF_ERROR(Settle(a));
    stats_[kind].requests += places.size();
    RETURN_IF_ERROR(ReadSlots(*a));
    std::vector<int64_t> pages;
    for (size_t k = 0; k < places.size(); ++k) {
      Sequence& s = table_[places[k]];
      if (!(*a)[k].status.ok()) {
        RETURN_IF_ERROR(Refused((*a)[k].status, s, &pages));
        continue;
      }
      table_.Apply(s, seq[k], HostSlots((*a)[k]), (*a)[k].count);
      stats_[kind].slots += (*a)[k].count;
      if (s.len >= s.target_len) table_.Finish(s, &pages);
    }
    client_->Release(*a);
    return FreePages(pages);
  }

  absl::Status Admit() {
    std::vector<int> places;
    std::vector<int64_t> prefix, seq, last;
    for (int i = 0; i < table_.size(); ++i) {
      if (table_[i].live) continue;
      places.push_back(i);
      prefix.push_back(0);
      seq.push_back(table_.Uniform(1, w_.prefill_chunk));
      last.push_back(-1);
    }
    if (places.empty()) return absl::OkStatus();
    absl::StatusOr<Allocation> a = Timed(kExtend, [&] {
      return client_->AllocExtend(prefix, seq, last, NextCallOptions(false));
    });
    if (!a.ok()) return a.status();
    RETURN_IF_ERROR(Settle(a));
    stats_[kExtend].requests += places.size();
    RETURN_IF_ERROR(ReadSlots(*a));
    std::vector<int64_t> pages;
    for (size_t k = 0; k < places.size(); ++k) {
      Sequence& s = table_[places[k]];
      if (!(*a)[k].status.ok()) {
        ++refused_;
        continue;
      }
      table_.Start(s, seq[k], w_.max_seq_len);
      table_.Apply(s, seq[k], HostSlots((*a)[k]), (*a)[k].count);
      stats_[kExtend].slots += (*a)[k].count;
    }
    client_->Release(*a);
    return absl::OkStatus();
  }

  absl::Status Decode() {
    std::vector<int> places;
    std::vector<int64_t> seq, last;
    for (int i = 0; i < table_.size(); ++i) {
      if (!table_[i].live) continue;
      places.push_back(i);
      seq.push_back(table_[i].len + 1);
      last.push_back(table_[i].last_loc);
    }
    if (places.empty()) return absl::OkStatus();
    absl::StatusOr<Allocation> a = Timed(kDecode, [&] {
      return client_->AllocDecode(seq, last, NextCallOptions(false));
    });
    return Consume(kDecode, a, places, seq);
  }

  absl::Status PrefillChunk() {
    std::vector<int> places;
    std::vector<int64_t> prefix, seq, last;
    for (int i = 0; i < table_.size() &&
                    static_cast<int>(places.size()) < w_.prefill_requests;
         ++i) {
      const int k = table_.Uniform(0, table_.size() - 1);
      Sequence& s = table_[k];
      if (!s.live || s.len >= s.target_len) continue;
      bool taken = false;
      for (int p : places) taken |= p == k;
      if (taken) continue;
      places.push_back(k);
      prefix.push_back(s.len);
      seq.push_back(std::min<int64_t>(s.len + w_.prefill_chunk, s.target_len));
      last.push_back(s.last_loc);
    }
    if (places.empty()) return absl::OkStatus();
    absl::StatusOr<Allocation> a = Timed(kExtend, [&] {
      return client_->AllocExtend(prefix, seq, last, NextCallOptions(false));
    });
    return Consume(kExtend, a, places, seq);
  }

  // Speculative decoding: checkpoint, allocate draft slots for every
  // sequence, reject them all (Rollback). The sequences are as before, so
  // the slots need not be read.
  absl::Status Speculate() {
    std::vector<int64_t> prefix, seq, last;
    for (int i = 0; i < table_.size(); ++i) {
      if (!table_[i].live) continue;
      prefix.push_back(table_[i].len);
      seq.push_back(table_[i].len + w_.draft_tokens);
      last.push_back(table_[i].last_loc);
    }
    if (prefix.empty()) return absl::OkStatus();
    if (!w_.piggyback_ops) {
      RETURN_IF_ERROR(
          Timed(kCheckpoint, [&] { return client_->Checkpoint(); }));
    }
    absl::StatusOr<Allocation> a = Timed(kExtend, [&] {
      return client_->AllocExtend(prefix, seq, last,
                                  NextCallOptions(w_.piggyback_ops));
    });
    if (!a.ok()) return a.status();
    RETURN_IF_ERROR(Settle(a));
    stats_[kExtend].requests += prefix.size();
    for (size_t k = 0; k < a->size(); ++k) {
      if ((*a)[k].status.ok()) {
        stats_[kExtend].slots += (*a)[k].count;
      } else if ((*a)[k].status.code() ==
                 absl::StatusCode::kResourceExhausted) {
        ++refused_;
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
  const int64_t page_size_;
  SequenceTable table_;
  std::atomic<int64_t>* const calls_counter_;
  CallOptions options_;
  RpcStats stats_[kNumRpcKinds];
  int64_t calls_ = 0;
  int64_t refused_ = 0;
  std::vector<int64_t> host_;
  // Pages of finished sequences, freed with the next allocation call.
  std::vector<int64_t> pending_free_;
  const int64_t* base_ = nullptr;
};

int WorkerMain() {
  const int index = absl::GetFlag(FLAGS_worker_index);
  absl::StatusOr<Control*> control =
      MapControl(absl::GetFlag(FLAGS_control_file), /*create=*/false);
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
  const Workload workload = Workload::FromFlags();
  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.client_name = absl::StrCat("bench-", index);
  options.fast_channel = absl::GetFlag(FLAGS_fast_channel);
  options.fast_channel_spin =
      absl::Microseconds(absl::GetFlag(FLAGS_client_spin_us));
  // Room for the largest call (a spec step over every sequence, or an
  // admission of every sequence) a few times over; we release each call's
  // region right after reading it.
  options.ring_capacity_slots = std::max<int64_t>(
      1 << 16, 4 * int64_t{workload.batch} *
                   std::max(workload.prefill_chunk, workload.draft_tokens));
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return fail(client.status());
  Worker worker(client->get(), workload,
                absl::GetFlag(FLAGS_seed) + static_cast<uint64_t>(index),
                &me.calls);
  if (absl::Status s = worker.Warm(); !s.ok()) return fail(s);
  me.state.store(kReady);
  while ((*control)->go.load() == 0) absl::SleepFor(absl::Microseconds(100));
  while ((*control)->stop.load(std::memory_order_relaxed) == 0) {
    if (absl::Status s = worker.Step(); !s.ok()) return fail(s);
  }
  std::ofstream out(absl::GetFlag(FLAGS_worker_out));
  for (int r = 0; r < kNumRpcKinds; ++r) {
    const RpcStats& stats = worker.stats(static_cast<RpcKind>(r));
    out << kRpcNames[r] << " " << stats.slots << " " << stats.requests << " "
        << stats.latency.Serialize() << "\n";
  }
  out << "refused " << worker.refused() << "\n";
  out.close();
  if (!out) return fail(absl::InternalError("cannot write --worker_out"));
  // Done before the session closes: the coordinator's "after" snapshot must
  // not include our final frees.
  me.state.store(kDone);
  return 0;
}

// ---------------------------------------------------------------------------
// Floors.

struct Latency {
  LatencyHistogram histogram;
  double seconds = 0;
};

// grpc.health.v1.Health/Check, one call at a time on one channel: what any
// unary call costs on this socket before the daemon does any work.
absl::StatusOr<Latency> MeasureHealthCheck(const std::string& target,
                                           double seconds) {
  // The client library's channel, so the floor differs from an allocation
  // call only in what the call carries and does.
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateCustomChannel(
      target, grpc::InsecureChannelCredentials(), ClientChannelArguments()));
  Latency result;
  grpc::health::v1::HealthCheckRequest request;
  const int64_t start = NowNanos();
  const int64_t end = start + static_cast<int64_t>(seconds * 1e9);
  for (int i = 0;; ++i) {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckResponse response;
    const int64_t t0 = NowNanos();
    grpc::Status status = stub->Check(&context, request, &response);
    const int64_t t1 = NowNanos();
    if (!status.ok()) {
      return absl::UnavailableError(
          absl::StrCat("Health/Check: ", status.error_message()));
    }
    // The first calls open the connection; keep them out.
    if (i >= 100) result.histogram.Record(t1 - t0);
    if (t1 >= end && result.histogram.count() > 0) break;
  }
  result.seconds = (NowNanos() - start) / 1e9;
  return result;
}

// Where the in-process executor writes, and how we read it back.
struct InProcessExecutor {
  std::unique_ptr<PlanExecutor> executor;
  int64_t* destination = nullptr;  // host or device memory
  std::vector<int64_t> host;
  bool on_device = false;
  std::string name;

  ~InProcessExecutor() {
#ifdef PAGEALLOC_HAVE_CUDA
    if (on_device) cudaFree(destination);
#endif
  }
  absl::Status CopyToHost(int64_t count) {
#ifdef PAGEALLOC_HAVE_CUDA
    if (on_device) {
      if (cudaMemcpy(host.data(), destination, count * sizeof(int64_t),
                     cudaMemcpyDeviceToHost) != cudaSuccess) {
        return absl::InternalError("cudaMemcpy of the in-process slots");
      }
    }
#endif
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<InProcessExecutor>> MakeInProcessExecutor(
    const std::string& backend, int64_t capacity_slots) {
  auto result = std::make_unique<InProcessExecutor>();
  result->host.resize(capacity_slots);
  if (backend == "cuda") {
#ifdef PAGEALLOC_HAVE_CUDA
    ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutor> cuda,
                     CudaExecutor::Create(CudaExecutorOptions()));
    result->executor = std::move(cuda);
    void* device = nullptr;
    if (cudaMalloc(&device, capacity_slots * sizeof(int64_t)) != cudaSuccess) {
      return absl::InternalError("cudaMalloc for the in-process slots");
    }
    result->destination = static_cast<int64_t*>(device);
    result->on_device = true;
    result->name = "cuda";
    return result;
#else
    return absl::FailedPreconditionError(
        "--backend=cuda: this benchmark was built without CUDA");
#endif
  }
  result->executor = std::make_unique<CpuExecutor>();
  result->destination = result->host.data();
  result->name = "cpu";
  return result;
}

// The same decode steps a worker sends as AllocDecode (`batch` sequences,
// the same length model), made directly on a PagePool: planning, the
// executor's launch and its completion (Allocate + Synchronize, what the
// daemon's batcher does per launch in sync mode), no RPC. Admission and
// frees happen outside the timed region.
absl::StatusOr<Latency> MeasureInProcessDecode(
    const std::string& backend, const Workload& w, int64_t num_pages,
    int64_t page_size, double seconds, std::string* executor_name) {
  const int64_t capacity =
      int64_t{w.batch} * std::max<int64_t>(w.prefill_chunk, 1);
  ASSIGN_OR_RETURN(std::unique_ptr<InProcessExecutor> ex,
                   MakeInProcessExecutor(backend, capacity));
  *executor_name = ex->name;
  PoolOptions pool_options;
  pool_options.num_pages = num_pages;
  pool_options.page_size = page_size;
  ASSIGN_OR_RETURN(std::unique_ptr<PagePool> pool,
                   PagePool::Create(pool_options, ex->executor.get()));
  constexpr OwnerId kOwner = 1;
  RETURN_IF_ERROR(pool->AddOwner(kOwner, 0));
  SequenceTable table(w.batch, page_size, absl::GetFlag(FLAGS_seed));

  // Runs one batch; fills `results` and the host copy of the slots.
  auto run = [&](std::vector<AllocRequest>& requests,
                 std::vector<AllocResult>* results,
                 int64_t* nanos) -> absl::Status {
    int64_t offset = 0;
    for (AllocRequest& r : requests) {
      r.owner = kOwner;
      r.destination = ex->destination + offset;
      offset += r.seq_len -
                (r.kind == RequestKind::kDecode ? r.seq_len - 1 : r.prefix_len);
    }
    const int64_t t0 = NowNanos();
    *results = pool->Allocate(requests);
    RETURN_IF_ERROR(ex->executor->Synchronize());
    *nanos = NowNanos() - t0;
    return ex->CopyToHost(offset);
  };

  Latency result;
  std::vector<AllocRequest> requests;
  std::vector<AllocResult> results;
  std::vector<int> places;
  const int64_t start = NowNanos();
  const int64_t end = start + static_cast<int64_t>(seconds * 1e9);
  for (int step = 0;; ++step) {
    // Admit into empty places (untimed).
    requests.clear();
    places.clear();
    for (int i = 0; i < table.size(); ++i) {
      if (table[i].live) continue;
      AllocRequest r;
      r.kind = RequestKind::kExtend;
      r.index = places.size();
      r.seq_len = table.Uniform(1, w.prefill_chunk);
      requests.push_back(r);
      places.push_back(i);
    }
    int64_t nanos = 0;
    if (!requests.empty()) {
      RETURN_IF_ERROR(run(requests, &results, &nanos));
      int64_t offset = 0;
      for (size_t k = 0; k < places.size(); ++k) {
        if (!results[k].status.ok()) return results[k].status;
        Sequence& s = table[places[k]];
        table.Start(s, requests[k].seq_len, w.max_seq_len);
        table.Apply(s, requests[k].seq_len, ex->host.data() + offset,
                    results[k].num_slots);
        offset += requests[k].seq_len;
      }
    }
    // One decode step of every sequence (timed).
    requests.clear();
    places.clear();
    for (int i = 0; i < table.size(); ++i) {
      AllocRequest r;
      r.kind = RequestKind::kDecode;
      r.index = i;
      r.seq_len = table[i].len + 1;
      r.last_loc = table[i].last_loc;
      requests.push_back(r);
      places.push_back(i);
    }
    RETURN_IF_ERROR(run(requests, &results, &nanos));
    // The first steps load code and warm caches; keep them out.
    if (step >= 20) result.histogram.Record(nanos);
    std::vector<int64_t> pages;
    for (size_t k = 0; k < places.size(); ++k) {
      if (!results[k].status.ok()) return results[k].status;
      Sequence& s = table[places[k]];
      table.Apply(s, requests[k].seq_len, ex->host.data() + k, 1);
      if (s.len >= s.target_len) table.Finish(s, &pages);
    }
    if (!pages.empty())
      RETURN_IF_ERROR(pool->FreePages(kOwner, pages).status());
    if (NowNanos() >= end && result.histogram.count() > 0) break;
  }
  result.seconds = (NowNanos() - start) / 1e9;
  return result;
}

// ---------------------------------------------------------------------------
// The daemon: started here or given.

struct DaemonHandle {
  testing::Subprocess process;  // empty with --target
  std::string target;
  int pid = 0;
  std::string metrics_address;  // host:port, or empty
  std::string log_path;
};

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : "";
}

// pagealloc-server beside us: --server_binary, else our runfiles, else the
// bazel-bin layout (bench/ and server/ side by side).
std::string FindServer() {
  std::string flag = absl::GetFlag(FLAGS_server_binary);
  if (!flag.empty()) return flag;
  const std::string self = SelfPath();
  std::vector<std::string> candidates;
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (const char* dir = std::getenv(var)) {
      candidates.push_back(
          absl::StrCat(dir, "/pagealloc/server/pagealloc-server"));
    }
  }
  candidates.push_back(self + ".runfiles/pagealloc/server/pagealloc-server");
  candidates.push_back(self.substr(0, self.rfind('/')) +
                       "/../server/pagealloc-server");
  for (const std::string& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return "";
}

// A TCP port nothing listens on right now, for the daemon's /metrics.
absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 ||
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return absl::InternalError("cannot find a free port for /metrics");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

absl::StatusOr<DaemonHandle> StartOrAttach(const std::string& dir) {
  DaemonHandle daemon;
  if (!absl::GetFlag(FLAGS_target).empty()) {
    daemon.target = absl::GetFlag(FLAGS_target);
    daemon.pid = absl::GetFlag(FLAGS_server_pid);
    daemon.metrics_address = absl::GetFlag(FLAGS_metrics_address);
    RETURN_IF_ERROR(testing::DaemonStats(daemon.target).status());
    return daemon;
  }
  const std::string server = FindServer();
  if (server.empty()) {
    return absl::NotFoundError(
        "pagealloc-server not found; pass --server_binary or --target");
  }
  ASSIGN_OR_RETURN(int port, FreePort());
  daemon.target = absl::StrCat("unix://", dir, "/daemon.sock");
  daemon.metrics_address = absl::StrCat("127.0.0.1:", port);
  daemon.log_path = dir + "/daemon.log";
  std::vector<std::string> argv = {
      server,
      "--backend=" + absl::GetFlag(FLAGS_backend),
      "--listen=" + daemon.target,
      "--metrics_host=127.0.0.1",
      absl::StrCat("--metrics_port=", port),
      absl::StrCat("--num_pages=", absl::GetFlag(FLAGS_num_pages)),
      absl::StrCat("--page_size=", absl::GetFlag(FLAGS_page_size)),
      "--log_level=warn"};
  for (const std::string& f : absl::GetFlag(FLAGS_server_flags)) {
    argv.push_back(f);
  }
  ASSIGN_OR_RETURN(daemon.process,
                   testing::Subprocess::Start(argv, daemon.log_path));
  daemon.pid = daemon.process.pid();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!testing::DaemonStats(daemon.target).ok()) {
    if (!daemon.process.running() || absl::Now() > deadline) {
      return absl::UnavailableError(
          absl::StrCat("pagealloc-server did not start:\n",
                       testing::ReadLog(daemon.log_path)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return daemon;
}

// utime + stime of `pid` in seconds (fields 14 and 15 of /proc/<pid>/stat);
// -1 when unknown.
double CpuSeconds(int pid) {
  if (pid <= 0) return -1;
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // The command name (field 2) may hold spaces; count fields after its ')'.
  const size_t close_paren = text.rfind(')');
  if (close_paren == std::string::npos) return -1;
  std::vector<std::string> fields =
      absl::StrSplit(text.substr(close_paren + 2), ' ');
  int64_t utime = 0, stime = 0;
  // fields[0] is field 3 (state), so field 14 is fields[11].
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime)) {
    return -1;
  }
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

// The daemon's /metrics as "name{labels}" -> value.
std::map<std::string, double> ScrapeMetrics(const std::string& address) {
  std::map<std::string, double> values;
  if (address.empty()) return values;
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return values;
  }
  httplib::Client http(address.substr(0, colon), port);
  http.set_read_timeout(5, 0);
  httplib::Result response = http.Get("/metrics");
  if (!response || response->status != 200) return values;
  for (absl::string_view line : absl::StrSplit(response->body, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space == absl::string_view::npos ||
        !absl::SimpleAtod(line.substr(space + 1), &value)) {
      continue;
    }
    values[std::string(line.substr(0, space))] = value;
  }
  return values;
}

struct Snapshot {
  v1::GetStatsResponse stats;
  double cpu_seconds = -1;
  std::map<std::string, double> metrics;
};

absl::StatusOr<Snapshot> TakeSnapshot(const DaemonHandle& daemon) {
  Snapshot s;
  ASSIGN_OR_RETURN(s.stats, testing::DaemonStats(daemon.target));
  s.cpu_seconds = CpuSeconds(daemon.pid);
  s.metrics = ScrapeMetrics(daemon.metrics_address);
  return s;
}

// ---------------------------------------------------------------------------
// Phases.

struct PhaseResult {
  int clients = 0;
  double seconds = 0;
  RpcStats rpcs[kNumRpcKinds];
  int64_t refused = 0;
  int64_t launches = 0;
  int64_t alloc_calls = 0;
  double server_cpu_seconds = -1;
  // Means of the daemon's own histograms over the phase (seconds), -1 when
  // its /metrics could not be read.
  double server_decode_rpc_mean = -1;
  double server_queue_wait_mean = -1;
  double server_execute_mean = -1;
  double server_complete_mean = -1;
  double server_batch_requests_mean = -1;

  int64_t total_calls() const {
    int64_t n = 0;
    for (const RpcStats& r : rpcs) n += r.latency.count();
    return n;
  }
};

double MetricMean(const Snapshot& before, const Snapshot& after,
                  const std::string& name, const std::string& labels) {
  const std::string sum = absl::StrCat(name, "_sum", labels);
  const std::string count = absl::StrCat(name, "_count", labels);
  if (!after.metrics.count(sum) || !after.metrics.count(count)) return -1;
  auto get = [](const Snapshot& s, const std::string& key) {
    auto it = s.metrics.find(key);
    return it == s.metrics.end() ? 0.0 : it->second;
  };
  const double n = get(after, count) - get(before, count);
  return n > 0 ? (get(after, sum) - get(before, sum)) / n : -1;
}

class Phase {
 public:
  Phase(const DaemonHandle& daemon, const std::string& dir, int clients,
        int number, int of)
      : daemon_(daemon),
        dir_(dir),
        clients_(clients),
        number_(number),
        of_(of) {}

  absl::StatusOr<PhaseResult> Run() {
    const std::string control_path = absl::StrCat(dir_, "/control-", number_);
    ASSIGN_OR_RETURN(Control * control, MapControl(control_path, true));
    std::vector<testing::Subprocess> workers;
    std::vector<std::string> outs, logs;
    const std::string self = SelfPath();
    for (int i = 0; i < clients_; ++i) {
      outs.push_back(absl::StrCat(dir_, "/worker-", number_, "-", i, ".out"));
      logs.push_back(absl::StrCat(dir_, "/worker-", number_, "-", i, ".log"));
      std::vector<std::string> argv = {
          self,
          "--worker",
          "--target=" + daemon_.target,
          absl::StrCat("--worker_index=", i),
          "--control_file=" + control_path,
          "--worker_out=" + outs.back(),
          absl::StrCat("--seed=", absl::GetFlag(FLAGS_seed) + 1000 * number_)};
      for (const char* name :
           {"batch", "decode_weight", "prefill_weight", "spec_weight",
            "prefill_chunk", "prefill_requests", "draft_tokens", "max_seq_len",
            "async_completion", "fast_channel", "client_spin_us",
            "piggyback_ops"}) {
        argv.push_back(absl::StrCat("--", name, "=", FlagValue(name)));
      }
      ASSIGN_OR_RETURN(testing::Subprocess worker,
                       testing::Subprocess::Start(argv, logs.back()));
      workers.push_back(std::move(worker));
    }
    // Wait until every worker has connected and admitted its sequences.
    RETURN_IF_ERROR(WaitAll(control, kReady, logs, absl::Seconds(60)));
    ASSIGN_OR_RETURN(Snapshot before, TakeSnapshot(daemon_));
    const double duration = absl::GetFlag(FLAGS_duration_s);
    const int64_t start = NowNanos();
    control->go.store(1);
    int64_t last_calls = 0, last_time = start;
    double rate = 0;
    while (NowNanos() - start < duration * 1e9) {
      absl::SleepFor(absl::Milliseconds(250));
      int64_t calls = 0;
      for (int i = 0; i < clients_; ++i)
        calls += control->workers[i].calls.load();
      const int64_t now = NowNanos();
      rate = (calls - last_calls) / ((now - last_time) / 1e9);
      last_calls = calls;
      last_time = now;
      if (absl::GetFlag(FLAGS_progress)) {
        std::fprintf(stderr,
                     "\r[phase %d/%d] %d clients  %5.1f/%.1f s  %lld calls  "
                     "%.0f calls/s    ",
                     number_, of_, clients_, (now - start) / 1e9, duration,
                     static_cast<long long>(calls), rate);
      }
      for (int i = 0; i < clients_; ++i) {
        if (control->workers[i].state.load() == kFailed) {
          return WorkerFailure(i, logs[i]);
        }
      }
    }
    control->stop.store(1);
    RETURN_IF_ERROR(WaitAll(control, kDone, logs, absl::Seconds(60)));
    PhaseResult result;
    result.clients = clients_;
    result.seconds = (NowNanos() - start) / 1e9;
    if (absl::GetFlag(FLAGS_progress)) std::fprintf(stderr, "\n");
    ASSIGN_OR_RETURN(Snapshot after, TakeSnapshot(daemon_));
    for (int i = 0; i < clients_; ++i) {
      absl::StatusOr<int> status = workers[i].Wait(absl::Seconds(30));
      if (!status.ok() || *status != 0) return WorkerFailure(i, logs[i]);
      RETURN_IF_ERROR(ReadWorker(outs[i], &result));
    }
    munmap(control, sizeof(Control));
    result.launches =
        after.stats.launches_total() - before.stats.launches_total();
    result.alloc_calls = result.rpcs[kDecode].latency.count() +
                         result.rpcs[kExtend].latency.count();
    if (before.cpu_seconds >= 0 && after.cpu_seconds >= 0) {
      result.server_cpu_seconds = after.cpu_seconds - before.cpu_seconds;
    }
    result.server_decode_rpc_mean =
        MetricMean(before, after, "pagealloc_rpc_duration_seconds",
                   "{rpc=\"AllocDecode\"}");
    result.server_queue_wait_mean =
        MetricMean(before, after, "pagealloc_queue_wait_seconds", "");
    result.server_execute_mean =
        MetricMean(before, after, "pagealloc_execute_seconds", "");
    result.server_complete_mean =
        MetricMean(before, after, "pagealloc_complete_seconds", "");
    result.server_batch_requests_mean =
        MetricMean(before, after, "pagealloc_batch_requests", "");
    return result;
  }

 private:
  static std::string FlagValue(const std::string& name) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    return flag == nullptr ? "" : flag->CurrentValue();
  }

  absl::Status WorkerFailure(int i, const std::string& log) {
    return absl::InternalError(
        absl::StrFormat("worker %d of phase %d failed:\n%s", i, number_,
                        testing::ReadLog(log)));
  }

  absl::Status WaitAll(Control* control, WorkerState state,
                       const std::vector<std::string>& logs,
                       absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    for (int i = 0; i < clients_; ++i) {
      while (control->workers[i].state.load() != state) {
        if (control->workers[i].state.load() == kFailed) {
          return WorkerFailure(i, logs[i]);
        }
        if (absl::Now() > deadline) {
          return absl::DeadlineExceededError(absl::StrFormat(
              "worker %d of phase %d did not get ready in time:\n%s", i,
              number_, testing::ReadLog(logs[i])));
        }
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ReadWorker(const std::string& path, PhaseResult* result) {
    std::ifstream in(path);
    std::string line;
    int rpcs = 0;
    while (std::getline(in, line)) {
      std::vector<std::string> head =
          absl::StrSplit(line, absl::MaxSplits(' ', 3));
      if (head.size() == 2 && head[0] == "refused") {
        int64_t n = 0;
        if (!absl::SimpleAtoi(head[1], &n)) break;
        result->refused += n;
        continue;
      }
      for (int r = 0; r < kNumRpcKinds && head.size() == 4; ++r) {
        if (head[0] != kRpcNames[r]) continue;
        int64_t slots = 0, requests = 0;
        ASSIGN_OR_RETURN(LatencyHistogram h, LatencyHistogram::Parse(head[3]));
        if (!absl::SimpleAtoi(head[1], &slots) ||
            !absl::SimpleAtoi(head[2], &requests)) {
          break;
        }
        result->rpcs[r].latency.Merge(h);
        result->rpcs[r].slots += slots;
        result->rpcs[r].requests += requests;
        ++rpcs;
      }
    }
    if (rpcs != kNumRpcKinds) {
      return absl::DataLossError(absl::StrCat("bad worker output ", path));
    }
    return absl::OkStatus();
  }

  const DaemonHandle& daemon_;
  const std::string dir_;
  const int clients_, number_, of_;
};

// ---------------------------------------------------------------------------
// Reporting.

double Us(int64_t nanos) { return nanos / 1e3; }
double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

constexpr double kQuantiles[] = {0.5,  0.75,  0.9,   0.95,
                                 0.99, 0.995, 0.999, 0.9999};

std::string LatencyJson(const LatencyHistogram& h) {
  std::vector<std::string> curve;
  for (double q : kQuantiles) {
    curve.push_back(absl::StrFormat("[%g, %.3f]", q, Us(h.Percentile(q))));
  }
  return absl::StrFormat(
      "\"count\": %d, \"mean_us\": %.3f, \"p50_us\": %.3f, \"p90_us\": %.3f, "
      "\"p99_us\": %.3f, \"p999_us\": %.3f, \"max_us\": %.3f, "
      "\"percentiles_us\": [%s]",
      h.count(), h.mean_nanos() / 1e3, Us(h.Percentile(0.5)),
      Us(h.Percentile(0.9)), Us(h.Percentile(0.99)), Us(h.Percentile(0.999)),
      Us(h.max_nanos()), absl::StrJoin(curve, ", "));
}

struct Floors {
  Latency health;
  Latency in_process;
  std::string executor;
};

// -1 (unknown) stays -1; seconds become microseconds.
double MetricUs(double seconds) { return seconds < 0 ? -1 : seconds * 1e6; }

std::string PhaseJson(const PhaseResult& p, const Floors& floors) {
  std::vector<std::string> rpcs;
  for (int r = 0; r < kNumRpcKinds; ++r) {
    const RpcStats& s = p.rpcs[r];
    rpcs.push_back(absl::StrFormat(
        "\"%s\": {\"calls_per_s\": %.1f, \"slots_per_s\": %.1f, \"slots\": "
        "%d, %s}",
        kRpcNames[r], s.latency.count() / p.seconds, s.slots / p.seconds,
        s.slots, LatencyJson(s.latency)));
  }
  const LatencyHistogram& decode = p.rpcs[kDecode].latency;
  const double cpu_us_per_rpc =
      p.server_cpu_seconds < 0
          ? -1
          : Ratio(p.server_cpu_seconds * 1e6, p.total_calls());
  const double cpu_us_per_alloc =
      p.server_cpu_seconds < 0
          ? -1
          : Ratio(p.server_cpu_seconds * 1e6, p.alloc_calls);
  return absl::StrFormat(
      "{\"clients\": %d, \"async_completion\": %s, \"seconds\": %.3f, "
      "\"calls\": %d, \"calls_per_s\": %.1f, \"alloc_calls\": %d, "
      "\"alloc_calls_per_s\": %.1f, \"alloc_slots_per_s\": %.1f, "
      "\"launches\": %d, \"launches_per_s\": %.1f, \"calls_per_launch\": %.3f, "
      "\"requests_per_launch\": %.3f, \"refused_requests\": %d, "
      "\"server_cpu_s\": %.3f, \"server_cpu_us_per_rpc\": %.3f, "
      "\"server_cpu_us_per_alloc_call\": %.3f, "
      "\"server_metrics\": {\"alloc_decode_rpc_mean_us\": %.3f, "
      "\"queue_wait_mean_us\": %.3f, \"execute_mean_us\": %.3f, "
      "\"complete_mean_us\": %.3f, \"batch_requests_mean\": %.3f}, "
      "\"ratios\": {\"decode_p50_vs_health_p50\": %.3f, "
      "\"decode_p99_vs_health_p99\": %.3f, "
      "\"decode_p50_vs_in_process_p50\": %.3f, "
      "\"decode_p99_vs_in_process_p99\": %.3f}, "
      "\"rpcs\": {%s}}",
      p.clients, absl::GetFlag(FLAGS_async_completion) ? "true" : "false",
      p.seconds, p.total_calls(), p.total_calls() / p.seconds, p.alloc_calls,
      p.alloc_calls / p.seconds,
      (p.rpcs[kDecode].slots + p.rpcs[kExtend].slots) / p.seconds, p.launches,
      p.launches / p.seconds, Ratio(p.alloc_calls, p.launches),
      Ratio(p.rpcs[kDecode].requests + p.rpcs[kExtend].requests, p.launches),
      p.refused, p.server_cpu_seconds, cpu_us_per_rpc, cpu_us_per_alloc,
      MetricUs(p.server_decode_rpc_mean), MetricUs(p.server_queue_wait_mean),
      MetricUs(p.server_execute_mean), MetricUs(p.server_complete_mean),
      p.server_batch_requests_mean,
      Ratio(decode.Percentile(0.5), floors.health.histogram.Percentile(0.5)),
      Ratio(decode.Percentile(0.99), floors.health.histogram.Percentile(0.99)),
      Ratio(decode.Percentile(0.5),
            floors.in_process.histogram.Percentile(0.5)),
      Ratio(decode.Percentile(0.99),
            floors.in_process.histogram.Percentile(0.99)),
      absl::StrJoin(rpcs, ", "));
}

void PrintLatencyRow(const char* name, const LatencyHistogram& h,
                     double seconds) {
  std::printf("%-28s %9lld %10.0f %8.1f %8.1f %8.1f %8.1f\n", name,
              static_cast<long long>(h.count()), h.count() / seconds,
              Us(h.Percentile(0.5)), Us(h.Percentile(0.9)),
              Us(h.Percentile(0.99)), Us(h.Percentile(0.999)));
}

void PrintReport(const Floors& floors, const std::vector<PhaseResult>& phases,
                 const Workload& w) {
  const char* header = "%-28s %9s %10s %8s %8s %8s %8s\n";
  std::printf("\n== floors (same socket, same machine)\n");
  std::printf(header, "", "calls", "calls/s", "p50 us", "p90 us", "p99 us",
              "p99.9 us");
  PrintLatencyRow("Health/Check (empty unary)", floors.health.histogram,
                  floors.health.seconds);
  const std::string in_process =
      absl::StrFormat("in-process decode(%d) %s", w.batch, floors.executor);
  PrintLatencyRow(in_process.c_str(), floors.in_process.histogram,
                  floors.in_process.seconds);
  for (const PhaseResult& p : phases) {
    std::printf("\n== %d client(s), batch %d, %s completion, %.1f s\n",
                p.clients, w.batch, w.async_completion ? "async" : "sync",
                p.seconds);
    std::printf(header, "rpc", "calls", "calls/s", "p50 us", "p90 us", "p99 us",
                "p99.9 us");
    for (int r = 0; r < kNumRpcKinds; ++r) {
      PrintLatencyRow(kRpcNames[r], p.rpcs[r].latency, p.seconds);
    }
    std::printf(
        "allocation calls/s %.0f, slots/s %.0f, launches/s %.0f, "
        "calls/launch %.2f, requests/launch %.1f, refused %lld\n",
        p.alloc_calls / p.seconds,
        (p.rpcs[kDecode].slots + p.rpcs[kExtend].slots) / p.seconds,
        p.launches / p.seconds, Ratio(p.alloc_calls, p.launches),
        Ratio(p.rpcs[kDecode].requests + p.rpcs[kExtend].requests, p.launches),
        static_cast<long long>(p.refused));
    if (p.server_cpu_seconds >= 0) {
      std::printf(
          "server CPU %.2f s: %.1f us per RPC, %.1f us per "
          "allocation call\n",
          p.server_cpu_seconds,
          Ratio(p.server_cpu_seconds * 1e6, p.total_calls()),
          Ratio(p.server_cpu_seconds * 1e6, p.alloc_calls));
    }
    if (p.server_execute_mean >= 0) {
      std::printf(
          "daemon means: AllocDecode rpc_duration %.1f us, "
          "queue_wait %.1f us, execute %.1f us (completing %.1f us)\n",
          MetricUs(p.server_decode_rpc_mean),
          MetricUs(p.server_queue_wait_mean), MetricUs(p.server_execute_mean),
          MetricUs(p.server_complete_mean));
    }
    const LatencyHistogram& d = p.rpcs[kDecode].latency;
    std::printf(
        "AllocDecode p50 = %.2fx Health/Check p50, %.2fx in-process; "
        "p99 = %.2fx, %.2fx\n",
        Ratio(d.Percentile(0.5), floors.health.histogram.Percentile(0.5)),
        Ratio(d.Percentile(0.5), floors.in_process.histogram.Percentile(0.5)),
        Ratio(d.Percentile(0.99), floors.health.histogram.Percentile(0.99)),
        Ratio(d.Percentile(0.99),
              floors.in_process.histogram.Percentile(0.99)));
  }
  if (phases.size() > 1) {
    std::printf("\n== sweep\n%8s %14s %12s %13s %12s %12s\n", "clients",
                "alloc calls/s", "slots/s", "calls/launch", "decode p50",
                "decode p99");
    for (const PhaseResult& p : phases) {
      const LatencyHistogram& d = p.rpcs[kDecode].latency;
      std::printf("%8d %14.0f %12.0f %13.2f %12.1f %12.1f\n", p.clients,
                  p.alloc_calls / p.seconds,
                  (p.rpcs[kDecode].slots + p.rpcs[kExtend].slots) / p.seconds,
                  Ratio(p.alloc_calls, p.launches), Us(d.Percentile(0.5)),
                  Us(d.Percentile(0.99)));
    }
  }
}

absl::Status WriteJson(const std::string& path, const DaemonHandle& daemon,
                       const Floors& floors,
                       const std::vector<PhaseResult>& phases,
                       const Workload& w) {
  std::vector<std::string> phase_json;
  for (const PhaseResult& p : phases)
    phase_json.push_back(PhaseJson(p, floors));
  const std::string text = absl::StrFormat(
      "{\n\"config\": {\"backend\": \"%s\", \"target\": \"%s\", "
      "\"batch\": %d, \"duration_s\": %g, \"decode_weight\": %d, "
      "\"prefill_weight\": %d, \"spec_weight\": %d, \"prefill_chunk\": %d, "
      "\"prefill_requests\": %d, \"draft_tokens\": %d, \"max_seq_len\": %d, "
      "\"async_completion\": %s, \"fast_channel\": %s, "
      "\"piggyback_ops\": %s, \"page_size\": %d, "
      "\"num_pages\": %d},\n"
      "\"floors\": {\"health_check\": {%s},\n"
      "  \"in_process_decode\": {\"executor\": \"%s\", %s}},\n"
      "\"phases\": [\n%s\n]\n}\n",
      absl::GetFlag(FLAGS_backend), daemon.target, w.batch,
      absl::GetFlag(FLAGS_duration_s), w.decode_weight, w.prefill_weight,
      w.spec_weight, w.prefill_chunk, w.prefill_requests, w.draft_tokens,
      w.max_seq_len, w.async_completion ? "true" : "false",
      absl::GetFlag(FLAGS_fast_channel) ? "true" : "false",
      w.piggyback_ops ? "true" : "false", absl::GetFlag(FLAGS_page_size),
      absl::GetFlag(FLAGS_num_pages), LatencyJson(floors.health.histogram),
      floors.executor, LatencyJson(floors.in_process.histogram),
      absl::StrJoin(phase_json, ",\n"));
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status CoordinatorMain() {
  std::vector<int> client_counts;
  for (const std::string& c : absl::GetFlag(FLAGS_sweep_clients)) {
    int n = 0;
    if (!absl::SimpleAtoi(c, &n) || n < 1 || n > kMaxClients) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sweep_clients: bad count '", c, "'"));
    }
    client_counts.push_back(n);
  }
  if (client_counts.empty())
    client_counts.push_back(absl::GetFlag(FLAGS_clients));
  if (client_counts.front() < 1 || client_counts.front() > kMaxClients) {
    return absl::InvalidArgumentError(
        absl::StrCat("--clients must be 1..", kMaxClients));
  }
  const Workload w = Workload::FromFlags();
  if (w.batch < 1 || w.prefill_chunk < 1 || w.max_seq_len < 2 ||
      w.draft_tokens < 1) {
    return absl::InvalidArgumentError(
        "--batch, --prefill_chunk, --draft_tokens must be >= 1 and "
        "--max_seq_len >= 2");
  }
  // Unix socket paths are limited to 107 bytes: a short private directory.
  char pattern[] = "/tmp/pagealloc-bench-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    return absl::InternalError("mkdtemp for the benchmark's socket");
  }
  const std::string dir = pattern;
  ASSIGN_OR_RETURN(DaemonHandle daemon, StartOrAttach(dir));

  Floors floors;
  if (absl::GetFlag(FLAGS_progress)) {
    std::fprintf(stderr, "measuring floors (%.1f s each)...\n",
                 absl::GetFlag(FLAGS_floor_s));
  }
  ASSIGN_OR_RETURN(
      floors.health,
      MeasureHealthCheck(daemon.target, absl::GetFlag(FLAGS_floor_s)));
  ASSIGN_OR_RETURN(
      floors.in_process,
      MeasureInProcessDecode(absl::GetFlag(FLAGS_backend), w,
                             absl::GetFlag(FLAGS_num_pages),
                             absl::GetFlag(FLAGS_page_size),
                             absl::GetFlag(FLAGS_floor_s), &floors.executor));

  std::vector<PhaseResult> phases;
  for (size_t i = 0; i < client_counts.size(); ++i) {
    Phase phase(daemon, dir, client_counts[i], i + 1, client_counts.size());
    ASSIGN_OR_RETURN(PhaseResult result, phase.Run());
    phases.push_back(std::move(result));
  }
  PrintReport(floors, phases, w);
  if (!absl::GetFlag(FLAGS_json).empty()) {
    RETURN_IF_ERROR(
        WriteJson(absl::GetFlag(FLAGS_json), daemon, floors, phases, w));
  }
  if (daemon.process.pid() > 0) {
    daemon.process.Signal(SIGTERM);
    absl::StatusOr<int> exit = daemon.process.Wait(absl::Seconds(20));
    if (!exit.ok() || *exit != 0) {
      return absl::InternalError(absl::StrCat(
          "pagealloc-server did not exit cleanly (",
          exit.ok() ? testing::DescribeWaitStatus(*exit) : "still running",
          "):\n", testing::ReadLog(daemon.log_path)));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace pagealloc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As the daemon does (server/main.cc): Debian's Abseil leaves Mutex
  // deadlock detection on, a global lock in every Lock; a scheduler linking
  // the client library should turn it off the same way.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::GetFlag(FLAGS_worker)) return pagealloc::WorkerMain();
  absl::Status status = pagealloc::CoordinatorMain();
  if (!status.ok()) {
    std::fprintf(stderr, "pagealloc-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
