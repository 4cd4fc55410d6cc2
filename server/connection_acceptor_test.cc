// ConnectionAcceptor against more connections than it may hold and a
// process out of descriptors: connections over the cap and those without a
// descriptor to spare are closed at once, health says why, and accepting
// resumes by itself once descriptors are free.

#include "server/connection_acceptor.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/unique_fd.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::pagealloc::testing::WaitFor;
using ::testing::HasSubstr;

// A listening socket in the abstract namespace (no file, no path length
// limit), unique to this test.
sockaddr_un AbstractAddress() {
  static int serial = 0;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name =
      absl::StrFormat("pagealloc-acceptor-test-%d-%d", getpid(), serial++);
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  return address;
}

UniqueFd Listen(const sockaddr_un& address) {
  UniqueFd listener(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_EQ(bind(listener.get(), reinterpret_cast<const sockaddr*>(&address),
                 sizeof(address)),
            0)
      << std::strerror(errno);
  EXPECT_EQ(listen(listener.get(), 64), 0);
  return listener;
}

// A client connection; invalid when socket() or connect() fails.
UniqueFd Connect(const sockaddr_un& address) {
  UniqueFd client(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (client.valid() &&
      connect(client.get(), reinterpret_cast<const sockaddr*>(&address),
              sizeof(address)) != 0) {
    client.reset();
  }
  return client;
}

// Whether the server's end of `client` is closed (read sees end of file).
bool ClosedByServer(int client) {
  char byte;
  return recv(client, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

int OpenDescriptors() {
  DIR* dir = opendir("/proc/self/fd");
  int count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the directory's own
}

// Holds the connections the acceptor hands over, as gRPC would.
class Served {
 public:
  void Take(int fd) {
    absl::MutexLock lock(&mu_);
    fds_.emplace_back(fd);
  }
  int size() {
    absl::MutexLock lock(&mu_);
    return fds_.size();
  }
  // Closes the connections handed over, as gRPC does when they end.
  void CloseAll() {
    absl::MutexLock lock(&mu_);
    fds_.clear();
  }

 private:
  absl::Mutex mu_;
  std::vector<UniqueFd> fds_ ABSL_GUARDED_BY(mu_);
};

// Lowers this process's open-files limit for a test and restores it.
class OpenFilesLimit {
 public:
  explicit OpenFilesLimit(rlim_t soft) {
    getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit lowered = saved_;
    lowered.rlim_cur = soft;
    EXPECT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  }
  ~OpenFilesLimit() { setrlimit(RLIMIT_NOFILE, &saved_); }

 private:
  rlimit saved_{};
};

ConnectionAcceptor::Options FastRetry(int max_connections) {
  ConnectionAcceptor::Options options;
  options.max_connections = max_connections;
  options.retry_interval = absl::Milliseconds(10);
  return options;
}

TEST(ConnectionAcceptorTest, ReservesASixteenthOfTheLimitWithinBounds) {
  EXPECT_EQ(ConnectionAcceptor::ReservedDescriptors(128), 32);
  EXPECT_EQ(ConnectionAcceptor::ReservedDescriptors(1024), 64);
  EXPECT_EQ(ConnectionAcceptor::ReservedDescriptors(1 << 20), 1024);
}

TEST(ConnectionAcceptorTest, ClosesConnectionsOverTheCapUntilOneEnds) {
  const sockaddr_un address = AbstractAddress();
  Served served;
  ConnectionAcceptor acceptor(FastRetry(2),
                              [&served](int fd) { served.Take(fd); });
  acceptor.AddListener(Listen(address), "test socket");
  ASSERT_OK(acceptor.Start());

  UniqueFd first = Connect(address);
  UniqueFd second = Connect(address);
  ASSERT_TRUE(WaitFor([&] { return served.size() == 2; }, absl::Seconds(10)));
  UniqueFd third = Connect(address);
  ASSERT_TRUE(third.valid());
  EXPECT_TRUE(
      WaitFor([&] { return ClosedByServer(third.get()); }, absl::Seconds(10)))
      << "the connection over the cap was not closed";
  EXPECT_EQ(acceptor.refused_over_cap(), 1);
  EXPECT_FALSE(ClosedByServer(first.get()));
  EXPECT_EQ(acceptor.connections(), 2);
  // The cap is policy, not trouble: health stays OK.
  EXPECT_OK(acceptor.health());

  // Connections that end make room.
  served.CloseAll();
  EXPECT_EQ(acceptor.connections(), 0);
  UniqueFd fourth = Connect(address);
  EXPECT_TRUE(WaitFor([&] { return served.size() == 1; }, absl::Seconds(10)));
  EXPECT_FALSE(ClosedByServer(fourth.get()));
  acceptor.Stop();
}

TEST(ConnectionAcceptorTest, KeepsTheLastDescriptorsAndRecoversByItself) {
  const int open_now = OpenDescriptors();
  // Reserved: 32 of this limit, so about 30 connections (two descriptors
  // each in this process) fit.
  const OpenFilesLimit limit(open_now + 96);
  const sockaddr_un address = AbstractAddress();
  Served served;
  ConnectionAcceptor acceptor(FastRetry(100000),
                              [&served](int fd) { served.Take(fd); });
  acceptor.AddListener(Listen(address), "test socket");
  ASSERT_OK(acceptor.Start());

  std::vector<UniqueFd> clients;
  bool refused = false;
  while (!refused && clients.size() < 200) {
    // Counted before connecting: the acceptor may hand the connection over
    // before Connect returns.
    const int before = served.size();
    clients.push_back(Connect(address));
    ASSERT_TRUE(clients.back().valid()) << "the test ran out of descriptors";
    const int fd = clients.back().get();
    ASSERT_TRUE(WaitFor(
        [&] {
          refused = ClosedByServer(fd);
          return refused || served.size() > before;
        },
        absl::Seconds(10)));
  }
  ASSERT_TRUE(refused) << "200 connections and none refused";
  EXPECT_GE(acceptor.refused_no_descriptors(), 1);
  EXPECT_THAT(acceptor.health(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("test socket: descriptors nearly exhausted")));

  // Descriptors come back: health recovers without any new connection.
  served.CloseAll();
  clients.clear();
  EXPECT_TRUE(
      WaitFor([&] { return acceptor.health().ok(); }, absl::Seconds(10)));
  UniqueFd again = Connect(address);
  EXPECT_TRUE(WaitFor([&] { return served.size() == 1; }, absl::Seconds(10)));
  acceptor.Stop();
}

TEST(ConnectionAcceptorTest, SurvivesAcceptFailingForWantOfDescriptors) {
  const OpenFilesLimit limit(OpenDescriptors() + 64);
  const sockaddr_un address = AbstractAddress();
  Served served;
  ConnectionAcceptor acceptor(FastRetry(100000),
                              [&served](int fd) { served.Take(fd); });
  acceptor.AddListener(Listen(address), "test socket");
  ASSERT_OK(acceptor.Start());

  // Every descriptor taken but one, which the client's socket takes: the
  // acceptor's accept4 then fails with EMFILE.
  std::vector<UniqueFd> filler;
  while (true) {
    UniqueFd fd(open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) break;
    filler.push_back(std::move(fd));
  }
  ASSERT_FALSE(filler.empty());
  filler.pop_back();
  UniqueFd client = Connect(address);
  ASSERT_TRUE(client.valid());
  // It gives up its spare descriptor to close the waiting connection.
  EXPECT_TRUE(
      WaitFor([&] { return ClosedByServer(client.get()); }, absl::Seconds(10)));
  EXPECT_THAT(acceptor.health(), StatusIs(absl::StatusCode::kUnavailable,
                                          HasSubstr("Too many open files")));
  EXPECT_EQ(served.size(), 0);

  filler.clear();
  client.reset();
  EXPECT_TRUE(
      WaitFor([&] { return acceptor.health().ok(); }, absl::Seconds(10)));
  UniqueFd again = Connect(address);
  EXPECT_TRUE(WaitFor([&] { return served.size() == 1; }, absl::Seconds(10)));
  acceptor.Stop();
}

}  // namespace
}  // namespace pagealloc
