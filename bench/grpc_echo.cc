#include "bench/grpc_echo.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/clock.h"
#include "client/client.h"
#include "common/handoff_thread.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "proto/pagealloc.grpc.pb.h"
#include "server/server.h"

namespace pagealloc::bench {
namespace {

// The calls of each client that open its connection and warm its caches:
// not timed (as in MeasureHealthCheck).
constexpr int kUntimedCalls = 100;

// The slots the requests' last_locs lie in: the benchmark's default pool
// (1 << 20 pages of 16 tokens), so that they take as many bytes on the wire
// as a scheduler's.
constexpr int64_t kSlotSpace = int64_t{1} << 24;

// The client library's call timeout (ClientOptions.call_timeout): each of
// its calls carries a deadline, and so do ours.
constexpr absl::Duration kCallTimeout = absl::Seconds(30);

// AllocDecode only; every other method answers UNIMPLEMENTED (the
// generated CallbackService's default).
class EchoService final : public v1::PageAllocator::CallbackService {
 public:
  EchoService(int64_t page_size, HandoffThread* handoff)
      : page_size_(page_size), handoff_(handoff) {}

  grpc::ServerUnaryReactor* AllocDecode(grpc::CallbackServerContext* context,
                                        const v1::AllocDecodeRequest* request,
                                        v1::AllocResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    // The answer is filled on the thread that sends it, as the daemon's
    // batcher thread writes the results of the launch it ran.
    if (answer_.load(std::memory_order_relaxed) == EchoAnswer::kHandedOff) {
      handoff_->Run([this, reactor, request, response] {
        Fill(*request, response);
        reactor->Finish(grpc::Status::OK);
      });
    } else {
      Fill(*request, response);
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }

  void set_answer(EchoAnswer answer) {
    answer_.store(answer, std::memory_order_relaxed);
  }
  int64_t answered() const { return launches_.load(std::memory_order_relaxed); }

 private:
  // An answer of the daemon's shape for `request`: every request accepted
  // with one slot, the slots consecutive in the ring.
  void Fill(const v1::AllocDecodeRequest& request,
            v1::AllocResponse* response) {
    const int n = request.seq_lens_size();
    const int64_t launch =
        launches_.fetch_add(1, std::memory_order_relaxed) + 1;
    const int64_t begin = ring_.fetch_add(n, std::memory_order_relaxed);
    v1::PackedResults* packed = response->mutable_packed();
    packed->mutable_codes()->Resize(n, 0);
    packed->mutable_counts()->Resize(n, 1);
    packed->mutable_ring_offsets()->Reserve(n);
    packed->mutable_new_pages()->Reserve(n);
    for (int k = 0; k < n; ++k) {
      packed->add_ring_offsets(begin + k);
      // The new token (position seq_len - 1) starts a page.
      const int64_t position = std::max<int64_t>(request.seq_lens(k) - 1, 0);
      packed->add_new_pages(position % page_size_ == 0 ? 1 : 0);
    }
    response->set_ring_end(begin + n);
    response->set_batch_requests(n);
    response->set_launch_id(launch);
    response->set_completion_value(launch);
  }

  const int64_t page_size_;
  HandoffThread* const handoff_;
  std::atomic<EchoAnswer> answer_{EchoAnswer::kInline};
  std::atomic<int64_t> launches_{0};
  std::atomic<int64_t> ring_{0};
};

// One client's decode batch: the arrays it sends, stepped after each call
// as a scheduler's sequences grow by a token.
class DecodeBatch {
 public:
  DecodeBatch(const Workload& w, uint64_t seed)
      : max_seq_len_(w.max_seq_len), random_(seed) {
    for (int k = 0; k < w.batch; ++k) {
      seq_lens_.push_back(random_.Uniform(1, w.max_seq_len));
      last_locs_.push_back(seq_lens_.back() == 1 ? -1 : LargeSlot());
    }
    // A session reference as Register hands out: an id and 32 bytes.
    ref_.set_session_id(1 + seed % 1000);
    ref_.set_session_token(std::string(32, 'k'));
  }

  // Fills `request` as Client::AllocDecode does.
  void Build(v1::AllocDecodeRequest* request) const {
    request->mutable_seq_lens()->Add(seq_lens_.begin(), seq_lens_.end());
    request->mutable_last_locs()->Add(last_locs_.begin(), last_locs_.end());
    *request->mutable_session() = ref_;
    v1::AllocOptions* options = request->mutable_options();
    options->set_packed_results(true);
    options->set_release_ring_up_to(release_up_to_);
  }

