// The gRPC echo floor's two ends: EchoServer, an in-process gRPC server that
// answers pagealloc.v1.PageAllocator/AllocDecode with an answer shaped like
// the daemon's and does nothing else, and MeasureEchoCalls, its clients.
// Between the empty call (Health/Check) and the daemon's AllocDecode lie
// two costs: gRPC carrying a call of that shape (parsing and serialising
// 256 requests' arrays, answering from another thread) and the daemon's own
// work. The echo server has only the first, so the benchmark can tell them
// apart in the same run (bench/README.md, "Floors"). The benchmark hosts
// the server in a child process, as the daemon runs (bench/echo_process.h).

#ifndef PAGEALLOC_BENCH_GRPC_ECHO_H_
#define PAGEALLOC_BENCH_GRPC_ECHO_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/latency_histogram.h"
#include "bench/workload.h"

namespace pagealloc::bench {

// How the echo server answers an AllocDecode call.
enum class EchoAnswer {
  // On the gRPC callback thread that read the call, as the daemon answers
  // an empty call (and a call it runs on the submitting thread).
  kInline,
  // On another thread (a HandoffThread, spinning between answers), as the
  // daemon's spinning batcher thread answers an allocation call.
  kHandedOff,
};

// An in-process gRPC server on a Unix socket in a fresh directory under
// /tmp, built with the daemon's settings (ApplyGrpcServerSettings) and
// serving the default health service and AllocDecode. AllocDecode fills
// an AllocResponse from the request's size: packed results, one per
// request (code 0, consecutive ring offsets, count 1, a new page where the
// new token starts one), ring_end, batch_requests, launch_id and
// completion_value; nothing is allocated or checked. Other methods are
// UNIMPLEMENTED.
//
// This class is thread-safe.
class EchoServer {
 public:
  struct Options {
    // The HandoffThread's longest spin between answers (kHandedOff).
    absl::Duration handoff_spin = absl::Microseconds(200);
    // Tokens per page, for the answers' new_pages.
    int64_t page_size = 16;
  };

  // Starts the server. UNAVAILABLE when it cannot listen; INTERNAL when
  // the directory cannot be made.
  static absl::StatusOr<std::unique_ptr<EchoServer>> Start(
      const Options& options);
  // Shuts the server down (waiting for the calls in flight), stops the
  // hand-off thread, removes the socket and its directory.
  ~EchoServer();

  EchoServer(const EchoServer&) = delete;
  EchoServer& operator=(const EchoServer&) = delete;

  // The gRPC target: "unix:///tmp/pagealloc-echo-XXXXXX/echo.sock".
  const std::string& target() const;
  // Sets how AllocDecode calls that arrive from now on are answered
  // (kInline at the start).
  void set_answer(EchoAnswer answer);
  // AllocDecode calls answered so far.
  int64_t answered() const;

 private:
  class Impl;
  explicit EchoServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The call MeasureEchoCalls makes.
enum class EchoCall {
  kHealthCheck,  // grpc.health.v1.Health/Check, empty
  kAllocDecode,  // AllocDecode of w.batch decode requests
};

// Called by MeasureEchoCalls at its timed window's ends, e.g. to read CPU
// time over the window. Either may be empty.
struct EchoWindowHooks {
  // Once every client has made its untimed calls, before the clock starts
  // and before any timed call (the clients wait for it to return).
  std::function<void()> at_start;
  // Once the last client's last call has returned and every client thread
  // has ended.
  std::function<void()> at_end;
};

struct EchoCalls {
  LatencyHistogram histogram;  // every client's timed calls, merged
  double seconds = 0;          // the timed window, all clients together
  int64_t calls = 0;           // every call made, the untimed ones included
};

// Makes `call` on `target`, one at a time from each of `clients` threads,
// each on a channel of its own (the client library's channel arguments and
// its own connection). Each client's first 100 calls (connection set-up)
// are not timed; then the clients start together and call for `seconds`.
// An AllocDecode carries w.batch requests shaped like a scheduler's
// (seq_lens in [1, w.max_seq_len] growing by one a call, large last_locs,
// a session reference, packed_results set and a deadline, as the client
// library sends) and its answer is parsed and checked as the client
// library checks it; a call is timed as a worker times the client library's
// call, from building the request to the checked answer. Calls `hooks`
// at the window's start and end, also when a call fails. UNAVAILABLE when a
// call fails, INTERNAL when an answer has the wrong size, INVALID_ARGUMENT when
// clients < 1.
absl::StatusOr<EchoCalls> MeasureEchoCalls(const std::string& target,
                                           EchoCall call, const Workload& w,
                                           int clients, double seconds,
                                           uint64_t seed,
                                           const EchoWindowHooks& hooks = {});

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_GRPC_ECHO_H_
