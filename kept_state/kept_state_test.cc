// KeptState where the daemon holds its own descriptors (no service
// manager): what it offers a successor, and what a successor asks before
// the running daemon stops (CheckTakeOver) and takes over after (Open).
// The process-level handover is tests/restart_test.cc's Handover case.

#include "kept_state/kept_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "allocator/fake_executor.h"
#include "allocator/page_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/unique_fd.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

constexpr int64_t kPageSize = 4;
constexpr int64_t kNumPages = 64;

KeptStateOptions DaemonKept(std::string fingerprint) {
  KeptStateOptions options;
  options.fingerprint = std::move(fingerprint);
  options.log_capacity_bytes = 64 << 10;
  options.max_owners = 8;
  options.keeper = DescriptorKeeper::kDaemon;
  return options;
}

PoolOptions PoolWith(PoolChangeLog* log) {
  PoolOptions options;
  options.num_pages = kNumPages;
  options.page_size = kPageSize;
  options.change_log = log;
  return options;
}

UniqueFd Dup(int fd) { return UniqueFd(fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

// Takes `pages` pages for `owner`.
void Allocate(PagePool& pool, OwnerId owner, int64_t pages) {
  std::vector<int64_t> slots(pages * kPageSize);
  AllocRequest request{RequestKind::kAlloc, owner, 0,           0,
                       pages * kPageSize,   -1,    slots.data()};
  ASSERT_OK(pool.Allocate({request})[0].status);
}

class KeptByTheDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("NOTIFY_SOCKET");
    ASSERT_OK_AND_ASSIGN(kept_, KeptState::Open(DaemonKept("page_size=4"), {}));
    EXPECT_EQ(kept_->outcome(), KeptStateOutcome::kNone);
    ASSERT_OK_AND_ASSIGN(pool_,
                         PagePool::Create(PoolWith(kept_.get()), &executor_));
    ASSERT_OK(pool_->AddOwner(1, 0, "session one"));
    Allocate(*pool_, 1, 3);
    slab_.reset(memfd_create("slab", MFD_CLOEXEC));
    DaemonIdentity identity;
    identity.slab_id = 7;
    ASSERT_OK(kept_->StartKeeping(*pool_, slab_.get(), identity));
    // Changes after the snapshot: records a successor replays.
    ASSERT_OK(pool_->AddOwner(2, 0, "session two"));
    Allocate(*pool_, 2, 5);
    Allocate(*pool_, 1, 1);
  }

  int state_fd() const {
    absl::StatusOr<std::vector<std::pair<std::string, int>>> fds =
        kept_->KeptDescriptors();
    if (!fds.ok()) return -1;
    for (const auto& [name, fd] : *fds) {
      if (name == kStateFdName) return fd;
    }
    return -1;
  }

  FakeExecutor executor_;
  std::unique_ptr<KeptState> kept_;
  std::unique_ptr<PagePool> pool_;
  UniqueFd slab_;
};

TEST(KeptStateTest, TheServiceManagersStoreNeedsAServiceManager) {
  unsetenv("NOTIFY_SOCKET");
  KeptStateOptions options = DaemonKept("page_size=4");
  options.keeper = DescriptorKeeper::kServiceManager;
  EXPECT_THAT(KeptState::Open(options, {}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("NOTIFY_SOCKET")));
  options.keeper = DescriptorKeeper::kDaemon;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KeptState> kept,
                       KeptState::Open(options, {}));
  // Nothing is offered before the daemon keeps its state.
  EXPECT_THAT(
      kept->KeptDescriptors().status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not kept")));
}

TEST_F(KeptByTheDaemonTest, OffersTheSlabAndTheJournal) {
  ASSERT_OK_AND_ASSIGN(auto fds, kept_->KeptDescriptors());
  EXPECT_THAT(fds, UnorderedElementsAre(Pair(kSlabFdName, slab_.get()),
                                        Pair(kStateFdName, ::testing::_)));
  EXPECT_TRUE(kept_->stats().keeping);
}

TEST_F(KeptByTheDaemonTest, ASuccessorChecksThenTakesOverTheSamePool) {
  EXPECT_OK(KeptState::CheckTakeOver(DaemonKept("page_size=4"), state_fd()));

  absl::flat_hash_map<std::string, UniqueFd> passed;
  passed.emplace(kStateFdName, Dup(state_fd()));
  passed.emplace(kSlabFdName, Dup(slab_.get()));
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<KeptState> successor,
      KeptState::Open(DaemonKept("page_size=4"), std::move(passed)));
  ASSERT_EQ(successor->outcome(), KeptStateOutcome::kRecovered);
  EXPECT_EQ(successor->identity().slab_id, 7u);
  FakeExecutor executor;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<PagePool> pool,
      PagePool::CreateFromState(PoolWith(successor.get()), &executor,
                                successor->recovered_state()));
  ASSERT_OK(successor->Replay(*pool));
  EXPECT_EQ(successor->stats().replayed_records, 3);
  // The successor's pool is the daemon's, page for page.
  EXPECT_TRUE(pool->ExportState() == pool_->ExportState());
}

TEST_F(KeptByTheDaemonTest, ASuccessorOfOtherFlagsRefusesBeforeTheDaemonStops) {
  EXPECT_THAT(KeptState::CheckTakeOver(DaemonKept("page_size=8"), state_fd()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("kept 'page_size=4', now 'page_size=8'")));
  // Told to discard, it would take over (and start fresh): no refusal.
  KeptStateOptions discard = DaemonKept("page_size=8");
  discard.discard = true;
  EXPECT_OK(KeptState::CheckTakeOver(discard, state_fd()));
  // Open refuses the same way.
  absl::flat_hash_map<std::string, UniqueFd> passed;
  passed.emplace(kStateFdName, Dup(state_fd()));
  EXPECT_THAT(
      KeptState::Open(DaemonKept("page_size=8"), std::move(passed)).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("--discard_state")));
  // The check read a duplicate: the daemon keeps recording.
  Allocate(*pool_, 2, 1);
  EXPECT_EQ(kept_->stats().failures, 0);
}

TEST(KeptStateTest, AJournalThatFailsAChecksumNowIsLeftToOpen) {
  // Mid-write, a journal may fail a check: the successor goes on, and
  // Open (after the daemon stopped) decides, failing closed.
  UniqueFd garbage(memfd_create("garbage", MFD_CLOEXEC));
  const std::string bytes(8192, 'x');
  ASSERT_EQ(write(garbage.get(), bytes.data(), bytes.size()),
            static_cast<ssize_t>(bytes.size()));
  EXPECT_OK(KeptState::CheckTakeOver(DaemonKept("page_size=4"), garbage.get()));
  absl::flat_hash_map<std::string, UniqueFd> passed;
  passed.emplace(kStateFdName, std::move(garbage));
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<KeptState> kept,
      KeptState::Open(DaemonKept("page_size=4"), std::move(passed)));
  EXPECT_EQ(kept->outcome(), KeptStateOutcome::kCorrupt);
}

}  // namespace
}  // namespace pagealloc
