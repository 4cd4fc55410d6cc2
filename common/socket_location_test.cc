#include "common/socket_location.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A listening Unix socket at `path`; the descriptor, closed by the test.
int Listen(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0)
      << path << ": " << std::strerror(errno);
  EXPECT_EQ(listen(fd, 1), 0);
  return fd;
}

class SocketLocationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/pagealloc-socket-location-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    root_ = dir;
    system_ = root_ + "/run";
    runtime_ = root_ + "/user";
    ASSERT_EQ(mkdir(system_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir(runtime_.c_str(), 0700), 0);
    ASSERT_EQ(mkdir((runtime_ + "/pagealloc").c_str(), 0700), 0);
  }
  void TearDown() override {
    for (int fd : fds_) close(fd);
    std::filesystem::remove_all(root_);
  }

  std::string root_, system_, runtime_;
  std::vector<int> fds_;
};

TEST_F(SocketLocationTest, SystemDirectoryFirstThenTheRuntimeDirectory) {
  EXPECT_THAT(SocketDirectories("/run/pagealloc", "/run/user/1000"),
              ElementsAre("/run/pagealloc", "/run/user/1000/pagealloc"));
  EXPECT_THAT(SocketDirectories("/run/pagealloc", ""),
              ElementsAre("/run/pagealloc"));
  EXPECT_EQ(SocketPathIn("/run/pagealloc", 3), "/run/pagealloc/gpu3.sock");
}

TEST_F(SocketLocationTest, FindsTheFallbackSocketOfAnUnprivilegedDaemon) {
  const std::vector<std::string> dirs = SocketDirectories(system_, runtime_);
  fds_.push_back(Listen(runtime_ + "/pagealloc/gpu0.sock"));
  EXPECT_THAT(FindDaemonTarget(0, dirs),
              IsOkAndHolds("unix://" + runtime_ + "/pagealloc/gpu0.sock"));
  // The system directory's socket comes first, as the daemon's choice.
  fds_.push_back(Listen(system_ + "/gpu0.sock"));
  EXPECT_THAT(FindDaemonTarget(0, dirs),
              IsOkAndHolds("unix://" + system_ + "/gpu0.sock"));
}

TEST_F(SocketLocationTest, SaysWhereItLookedWhenNoSocketIsThere) {
  std::ofstream(system_ + "/gpu1.sock") << "not a socket";
  EXPECT_THAT(
      FindDaemonTarget(1, SocketDirectories(system_, runtime_)),
      StatusIs(absl::StatusCode::kUnavailable,
               HasSubstr("no pagealloc daemon socket for GPU 1: looked at " +
                         system_ + "/gpu1.sock (not a socket), " + runtime_ +
                         "/pagealloc/gpu1.sock (No such file or directory)")));
}

}  // namespace
}  // namespace pagealloc
