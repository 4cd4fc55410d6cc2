// Hostile clients against the memory the daemon shares with them. The
// real pagealloc-server, CPU backend, and a session whose memory this test
// takes over the memory socket by hand:
//  - the ring comes read-only: no write, writable mapping, resize or hole
//    punch (fallocate answers EBADF);
//  - what a client can still punch (its own fast channel, its ring
//    reopened through /proc/self/fd, the KV slab every session shares)
//    only zeroes memory: the daemon writes into it again without fault,
//    its budget charge unchanged, and other sessions keep working;
//  - memory the daemon lets go is freed even while the client still maps
//    it, so nothing stays charged to the daemon.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/client.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/memory_socket.h"
#include "tests/daemon_process.h"
#include "tests/hostile/hostile_daemon.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

namespace ms = ::pagealloc::memory_socket;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(30);
constexpr char kUsed[] = "pagealloc_session_memory_used_bytes{memory=\"host\"}";

struct Attacker {
  v1::RegisterResponse registered;
  ms::SessionMemory memory;
};

absl::StatusOr<Attacker> Attack(const Daemon& daemon,
                                v1::PageAllocator::Stub& stub) {
  Attacker attacker;
  ASSIGN_OR_RETURN(attacker.registered, RawRegister(stub, "puncher"));
  ASSIGN_OR_RETURN(
      attacker.memory,
      ms::ReceiveSessionMemory(ms::MemorySocketPath(daemon.socket_path),
                               attacker.registered.session_id(),
                               attacker.registered.session_token(), kWait));
  return attacker;
}

// The attacker's own allocation over gRPC: the daemon writes its slots
// into the attacker's ring.
absl::Status AllocInto(v1::PageAllocator::Stub& stub, const Attacker& attacker,
                       int requests) {
  v1::AllocRequest request;
  request.mutable_session()->set_session_id(attacker.registered.session_id());
  request.mutable_session()->set_session_token(
      attacker.registered.session_token());
  for (int i = 0; i < requests; ++i) request.add_num_tokens(16);
  v1::AllocResponse response;
  grpc::ClientContext context;
  const grpc::Status status = stub.Alloc(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  for (const v1::RequestResult& result : response.results()) {
    if (result.code() != 0) return absl::InternalError(result.message());
  }
  return absl::OkStatus();
}

int Punch(int fd, uint64_t bytes) {
  return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                   static_cast<off_t>(bytes));
}

TEST(HostileHolePunchTest, TheRingIsHandedOverReadOnly) {
  ASSERT_OK_AND_ASSIGN(Daemon daemon, StartDaemon("ring-read-only", {}));
  std::unique_ptr<v1::PageAllocator::Stub> stub = RawStub(daemon);
  ASSERT_OK_AND_ASSIGN(Attacker attacker, Attack(daemon, *stub));
  const int ring = attacker.memory.ring.get();
  const uint64_t bytes = attacker.memory.ring_bytes;
  ASSERT_GE(ring, 0);
  EXPECT_EQ(fcntl(ring, F_GETFL) & O_ACCMODE, O_RDONLY);
  errno = 0;
  EXPECT_EQ(Punch(ring, bytes), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_NE(ftruncate(ring, 0), 0);
  EXPECT_EQ(write(ring, "x", 1), -1);
  EXPECT_EQ(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ring, 0),
            MAP_FAILED);
  void* view = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, ring, 0);
  ASSERT_NE(view, MAP_FAILED);
  EXPECT_NE(mprotect(view, bytes, PROT_READ | PROT_WRITE), 0);
  EXPECT_NE(madvise(view, bytes, MADV_REMOVE), 0);
  munmap(view, bytes);
  // The session works as ever.
  EXPECT_OK(AllocInto(*stub, attacker, 4));
}

