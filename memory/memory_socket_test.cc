// The memory socket's wire format, and its client's end against a daemon's
// end played by this test through the same codec, over a real socket.

#include "memory/memory_socket.h"

#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/fd_passing.h"
#include "memory/shared_region.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace memory_socket {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

absl::Span<const char> BytesOf(const void* data, size_t size) {
  return absl::MakeConstSpan(static_cast<const char*>(data), size);
}

TEST(MemorySocketFormatTest, HelloRoundTrip) {
  ASSERT_OK_AND_ASSIGN(Hello hello, MakeHello(42, "secret"));
  ASSERT_OK_AND_ASSIGN(Hello parsed,
                       ParseHello(BytesOf(&hello, sizeof(hello))));
  EXPECT_EQ(parsed.session_id, 42u);
  EXPECT_EQ(TokenOf(parsed), "secret");
  EXPECT_THAT(MakeHello(1, std::string(65, 't')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("65")));
  EXPECT_EQ(MemorySocketPath("/run/pagealloc/gpu0.sock"),
            "/run/pagealloc/gpu0.sock.fd");
}

TEST(MemorySocketFormatTest, MalformedHellosAreRefused) {
  ASSERT_OK_AND_ASSIGN(Hello good, MakeHello(42, "secret"));
  EXPECT_THAT(ParseHello(BytesOf(&good, sizeof(good) - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("87 bytes; expected 88")));
  Hello bad = good;
  bad.magic ^= 1;
  EXPECT_THAT(ParseHello(BytesOf(&bad, sizeof(bad))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("magic")));
  bad = good;
  bad.version = kVersion + 1;
  EXPECT_THAT(
      ParseHello(BytesOf(&bad, sizeof(bad))),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("version")));
  bad = good;
  bad.token_bytes = 1000;
  EXPECT_THAT(ParseHello(BytesOf(&bad, sizeof(bad))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("token of 1000 bytes")));
}

TEST(MemorySocketFormatTest, MalformedDaemonMessagesAreRefused) {
  const MemoryEntry ring{static_cast<uint32_t>(MemoryKind::kRing), 0, 64};
  const DaemonMessage handoff = MakeHandoff({ring});
  ASSERT_OK(ParseDaemonMessage(BytesOf(&handoff, sizeof(handoff)), 1).status());
  // One descriptor per entry, known kinds, a status on refusals.
  EXPECT_THAT(ParseDaemonMessage(BytesOf(&handoff, sizeof(handoff)), 2),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("1 entries with 2 descriptors")));
  DaemonMessage bad = handoff;
  bad.entries[0].kind = 9;
  EXPECT_THAT(
      ParseDaemonMessage(BytesOf(&bad, sizeof(bad)), 1),
      StatusIs(absl::StatusCode::kInternal, HasSubstr("unknown kind 9")));
  // Between the CPU kinds and the CUDA kinds nothing is known either.
  for (uint32_t kind : {0u, 5u, 9u, 12u}) {
    bad = handoff;
    bad.entries[0].kind = kind;
    EXPECT_THAT(ParseDaemonMessage(BytesOf(&bad, sizeof(bad)), 1),
                StatusIs(absl::StatusCode::kInternal,
                         HasSubstr(absl::StrFormat("unknown kind %d", kind))));
  }
  bad = handoff;
  bad.kind = 7;
  EXPECT_THAT(
      ParseDaemonMessage(BytesOf(&bad, sizeof(bad)), 1),
      StatusIs(absl::StatusCode::kInternal, HasSubstr("unknown kind 7")));
  DaemonMessage refusal = MakeStatusMessage(
      MessageKind::kRefused, absl::UnauthenticatedError("wrong token"));
  ASSERT_OK_AND_ASSIGN(
      DaemonMessage parsed,
      ParseDaemonMessage(BytesOf(&refusal, sizeof(refusal)), 0));
  EXPECT_THAT(StatusOf(parsed),
              StatusIs(absl::StatusCode::kUnauthenticated, "wrong token"));
  EXPECT_THAT(ParseDaemonMessage(BytesOf(&refusal, sizeof(refusal)), 1),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("descriptors")));
  refusal.code = 0;
  EXPECT_THAT(ParseDaemonMessage(BytesOf(&refusal, sizeof(refusal)), 0),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("code 0")));
  // An over-long message length is clamped, never read past the buffer.
  DaemonMessage ended =
      MakeStatusMessage(MessageKind::kEnded, absl::NotFoundError("gone"));
  ended.message_bytes = 1 << 30;
  ASSERT_OK_AND_ASSIGN(parsed,
                       ParseDaemonMessage(BytesOf(&ended, sizeof(ended)), 0));
  EXPECT_EQ(StatusOf(parsed).message().size(), kMaxMessageBytes);
}

