// The CUDA backend's rings and completion counter across processes, on a
// real GPU. A pagealloc-server with the CUDA backend runs in its own
// process; this process connects two clients, each of which imports its
// ring and the pool's completion counter from the file descriptors the
// memory socket hands over (no CUDA IPC). Each allocation call is answered
// as soon as its launch is queued (async completion), and right after the
// answer a kernel on the client's own stream reads the call's slots, ordered
// only by Client::OrderAfter (cuStreamWaitValue64 on the counter): no host
// synchronisation between the allocation and the read. The ring is never
// released, so at the end it still holds what the daemon wrote for every
// call: each kernel must have read exactly that, never the poison the ring
// held before, and the slots must be whole pages no two calls share.
//
// Without a GPU every test skips. PAGEALLOC_GPU_TEST_QUICK=1 shrinks it.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/gpu/copy_slots_kernel.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::Daemon;
using ::pagealloc::testing::LaunchCopySlots;
using ::pagealloc::testing::ReadLog;
using ::pagealloc::testing::StartDaemon;

constexpr int64_t kPageSize = 16;
constexpr int64_t kNumPages = 32768;
constexpr int64_t kRingSlots = int64_t{1} << 20;
// What the ring holds before the daemon writes a call's slots (memset
// 0xff), and what the kernels' output holds before they run.
constexpr int64_t kRingPoison = -1;
constexpr int64_t kOutPoison = 0x5a5a5a5a5a5a5a5a;

bool Quick() {
  const char* value = std::getenv("PAGEALLOC_GPU_TEST_QUICK");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// One accepted request whose slots a kernel copied.
struct Issued {
  int client = 0;
  int64_t call = 0;
  int request = 0;
  const int64_t* ring_slots = nullptr;  // in the client's mapped ring
  int64_t count = 0;
  int64_t out_offset = 0;  // where the kernel copied them
  uint64_t completion_value = 0;
};

std::string Describe(const Issued& issued) {
  return absl::StrFormat(
      "client %d call %d request %d (%d slots, completion value %d)",
      issued.client, issued.call, issued.request, issued.count,
      issued.completion_value);
}

// Parameters: async completion, fast channel.
class CompletionCounterTest
    : public ::testing::TestWithParam<std::tuple<bool, bool>> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "skipped: this machine has no CUDA GPU";
  }
};

