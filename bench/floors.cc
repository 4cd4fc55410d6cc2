#include "bench/floors.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "allocator/page_pool.h"
#include "bench/clock.h"
#include "bench/cpu_time.h"
#include "bench/echo_process.h"
#include "bench/grpc_echo.h"
#include "client/client.h"
#include "common/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "kernels/cpu_executor.h"
#include "tests/workload.h"
#ifdef PAGEALLOC_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda_executor.h"
#endif

namespace pagealloc::bench {
namespace {

using ::pagealloc::testing::SequenceSet;

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

// Threads that run one job at a time, taking turns: Run(k, job) wakes
// thread k (asleep since its last turn), runs `job` there and returns when
// it is done.
class TurnTakingThreads {
 public:
  explicit TurnTakingThreads(int n) {
    for (int k = 0; k < n; ++k) {
      threads_.emplace_back([this, k] { Serve(k); });
    }
  }
  ~TurnTakingThreads() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& thread : threads_) thread.join();
  }

  int size() const { return threads_.size(); }

  void Run(int k, std::function<void()> job) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    job_ = std::move(job);
    turn_ = k;
    done_ = false;
    mu_.Await(absl::Condition(&done_));
  }

 private:
  void Serve(int k) ABSL_LOCKS_EXCLUDED(mu_) {
    while (true) {
      std::function<void()> job;
      {
        absl::MutexLock lock(&mu_);
        auto mine = [this, k]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return turn_ == k || stopping_;
        };
        mu_.Await(absl::Condition(&mine));
        if (turn_ != k) return;  // stopping
        job = std::move(job_);
      }
      job();
      absl::MutexLock lock(&mu_);
      turn_ = -1;
      done_ = true;
    }
  }

  absl::Mutex mu_;
  std::function<void()> job_ ABSL_GUARDED_BY(mu_);
  int turn_ ABSL_GUARDED_BY(mu_) = -1;
  bool done_ ABSL_GUARDED_BY(mu_) = true;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace

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

absl::StatusOr<Latency> MeasureInProcessDecode(
    const std::string& backend, const Workload& w, int64_t num_pages,
    int64_t page_size, double seconds, uint64_t seed, int threads,
    std::string* executor_name, Latency* enqueue) {
  if (threads < 1) {
    return absl::InvalidArgumentError("the in-process floor needs a thread");
  }
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
  SequenceSet live(page_size);
  WorkloadRandom random(seed);

  // Runs one batch; fills `results` and the host copy of the slots.
  // `enqueue_nanos`: until Allocate returned; `nanos`: until the launch is
  // complete.
  int64_t enqueue_nanos = 0;
  auto run = [&](std::vector<AllocRequest>& requests,
                 std::vector<AllocResult>* results,
                 int64_t* nanos) -> absl::Status {
    int64_t offset = 0;
    for (AllocRequest& r : requests) {
      r.owner = kOwner;
      r.destination = ex->destination + offset;
      offset += ToExtendShape(r).num_slots();
    }
    const int64_t t0 = NowNanos();
    *results = pool->Allocate(requests);
    enqueue_nanos = NowNanos() - t0;
    RETURN_IF_ERROR(ex->executor->Synchronize());
    *nanos = NowNanos() - t0;
    return ex->CopyToHost(offset);
  };

  // The timed steps' threads; none: this one.
  std::unique_ptr<TurnTakingThreads> turns;
  if (threads > 1) turns = std::make_unique<TurnTakingThreads>(threads);

  Latency result;
  std::vector<AllocRequest> requests;
  std::vector<AllocResult> results;
  const int64_t start = NowNanos();
  const int64_t end = start + static_cast<int64_t>(seconds * 1e9);
  for (int step = 0;; ++step) {
    // Admit into empty places (untimed).
    requests.clear();
    while (live.size() + requests.size() < static_cast<size_t>(w.batch)) {
      AllocRequest r;
      r.kind = RequestKind::kExtend;
      r.index = requests.size();
      r.seq_len = random.PromptLen(w);
      requests.push_back(r);
    }
    int64_t nanos = 0;
    if (!requests.empty()) {
      RETURN_IF_ERROR(run(requests, &results, &nanos));
      int64_t offset = 0;
      for (size_t k = 0; k < requests.size(); ++k) {
        if (!results[k].status.ok()) return results[k].status;
        const ExtendShape shape = ToExtendShape(requests[k]);
        const size_t i = live.Add(kNoOwner, random.TargetLen(w, shape.seq_len));
        RETURN_IF_ERROR(live.Record(
            i, shape,
            absl::MakeConstSpan(ex->host.data() + offset, shape.num_slots())));
        offset += shape.num_slots();
      }
    }
    // One decode step of every sequence (timed).
    requests.clear();
    for (size_t i = 0; i < live.size(); ++i) {
      AllocRequest r;
      r.kind = RequestKind::kDecode;
      r.index = i;
      r.seq_len = live[i].len + 1;
      r.last_loc = live[i].last_loc;
      requests.push_back(r);
    }
    if (turns != nullptr) {
      absl::Status ran;
      turns->Run(step % turns->size(),
                 [&] { ran = run(requests, &results, &nanos); });
      RETURN_IF_ERROR(ran);
    } else {
      RETURN_IF_ERROR(run(requests, &results, &nanos));
    }
    // The first steps load code and warm caches; keep them out.
    if (step >= 20) {
      result.histogram.Record(nanos);
      if (enqueue != nullptr) enqueue->histogram.Record(enqueue_nanos);
    }
    std::vector<size_t> finished;
    for (size_t k = 0; k < requests.size(); ++k) {
      if (!results[k].status.ok()) return results[k].status;
      RETURN_IF_ERROR(live.Record(k, ToExtendShape(requests[k]),
                                  absl::MakeConstSpan(ex->host.data() + k, 1)));
      if (live[k].finished()) finished.push_back(k);
    }
    std::vector<int64_t> pages;
    live.RemoveAll(finished, &pages);
    if (!pages.empty()) {
      RETURN_IF_ERROR(pool->FreePages(kOwner, pages).status());
    }
    if (NowNanos() >= end && result.histogram.count() > 0) break;
  }
  result.seconds = (NowNanos() - start) / 1e9;
  if (enqueue != nullptr) enqueue->seconds = result.seconds;
  return result;
}