// A listening memory socket whose daemon's end the test plays.
class MemorySocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/pagealloc-ms-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    path_ = dir_ + "/daemon.sock.fd";
    listener_.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strcpy(address.sun_path, path_.c_str());
    ASSERT_EQ(bind(listener_.get(), reinterpret_cast<sockaddr*>(&address),
                   sizeof(address)),
              0);
    ASSERT_EQ(listen(listener_.get(), 8), 0);
  }
  void TearDown() override {
    if (daemon_.joinable()) daemon_.join();
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }

  // Accepts one connection, reads its Hello and runs `answer` on it.
  void PlayDaemon(std::function<void(UniqueFd, const Hello&)> answer) {
    daemon_ = std::thread([this, answer] {
      UniqueFd connection(
          accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      Hello hello;
      std::vector<UniqueFd> none;
      absl::StatusOr<size_t> got = ReceiveWithFds(
          connection.get(),
          absl::MakeSpan(reinterpret_cast<char*>(&hello), sizeof(hello)), 0,
          &none);
      ASSERT_OK(got.status());
      ASSERT_OK_AND_ASSIGN(Hello parsed, ParseHello(BytesOf(&hello, *got)));
      answer(std::move(connection), parsed);
    });
  }

  std::string dir_, path_;
  UniqueFd listener_;
  std::thread daemon_;
};

TEST_F(MemorySocketTest, TheSessionReceivesItsMemoryThenLearnsWhyItEnded) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> channel,
                       SharedRegion::Create("channel", 4096));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> ring,
                       SharedRegion::Create("ring", 8192));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> slab,
                       SharedRegion::Create("kv-slab", 16384));
  UniqueFd doorbell(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  UniqueFd kept;  // the daemon's end, kept open until the test ends it
  PlayDaemon([&](UniqueFd connection, const Hello& hello) {
    EXPECT_EQ(hello.session_id, 7u);
    EXPECT_EQ(TokenOf(hello), "token-7");
    const MemoryEntry entries[] = {
        {static_cast<uint32_t>(MemoryKind::kChannel), 0, 4096},
        {static_cast<uint32_t>(MemoryKind::kDoorbell), 0, 0},
        {static_cast<uint32_t>(MemoryKind::kRing), 0, 8192},
        {static_cast<uint32_t>(MemoryKind::kKvSlab), 0, 16384}};
    const DaemonMessage message = MakeHandoff(entries);
    ASSERT_OK(
        SendWithFds(connection.get(), BytesOf(&message, sizeof(message)),
                    {channel->fd(), doorbell.get(), ring->fd(), slab->fd()}));
    kept = std::move(connection);
  });
  ASSERT_OK_AND_ASSIGN(
      SessionMemory memory,
      ReceiveSessionMemory(path_, 7, "token-7", absl::Seconds(30)));
  daemon_.join();
  EXPECT_EQ(memory.channel_bytes, 4096u);
  EXPECT_EQ(memory.ring_bytes, 8192u);
  ASSERT_TRUE(memory.doorbell.valid());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> mapped,
                       SharedRegion::FromFd(std::move(memory.ring), 8192,
                                            SharedRegion::Access::kReadOnly));
  static_cast<int64_t*>(ring->base())[1023] = 77;
  EXPECT_EQ(static_cast<const int64_t*>(mapped->base())[1023], 77);
  // The KV slab is the same memory, writable from both ends.
  EXPECT_EQ(memory.kv_slab_bytes, 16384u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> kv,
                       SharedRegion::FromFd(std::move(memory.kv_slab), 16384,
                                            SharedRegion::Access::kReadWrite));
  static_cast<char*>(kv->base())[16383] = 9;
  EXPECT_EQ(static_cast<const char*>(slab->base())[16383], 9);
  const uint64_t one = 1;
  ASSERT_EQ(write(memory.doorbell.get(), &one, sizeof(one)), 8);
  uint64_t rung = 0;
  ASSERT_EQ(read(doorbell.get(), &rung, sizeof(rung)), 8);
  EXPECT_EQ(rung, 1u);

  // The daemon ends the session and says why.
  const DaemonMessage ended = MakeStatusMessage(
      MessageKind::kEnded, absl::NotFoundError("session 7 lost its lease"));
  ASSERT_OK(SendWithFds(kept.get(), BytesOf(&ended, sizeof(ended)), {}));
  kept.reset();
  EXPECT_THAT(
      ReadSessionEnd(memory.connection.get()),
      StatusIs(absl::StatusCode::kNotFound, "session 7 lost its lease"));
}

