// KeptState where the daemon holds its own descriptors (no service
// manager): what it offers a successor, and what a successor asks before
// the running daemon stops (CheckTakeOver) and takes over after (Open).
// The process-level handover is tests/restart_test.cc's Handover case.
//
// And the kept states of this release and the earlier ones as files
// (testdata/kept_state_v<N>.journal.gz; v1 holds its match record in
// record format 1, v2 in format 2; v3 holds pages awaiting release, in its
// snapshot and in a record; v4 holds tagged calls: sessions' latest calls
// in its snapshot, tagged calls in its records): a later build must take
// each over page for page (an upgrade keeps the pool), or refuse it by its
// format or semantics version, never misread it. A build that changes the
// format on purpose keeps a reader for the old one, or bumps the version so
// that the refusal is what this test sees, and adds its own file. Written
// by this test with PAGEALLOC_GOLDEN_OUT set:
//   ./bazelw run //kept_state:kept_state_test -- --gtest_filter='*Golden*'
//   (with
//   PAGEALLOC_GOLDEN_OUT=$PWD/kept_state/testdata/kept_state_v4.journal.gz)

#include "kept_state/kept_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/fake_executor.h"
#include "allocator/page_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/unique_fd.h"
#include "pool_state/pool_state_codec.h"
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

// Takes `pages` pages for `owner`, in one call tagged `call` (untagged by
// default).
void Allocate(PagePool& pool, OwnerId owner, int64_t pages, CallTag call = {}) {
  std::vector<int64_t> slots(pages * kPageSize);
  AllocRequest request{RequestKind::kAlloc, owner, 0,           0,
                       pages * kPageSize,   -1,    slots.data()};
  const CallSpan calls[] = {{1, false, call}};
  ASSERT_OK(pool.Allocate({request}, call.id != 0
                                         ? calls
                                         : absl::Span<const CallSpan>())[0]
                .status);
}

