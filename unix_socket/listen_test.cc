#include "unix_socket/listen.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/unique_fd.h"
#include "tests/socket_dir.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

// A socket file nobody accepts on: a dead daemon's.
void BindAndClose(const std::string& path, int type) {
  UniqueFd fd(socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(
      bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0)
      << std::strerror(errno);
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// Sockets in a directory of their own under /tmp (TEST_TMPDIR is too long
// a path for a Unix socket).
class ListenTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = ::pagealloc::testing::MakeSocketDir("listen");
    path_ = dir_ + "/gpu0.sock";
  }

  UnixListenOptions Options() const {
    UnixListenOptions options;
    options.type = GetParam();
    return options;
  }

  std::string dir_;
  std::string path_;
};

TEST_P(ListenTest, RefusesALiveSocketAndReplacesAStaleOne) {
  ASSERT_OK_AND_ASSIGN(UniqueFd live, ListenOnUnixSocket(path_, Options()));
  // The probe connects with the listener's own type: a live SEQPACKET
  // socket refuses a stream connection and would look stale to one.
  EXPECT_THAT(ListenOnUnixSocket(path_, Options()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("another process is serving on " + path_)));
  live.reset();
  unlink(path_.c_str());
  BindAndClose(path_, GetParam());
  EXPECT_OK(ListenOnUnixSocket(path_, Options()).status());
}

TEST_P(ListenTest, NeverReplacesAFileThatIsNotASocket) {
  std::ofstream(path_) << "not a socket";
  EXPECT_THAT(ListenOnUnixSocket(path_, Options()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("exists and is not a socket")));
  std::ifstream in(path_);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "not a socket");
}

TEST_P(ListenTest, SetsTheModeAndTheBlockingTheCallerAsks) {
  UnixListenOptions options = Options();
  options.mode = 0600;
  options.nonblocking = false;
  ASSERT_OK_AND_ASSIGN(UniqueFd blocking, ListenOnUnixSocket(path_, options));
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(fcntl(blocking.get(), F_GETFL) & O_NONBLOCK, 0);
  blocking.reset();
  options.mode = 0660;
  options.nonblocking = true;
  ASSERT_OK_AND_ASSIGN(UniqueFd nonblocking,
                       ListenOnUnixSocket(path_, options));
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_NE(fcntl(nonblocking.get(), F_GETFL) & O_NONBLOCK, 0);
}

TEST_P(ListenTest, AnUnknownGroupLeavesNoSocketFileBehind) {
  UnixListenOptions options = Options();
  options.group = "no-such-group-of-pagealloc";
  EXPECT_THAT(ListenOnUnixSocket(path_, options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no group named no-such-group-of-pagealloc")));
  EXPECT_FALSE(Exists(path_));
}

TEST_P(ListenTest, CreatesAMissingDirectoryButNotItsParents) {
  UnixListenOptions options = Options();
  options.directory_mode = 0700;
  const std::string made = dir_ + "/made";
  {
    ASSERT_OK_AND_ASSIGN(UniqueFd fd,
                         ListenOnUnixSocket(made + "/gpu0.sock", options));
    struct stat st;
    ASSERT_EQ(stat(made.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    unlink((made + "/gpu0.sock").c_str());
  }
  EXPECT_THAT(ListenOnUnixSocket(dir_ + "/no/such/gpu0.sock", options).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("cannot create the socket directory " + dir_ +
                                 "/no/such")));
  // The caller's advice on choosing another socket goes with the refusal.
  options.socket_advice = "--listen=unix:///tmp/x.sock";
  EXPECT_THAT(ListenOnUnixSocket(dir_ + "/no/such/gpu0.sock", options).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("may write (--listen=unix:///tmp/x.sock), or "
                                 "create that directory")));
}

TEST_P(ListenTest, RefusesAPathTooLongForAUnixSocket) {
  const std::string path = dir_ + "/" + std::string(120, 's');
  EXPECT_THAT(ListenOnUnixSocket(path, Options()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Unix sockets allow at most 107")));
  EXPECT_THAT(ListenOnUnixSocket("", Options()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("an empty socket path")));
}

INSTANTIATE_TEST_SUITE_P(StreamAndSeqpacket, ListenTest,
                         ::testing::Values(SOCK_STREAM, SOCK_SEQPACKET),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == SOCK_STREAM ? "Stream"
                                                            : "Seqpacket";
                         });

TEST(CheckSocketDirectoryTest, ARegularFileIsNoDirectory) {
  EXPECT_THAT(CheckSocketDirectory("/dev/null", 0755),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cannot create sockets in /dev/null")));
}

}  // namespace
}  // namespace pagealloc