  // Checks `response` as Client::ToAllocation does (one entry per request
  // in every array, ring ranges ending at ring_end), then steps every
  // sequence by a token.
  absl::Status Step(const v1::AllocResponse& response) {
    const v1::PackedResults& packed = response.packed();
    const int n = seq_lens_.size();
    if (packed.codes_size() != n || packed.ring_offsets_size() != n ||
        packed.counts_size() != n || packed.new_pages_size() != n) {
      return absl::InternalError(absl::StrCat(
          "the echo answer has ", packed.codes_size(), " codes, ",
          packed.ring_offsets_size(), " ring offsets, ", packed.counts_size(),
          " counts and ", packed.new_pages_size(), " new_pages for ", n,
          " requests"));
    }
    for (int k = 0; k < n; ++k) {
      if (packed.codes(k) != 0 ||
          packed.ring_offsets(k) + packed.counts(k) > response.ring_end()) {
        return absl::InternalError(
            absl::StrCat("the echo answer's result ", k, " is malformed"));
      }
    }
    release_up_to_ = response.ring_end();
    for (int k = 0; k < n; ++k) {
      if (seq_lens_[k] >= max_seq_len_) {  // finished; a new one starts
        seq_lens_[k] = 1;
        last_locs_[k] = -1;
      } else {
        last_locs_[k] = last_locs_[k] < 0 ? LargeSlot() : last_locs_[k] + 1;
        ++seq_lens_[k];
      }
    }
    return absl::OkStatus();
  }

 private:
  int64_t LargeSlot() { return random_.Uniform(kSlotSpace / 2, kSlotSpace); }

  const int64_t max_seq_len_;
  WorkloadRandom random_;
  std::vector<int64_t> seq_lens_;
  std::vector<int64_t> last_locs_;
  v1::SessionRef ref_;
  int64_t release_up_to_ = 0;
};

// One client thread's channel and calls.
class EchoClient {
 public:
  EchoClient(const std::string& target, EchoCall call, const Workload& w,
             bool own_connection, uint64_t seed)
      : call_(call), batch_(w, seed) {
    // The client library's channel; several clients in one process would
    // share one connection through gRPC's global subchannel pool, so each
    // takes a pool of its own.
    grpc::ChannelArguments args = ClientChannelArguments();
    if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
        target, grpc::InsecureChannelCredentials(), args);
    health_ = grpc::health::v1::Health::NewStub(channel);
    allocator_ = v1::PageAllocator::NewStub(channel);
  }

  // Makes one call and returns its latency: for AllocDecode, as a worker
  // times the client library's call, from building the request to the
  // checked answer.
  absl::StatusOr<int64_t> Call() {
    const int64_t t0 = NowNanos();
    grpc::ClientContext context;
    grpc::Status status;
    if (call_ == EchoCall::kHealthCheck) {
      // As MeasureHealthCheck calls it.
      grpc::health::v1::HealthCheckResponse response;
      status = health_->Check(&context, health_request_, &response);
      if (!status.ok()) return Unavailable("Health/Check", status);
      return NowNanos() - t0;
    }
    v1::AllocDecodeRequest request;
    batch_.Build(&request);
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
    v1::AllocResponse response;
    status = allocator_->AllocDecode(&context, request, &response);
    if (!status.ok()) return Unavailable("AllocDecode", status);
    absl::Status checked = batch_.Step(response);
    if (!checked.ok()) return checked;
    return NowNanos() - t0;
  }

 private:
  static absl::Status Unavailable(const char* method,
                                  const grpc::Status& status) {
    return absl::UnavailableError(
        absl::StrCat("echo server ", method, ": ", status.error_message()));
  }

  const EchoCall call_;
  DecodeBatch batch_;
  grpc::health::v1::HealthCheckRequest health_request_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  std::unique_ptr<v1::PageAllocator::Stub> allocator_;
};

}  // namespace

class EchoServer::Impl {
 public:
  Impl(const Options& options, std::string dir)
      : dir_(std::move(dir)),
        socket_path_(dir_ + "/echo.sock"),
        target_(absl::StrCat("unix://", socket_path_)),
        handoff_(options.handoff_spin),
        service_(options.page_size, &handoff_) {}

