// The descriptor keeper as a process: it answers a successor's handover
// while its daemon runs (stopping the daemon first), after the daemon's
// death (at once), and never after it was retired or lingered out. This
// test plays the daemon; the keeper is fd_keeper_main_for_test, which runs
// RunFdKeeper as the daemon's own main does.

#include "fd_keeper/fd_keeper.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "handover/handover.h"
#include "memory/unique_fd.h"
#include "tests/memfd_text.h"
#include "tests/socket_dir.h"
#include "tests/status_matchers.h"
#include "tests/subprocess.h"
#include "tests/wait_for.h"

extern char** environ;

namespace pagealloc {
namespace {

using ::pagealloc::testing::MemfdWithText;
using ::pagealloc::testing::ReadText;
using ::pagealloc::testing::RunfilePath;
using ::pagealloc::testing::StatusIs;
using ::pagealloc::testing::WaitFor;
using ::testing::HasSubstr;

// Whether keeper `pid` has exited (reaped here once the FdKeeper that
// spawned it is gone, as init reaps it once the daemon is).
bool Gone(pid_t pid) {
  waitpid(pid, nullptr, WNOHANG);
  return kill(pid, 0) != 0;
}

class FdKeeperTest : public ::testing::Test {
 protected:
  FdKeeper::Options Options(absl::Duration linger = absl::Seconds(30)) {
    FdKeeper::Options options;
    options.binary = RunfilePath("fd_keeper/fd_keeper_main_for_test");
    options.socket_path = path_;
    options.fds = {{"pagealloc-slab", slab_.get()},
                   {"pagealloc-state", state_.get()}};
    options.linger = linger;
    options.stop = [this] { ++stops_; };
    return options;
  }

  // Takes the pool over as a successor does: the descriptors, checked.
  void TakeOver() {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingHandover> pending,
                         PendingHandover::Request(path_, absl::Seconds(10)));
    ASSERT_EQ(pending->fds().size(), 2u);
    EXPECT_EQ(ReadText(pending->fds().at("pagealloc-slab").get()), "kv bytes");
    EXPECT_EQ(ReadText(pending->fds().at("pagealloc-state").get()), "journal");
    ASSERT_OK(pending->Accept(absl::Seconds(10)));
  }

  const std::string path_ =
      ::pagealloc::testing::MakeSocketDir("fdkeeper") + "/gpu0.sock.handover";
  UniqueFd slab_ = MemfdWithText("kv bytes");
  UniqueFd state_ = MemfdWithText("journal");
  std::atomic<int> stops_{0};
};

TEST_F(FdKeeperTest, ARunningDaemonIsStoppedBeforeItsSuccessorGoesOn) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FdKeeper> keeper,
                       FdKeeper::Spawn(Options()));
  // A successor that cannot take the state over changes nothing.
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingHandover> pending,
                         PendingHandover::Request(path_, absl::Seconds(10)));
    pending->Refuse("another build");
  }
  EXPECT_EQ(stops_, 0);
  TakeOver();
  EXPECT_EQ(stops_, 1);
  EXPECT_TRUE(keeper->handed_over());
  EXPECT_TRUE(WaitFor([&] { return Gone(keeper->pid()); }, absl::Seconds(10)));
  EXPECT_FALSE(keeper->lost());
  // Its socket went before DONE: the successor listens there next.
  EXPECT_NE(access(path_.c_str(), F_OK), 0);
}

TEST_F(FdKeeperTest, ADeadDaemonsPoolIsTakenOverFromItsKeeper) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FdKeeper> keeper,
                       FdKeeper::Spawn(Options()));
  const pid_t pid = keeper->pid();
  // The daemon dies: its end of the link closes, and so do its own
  // descriptors. The keeper's still hold the memory.
  keeper.reset();
  slab_.reset();
  state_.reset();
  TakeOver();
  EXPECT_EQ(stops_, 0);  // nothing to stop
  EXPECT_TRUE(WaitFor([&] { return Gone(pid); }, absl::Seconds(10)));
  EXPECT_THAT(
      PendingHandover::Request(path_, absl::Seconds(10)).status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("no daemon answers")));
}