TEST(HostileHolePunchTest,
     PunchedMemoryIsWrittenAgainAtNoOnesExpenseButItsOwn) {
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon("punched",
                  {"--kv_layout=mha:layers=2,kv_heads=2,head_dim=64,dtype=bf16",
                   "--num_pages=256", "--kv_scrub", "--lease_ms=60000"}));
  int port = -1;
  ASSERT_TRUE(WaitFor([&] { return (port = MetricsPort(daemon)) > 0; }, kWait));
  std::unique_ptr<Client> honest = ConnectTo(daemon, "honest");
  ASSERT_NE(honest, nullptr);
  std::unique_ptr<v1::PageAllocator::Stub> stub = RawStub(daemon);
  ASSERT_OK_AND_ASSIGN(Attacker attacker, Attack(daemon, *stub));
  const double used = MetricValue(port, kUsed);
  ASSERT_GT(used, 0);

  // Its own channel, the shared KV slab, and its ring reopened writable
  // through /proc: all punched whole.
  ASSERT_GE(attacker.memory.channel.get(), 0);
  EXPECT_EQ(Punch(attacker.memory.channel.get(), attacker.memory.channel_bytes),
            0);
  ASSERT_GE(attacker.memory.kv_slab.get(), 0);
  EXPECT_EQ(Punch(attacker.memory.kv_slab.get(), attacker.memory.kv_slab_bytes),
            0);
  const std::string reopen =
      absl::StrFormat("/proc/self/fd/%d", attacker.memory.ring.get());
  UniqueFd writable(open(reopen.c_str(), O_RDWR | O_CLOEXEC));
  if (writable.valid()) {
    EXPECT_EQ(Punch(writable.get(), attacker.memory.ring_bytes), 0);
  }

  // The daemon writes the attacker's slots and scrubs the pages it frees
  // into the punched memory again: no fault, the charge as it was, and
  // the other session unharmed.
  for (int round = 0; round < 8; ++round) {
    ASSERT_OK(AllocInto(*stub, attacker, 16));
    ASSERT_OK(RoundTrip(*honest));
  }
  EXPECT_TRUE(daemon.process.running()) << ReadLog(daemon.log_path);
  EXPECT_EQ(MetricValue(port, kUsed), used);
}

// Pages of `bytes` at `view` that are in memory (mincore).
int ResidentPages(void* view, uint64_t bytes) {
  const long page = sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> resident((bytes + page - 1) / page);
  if (mincore(view, bytes, resident.data()) != 0) return -1;
  int count = 0;
  for (unsigned char r : resident) count += r & 1;
  return count;
}

TEST(HostileHolePunchTest, MemoryLetGoIsFreedWhileTheClientStillMapsIt) {
  ASSERT_OK_AND_ASSIGN(Daemon daemon,
                       StartDaemon("let-go", {"--ring_capacity_slots=65536"}));
  std::unique_ptr<v1::PageAllocator::Stub> stub = RawStub(daemon);
  ASSERT_OK_AND_ASSIGN(Attacker attacker, Attack(daemon, *stub));
  const uint64_t ring_bytes = attacker.memory.ring_bytes;
  const uint64_t channel_bytes = attacker.memory.channel_bytes;
  void* ring = mmap(nullptr, ring_bytes, PROT_READ, MAP_SHARED,
                    attacker.memory.ring.get(), 0);
  void* channel = mmap(nullptr, channel_bytes, PROT_READ | PROT_WRITE,
                       MAP_SHARED, attacker.memory.channel.get(), 0);
  ASSERT_NE(ring, MAP_FAILED);
  ASSERT_NE(channel, MAP_FAILED);
  attacker.memory.ring.reset();
  attacker.memory.channel.reset();
  // Reserved at Register; read here once, so that every page is in memory
  // (mincore counts a reserved page once it has been touched).
  const long page = sysconf(_SC_PAGESIZE);
  int64_t sum = 0;
  for (uint64_t at = 0; at < ring_bytes; at += page) {
    sum += static_cast<volatile const char*>(ring)[at];
  }
  for (uint64_t at = 0; at < channel_bytes; at += page) {
    sum += static_cast<volatile const char*>(channel)[at];
  }
  (void)sum;
  EXPECT_EQ(ResidentPages(ring, ring_bytes),
            static_cast<int>(ring_bytes / page));
  EXPECT_EQ(ResidentPages(channel, channel_bytes),
            static_cast<int>((channel_bytes + page - 1) / page));

  // The session ends (its memory socket connection closes); the mappings
  // stay, the pages go, but for the channel's header.
  attacker.memory.connection.reset();
  EXPECT_TRUE(WaitFor(
      [&] {
        // The channel's header page stays: its session_ended word is
        // the client's to read.
        return ResidentPages(ring, ring_bytes) == 0 &&
               ResidentPages(channel, channel_bytes) == 1;
      },
      kWait))
      << ResidentPages(ring, ring_bytes) << " ring pages, "
      << ResidentPages(channel, channel_bytes)
      << " channel pages left (1 expected)";
  munmap(ring, ring_bytes);
  munmap(channel, channel_bytes);
  EXPECT_TRUE(daemon.process.running());
}

}  // namespace
}  // namespace pagealloc::testing
