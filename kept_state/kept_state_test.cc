// KeptState where the daemon holds its own descriptors (no service
// manager): what it offers a successor, and what a successor asks before
// the running daemon stops (CheckTakeOver) and takes over after (Open).
// The process-level handover is tests/restart_test.cc's Handover case.
//
// And the kept states of this release and the earlier ones as files
// (testdata/kept_state_v<N>.journal.gz; v1 holds its match record in
// record format 1, v2 in format 2; v3 holds pages awaiting release, in its
// snapshot and in a record): a later build must take each over page
// for page (an upgrade keeps the pool), or refuse it by its format or
// semantics version, never misread it. A build that changes the format on
// purpose keeps a reader for the old one, or bumps the version so that the
// refusal is what this test sees, and adds its own file. Written by this
// test with PAGEALLOC_GOLDEN_OUT set:
//   ./bazelw run //kept_state:kept_state_test -- --gtest_filter='*Golden*'
//   (with
//   PAGEALLOC_GOLDEN_OUT=$PWD/kept_state/testdata/kept_state_v3.journal.gz)

#include "kept_state/kept_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/fake_executor.h"
#include "allocator/page_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/unique_fd.h"
#include "tests/status_matchers.h"
#include "zlib.h"

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
  options.max_pinned_pages_per_owner = 16;
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

