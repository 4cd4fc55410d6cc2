// Attack: reach another session's shared memory. A session's fast channel,
// doorbell and (CPU backend) ring are anonymous memory made for it alone
// and handed over as descriptors on the memory socket after its token is
// proven (memory/memory_socket.h), so:
//   - nothing is named in /dev/shm for another process to open;
//   - a wrong token, an unknown session, bytes that are no Hello, and even
//     the right token a second time get a refusal and no descriptor;
//   - two sessions' channels are different memory: what one writes never
//     shows in the other's.
// The victim's pages and channel are untouched throughout.

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "fast_channel/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/fd_passing.h"
#include "memory/memory_socket.h"
#include "tests/host_files.h"
#include "tests/hostile/hostile_channel_fixture.h"
#include "tests/status_matchers.h"

namespace pagealloc::testing {
namespace {

namespace ms = ::pagealloc::memory_socket;
using ::testing::HasSubstr;

// One raw attempt on the memory socket: what came back, and whether the
// daemon closed the connection after it.
struct Attempt {
  absl::Status status;  // the daemon's refusal, or OK for a handoff
  size_t fds = 0;
  bool closed = false;
};

Attempt TryHello(const std::string& path, absl::Span<const char> hello) {
  Attempt attempt;
  UniqueFd connection(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  EXPECT_EQ(connect(connection.get(), reinterpret_cast<sockaddr*>(&address),
                    sizeof(address)),
            0);
  EXPECT_OK(SendWithFds(connection.get(), hello, {}));
  ms::DaemonMessage message;
  std::vector<UniqueFd> fds;
  absl::StatusOr<size_t> received = ReceiveWithFds(
      connection.get(),
      absl::MakeSpan(reinterpret_cast<char*>(&message), sizeof(message)),
      ms::kMaxEntries, &fds);
  EXPECT_OK(received.status());
  attempt.fds = fds.size();
  absl::StatusOr<ms::DaemonMessage> parsed = ms::ParseDaemonMessage(
      absl::MakeConstSpan(reinterpret_cast<const char*>(&message),
                          received.value_or(0)),
      fds.size());
  EXPECT_OK(parsed.status());
  if (parsed.ok() &&
      parsed->kind != static_cast<uint32_t>(ms::MessageKind::kHandoff)) {
    attempt.status = ms::StatusOf(*parsed);
  }
  char byte;
  std::vector<UniqueFd> more;
  attempt.closed =
      ReceiveWithFds(connection.get(), absl::MakeSpan(&byte, 1), 0, &more)
          .value_or(1) == 0;
  return attempt;
}

absl::Span<const char> BytesOf(const ms::Hello& hello) {
  return absl::MakeConstSpan(reinterpret_cast<const char*>(&hello),
                             sizeof(hello));
}

TEST_F(HostileChannelTest, TheMemorySocketHandsNothingToAWrongToken) {
  StartServer();
  RawSession victim = OpenRaw("victim");
  ASSERT_NE(victim.header, nullptr);
  victim.WriteAlloc(2);
  victim.Post();
  ASSERT_TRUE(victim.Await());
  ASSERT_EQ(victim.header->call_code, 0);
  const PoolSnapshot before = PoolSnapshot::Of(pool());
  const std::string& path = victim.registered.memory_socket();
  const uint64_t id = victim.id();
  const std::string& token = victim.registered.session_token();

  // Another process knows the victim's id but not its token: it gets a
  // refusal, no descriptor, and a closed connection.
  ASSERT_OK_AND_ASSIGN(ms::Hello guess,
                       ms::MakeHello(id, std::string(32, 'x')));
  Attempt wrong = TryHello(path, BytesOf(guess));
  EXPECT_THAT(wrong.status, StatusIs(absl::StatusCode::kUnauthenticated,
                                     HasSubstr("wrong session_token")));
  EXPECT_EQ(wrong.fds, 0u);
  EXPECT_TRUE(wrong.closed);
  // Nor with an id nobody has, nor with bytes that are no Hello.
  ASSERT_OK_AND_ASSIGN(ms::Hello unknown, ms::MakeHello(id + 12345, token));
  Attempt nobody = TryHello(path, BytesOf(unknown));
  EXPECT_THAT(nobody.status,
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown")));
  EXPECT_EQ(nobody.fds, 0u);
  EXPECT_TRUE(nobody.closed);
  Attempt garbage = TryHello(path, absl::MakeConstSpan("not a hello", 11));
  EXPECT_THAT(garbage.status, StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("11 bytes")));
  EXPECT_EQ(garbage.fds, 0u);
  EXPECT_TRUE(garbage.closed);
  // Even the right token gets the memory once: the session has its
  // connection already.
  ASSERT_OK_AND_ASSIGN(ms::Hello again, ms::MakeHello(id, token));
  Attempt twice = TryHello(path, BytesOf(again));
  EXPECT_THAT(twice.status, StatusIs(absl::StatusCode::kFailedPrecondition,
                                     HasSubstr("already has")));
  EXPECT_EQ(twice.fds, 0u);
  EXPECT_EQ(server().server().memory_socket()->refusals(), 4);

  // The victim is untouched: its pages are its own and its channel works.
  EXPECT_EQ(PoolSnapshot::Of(pool()), before);
  victim.WriteAlloc(1);
  victim.Post();
  ASSERT_TRUE(victim.Await());
  EXPECT_EQ(victim.header->call_code, 0);
  EXPECT_EQ(pool().Stats().used_pages, before.used_pages + 1);
}

TEST_F(HostileChannelTest, SessionsMemoryIsNamedNowhereAndSharedWithNoOne) {
  StartServer();
  RawSession a = OpenRaw("a");
  RawSession b = OpenRaw("b");
  ASSERT_NE(a.header, nullptr);
  ASSERT_NE(b.header, nullptr);
  auto client = Connect("client");
  ASSERT_NE(client, nullptr);
  HonestRoundTrip(*client);

  // Nothing of this daemon's sessions has a name another process could
  // open. (Tests running beside this one name their own scratch
  // pagealloc-test-*: multi_client_test's claim table, for one.)
  for (const std::string& name : DevShmNames()) {
    EXPECT_FALSE(absl::StartsWith(name, "pagealloc") &&
                 !absl::StartsWith(name, "pagealloc-test-"))
        << "/dev/shm/" << name;
  }
  // Two sessions' rings are different memory (so are their channels,
  // below).
  struct stat sa, sb;
  ASSERT_EQ(fstat(a.memory.ring.get(), &sa), 0);
  ASSERT_EQ(fstat(b.memory.ring.get(), &sb), 0);
  EXPECT_NE(sa.st_ino, sb.st_ino);
  // What one session writes into its channel never shows in another's
  // (past b's header, which its poller writes on its own).
  const char* b_body = b.base() + b.layout->in0;
  const size_t b_bytes = b.layout->total_bytes - b.layout->in0;
  const std::vector<char> b_before(b_body, b_body + b_bytes);
  std::memset(a.base() + a.layout->in0, 0x5a,
              a.layout->total_bytes - a.layout->in0);
  const std::vector<char> b_after(b_body, b_body + b_bytes);
  EXPECT_EQ(b_before, b_after);
  // b's channel is served as usual.
  b.WriteAlloc(1);
  b.Post();
  ASSERT_TRUE(b.Await());
  EXPECT_EQ(b.header->call_code, 0);
  HonestRoundTrip(*client);
  EXPECT_OK(pool().CheckInvariants());
}

}  // namespace
}  // namespace pagealloc::testing