// The records in the journal `fd` holds, decoded for a pool of the tests'
// geometry.
std::vector<std::string> RecordsIn(int fd) {
  absl::StatusOr<std::pair<std::unique_ptr<StateJournal>, RecoveredJournal>>
      opened = StateJournal::Open(UniqueFd(fcntl(fd, F_DUPFD_CLOEXEC, 0)));
  EXPECT_OK(opened.status());
  std::vector<std::string> records;
  if (!opened.ok()) return records;
  for (JournalRecord& record : opened->second.records) {
    records.push_back(std::move(record.payload));
  }
  return records;
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

// ... whose records keep the calls' tags, so that a successor can answer
// a retry from them.
TEST_F(KeptByTheDaemonTest, ANewJournalKeepsTheCallsTags) {
  EXPECT_TRUE(kept_->KeepsCallTags());
  Allocate(*pool_, 2, 2, {5, false});
  ASSERT_OK_AND_ASSIGN(const PagePool::OwnedPages twos, pool_->PagesOwnedBy(2));
  ASSERT_OK(pool_
                ->FreePages(2, {twos.owned.front()},
                            FreeOrder::kFirstAppearance, {6, false})
                .status());
  const std::vector<std::string> records = RecordsIn(state_fd());
  ASSERT_GE(records.size(), 2u);
  DecodedPoolChange decoded;
  ASSERT_OK(DecodePoolChange(records[records.size() - 2], pool_->geometry(),
                             &decoded));
  ASSERT_EQ(decoded.change().kind, PoolChangeKind::kAllocate);
  ASSERT_EQ(decoded.change().calls.size(), 1u);
  EXPECT_EQ(decoded.change().calls[0].call, (CallTag{5, false}));
  ASSERT_OK(DecodePoolChange(records.back(), pool_->geometry(), &decoded));
  ASSERT_EQ(decoded.change().kind, PoolChangeKind::kFree);
  EXPECT_EQ(decoded.change().call, (CallTag{6, false}));
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
// kind of page and records of every common kind. Some calls are tagged
// (journal format 4 on): an allocation before the snapshot (session one's
// latest call, with its pages, is in the snapshot), and after it a
// checkpoint and an allocation of one call and a free; a file of an older
// format holds the same operations untagged, which leave the same pages.
constexpr char kGoldenFingerprint[] = "golden kept state\npage_size=4";
struct Golden {
  const char* path;
  uint32_t journal_format;  // which says the format of its records
};
constexpr Golden kGoldens[] = {
    {"kept_state/testdata/kept_state_v1.journal.gz", 1},
    {"kept_state/testdata/kept_state_v2.journal.gz", 2},
    {"kept_state/testdata/kept_state_v3.journal.gz", 3},
    {"kept_state/testdata/kept_state_v4.journal.gz", 4},
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
  // Tagged (journal format 4 on): in the snapshot, session one's latest
  // call with its six pages.
  Allocate(pool, 1, 6, {1, false});
  Allocate(pool, 2, 3, {1, false});
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
  // Records after the snapshot. A call of session two that checkpoints,
  // then allocates: its latest call, from the records.
  ASSERT_OK(pool.Checkpoint(2, {2, false}).status());
  Allocate(pool, 2, 2, {2, false});
  const std::vector<PrefixKey> chain = {GoldenKey(1), GoldenKey(2)};
  ASSERT_OK(pool.MatchPrefix(2, chain, /*adopt=*/true).status());
  ASSERT_OK_AND_ASSIGN(const PagePool::OwnedPages held, pool.PagesOwnedBy(1));
  ASSERT_FALSE(held.owned.empty());
  ASSERT_OK(pool.Publish(1, {held.owned.back()}, {GoldenKey(3)}, &chain.back(),
                         /*pin=*/true)
                .status());
  ASSERT_OK(pool.AddOwner(3, 0, "session three"));
  Allocate(pool, 3, 1, {1, false});
  // A tagged free of its page before the session goes leaves the pages as
  // the session's removal alone (an older file's) does.
  const std::vector<int64_t> three = PagesOf(pool, 3);
  ASSERT_EQ(three.size(), 1u);
  ASSERT_OK(pool.FreePages(3, three, FreeOrder::kFirstAppearance, {2, false})
                .status());
  ASSERT_OK(pool.RemoveOwner(3).status());
  // And in a record.
  const std::vector<int64_t> two = PagesOf(pool, 2);
  ASSERT_FALSE(two.empty());
  ASSERT_OK(pool.AwaitRelease(2, {two.back()}));
}

// The state a file of `journal_format` keeps of `state`: before journal
// format 3, no page awaits release; before 4, no session has kept calls.
PoolState KeptIn(uint32_t journal_format, PoolState state) {
  for (PoolOwnerState& owner : state.owners) {
    if (journal_format < 3) owner.awaiting_release.clear();
    if (journal_format < 4) owner.kept_calls.clear();
  }
  return state;
}

// The journal in `golden_path` (relative to the workspace), uncompressed;
// empty when it cannot be read.
std::string ReadGolden(const char* golden_path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string path =
      srcdir != nullptr && workspace != nullptr
          ? absl::StrCat(srcdir, "/", workspace, "/", golden_path)
          : std::string(golden_path);
  gzFile file = gzopen(path.c_str(), "rb");
  EXPECT_NE(file, nullptr) << path;
  std::string golden;
  if (file == nullptr) return golden;
  char chunk[1 << 16];
  int n;
  while ((n = gzread(file, chunk, sizeof(chunk))) > 0) golden.append(chunk, n);
  gzclose(file);
  return golden;
}

// A memfd holding `bytes`.
UniqueFd MemfdWith(const std::string& bytes) {
  UniqueFd fd(memfd_create("golden", MFD_CLOEXEC));
  EXPECT_EQ(write(fd.get(), bytes.data(), bytes.size()),
            static_cast<ssize_t>(bytes.size()));
  return fd;
}

// `owner`'s latest call in `state` (an empty one when it is not there).
PoolKeptCall LastCallOf(const PoolState& state, OwnerId owner) {
  for (const PoolOwnerState& o : state.owners) {
    if (o.id == owner && !o.kept_calls.empty()) return o.kept_calls.back();
  }
  return PoolKeptCall();
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
    const uint32_t format = kept_golden.journal_format;
    SCOPED_TRACE(kept_golden.path);
    const std::string golden = ReadGolden(kept_golden.path);
    ASSERT_FALSE(golden.empty());

    UniqueFd golden_fd = MemfdWith(golden);
    // Its records hold the calls' tags from journal format 4 on: a tagged
    // allocation and a tagged free among them.
    {
      bool tagged_allocate = false;
      bool tagged_free = false;
      DecodedPoolChange decoded;
      for (const std::string& record : RecordsIn(golden_fd.get())) {
        ASSERT_OK(DecodePoolChange(record, pool->geometry(), &decoded));
        const PoolChange& change = decoded.change();
        for (const CallSpan& call : change.calls) {
          tagged_allocate |= call.call.id != 0;
        }
        tagged_free |=
            change.kind == PoolChangeKind::kFree && change.call.id != 0;
      }
      EXPECT_EQ(tagged_allocate, format >= 4);
      EXPECT_EQ(tagged_free, format >= 4);
    }
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
    const PoolState recovered_state = recovered->ExportState();
    EXPECT_EQ(
        FirstDifference(recovered_state, KeptIn(format, pool->ExportState())),
        "");
    // The sessions' latest calls (journal format 4 on): session one's from
    // the snapshot, with the pages it took; session two's from the records,
    // a checkpoint and an allocation of one call.
    const PoolKeptCall one = LastCallOf(recovered_state, 1);
    const PoolKeptCall two = LastCallOf(recovered_state, 2);
    if (format >= 4) {
      EXPECT_EQ(one, LastCallOf(pool->ExportState(), 1));
      EXPECT_EQ(one.id, 1u);
      EXPECT_EQ(one.parts, kCallAllocate);
      EXPECT_EQ(one.pages.size(), 6u);
      EXPECT_EQ(two, LastCallOf(pool->ExportState(), 2));
      EXPECT_EQ(two.id, 2u);
      EXPECT_EQ(two.parts, kCallCheckpoint | kCallAllocate);
      EXPECT_EQ(two.pages.size(), 2u);
      // A retry of it after the restart is answered from what was kept.
      ASSERT_OK_AND_ASSIGN(
          const std::optional<PoolKeptCall> retried,
          recovered->RetriedCall(2, {2, true}, kCallCheckpoint));
      ASSERT_TRUE(retried.has_value());
      EXPECT_EQ(retried->checkpoint_id, two.checkpoint_id);
    } else {
      EXPECT_EQ(one, PoolKeptCall());
      EXPECT_EQ(two, PoolKeptCall());
    }
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
    // Tagged: a file of journal format 4 keeps the tag, one of 3 the
    // record without it (and the server refuses retries on such a file).
    EXPECT_EQ(successor->KeepsCallTags(), format >= 4);
    ASSERT_OK(recovered->AwaitRelease(2, {page}, {3, false}));
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
    if (format >= 3) {
      const std::string& fence = journal.records[1].payload;
      ASSERT_FALSE(fence.empty());
      EXPECT_EQ(fence[0], static_cast<char>(format));
      EXPECT_EQ(fence.size(), 2 + 8 + 4 + 8 + (format >= 4 ? 9 : 0));
      DecodedPoolChange decoded;
      ASSERT_OK(DecodePoolChange(fence, recovered->geometry(), &decoded));
      EXPECT_EQ(decoded.change().kind, PoolChangeKind::kAwaitRelease);
      const CallTag kept_tag = format >= 4 ? CallTag{3, false} : CallTag{};
      EXPECT_EQ(decoded.change().call, kept_tag);
    }
  }
}

// A journal of format 3 taken over keeps record format 3, which cannot hold
// the calls' tags: tagged calls are kept untagged, KeepsCallTags says so,
// and a successor of that file knows of no session's latest call (so that
// a retry answered from it could run a call twice: the server refuses
// retries then).
TEST(KeptStateGoldenTest, AJournalOfFormat3KeepsItsRecordsUntagged) {
  unsetenv("NOTIFY_SOCKET");
  const std::string golden =
      ReadGolden("kept_state/testdata/kept_state_v3.journal.gz");
  ASSERT_FALSE(golden.empty());
  absl::flat_hash_map<std::string, UniqueFd> passed;
  passed.emplace(kStateFdName, MemfdWith(golden));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KeptState> kept,
                       KeptState::Open(GoldenOptions(), std::move(passed)));
  ASSERT_EQ(kept->outcome(), KeptStateOutcome::kRecovered)
      << kept->stats().reason;
  EXPECT_FALSE(kept->KeepsCallTags());
  FakeExecutor executor;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<PagePool> pool,
      PagePool::CreateFromState(PoolWith(kept.get()), &executor,
                                kept->recovered_state()));
  ASSERT_OK(kept->Replay(*pool));
  ASSERT_OK(kept->StartKeeping(*pool, -1, kept->identity()));
  EXPECT_FALSE(kept->KeepsCallTags());

  // This build's pool keeps the calls in memory all the same.
  Allocate(*pool, 1, 2, {7, false});
  const std::vector<int64_t> ones = PagesOf(*pool, 1);
  ASSERT_FALSE(ones.empty());
  ASSERT_OK(
      pool->FreePages(1, {ones.back()}, FreeOrder::kFirstAppearance, {8, false})
          .status());
  ASSERT_OK(pool->Checkpoint(1, {9, false}).status());
  ASSERT_OK_AND_ASSIGN(const uint64_t latest, pool->LastCallId(1));
  EXPECT_EQ(latest, 9u);

  ASSERT_OK_AND_ASSIGN(auto fds, kept->KeptDescriptors());
  ASSERT_EQ(fds.size(), 1u);
  ASSERT_OK_AND_ASSIGN(auto reopened, StateJournal::Open(Dup(fds[0].second)));
  EXPECT_EQ(reopened.second.format_version, 3u);
  ASSERT_EQ(reopened.second.records.size(), 3u);
  DecodedPoolChange decoded;
  for (const JournalRecord& record : reopened.second.records) {
    ASSERT_FALSE(record.payload.empty());
    EXPECT_EQ(record.payload[0], 3);
    ASSERT_OK(DecodePoolChange(record.payload, pool->geometry(), &decoded));
    EXPECT_EQ(decoded.change().call, CallTag());
    for (const CallSpan& call : decoded.change().calls) {
      EXPECT_EQ(call.call, CallTag());
    }
  }
  EXPECT_EQ(kept->stats().failures, 0);

  // A successor of the file: the same pages, no latest call.
  absl::flat_hash_map<std::string, UniqueFd> again;
  again.emplace(kStateFdName, Dup(fds[0].second));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KeptState> successor,
                       KeptState::Open(GoldenOptions(), std::move(again)));
  ASSERT_EQ(successor->outcome(), KeptStateOutcome::kRecovered);
  EXPECT_FALSE(successor->KeepsCallTags());
  FakeExecutor successor_executor;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<PagePool> recovered,
      PagePool::CreateFromState(PoolWith(successor.get()), &successor_executor,
                                successor->recovered_state()));
  ASSERT_OK(successor->Replay(*recovered));
  EXPECT_EQ(
      FirstDifference(recovered->ExportState(), KeptIn(3, pool->ExportState())),
      "");
  ASSERT_OK_AND_ASSIGN(const uint64_t kept_latest, recovered->LastCallId(1));
  EXPECT_EQ(kept_latest, 0u);
}

}  // namespace
}  // namespace pagealloc