// Held by the daemon alone, the descriptors die with it; a live keeper
// of its own (the probe) makes them outlive its crash.
TEST_F(KeptByTheDaemonTest, OutlivesACrashOnlyWhileAKeeperHoldsTheDescriptors) {
  EXPECT_FALSE(kept_->stats().outlives_crash);
  bool keeper_alive = true;
  kept_->SetCrashSurvivalProbe([&keeper_alive] { return keeper_alive; });
  EXPECT_TRUE(kept_->stats().outlives_crash);
  keeper_alive = false;
  EXPECT_FALSE(kept_->stats().outlives_crash);
  keeper_alive = true;
  // A state that can no longer be kept outlives nothing, and tells its
  // observer (which retires the keeper).
  int broke = 0;
  kept_->SetBreakObserver([&broke] { ++broke; });
  PoolState huge = pool_->ExportState();
  huge.owners.front().metadata.assign(24 << 20, 'x');
  kept_->WriteSnapshot(huge);  // larger than its slot
  EXPECT_EQ(broke, 1);
  EXPECT_FALSE(kept_->stats().keeping);
  EXPECT_FALSE(kept_->stats().outlives_crash);
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

// A journal this build creates is of the newest journal format, with
// records of the newest record format.
TEST_F(KeptByTheDaemonTest, ANewJournalIsOfTheNewestFormats) {
  ASSERT_OK_AND_ASSIGN(auto reopened, StateJournal::Open(Dup(state_fd())));
  EXPECT_EQ(reopened.second.format_version, StateJournal::kFormatVersion);
  ASSERT_FALSE(reopened.second.records.empty());
  for (const JournalRecord& record : reopened.second.records) {
    ASSERT_FALSE(record.payload.empty());
    EXPECT_EQ(record.payload[0], static_cast<char>(kPoolChangeFormatVersion));
  }
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

// The golden state: two sessions, owned pages, frees, a checkpoint, a
// published chain (one page pinned), an adopt, before and after the
// snapshot StartKeeping writes, so that the file holds a snapshot of every
// kind of page and records of every common kind.
constexpr char kGoldenFingerprint[] = "golden kept state\npage_size=4";
struct Golden {
  const char* path;
  uint32_t journal_format;  // which says the format of its records
};
constexpr Golden kGoldens[] = {
    {"kept_state/testdata/kept_state_v1.journal.gz", 1},
    {"kept_state/testdata/kept_state_v2.journal.gz", 2},
    {"kept_state/testdata/kept_state_v3.journal.gz", 3},
};

PrefixKey GoldenKey(int tag) {
  PrefixKey key{};
  for (size_t i = 0; i < key.size(); ++i) key[i] = tag * 31 + i;
  return key;
}

std::vector<int64_t> PagesOf(PagePool& pool, OwnerId owner) {
  absl::StatusOr<PagePool::OwnedPages> owned = pool.PagesOwnedBy(owner);
  if (!owned.ok()) return {};
  std::vector<int64_t> pages = owned->owned;
  pages.insert(pages.end(), owned->shared.begin(), owned->shared.end());
  return pages;
}

void GoldenOperations(PagePool& pool, KeptState& kept, int slab_fd) {
  ASSERT_OK(pool.AddOwner(1, 0, "session one"));
  ASSERT_OK(pool.AddOwner(2, 40, "session two"));
  Allocate(pool, 1, 6);
  Allocate(pool, 2, 3);
  std::vector<int64_t> one = PagesOf(pool, 1);
  ASSERT_GE(one.size(), 6u);
  ASSERT_OK(pool.FreePages(1, {one[1], one[4]}, FreeOrder::kFirstAppearance)
                .status());
  ASSERT_OK(pool.Publish(1, {one[0], one[2]}, {GoldenKey(1), GoldenKey(2)},
                         nullptr, /*pin=*/false)
                .status());
  // Freed behind a fence (journal format 3 on): in the snapshot.
  ASSERT_OK(pool.AwaitRelease(1, {one[3]}));
  DaemonIdentity identity;
  identity.slab_id = 0x601de2;
  ASSERT_OK(kept.StartKeeping(pool, slab_fd, identity));
  // Records after the snapshot.
  ASSERT_OK(pool.Checkpoint(2).status());
  Allocate(pool, 2, 2);
  const std::vector<PrefixKey> chain = {GoldenKey(1), GoldenKey(2)};
  ASSERT_OK(pool.MatchPrefix(2, chain, /*adopt=*/true).status());
  ASSERT_OK_AND_ASSIGN(const PagePool::OwnedPages held, pool.PagesOwnedBy(1));
  ASSERT_FALSE(held.owned.empty());
  ASSERT_OK(pool.Publish(1, {held.owned.back()}, {GoldenKey(3)}, &chain.back(),
                         /*pin=*/true)
                .status());
  ASSERT_OK(pool.AddOwner(3, 0, "session three"));
  Allocate(pool, 3, 1);
  ASSERT_OK(pool.RemoveOwner(3).status());
  // And in a record.
  const std::vector<int64_t> two = PagesOf(pool, 2);
  ASSERT_FALSE(two.empty());
  ASSERT_OK(pool.AwaitRelease(2, {two.back()}));
}

// The state a file of `journal_format` keeps of `state`: before journal
// format 3, no page awaits release.
PoolState KeptIn(uint32_t journal_format, PoolState state) {
  if (journal_format < 3) {
    for (PoolOwnerState& owner : state.owners) owner.awaiting_release.clear();
  }
  return state;
}

KeptStateOptions GoldenOptions() {
  KeptStateOptions options = DaemonKept(kGoldenFingerprint);
  options.snapshot_capacity_bytes = 64 << 10;
  options.log_capacity_bytes = 64 << 10;
  return options;
}

TEST(KeptStateGoldenTest, ThisReleasesKeptStateIsTakenOverPageForPage) {
  unsetenv("NOTIFY_SOCKET");
  // The pool the golden operations make now, with this build.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KeptState> kept,
                       KeptState::Open(GoldenOptions(), {}));
  FakeExecutor executor;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PagePool> pool,
                       PagePool::Create(PoolWith(kept.get()), &executor));
  UniqueFd slab(memfd_create("slab", MFD_CLOEXEC));
  GoldenOperations(*pool, *kept, slab.get());
  ASSERT_OK(pool->CheckInvariants());
  ASSERT_OK_AND_ASSIGN(auto fds, kept->KeptDescriptors());
  int journal = -1;
  for (const auto& [name, fd] : fds) {
    if (name == kStateFdName) journal = fd;
  }
  struct stat st;
  ASSERT_EQ(fstat(journal, &st), 0);
  std::string bytes(st.st_size, '\0');
  ASSERT_EQ(pread(journal, bytes.data(), bytes.size(), 0), st.st_size);

  if (const char* out = std::getenv("PAGEALLOC_GOLDEN_OUT")) {
    gzFile file = gzopen(out, "wb9");
    ASSERT_NE(file, nullptr) << out;
    ASSERT_EQ(gzwrite(file, bytes.data(), bytes.size()),
              static_cast<int>(bytes.size()));
    ASSERT_EQ(gzclose(file), Z_OK);
    GTEST_SKIP() << "wrote " << out;
  }

  // The files this release and the earlier ones wrote.
  for (const Golden& kept_golden : kGoldens) {
    const char* golden_path = kept_golden.path;
    SCOPED_TRACE(golden_path);
    const char* srcdir = std::getenv("TEST_SRCDIR");
    const char* workspace = std::getenv("TEST_WORKSPACE");
    const std::string path =
        srcdir != nullptr && workspace != nullptr
            ? absl::StrCat(srcdir, "/", workspace, "/", golden_path)
            : std::string(golden_path);
    gzFile file = gzopen(path.c_str(), "rb");
    ASSERT_NE(file, nullptr) << path;
    std::string golden;
    char chunk[1 << 16];
    int n;
    while ((n = gzread(file, chunk, sizeof(chunk))) > 0)
      golden.append(chunk, n);
    gzclose(file);
    ASSERT_FALSE(golden.empty());

    UniqueFd golden_fd(memfd_create("golden", MFD_CLOEXEC));
    ASSERT_EQ(write(golden_fd.get(), golden.data(), golden.size()),
              static_cast<ssize_t>(golden.size()));
    EXPECT_OK(KeptState::CheckTakeOver(GoldenOptions(), golden_fd.get()));
    absl::flat_hash_map<std::string, UniqueFd> passed;
    passed.emplace(kStateFdName, std::move(golden_fd));
    passed.emplace(kSlabFdName, UniqueFd(memfd_create("slab", MFD_CLOEXEC)));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<KeptState> successor,
                         KeptState::Open(GoldenOptions(), std::move(passed)));
    ASSERT_EQ(successor->outcome(), KeptStateOutcome::kRecovered)
        << successor->stats().reason;
    EXPECT_EQ(successor->identity().slab_id, 0x601de2u);
    FakeExecutor recovered_executor;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PagePool> recovered,
                         PagePool::CreateFromState(
                             PoolWith(successor.get()), &recovered_executor,
                             successor->recovered_state()));
    ASSERT_OK(successor->Replay(*recovered));
    EXPECT_GT(successor->stats().replayed_records, 0);
    ASSERT_OK(recovered->CheckInvariants());
    // Page for page what this build's own run of the same operations holds.
    EXPECT_EQ(FirstDifference(
                  recovered->ExportState(),
                  KeptIn(kept_golden.journal_format, pool->ExportState())),
              "");
    for (OwnerId owner : {1, 2}) {
      EXPECT_EQ(PagesOf(*recovered, owner), PagesOf(*pool, owner)) << owner;
      EXPECT_EQ(*recovered->OwnerMetadata(owner), *pool->OwnerMetadata(owner));
    }
    EXPECT_FALSE(recovered->OwnerMetadata(3).ok());

    // The successor goes on in the formats the journal was made with, so
    // that the build that made it can take it back: an adopt's record
    // holds the keys in record format 1, the pages it took in 2.
    ASSERT_OK(successor->StartKeeping(*recovered, -1, successor->identity()));
    ASSERT_OK(
        recovered->MatchPrefix(2, {GoldenKey(1), GoldenKey(2)}, true).status());
    // A page beginning to await release is a record from journal format 3
    // on, and not kept in an older file.
    ASSERT_OK_AND_ASSIGN(const PagePool::OwnedPages twos,
                         recovered->PagesOwnedBy(2));
    ASSERT_OK_AND_ASSIGN(const std::vector<int64_t> waiting,
                         recovered->PagesAwaitingRelease(2));
    int64_t page = 0;
    for (int64_t p : twos.owned) {
      if (std::find(waiting.begin(), waiting.end(), p) == waiting.end())
        page = p;
    }
    ASSERT_NE(page, 0);
    ASSERT_OK(recovered->AwaitRelease(2, {page}));
    ASSERT_OK_AND_ASSIGN(auto kept_fds, successor->KeptDescriptors());
    ASSERT_EQ(kept_fds.size(), 1u);  // no slab: the state alone
    ASSERT_OK_AND_ASSIGN(auto reopened,
                         StateJournal::Open(Dup(kept_fds[0].second)));
    const RecoveredJournal& journal = reopened.second;
    EXPECT_EQ(journal.format_version, kept_golden.journal_format);
    ASSERT_EQ(journal.records.size(),
              kept_golden.journal_format >= 3 ? 2u : 1u);
    EXPECT_EQ(successor->stats().failures, 0);
    const std::string& record = journal.records[0].payload;
    ASSERT_FALSE(record.empty());
    EXPECT_EQ(record[0], static_cast<char>(kept_golden.journal_format));
    EXPECT_EQ(record.size(), kept_golden.journal_format == 1
                                 ? 2 + 8 + 1 + 1 + 4 + 2 * 32
                                 : 2 + 8 + 1 + 1 + 3 * 4 + 2 * 8);
  }
}

}  // namespace
}  // namespace pagealloc
