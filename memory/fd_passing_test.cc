#include "memory/fd_passing.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/shared_region.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

class FdPassingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int pair[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
    sender_.reset(pair[0]);
    receiver_.reset(pair[1]);
  }

  absl::Span<const char> Bytes(const std::string& text) {
    return absl::MakeConstSpan(text.data(), text.size());
  }

  UniqueFd sender_, receiver_;
};

TEST_F(FdPassingTest, TheMessageAndItsDescriptorsArriveTogether) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> memory,
                       SharedRegion::Create("fd-passing-test", 4096));
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  ASSERT_OK(SendWithFds(sender_.get(), Bytes("hello"),
                        {memory->fd(), write_end.get()}));
  // The sender's copies may go: the receiver's are its own.
  write_end.reset();

  char buffer[16];
  std::vector<UniqueFd> fds;
  EXPECT_THAT(ReceiveWithFds(receiver_.get(), absl::MakeSpan(buffer), 4, &fds),
              IsOkAndHolds(5));
  EXPECT_EQ(std::string(buffer, 5), "hello");
  ASSERT_EQ(fds.size(), 2u);
  // Close-on-exec, and the same open files.
  EXPECT_NE(fcntl(fds[0].get(), F_GETFD) & FD_CLOEXEC, 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> mapped,
                       SharedRegion::FromFd(std::move(fds[0]), 4096,
                                            SharedRegion::Access::kReadWrite));
  std::strcpy(static_cast<char*>(mapped->base()), "shared");
  EXPECT_STREQ(static_cast<const char*>(memory->base()), "shared");
  ASSERT_EQ(write(fds[1].get(), "x", 1), 1);
  char x = 0;
  ASSERT_EQ(read(read_end.get(), &x, 1), 1);
  EXPECT_EQ(x, 'x');
}

TEST_F(FdPassingTest, AMessageWithoutDescriptors) {
  ASSERT_OK(SendWithFds(sender_.get(), Bytes("plain"), {}));
  char buffer[16];
  std::vector<UniqueFd> fds;
  EXPECT_THAT(ReceiveWithFds(receiver_.get(), absl::MakeSpan(buffer), 0, &fds),
              IsOkAndHolds(5));
  EXPECT_TRUE(fds.empty());
}

TEST_F(FdPassingTest, ClosedPeerReadsAsZeroAndSendFails) {
  sender_.reset();
  char buffer[16];
  std::vector<UniqueFd> fds;
  EXPECT_THAT(ReceiveWithFds(receiver_.get(), absl::MakeSpan(buffer), 4, &fds),
              IsOkAndHolds(0));
  EXPECT_THAT(SendWithFds(receiver_.get(), Bytes("anyone?"), {}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("sendmsg")));
}

TEST_F(FdPassingTest, NothingWaitingOnANonBlockingSocketIsUnavailable) {
  ASSERT_EQ(fcntl(receiver_.get(), F_SETFL, O_NONBLOCK), 0);
  char buffer[16];
  std::vector<UniqueFd> fds;
  EXPECT_THAT(
      ReceiveWithFds(receiver_.get(), absl::MakeSpan(buffer), 4, &fds),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no message")));
}

TEST_F(FdPassingTest, UnexpectedDescriptorsAreRefusedAndClosed) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  // Two descriptors where one is expected, then one where none is: the
  // receiver keeps none of them.
  ASSERT_OK(SendWithFds(sender_.get(), Bytes("two"),
                        {write_end.get(), write_end.get()}));
  ASSERT_OK(SendWithFds(sender_.get(), Bytes("one"), {write_end.get()}));
  write_end.reset();
  char buffer[16];
  std::vector<UniqueFd> fds;
  EXPECT_THAT(ReceiveWithFds(receiver_.get(), absl::MakeSpan(buffer), 1, &fds),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("more than the 1 descriptors")));
  EXPECT_THAT(ReceiveWithFds(receiver_.get(), absl::MakeSpan(buffer), 0, &fds),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("more than the 0 descriptors")));
  EXPECT_TRUE(fds.empty());
  // Every copy of the pipe's write end is closed: its reader sees EOF.
  char x;
  EXPECT_EQ(read(read_end.get(), &x, 1), 0);
}

TEST_F(FdPassingTest, AMessageLongerThanTheBufferIsRefused) {
  ASSERT_OK(SendWithFds(sender_.get(), Bytes("a longer message"), {}));
  char buffer[4];
  std::vector<UniqueFd> fds;
  EXPECT_THAT(ReceiveWithFds(receiver_.get(), absl::MakeSpan(buffer), 0, &fds),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("longer than the 4 bytes")));
}

TEST_F(FdPassingTest, TooManyDescriptorsAreRefusedBeforeSending) {
  std::vector<int> many(kMaxPassedFds + 1, sender_.get());
  EXPECT_THAT(
      SendWithFds(sender_.get(), Bytes("x"), many),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 16")));
}

}  // namespace
}  // namespace pagealloc