TEST_P(CompletionCounterTest,
       KernelsOrderedByTheCounterReadWhatTheDaemonWrote) {
  const auto [async, fast] = GetParam();
  const int64_t calls_per_client = Quick() ? 500 : 4000;
  absl::StatusOr<Daemon> daemon =
      StartDaemon(absl::StrFormat("counter-%d-%d", async, fast),
                  {"--backend=cuda", "--gpu=0",
                   absl::StrFormat("--num_pages=%d", kNumPages),
                   absl::StrFormat("--page_size=%d", kPageSize)});
  ASSERT_OK(daemon.status());

  constexpr int kClients = 2;
  std::unique_ptr<Client> clients[kClients];
  cudaStream_t streams[kClients];
  for (int c = 0; c < kClients; ++c) {
    ClientOptions options;
    options.target = daemon->target;
    options.client_name = absl::StrFormat("writer-%d", c);
    options.ring_capacity_slots = kRingSlots;
    options.fast_channel = fast;
    absl::StatusOr<std::unique_ptr<Client>> connected =
        Client::Connect(options);
    ASSERT_OK(connected.status())
        << "the client could not import its ring and the completion counter; "
           "daemon log:\n"
        << ReadLog(daemon->log_path);
    clients[c] = *std::move(connected);
    ASSERT_EQ(clients[c]->pool().backend(), v1::BACKEND_CUDA);
    ASSERT_EQ(clients[c]->uses_fast_channel(), fast);
    ASSERT_EQ(cudaStreamCreateWithFlags(&streams[c], cudaStreamNonBlocking),
              cudaSuccess);
  }

  // A first, synchronous call finds the ring's start (the first region is
  // at position 0); the rest of the ring is then poisoned through the
  // client's own mapping (read-write: the descriptor grants it anyway).
  std::vector<Issued> issued;
  for (int c = 0; c < kClients; ++c) {
    ASSERT_OK_AND_ASSIGN(Allocation first, clients[c]->Alloc({kPageSize}));
    ASSERT_OK(first.status());
    ASSERT_TRUE(first.on_device());
    // A fresh session's first region starts at position 0.
    ASSERT_EQ(first.ring_end(), kPageSize);
    int64_t* ring = const_cast<int64_t*>(first[0].slots);
    ASSERT_EQ(cudaMemset(ring + kPageSize, 0xff,
                         (kRingSlots - kPageSize) * sizeof(int64_t)),
              cudaSuccess);
    issued.push_back({c, -1, 0, first[0].slots, first[0].count, -1,
                      first.completion_value()});
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const int64_t out_words = kClients * calls_per_client * 3 * kPageSize;
  int64_t* out = nullptr;
  ASSERT_EQ(
      cudaMalloc(reinterpret_cast<void**>(&out), out_words * sizeof(int64_t)),
      cudaSuccess);
  {
    const std::vector<int64_t> poison(out_words, kOutPoison);
    ASSERT_EQ(cudaMemcpy(out, poison.data(), out_words * sizeof(int64_t),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }

  CallOptions call_options;
  call_options.async_completion = async;
  std::mt19937_64 random(20240611);
  int64_t out_used = 0;
  uint64_t last_value[kClients] = {0, 0};
  for (int64_t call = 0; call < calls_per_client; ++call) {
    for (int c = 0; c < kClients; ++c) {
      const int requests = 1 + static_cast<int>(random() % 3);
      const std::vector<int64_t> tokens(requests, kPageSize);
      absl::StatusOr<Allocation> a = clients[c]->Alloc(tokens, call_options);
      ASSERT_OK(a.status()) << "client " << c << " call " << call;
      ASSERT_OK(a->status()) << "client " << c << " call " << call;
      ASSERT_GE(a->completion_value(), last_value[c])
          << "the completion counter went backwards at client " << c << " call "
          << call;
      last_value[c] = a->completion_value();
      // Straight from the answer to the GPU: wait for the launch, then read.
      ASSERT_OK(clients[c]->OrderAfter(*a, streams[c]));
      for (int r = 0; r < requests; ++r) {
        const RequestSlots& slots = (*a)[r];
        ASSERT_EQ(slots.count, kPageSize);
        ASSERT_EQ(LaunchCopySlots(slots.slots, out + out_used, slots.count,
                                  streams[c]),
                  cudaSuccess);
        issued.push_back({c, call, r, slots.slots, slots.count, out_used,
                          a->completion_value()});
        out_used += slots.count;
      }
    }
  }
  for (int c = 0; c < kClients; ++c) {
    ASSERT_EQ(cudaStreamSynchronize(streams[c]), cudaSuccess);
  }
  std::vector<int64_t> seen(out_used);
  ASSERT_EQ(cudaMemcpy(seen.data(), out, out_used * sizeof(int64_t),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);

  // Every kernel read exactly what the daemon wrote; every call got whole
  // pages of its own.
  int64_t read_too_early = 0;  // the kernel saw the ring's poison
  int64_t not_run = 0;         // the output still holds its poison
  int64_t other = 0;
  std::vector<std::string> examples;
  absl::flat_hash_map<int64_t, std::string> page_owner;
  for (const Issued& i : issued) {
    std::vector<int64_t> written(i.count);
    ASSERT_OK(
        clients[i.client]->CopyToHost(i.ring_slots, i.count, written.data()));
    const int64_t page = written[0] / kPageSize;
    bool whole_page = page >= 1 && page <= kNumPages;
    for (int64_t k = 0; k < i.count && whole_page; ++k) {
      whole_page = written[k] == page * kPageSize + k;
    }
    ASSERT_TRUE(whole_page)
        << Describe(i) << ": the daemon wrote [" << absl::StrJoin(written, ", ")
        << "], not one whole page";
    auto [owner, fresh] = page_owner.emplace(page, Describe(i));
    ASSERT_TRUE(fresh) << "page " << page << " given to " << Describe(i)
                       << " and to " << owner->second;
    if (i.out_offset < 0) continue;  // the synchronous first call
    for (int64_t k = 0; k < i.count; ++k) {
      const int64_t got = seen[i.out_offset + k];
      if (got == written[k]) continue;
      if (got == kRingPoison) {
        ++read_too_early;
      } else if (got == kOutPoison) {
        ++not_run;
      } else {
        ++other;
      }
      if (examples.size() < 10) {
        examples.push_back(
            absl::StrFormat("%s slot %d: kernel read %d, the daemon wrote %d",
                            Describe(i), k, got, written[k]));
      }
    }
  }
  EXPECT_EQ(read_too_early, 0)
      << "slots read before the daemon's launch wrote them: the stream's "
         "wait on the completion counter did not hold";
  EXPECT_EQ(not_run, 0) << "slots the copy kernel never wrote";
  EXPECT_EQ(other, 0) << "slots that differ from the ring's final contents";
  EXPECT_TRUE(examples.empty()) << absl::StrJoin(examples, "\n");
  if (async) {
    EXPECT_GE(last_value[0] + last_value[1], 2u)
        << "async calls must carry completion values >= 1";
  }
  absl::PrintF(
      "%s, %s: %d requests from %d clients, %d slots read on the GPU; last "
      "completion values %d and %d\n",
      async ? "async completion" : "sync completion",
      fast ? "fast channel" : "gRPC", issued.size(), kClients, out_used,
      last_value[0], last_value[1]);

  cudaFree(out);
  for (int c = 0; c < kClients; ++c) {
    cudaStreamDestroy(streams[c]);
    ASSERT_OK(clients[c]->Close());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, CompletionCounterTest,
    ::testing::Combine(::testing::Bool(), ::testing::Bool()),
    [](const auto& info) {
      return absl::StrFormat("%s_%s",
                             std::get<0>(info.param) ? "Async" : "Sync",
                             std::get<1>(info.param) ? "FastChannel" : "Grpc");
    });

}  // namespace
}  // namespace pagealloc