// A daemon may die while its keeper starts, before it hears READY: its
// journal was whole when it spawned the keeper, which keeps the pool.
TEST_F(FdKeeperTest, AKeeperWhoseDaemonDiedBeforeItsReadyKeepsThePool) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
  UniqueFd daemon_end(pair[0]);
  UniqueFd keeper_end(pair[1]);
  daemon_end.reset();  // the daemon is gone already
  std::string binary = RunfilePath("fd_keeper/fd_keeper_main_for_test");
  std::vector<std::string> args = {
      binary,  kFdKeeperArg,     path_,
      "30000", "pagealloc-slab", "pagealloc-state"};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  // Through duplicates above 3..5, so that no dup2 overwrites a source.
  const UniqueFd sources[] = {UniqueFd(fcntl(keeper_end.get(), F_DUPFD, 64)),
                              UniqueFd(fcntl(slab_.get(), F_DUPFD, 64)),
                              UniqueFd(fcntl(state_.get(), F_DUPFD, 64))};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int i = 0; i < 3; ++i) {
    posix_spawn_file_actions_adddup2(&actions, sources[i].get(), 3 + i);
  }
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(),
                        environ),
            0);
  posix_spawn_file_actions_destroy(&actions);
  keeper_end.reset();
  ASSERT_TRUE(WaitFor([&] { return access(path_.c_str(), F_OK) == 0; },
                      absl::Seconds(10)));
  TakeOver();
  EXPECT_TRUE(WaitFor([&] { return Gone(pid); }, absl::Seconds(10)));
}

TEST_F(FdKeeperTest, ARetiredKeeperOffersNothing) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FdKeeper> keeper,
                       FdKeeper::Spawn(Options()));
  keeper->Retire();
  keeper->Retire();  // idempotent
  EXPECT_TRUE(WaitFor([&] { return Gone(keeper->pid()); }, absl::Seconds(10)));
  EXPECT_FALSE(keeper->lost());
  EXPECT_THAT(
      PendingHandover::Request(path_, absl::Seconds(10)).status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("no daemon answers")));
}

TEST_F(FdKeeperTest, AKeeperWithNoSuccessorLeavesAfterItsLinger) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FdKeeper> keeper,
                       FdKeeper::Spawn(Options(absl::Milliseconds(200))));
  const pid_t pid = keeper->pid();
  keeper.reset();  // the daemon is gone
  EXPECT_TRUE(WaitFor([&] { return Gone(pid); }, absl::Seconds(10)));
  EXPECT_THAT(
      PendingHandover::Request(path_, absl::Seconds(10)).status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("no daemon answers")));
}

TEST_F(FdKeeperTest, ASecondKeeperOnALiveSocketIsRefused) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FdKeeper> keeper,
                       FdKeeper::Spawn(Options()));
  EXPECT_THAT(FdKeeper::Spawn(Options()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("handover socket")));
  // The first still answers.
  TakeOver();
  EXPECT_EQ(stops_, 1);
}

// The daemon blocks the signals it waits for; its keeper does not inherit
// that: an operator's kill ends it, and the pool with it.
TEST_F(FdKeeperTest, AKeeperEndsOnSigtermThoughItsDaemonBlocksIt) {
  sigset_t blocked, before;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGINT);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &blocked, &before), 0);
  absl::StatusOr<std::unique_ptr<FdKeeper>> keeper = FdKeeper::Spawn(Options());
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  ASSERT_OK(keeper.status());
  ASSERT_EQ(kill((*keeper)->pid(), SIGTERM), 0);
  EXPECT_TRUE(WaitFor([&] { return (*keeper)->lost(); }, absl::Seconds(10)));
  EXPECT_TRUE(
      WaitFor([&] { return Gone((*keeper)->pid()); }, absl::Seconds(10)));
}

TEST_F(FdKeeperTest, AKeeperThatCannotStartSaysSo) {
  FdKeeper::Options options = Options();
  options.binary = "/nonexistent/pagealloc-server";
  EXPECT_THAT(FdKeeper::Spawn(options).status(),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("/nonexistent/pagealloc-server")));
  options = Options();
  options.fds.clear();
  EXPECT_THAT(FdKeeper::Spawn(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 to 16 descriptors, not 0")));
}

}  // namespace
}  // namespace pagealloc
