#include "handover/handover.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/unique_fd.h"
#include "tests/memfd_text.h"
#include "tests/socket_dir.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::MemfdWithText;
using ::pagealloc::testing::ReadText;
using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

std::string SocketPath() {
  return ::pagealloc::testing::MakeSocketDir("handover") +
         "/gpu0.sock.handover";
}

// Polls `done` for up to 10 s: the listener answers on its own thread.
template <typename F>
bool Eventually(F done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

class HandoverTest : public ::testing::Test {
 protected:
  void StartListener() {
    HandoverListener::Callbacks callbacks;
    callbacks.offer = [this]() -> absl::StatusOr<std::vector<OfferedFd>> {
      if (!offer_error_.ok()) return offer_error_;
      return std::vector<OfferedFd>{{"pagealloc-slab", slab_.get()},
                                    {"pagealloc-state", state_.get()}};
    };
    // As the daemon's Shutdown does: no successor after this one.
    callbacks.stop = [this] {
      stops_++;
      listener_->Stop();
    };
    ASSERT_OK_AND_ASSIGN(listener_,
                         HandoverListener::Start(path_, std::move(callbacks)));
  }

  const std::string path_ = SocketPath();
  UniqueFd slab_ = MemfdWithText("the KV slab");
  UniqueFd state_ = MemfdWithText("the journal");
  absl::Status offer_error_ = absl::OkStatus();
  std::atomic<int> stops_{0};
  std::unique_ptr<HandoverListener> listener_;
};

TEST_F(HandoverTest, SuccessorGetsTheDescriptorsAndTheDaemonStops) {
  StartListener();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingHandover> pending,
                       PendingHandover::Request(path_, absl::Seconds(10)));
  ASSERT_EQ(pending->fds().size(), 2u);
  // The successor's own descriptors, to the daemon's files.
  EXPECT_EQ(ReadText(pending->fds()["pagealloc-slab"].get()), "the KV slab");
  EXPECT_EQ(ReadText(pending->fds()["pagealloc-state"].get()), "the journal");
  EXPECT_NE(pending->fds()["pagealloc-state"].get(), state_.get());
  // Nothing stops before the successor says GO.
  EXPECT_EQ(stops_.load(), 0);
  ASSERT_OK(pending->Accept(absl::Seconds(10)));
  EXPECT_EQ(stops_.load(), 1);
  EXPECT_TRUE(Eventually([&] { return listener_->handed_over() == 1; }));
}

TEST_F(HandoverTest, SuccessorThatRefusesLeavesTheDaemonServing) {
  StartListener();
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingHandover> pending,
                         PendingHandover::Request(path_, absl::Seconds(10)));
    pending->Refuse("kept for a pool of other flags");
  }
  EXPECT_TRUE(Eventually([&] { return listener_->refused() == 1; }));
  EXPECT_EQ(stops_.load(), 0);
  // A successor that drops the connection without a word is refused too.
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingHandover> pending,
                         PendingHandover::Request(path_, absl::Seconds(10)));
  }
  EXPECT_TRUE(Eventually([&] { return listener_->refused() == 2; }));
  // And the daemon still answers the next one.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingHandover> pending,
                       PendingHandover::Request(path_, absl::Seconds(10)));
  ASSERT_OK(pending->Accept(absl::Seconds(10)));
  EXPECT_EQ(stops_.load(), 1);
}

TEST_F(HandoverTest, ASecondSuccessorMeanwhileGetsNothing) {
  StartListener();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingHandover> first,
                       PendingHandover::Request(path_, absl::Seconds(10)));
  // The second waits behind the first (one successor at a time).
  absl::StatusOr<std::unique_ptr<PendingHandover>> second;
  std::thread asking(
      [&] { second = PendingHandover::Request(path_, absl::Seconds(30)); });
  ASSERT_OK(first->Accept(absl::Seconds(10)));
  EXPECT_EQ(stops_.load(), 1);
  asking.join();
  // Refused, or the socket already gone: never an offer.
  EXPECT_FALSE(second.ok());
  EXPECT_EQ(stops_.load(), 1);
}

TEST_F(HandoverTest, DaemonWhoseStateIsNotKeptRefuses) {
  offer_error_ = absl::FailedPreconditionError("the state is no longer kept");
  StartListener();
  EXPECT_THAT(PendingHandover::Request(path_, absl::Seconds(10)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the state is no longer kept")));
  EXPECT_EQ(stops_.load(), 0);
}

TEST_F(HandoverTest, NoDaemonIsNotFound) {
  EXPECT_THAT(PendingHandover::Request(path_, absl::Seconds(1)).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  StartListener();
  listener_->Stop();
  // A stopped listener's socket file is gone.
  EXPECT_NE(access(path_.c_str(), F_OK), 0);
  EXPECT_THAT(PendingHandover::Request(path_, absl::Seconds(1)).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

TEST_F(HandoverTest, HostilePeerIsRefusedAndTheDaemonServesOn) {
  StartListener();
  for (const std::string& message :
       {std::string("TAKE 99"), std::string("GIVE 1"), std::string(),
        std::string(5000, 'x')}) {
    UniqueFd peer(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path_.c_str(), path_.size() + 1);
    ASSERT_EQ(connect(peer.get(), reinterpret_cast<sockaddr*>(&address),
                      sizeof(address)),
              0);
    if (!message.empty()) {
      send(peer.get(), message.data(), message.size(), MSG_NOSIGNAL);
    } else {
      shutdown(peer.get(), SHUT_WR);
    }
    char answer[256] = {};
    const ssize_t n = recv(peer.get(), answer, sizeof(answer) - 1, 0);
    // Either a refusal or a closed connection; never an offer.
    if (n > 0) {
      EXPECT_THAT(std::string(answer, n), HasSubstr("REFUSE"))
          << message.size();
    }
  }
  EXPECT_TRUE(Eventually([&] { return listener_->refused() == 4; }));
  EXPECT_EQ(stops_.load(), 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingHandover> pending,
                       PendingHandover::Request(path_, absl::Seconds(10)));
  EXPECT_EQ(pending->fds().size(), 2u);
}

TEST_F(HandoverTest, ALiveListenerIsNotReplacedAndAStaleOneIs) {
  StartListener();
  HandoverListener::Callbacks callbacks;
  callbacks.offer = [] { return std::vector<OfferedFd>(); };
  callbacks.stop = [] {};
  EXPECT_THAT(HandoverListener::Start(path_, callbacks).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("another process is serving on " + path_)));
  // A socket file nobody listens on (a daemon that died) is replaced.
  listener_.reset();
  UniqueFd stale(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path_.c_str(), path_.size() + 1);
  ASSERT_EQ(
      bind(stale.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)),
      0);
  stale.reset();
  EXPECT_OK(HandoverListener::Start(path_, callbacks).status());
}

TEST(HandoverSocketLiveTest, SaysWhetherAProcessListens) {
  const std::string path = SocketPath();
  EXPECT_FALSE(HandoverSocketLive(path));
  HandoverListener::Callbacks callbacks;
  callbacks.offer = []() -> absl::StatusOr<std::vector<OfferedFd>> {
    return absl::FailedPreconditionError("nothing kept");
  };
  callbacks.stop = [] {};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<HandoverListener> listener,
                       HandoverListener::Start(path, callbacks));
  EXPECT_TRUE(HandoverSocketLive(path));
  listener.reset();
  EXPECT_FALSE(HandoverSocketLive(path));
}

}  // namespace
}  // namespace pagealloc