  ~Impl() {
    if (server_ != nullptr) {
      // Calls in flight finish first: handed-off ones need handoff_ running.
      server_->Shutdown();
      server_->Wait();
    }
    handoff_.Stop();
    unlink(socket_path_.c_str());
    rmdir(dir_.c_str());
  }

  absl::Status Start() {
    // As the daemon's server: the default health service, and the daemon's
    // builder settings. The daemon accepts its Unix-socket connections
    // itself and hands them to gRPC (server/connection_acceptor.h); a
    // connection carries calls the same way either way, so gRPC's own
    // listener serves here. Neither reflection nor the daemon's
    // interceptors are installed: the floor is gRPC's carrying alone.
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    ApplyGrpcServerSettings(ServerOptions(), &builder);
    builder.AddListeningPort(target_, grpc::InsecureServerCredentials());
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("the gRPC echo server cannot listen on ", target_));
    }
    return absl::OkStatus();
  }

  const std::string& target() const { return target_; }
  EchoService& service() { return service_; }

 private:
  const std::string dir_;
  const std::string socket_path_;
  const std::string target_;
  HandoffThread handoff_;
  EchoService service_;
  std::unique_ptr<grpc::Server> server_;
};

absl::StatusOr<std::unique_ptr<EchoServer>> EchoServer::Start(
    const Options& options) {
  // Unix socket paths are limited to 107 bytes: a short private directory.
  char pattern[] = "/tmp/pagealloc-echo-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    return absl::InternalError("mkdtemp for the echo server's socket");
  }
  auto impl = std::make_unique<Impl>(options, pattern);
  absl::Status started = impl->Start();
  if (!started.ok()) return started;
  return std::unique_ptr<EchoServer>(new EchoServer(std::move(impl)));
}

EchoServer::EchoServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EchoServer::~EchoServer() = default;

const std::string& EchoServer::target() const { return impl_->target(); }

void EchoServer::set_answer(EchoAnswer answer) {
  impl_->service().set_answer(answer);
}

int64_t EchoServer::answered() const { return impl_->service().answered(); }

absl::StatusOr<EchoCalls> MeasureEchoCalls(const std::string& target,
                                           EchoCall call, const Workload& w,
                                           int clients, double seconds,
                                           uint64_t seed,
                                           const EchoWindowHooks& hooks) {
  if (clients < 1) {
    return absl::InvalidArgumentError("the echo floor needs a client");
  }
  struct PerClient {
    LatencyHistogram histogram;
    int64_t calls = 0;
    int64_t end = 0;  // when its last call returned
    absl::Status status;
  };
  std::vector<PerClient> results(clients);
  // The timed window starts once every client has made its untimed calls.
  absl::Mutex mu;
  int arrived = 0;
  int64_t start = 0;
  auto run = [&](int index) {
    PerClient& mine = results[index];
    EchoClient client(target, call, w, clients > 1, seed + index);
    for (int i = 0; i < kUntimedCalls && mine.status.ok(); ++i) {
      mine.status = client.Call().status();
      ++mine.calls;
    }
    int64_t end = 0;
    {
      absl::MutexLock lock(&mu);
      if (++arrived == clients) {
        // The others wait in Await below until the clock has started.
        if (hooks.at_start) hooks.at_start();
        start = NowNanos();
      }
      auto all = [&] { return arrived == clients; };
      mu.Await(absl::Condition(&all));
      end = start + static_cast<int64_t>(seconds * 1e9);
    }
    while (mine.status.ok()) {
      absl::StatusOr<int64_t> nanos = client.Call();
      ++mine.calls;
      if (!nanos.ok()) {
        mine.status = nanos.status();
        break;
      }
      mine.histogram.Record(*nanos);
      if (NowNanos() >= end) break;
    }
    mine.end = NowNanos();
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < clients; ++i) threads.emplace_back(run, i);
  run(0);
  for (std::thread& thread : threads) thread.join();
  if (hooks.at_end) hooks.at_end();

  EchoCalls result;
  int64_t last = start;
  for (PerClient& r : results) {
    if (!r.status.ok()) return r.status;
    result.histogram.Merge(r.histogram);
    result.calls += r.calls;
    last = std::max(last, r.end);
  }
  result.seconds = (last - start) / 1e9;
  return result;
}

}  // namespace pagealloc::bench