// The CUDA backend's ring and completion counter arrive in their own
// fields, each with its size (the descriptors here are memfds: the socket
// only carries them; mapping them is the CUDA client's part).
TEST_F(MemorySocketTest, CudaRingAndCompletionCounterArriveByKind) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> ring,
                       SharedRegion::Create("cuda-ring", 4096));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> counter,
                       SharedRegion::Create("counter", 4096));
  static_cast<int64_t*>(ring->base())[0] = 10;
  static_cast<int64_t*>(counter->base())[0] = 11;
  UniqueFd kept;
  PlayDaemon([&](UniqueFd connection, const Hello&) {
    const MemoryEntry entries[] = {
        {static_cast<uint32_t>(MemoryKind::kCompletionCounter), 0, 2 << 20},
        {static_cast<uint32_t>(MemoryKind::kCudaRing), 0, 8 << 20}};
    const DaemonMessage message = MakeHandoff(entries);
    ASSERT_OK(SendWithFds(connection.get(), BytesOf(&message, sizeof(message)),
                          {counter->fd(), ring->fd()}));
    kept = std::move(connection);
  });
  ASSERT_OK_AND_ASSIGN(SessionMemory memory,
                       ReceiveSessionMemory(path_, 1, "t", absl::Seconds(30)));
  daemon_.join();
  EXPECT_FALSE(memory.ring.valid());
  EXPECT_EQ(memory.cuda_ring_bytes, uint64_t{8} << 20);
  EXPECT_EQ(memory.completion_counter_bytes, uint64_t{2} << 20);
  ASSERT_TRUE(memory.cuda_ring.valid());
  ASSERT_TRUE(memory.completion_counter.valid());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> mapped_ring,
                       SharedRegion::FromFd(std::move(memory.cuda_ring), 4096,
                                            SharedRegion::Access::kReadOnly));
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<SharedRegion> mapped_counter,
      SharedRegion::FromFd(std::move(memory.completion_counter), 4096,
                           SharedRegion::Access::kReadOnly));
  EXPECT_EQ(static_cast<const int64_t*>(mapped_ring->base())[0], 10);
  EXPECT_EQ(static_cast<const int64_t*>(mapped_counter->base())[0], 11);
}

TEST_F(MemorySocketTest, AConnectionClosedWithoutAWordMeansTheDaemonIsGone) {
  UniqueFd kept;
  PlayDaemon([&](UniqueFd connection, const Hello&) {
    const DaemonMessage message = MakeHandoff({});
    ASSERT_OK(
        SendWithFds(connection.get(), BytesOf(&message, sizeof(message)), {}));
    kept = std::move(connection);
  });
  ASSERT_OK_AND_ASSIGN(SessionMemory memory,
                       ReceiveSessionMemory(path_, 1, "t", absl::Seconds(30)));
  daemon_.join();
  EXPECT_FALSE(memory.channel.valid());
  EXPECT_FALSE(memory.ring.valid());
  kept.reset();  // the daemon dies
  EXPECT_THAT(ReadSessionEnd(memory.connection.get()),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("the daemon went away")));
}

TEST_F(MemorySocketTest, ARefusalCarriesTheDaemonsStatus) {
  PlayDaemon([](UniqueFd connection, const Hello& hello) {
    const DaemonMessage message = MakeStatusMessage(
        MessageKind::kRefused,
        absl::UnauthenticatedError(absl::StrFormat(
            "wrong session_token for session %d", hello.session_id)));
    ASSERT_OK(
        SendWithFds(connection.get(), BytesOf(&message, sizeof(message)), {}));
  });
  EXPECT_THAT(ReceiveSessionMemory(path_, 5, "guess", absl::Seconds(30)),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       "wrong session_token for session 5"));
}

TEST_F(MemorySocketTest, SilenceAndAbsenceAreReported) {
  UniqueFd kept;
  PlayDaemon([&](UniqueFd connection, const Hello&) {
    kept = std::move(connection);  // never answers
  });
  EXPECT_THAT(ReceiveSessionMemory(path_, 1, "t", absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("did not answer")));
  daemon_.join();
  EXPECT_THAT(
      ReceiveSessionMemory(dir_ + "/nobody.fd", 1, "t", absl::Seconds(1)),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot connect")));
}

}  // namespace
}  // namespace memory_socket
}  // namespace pagealloc