absl::StatusOr<EchoFloor> MeasureEchoFloor(const std::string& binary,
                                           const std::string& dir,
                                           const Workload& w, int64_t page_size,
                                           absl::Duration handoff_spin,
                                           int clients, double seconds,
                                           uint64_t seed) {
  EchoServer::Options options;
  options.handoff_spin = handoff_spin;
  options.page_size = page_size;
  auto measure = [&](const EchoServerProcess& server, EchoCall call, int n,
                     WindowCpu* cpu) -> absl::StatusOr<Latency> {
    double server_before = -1, server_after = -1;
    HostCpuTicks host_before, host_after;
    EchoWindowHooks hooks;
    hooks.at_start = [&] {
      server_before = CpuSeconds(server.pid());
      host_before = ReadHostCpu();
    };
    hooks.at_end = [&] {
      server_after = CpuSeconds(server.pid());
      host_after = ReadHostCpu();
    };
    ASSIGN_OR_RETURN(
        EchoCalls calls,
        MeasureEchoCalls(server.target(), call, w, n, seconds, seed, hooks));
    if (server_before >= 0 && server_after >= 0) {
      cpu->server_cpu_seconds = server_after - server_before;
    }
    cpu->host_cpus_busy = HostCpusBusy(host_before, host_after);
    cpu->host_cpus = host_after.cpus;
    Latency latency;
    latency.histogram = std::move(calls.histogram);
    latency.seconds = calls.seconds;
    return latency;
  };
  EchoFloor floor;
  floor.handoff_spin = handoff_spin;
  {
    ASSIGN_OR_RETURN(
        EchoServerProcess server,
        EchoServerProcess::Start(binary, dir, EchoAnswer::kInline, options));
    ASSIGN_OR_RETURN(floor.empty, measure(server, EchoCall::kHealthCheck, 1,
                                          &floor.empty_cpu));
    ASSIGN_OR_RETURN(
        floor.inline_decode,
        measure(server, EchoCall::kAllocDecode, 1, &floor.inline_cpu));
    RETURN_IF_ERROR(server.Stop());
  }
  ASSIGN_OR_RETURN(
      EchoServerProcess server,
      EchoServerProcess::Start(binary, dir, EchoAnswer::kHandedOff, options));
  ASSIGN_OR_RETURN(floor.handed_off, measure(server, EchoCall::kAllocDecode, 1,
                                             &floor.handed_off_cpu));
  if (clients > 1) {
    floor.clients = clients;
    ASSIGN_OR_RETURN(
        floor.clients_handed_off,
        measure(server, EchoCall::kAllocDecode, clients, &floor.clients_cpu));
  }
  RETURN_IF_ERROR(server.Stop());
  floor.measured = true;
  return floor;
}

absl::StatusOr<IdleCost> MeasureIdleDaemon(const std::string& target, int pid,
                                           int sessions, bool fast_channel,
                                           int64_t page_size, double seconds) {
  IdleCost idle;
  idle.sessions = sessions;
  idle.fast_channel = fast_channel;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < sessions; ++i) {
    ClientOptions options;
    options.target = target;
    options.client_name = absl::StrCat("bench-idle-", i);
    options.fast_channel = fast_channel;
    options.ring_capacity_slots = 1 << 12;
    ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(options));
    const int64_t tokens[] = {page_size};
    RETURN_IF_ERROR(client->Alloc(tokens).status());
    clients.push_back(std::move(client));
  }
  absl::SleepFor(absl::Seconds(1));
  const double before = CpuSeconds(pid);
  const absl::Time start = absl::Now();
  absl::SleepFor(absl::Seconds(seconds));
  const double after = CpuSeconds(pid);
  idle.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (before >= 0 && after >= 0) idle.cpu_seconds = after - before;
  for (std::unique_ptr<Client>& client : clients) {
    RETURN_IF_ERROR(client->Close());
  }
  return idle;
}

}  // namespace pagealloc::bench
