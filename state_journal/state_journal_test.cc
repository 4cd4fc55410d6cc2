#include "state_journal/state_journal.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/unique_fd.h"
#include "state_journal/format.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

namespace jf = journal_format;
constexpr int64_t Field(size_t offset) { return static_cast<int64_t>(offset); }
using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

UniqueFd NewMemfd() {
  UniqueFd fd(
      memfd_create("state-journal-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid()) << std::strerror(errno);
  return fd;
}

UniqueFd Dup(int fd) {
  UniqueFd copy(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  EXPECT_TRUE(copy.valid()) << std::strerror(errno);
  return copy;
}

// The file's bytes, read with pread (not through any mapping of ours).
std::string ReadAll(int fd) {
  struct stat st;
  EXPECT_EQ(fstat(fd, &st), 0);
  std::string bytes(st.st_size, '\0');
  EXPECT_EQ(pread(fd, bytes.data(), bytes.size(), 0),
            static_cast<ssize_t>(bytes.size()));
  return bytes;
}

// A new memfd (unsealed, so a test may truncate it) holding `bytes`.
UniqueFd MemfdWith(const std::string& bytes) {
  UniqueFd fd = NewMemfd();
  EXPECT_EQ(pwrite(fd.get(), bytes.data(), bytes.size(), 0),
            static_cast<ssize_t>(bytes.size()));
  return fd;
}

using Opened = std::pair<std::unique_ptr<StateJournal>, RecoveredJournal>;

absl::StatusOr<Opened> OpenBytes(const std::string& bytes) {
  return StateJournal::Open(MemfdWith(bytes));
}

absl::StatusOr<RecoveredJournal> Recover(const std::string& bytes) {
  absl::StatusOr<Opened> opened = OpenBytes(bytes);
  if (!opened.ok()) return opened.status();
  return std::move(opened->second);
}

// What a journal holds, torn_bytes (a metric) aside.
struct Content {
  std::string creator;
  uint64_t epoch = 0;
  std::string snapshot;
  std::vector<std::pair<uint32_t, std::string>> records;

  bool operator==(const Content& other) const {
    return creator == other.creator && epoch == other.epoch &&
           snapshot == other.snapshot && records == other.records;
  }
  bool operator!=(const Content& other) const { return !(*this == other); }

  void Append(uint32_t kind, std::string payload) {
    records.emplace_back(kind, std::move(payload));
  }
  void Snapshot(std::string bytes) {
    ++epoch;
    snapshot = std::move(bytes);
    records.clear();
  }
};

Content ContentOf(const RecoveredJournal& recovered) {
  Content content;
  content.creator = recovered.creator;
  content.epoch = recovered.epoch;
  content.snapshot = recovered.snapshot;
  for (const JournalRecord& record : recovered.records) {
    content.Append(record.kind, record.payload);
  }
  return content;
}

// Short enough for a failure message: sizes, not bytes.
std::string Describe(const Content& content) {
  std::string text = absl::StrFormat(
      "epoch %d, snapshot of %d bytes, %d "
      "records:",
      content.epoch, content.snapshot.size(), content.records.size());
  for (const auto& [kind, payload] : content.records) {
    absl::StrAppendFormat(&text, " (%d, %d B)", kind, payload.size());
  }
  return text;
}

// Deterministic bytes of `length`, different for each `seed`.
// Deterministic bytes of `length`, different for each `seed`; 8 at a time,
// so that the killed writer spends its time in the journal, not here.
std::string Pattern(uint64_t seed, int64_t length) {
  std::string bytes(length, '\0');
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < length; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(bytes.data() + i, &x, std::min<int64_t>(8, length - i));
  }
  return bytes;
}

StateJournalOptions SmallOptions() {
  StateJournalOptions options;
  options.snapshot_capacity_bytes = 8 << 10;
  options.log_capacity_bytes = 16 << 10;
  options.creator = "pool 1024 x 16; build test";
  return options;
}

class StateJournalTest : public ::testing::Test {
 protected:
  // Creates a journal in a new memfd; file_ keeps a descriptor of it.
  std::unique_ptr<StateJournal> CreateJournal(
      const StateJournalOptions& options = SmallOptions()) {
    UniqueFd fd = NewMemfd();
    file_ = Dup(fd.get());
    absl::StatusOr<std::unique_ptr<StateJournal>> journal =
        StateJournal::Create(std::move(fd), options);
    EXPECT_TRUE(journal.ok()) << journal.status();
    return journal.ok() ? std::move(journal).value() : nullptr;
  }

  Content Reopened() {
    absl::StatusOr<Opened> opened = StateJournal::Open(Dup(file_.get()));
    EXPECT_TRUE(opened.ok()) << opened.status();
    return opened.ok() ? ContentOf(opened->second) : Content{};
  }

  UniqueFd file_;
};

TEST_F(StateJournalTest, NewJournalIsEmptyAndSealed) {
  std::unique_ptr<StateJournal> journal = CreateJournal();
  ASSERT_NE(journal, nullptr);
  EXPECT_EQ(journal->log_bytes_used(), 0);
  EXPECT_EQ(journal->log_capacity(), 16 << 10);
  EXPECT_EQ(journal->snapshot_capacity(), 8 << 10);
  EXPECT_EQ(journal->epoch(), 0u);
  struct stat st;
  ASSERT_EQ(fstat(file_.get(), &st), 0);
  EXPECT_EQ(st.st_size, StateJournal::FileSizeFor(SmallOptions()));
  EXPECT_EQ(fcntl(file_.get(), F_GET_SEALS),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);

  ASSERT_OK_AND_ASSIGN(Opened opened, StateJournal::Open(Dup(file_.get())));
  const RecoveredJournal& recovered = opened.second;
  EXPECT_EQ(recovered.creator, SmallOptions().creator);
  EXPECT_EQ(recovered.format_version, StateJournal::kFormatVersion);
  EXPECT_EQ(recovered.epoch, 0u);
  EXPECT_EQ(recovered.snapshot, "");
  EXPECT_TRUE(recovered.records.empty());
  EXPECT_EQ(recovered.torn_bytes, 0);
}

TEST_F(StateJournalTest, CreateRefusesBadOptionsAndUsedFiles) {
  StateJournalOptions options = SmallOptions();
  options.log_capacity_bytes = 1001;
  EXPECT_EQ(StateJournal::FileSizeFor(options), -1);
  EXPECT_THAT(StateJournal::Create(NewMemfd(), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("log_capacity_bytes (1001)")));
  options = SmallOptions();
  options.snapshot_capacity_bytes = -1;
  EXPECT_THAT(StateJournal::Create(NewMemfd(), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("snapshot_capacity_bytes (-1)")));
  options = SmallOptions();
  options.creator = std::string(257, 'c');
  EXPECT_THAT(StateJournal::Create(NewMemfd(), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("creator is 257 bytes")));
  EXPECT_THAT(
      StateJournal::Create(UniqueFd(), SmallOptions()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no descriptor")));

  // Create never lays a journal over another's bytes.
  std::unique_ptr<StateJournal> journal = CreateJournal();
  ASSERT_NE(journal, nullptr);
  const std::string before = ReadAll(file_.get());
  EXPECT_THAT(
      StateJournal::Create(Dup(file_.get()), SmallOptions()),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not empty")));
  EXPECT_EQ(ReadAll(file_.get()), before);
}

TEST_F(StateJournalTest, RoundTripThroughReopen) {
  std::unique_ptr<StateJournal> journal = CreateJournal();
  ASSERT_NE(journal, nullptr);
  Content model;
  model.creator = SmallOptions().creator;
  for (int i = 0; i < 40; ++i) {
    const std::string payload = Pattern(i, (i * 37) % 300);
    // Some records in pieces: the payload is the pieces back to back.
    const absl::string_view view(payload);
    if (i % 3 == 0) {
      ASSERT_OK(journal->Append(i, {view.substr(0, view.size() / 2), "",
                                    view.substr(view.size() / 2)}));
    } else {
      ASSERT_OK(journal->Append(i, {view}));
    }
    model.Append(i, payload);
  }
  EXPECT_EQ(Reopened(), model);

  const std::string snapshot = Pattern(1000, 5000);
  ASSERT_OK(journal->WriteSnapshot(snapshot));
  model.Snapshot(snapshot);
  EXPECT_EQ(journal->log_bytes_used(), 0);
  EXPECT_EQ(journal->epoch(), 1u);
  for (int i = 0; i < 20; ++i) {
    const std::string payload = Pattern(2000 + i, i * 50);
    ASSERT_OK(journal->Append(7, {payload}));
    model.Append(7, payload);
  }

  // Reopened as the daemon does after a restart: the fd store's
  // descriptor, here through /proc/self/fd.
  const std::string path = absl::StrFormat("/proc/self/fd/%d", file_.get());
  ASSERT_OK_AND_ASSIGN(
      Opened opened,
      StateJournal::Open(UniqueFd(open(path.c_str(), O_RDWR | O_CLOEXEC))));
  EXPECT_EQ(ContentOf(opened.second), model) << Describe(model);
  EXPECT_EQ(opened.second.torn_bytes, 0);
  std::unique_ptr<StateJournal> resumed = std::move(opened.first);
  EXPECT_EQ(resumed->log_bytes_used(), journal->log_bytes_used());
  EXPECT_EQ(resumed->epoch(), 1u);
  journal.reset();

  // The reopened writer goes on after the last record.
  ASSERT_OK(resumed->Append(99, {"after the restart"}));
  model.Append(99, "after the restart");
  EXPECT_EQ(Reopened(), model);
  ASSERT_OK(resumed->WriteSnapshot("second"));
  model.Snapshot("second");
  ASSERT_OK(resumed->Append(100, {"x"}));
  model.Append(100, "x");
  EXPECT_EQ(Reopened(), model);
}

TEST_F(StateJournalTest, FileOnTmpfsRoundTrips) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path =
      absl::StrFormat("%s/journal-%d", dir != nullptr ? dir : "/tmp", getpid());
  UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  ASSERT_TRUE(fd.valid()) << std::strerror(errno);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateJournal> journal,
                         StateJournal::Create(std::move(fd), SmallOptions()));
    ASSERT_OK(journal->WriteSnapshot("pool"));
    ASSERT_OK(journal->Append(1, {"one"}));
  }
  ASSERT_OK_AND_ASSIGN(
      Opened opened,
      StateJournal::Open(UniqueFd(open(path.c_str(), O_RDWR | O_CLOEXEC))));
  EXPECT_EQ(opened.second.snapshot, "pool");
  ASSERT_EQ(opened.second.records.size(), 1u);
  EXPECT_EQ(opened.second.records[0].payload, "one");
  unlink(path.c_str());
}

TEST_F(StateJournalTest, FullLogRefusesAndChangesNothing) {
  StateJournalOptions options = SmallOptions();
  options.log_capacity_bytes = 1024;
  options.snapshot_capacity_bytes = 100;
  std::unique_ptr<StateJournal> journal = CreateJournal(options);
  ASSERT_NE(journal, nullptr);
  const std::string payload(64, 'p');  // 96 bytes a record
  for (int i = 0; i < 10; ++i) ASSERT_OK(journal->Append(1, {payload}));
  EXPECT_EQ(journal->log_bytes_used(), 960);

  std::string before = ReadAll(file_.get());
  EXPECT_THAT(journal->Append(1, {payload}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("does not fit the log: 960 of 1024")));
  EXPECT_THAT(journal->Append(1, {std::string(5000, 'q')}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("does not fit")));
  EXPECT_EQ(journal->log_bytes_used(), 960);
  EXPECT_EQ(ReadAll(file_.get()), before);
  // What still fits: 64 bytes, a 32-byte header and 32 of payload.
  ASSERT_OK(journal->Append(2, {std::string(32, 'r')}));
  EXPECT_EQ(journal->log_bytes_used(), 1024);
  EXPECT_THAT(journal->Append(3, {}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("1024 of 1024 bytes used")));
  EXPECT_EQ(Reopened().records.size(), 11u);

  // A snapshot empties the log.
  ASSERT_OK(journal->WriteSnapshot(std::string(100, 's')));
  EXPECT_EQ(journal->log_bytes_used(), 0);
  EXPECT_EQ(Reopened().records.size(), 0u);
  ASSERT_OK(journal->Append(4, {payload}));

  // One too big for its slot changes nothing.
  before = ReadAll(file_.get());
  EXPECT_THAT(journal->WriteSnapshot(std::string(101, 's')),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("101 bytes does not fit its slot of 100")));
  EXPECT_EQ(ReadAll(file_.get()), before);
  EXPECT_EQ(journal->epoch(), 1u);
  EXPECT_EQ(journal->log_bytes_used(), 96);
  const Content content = Reopened();
  EXPECT_EQ(content.epoch, 1u);
  EXPECT_EQ(content.records.size(), 1u);
}

// Every byte of the commit word is checked: no single corrupted byte of it
// decodes (in particular none moves the tail to another record's end).
TEST(CommitWordTest, AnyOneCorruptedByteIsFound) {
  const std::pair<uint64_t, uint64_t> words[] = {
      {0, 0}, {1, 96}, {0xffff, 4096}, {123456789, jf::kMaxLogCapacityBytes}};
  for (const auto& [epoch, tail] : words) {
    const uint64_t word = jf::EncodeCommitWord(epoch, tail);
    const std::optional<jf::CommitState> state = jf::DecodeCommitWord(word);
    ASSERT_TRUE(state.has_value());
    EXPECT_EQ(state->epoch_tag, jf::EpochTag(epoch));
    EXPECT_EQ(state->tail, tail);
    for (int byte = 0; byte < 8; ++byte) {
      for (uint64_t flip = 1; flip < 256; ++flip) {
        EXPECT_FALSE(jf::DecodeCommitWord(word ^ (flip << (8 * byte))))
            << "byte " << byte << " ^ " << flip;
      }
    }
  }
  // An all-zero word (a zeroed page) is no commit word.
  EXPECT_FALSE(jf::DecodeCommitWord(0).has_value());
}

// One operation on a journal, to be cut short.
struct Operation {
  std::string name;
  std::function<absl::Status(StateJournal&)> run;
  std::function<void(Content&)> model;  // what it does to the content
  int64_t record_bytes = 0;             // an Append's record, else 0
};

Operation AppendOp(uint32_t kind, std::vector<std::string> parts) {
  std::string payload;
  for (const std::string& part : parts) payload += part;
  Operation op;
  op.name = absl::StrFormat("Append of %d bytes in %d parts", payload.size(),
                            parts.size());
  op.record_bytes = jf::RecordBytes(payload.size());
  op.run = [kind, parts](StateJournal& journal) {
    std::vector<absl::string_view> views(parts.begin(), parts.end());
    return journal.Append(kind, views);
  };
  op.model = [kind, payload](Content& content) {
    content.Append(kind, payload);
  };
  return op;
}

Operation SnapshotOp(std::string snapshot) {
  Operation op;
  op.name = absl::StrFormat("WriteSnapshot of %d bytes", snapshot.size());
  op.run = [snapshot](StateJournal& journal) {
    return journal.WriteSnapshot(snapshot);
  };
  op.model = [snapshot](Content& content) { content.Snapshot(snapshot); };
  return op;
}

// Stops `op` after each of its stores in turn, k = 0, 1, ... until it runs
// whole, and opens what each stop left: the content before the operation
// until its commit store, after it from there on, never anything else; and
// the writer recovered from each goes on appending after it.
void CrashAtEveryStore(const std::string& before_bytes, const Operation& op) {
  SCOPED_TRACE(op.name);
  ASSERT_OK_AND_ASSIGN(RecoveredJournal before_recovered,
                       Recover(before_bytes));
  const Content before = ContentOf(before_recovered);
  Content after = before;
  op.model(after);
  ASSERT_NE(before, after);

  bool committed = false;
  for (int64_t k = 0;; ++k) {
    SCOPED_TRACE(absl::StrFormat("stopped after %d stores", k));
    UniqueFd fd = MemfdWith(before_bytes);
    UniqueFd view = Dup(fd.get());
    bool crashed;
    {
      ASSERT_OK_AND_ASSIGN(Opened opened, StateJournal::Open(std::move(fd)));
      opened.first->CrashAfterStoresForTesting(k);
      ASSERT_OK(op.run(*opened.first));
      crashed = opened.first->crashed_for_testing();
    }
    const std::string bytes = ReadAll(view.get());
    ASSERT_OK_AND_ASSIGN(Opened reopened, OpenBytes(bytes));
    Content got = ContentOf(reopened.second);
    if (!crashed) {
      // Every store made: the operation is done.
      ASSERT_EQ(got, after) << Describe(got);
      ASSERT_GT(k, 0);
      break;
    }
    if (got == after) {
      committed = true;
    } else {
      ASSERT_FALSE(committed) << "went back to the state before the "
                                 "operation after it had committed";
      ASSERT_EQ(got, before) << "neither before nor after: " << Describe(got);
      // A record whose header is stored is seen as torn.
      if (op.record_bytes > 0 && k >= jf::kRecordHeaderBytes - 4) {
        EXPECT_EQ(reopened.second.torn_bytes, op.record_bytes);
      }
    }
    // The writer recovered from what is left goes on from there.
    const absl::Status next_status = reopened.first->Append(77, {"next"});
    if (absl::IsResourceExhausted(next_status)) continue;  // a full log
    ASSERT_OK(next_status);
    got.Append(77, "next");
    const std::string next_bytes = ReadAll(reopened.first->fd());
    ASSERT_OK_AND_ASSIGN(RecoveredJournal next, Recover(next_bytes));
    ASSERT_EQ(ContentOf(next), got) << Describe(ContentOf(next));
    EXPECT_EQ(next.torn_bytes, 0);
  }
}

TEST_F(StateJournalTest, CrashAtEveryStoreOfEachOperation) {
  std::unique_ptr<StateJournal> journal = CreateJournal();
  ASSERT_NE(journal, nullptr);
  // Epoch 0, empty log: the first append and the first snapshot.
  CrashAtEveryStore(ReadAll(file_.get()), AppendOp(1, {"first"}));
  CrashAtEveryStore(ReadAll(file_.get()), SnapshotOp(Pattern(1, 700)));

  // Epoch 1 (slot 1) with records; then epoch 2 (slot 0) over the empty
  // snapshot of epoch 0.
  ASSERT_OK(journal->WriteSnapshot(Pattern(2, 1500)));
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(journal->Append(i, {Pattern(10 + i, 100 * i + 3)}));
  }
  const std::string base = ReadAll(file_.get());
  CrashAtEveryStore(base, AppendOp(5, {std::string(64, 'a')}));
  CrashAtEveryStore(base, AppendOp(6, {"", Pattern(3, 10), "", "tail"}));
  CrashAtEveryStore(base, AppendOp(7, {}));
  CrashAtEveryStore(base, AppendOp(8, {Pattern(4, 4096)}));
  CrashAtEveryStore(base, SnapshotOp(Pattern(5, 3000)));
  CrashAtEveryStore(base, SnapshotOp(""));

  // An append that fills the log to its last byte.
  {
    ASSERT_OK_AND_ASSIGN(Opened opened, OpenBytes(base));
    StateJournal& nearly_full = *opened.first;
    while (nearly_full.log_capacity() - nearly_full.log_bytes_used() > 600) {
      ASSERT_OK(nearly_full.Append(3, {std::string(500, 'f')}));
    }
    const int64_t room =
        nearly_full.log_capacity() - nearly_full.log_bytes_used();
    CrashAtEveryStore(ReadAll(nearly_full.fd()),
                      AppendOp(9, {Pattern(6, room - jf::kRecordHeaderBytes)}));
  }

  // A snapshot over a torn one: the inactive slot holds a whole snapshot
  // of the next epoch that never committed.
  {
    ASSERT_OK_AND_ASSIGN(Opened opened, OpenBytes(base));
    opened.first->CrashAfterStoresForTesting(
        3000 + sizeof(jf::SlotHeader));  // all but the commit word
    ASSERT_OK(opened.first->WriteSnapshot(Pattern(7, 3000)));
    ASSERT_TRUE(opened.first->crashed_for_testing());
    const std::string torn = ReadAll(opened.first->fd());
    ASSERT_OK_AND_ASSIGN(RecoveredJournal recovered, Recover(torn));
    EXPECT_EQ(recovered.epoch, 1u);
    CrashAtEveryStore(torn, SnapshotOp(Pattern(8, 200)));
  }
}

// A journal whose writer is SIGKILLed at random instants, again and again:
// each time, what is left opens to a snapshot and records that are exactly
// a prefix of what the writer was writing, and nothing it had committed is
// lost.
//
// The writer writes one logical history: record i is (kind 1 + i % 7,
// Payload(i)); whenever its log is full it writes SnapshotFor(n), n being
// the records written so far, and goes on. Each child resumes the history
// where the journal it opens stands.
std::string Payload(int64_t i) { return Pattern(i, (i * 131) % 700); }

std::string SnapshotFor(int64_t n) {
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &n, sizeof(n));
  return bytes + Pattern(1'000'000 + n, (n * 977) % 30'000);
}

// Records covered by a snapshot, or -1 for a snapshot that is not one of
// SnapshotFor's.
int64_t RecordsInSnapshot(const std::string& snapshot) {
  if (snapshot.empty()) return 0;
  if (snapshot.size() < 8) return -1;
  int64_t n;
  std::memcpy(&n, snapshot.data(), sizeof(n));
  return n >= 0 && snapshot == SnapshotFor(n) ? n : -1;
}

// What the parent and the child share: how far the child got.
struct Progress {
  // Records the child's journal holds after its last committed operation.
  std::atomic<int64_t> committed;
  std::atomic<int64_t> operations;
};

// The child: exits only on an error (its exit code says which); otherwise
// it writes until killed.
[[noreturn]] void RunWriter(int fd, Progress* progress) {
  absl::StatusOr<Opened> opened = StateJournal::Open(UniqueFd(fd));
  if (!opened.ok()) _exit(10);
  StateJournal& journal = *opened->first;
  const int64_t in_snapshot = RecordsInSnapshot(opened->second.snapshot);
  if (in_snapshot < 0) _exit(11);
  int64_t n = in_snapshot + static_cast<int64_t>(opened->second.records.size());
  for (int64_t op = 0; op < 200'000; ++op) {
    const std::string payload = Payload(n);
    absl::Status status = journal.Append(1 + n % 7, {payload});
    if (absl::IsResourceExhausted(status)) {
      if (!journal.WriteSnapshot(SnapshotFor(n)).ok()) _exit(12);
      progress->operations.fetch_add(1, std::memory_order_relaxed);
      status = journal.Append(1 + n % 7, {payload});
    }
    if (!status.ok()) _exit(13);
    ++n;
    progress->committed.store(n, std::memory_order_relaxed);
    progress->operations.fetch_add(1, std::memory_order_relaxed);
  }
  for (;;) pause();
}

TEST_F(StateJournalTest, SurvivesSigkillAtRandomInstants) {
  StateJournalOptions options;
  options.snapshot_capacity_bytes = 40 << 10;
  options.log_capacity_bytes = 16 << 10;
  std::unique_ptr<StateJournal> journal = CreateJournal(options);
  ASSERT_NE(journal, nullptr);
  journal.reset();

  void* shared = mmap(nullptr, sizeof(Progress), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  Progress* progress = new (shared) Progress{};

  std::mt19937_64 random(20240611);
  int64_t records = 0;  // recovered after the last kill
  uint64_t epoch = 0;
  int64_t torn = 0;
  constexpr int kKills = 30;
  for (int round = 0; round < kKills; ++round) {
    SCOPED_TRACE(absl::StrFormat("round %d", round));
    progress->committed.store(records);
    progress->operations.store(0);
    UniqueFd child_fd = Dup(file_.get());
    const pid_t pid = fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) RunWriter(child_fd.release(), progress);
    child_fd.reset();
    // The instant does not matter to the check: a kill before the child
    // opened the journal leaves it as it was, which is a prefix too.
    absl::SleepFor(absl::Microseconds(random() % 3000));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int wait_status;
    ASSERT_EQ(waitpid(pid, &wait_status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGKILL)
        << "the writer exited by itself, code "
        << (WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1);

    ASSERT_OK_AND_ASSIGN(Opened opened, StateJournal::Open(Dup(file_.get())));
    const RecoveredJournal& recovered = opened.second;
    const int64_t in_snapshot = RecordsInSnapshot(recovered.snapshot);
    ASSERT_GE(in_snapshot, 0) << "a snapshot the writer never wrote, "
                              << recovered.snapshot.size() << " bytes";
    for (size_t j = 0; j < recovered.records.size(); ++j) {
      const int64_t i = in_snapshot + static_cast<int64_t>(j);
      ASSERT_EQ(recovered.records[j].kind, 1 + i % 7) << "record " << i;
      ASSERT_EQ(recovered.records[j].payload, Payload(i)) << "record " << i;
    }
    const int64_t now =
        in_snapshot + static_cast<int64_t>(recovered.records.size());
    // Everything the child saw committed is there, and at most the one
    // operation it was in the middle of besides.
    const int64_t committed = progress->committed.load();
    EXPECT_GE(now, committed);
    EXPECT_LE(now, committed + 1);
    EXPECT_GE(recovered.epoch, epoch);
    records = now;
    epoch = recovered.epoch;
    torn += recovered.torn_bytes > 0;
  }
  std::printf(
      "%d kills: %lld records in epoch %llu; %lld kills left a torn "
      "append\n",
      kKills, static_cast<long long>(records),
      static_cast<unsigned long long>(epoch), static_cast<long long>(torn));
  munmap(shared, sizeof(Progress));
}

// A journal with a snapshot in slot 1, three committed records, and an
// uncommitted one past the tail; offsets into its bytes.
class CorruptionTest : public StateJournalTest {
 protected:
  void SetUp() override {
    std::unique_ptr<StateJournal> journal = CreateJournal();
    ASSERT_NE(journal, nullptr);
    ASSERT_OK(journal->WriteSnapshot(Pattern(1, 2000)));
    for (int i = 0; i < 3; ++i) {
      record_offsets_.push_back(journal->log_bytes_used());
      ASSERT_OK(journal->Append(i, {Pattern(10 + i, 50 + 30 * i)}));
    }
    tail_ = journal->log_bytes_used();
    journal->CrashAfterStoresForTesting(100);
    ASSERT_OK(journal->Append(9, {std::string(200, 'u')}));
    bytes_ = ReadAll(file_.get());
    layout_ = jf::LayoutFor(SmallOptions().snapshot_capacity_bytes,
                            SmallOptions().log_capacity_bytes);
    ASSERT_OK_AND_ASSIGN(RecoveredJournal recovered, Recover(bytes_));
    original_ = ContentOf(recovered);
    ASSERT_EQ(original_.records.size(), 3u);
    ASSERT_GT(recovered.torn_bytes, 0);
  }

  std::string Flipped(int64_t offset, uint8_t flip = 0x40) const {
    std::string bytes = bytes_;
    bytes[offset] = static_cast<char>(bytes[offset] ^ flip);
    return bytes;
  }

  int64_t Slot(int index) const { return layout_.slot_offset[index]; }
  int64_t Log(int64_t offset) const { return layout_.log_offset + offset; }

  std::string bytes_;
  jf::FileLayout layout_;
  Content original_;
  std::vector<int64_t> record_offsets_;
  int64_t tail_ = 0;
};

TEST_F(CorruptionTest, DamageToWhatIsReadIsRefused) {
  struct Case {
    const char* what;
    int64_t offset;
    const char* message;
  };
  const Case cases[] = {
      {"magic", 3, "bad magic"},
      {"capacity", Field(offsetof(jf::FileHeader, log_capacity)) + 1,
       "header checksum mismatch"},
      {"creator", Field(offsetof(jf::FileHeader, creator)) + 2,
       "header checksum mismatch"},
      {"header checksum", Field(offsetof(jf::FileHeader, header_crc)),
       "header checksum mismatch"},
      {"commit word's tail", jf::kCommitWordOffset, "commit word"},
      {"commit word's epoch", jf::kCommitWordOffset + 5, "commit word"},
      {"commit word's check", jf::kCommitWordOffset + 7, "commit word"},
      {"snapshot's bytes", Slot(1) + jf::kSlotDataOffset + 1000,
       "snapshot of epoch 1 (slot 1, 2000 bytes): checksum mismatch"},
      {"snapshot's length", Slot(1) + Field(offsetof(jf::SlotHeader, length)),
       "checksum mismatch"},
      {"snapshot's epoch", Slot(1) + Field(offsetof(jf::SlotHeader, epoch)) + 1,
       "does not hold the committed snapshot"},
      {"record 0's kind", Log(record_offsets_[0]) + 8,
       "record 0 at log offset 0 (50 bytes of payload): checksum mismatch"},
      {"record 1's payload", Log(record_offsets_[1]) + 40,
       "record 1 at log offset 88 (80 bytes of payload): checksum mismatch"},
      {"record 2's padding", Log(tail_) - 1, "record 2"},
      {"record 2's length", Log(record_offsets_[2]) + 4, "record 2"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(Recover(Flipped(c.offset)),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(c.message)))
        << c.what;
  }
}

// Lengths and offsets the file states with a valid checksum, or before
// any checksum can be checked, are bounded before anything is read or
// allocated by them.
TEST_F(CorruptionTest, HostileLengthsAreBoundedBeforeUse) {
  const auto with = [this](int64_t offset, const void* value, size_t bytes) {
    std::string copy = bytes_;
    std::memcpy(copy.data() + offset, value, bytes);
    return copy;
  };
  const auto commit = [&](uint64_t epoch, uint64_t tail) {
    const uint64_t word = jf::EncodeCommitWord(epoch, tail);
    return with(jf::kCommitWordOffset, &word, sizeof(word));
  };
  const int64_t capacity = SmallOptions().log_capacity_bytes;
  EXPECT_THAT(Recover(commit(1, capacity + 8)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("committed tail (16392)")));
  EXPECT_THAT(
      Recover(commit(1, jf::kTailMask)),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("committed tail")));
  EXPECT_THAT(
      Recover(commit(1, tail_ + 4)),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not a multiple of 8")));
  EXPECT_THAT(Recover(commit(1, tail_ + 8)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("record 3 at log offset 344: its header "
                                 "runs past the committed tail")));
  // The uncommitted record past the tail is whole up to its crc.
  EXPECT_THAT(Recover(commit(1, tail_ + jf::RecordBytes(200))),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("record 3 at log offset 344 (200 bytes of "
                                 "payload): checksum mismatch")));
  EXPECT_THAT(Recover(commit(2, tail_)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("slot 0 does not hold the committed "
                                 "snapshot: epoch 0")));

  const uint32_t huge_payload = ~uint32_t{0};
  EXPECT_THAT(
      Recover(with(Log(record_offsets_[2]) + 4, &huge_payload, 4)),
      StatusIs(absl::StatusCode::kDataLoss,
               HasSubstr("record 2 at log offset 200: its 4294967295 bytes "
                         "of payload run past the committed tail (344)")));
  const uint64_t huge_length = uint64_t{1} << 63;
  EXPECT_THAT(Recover(with(Slot(1) + Field(offsetof(jf::SlotHeader, length)),
                           &huge_length, 8)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("does not hold the committed snapshot")));

  // A header that checks out yet states capacities past the bounds.
  jf::FileHeader header;
  std::memcpy(&header, bytes_.data(), sizeof(header));
  header.log_capacity = uint64_t{1} << 50;
  header.header_crc =
      static_cast<uint32_t>(crc32_z(0, reinterpret_cast<const Bytef*>(&header),
                                    offsetof(jf::FileHeader, header_crc)));
  EXPECT_THAT(
      Recover(with(0, &header, sizeof(header))),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("header out of range")));
}

// The format's checksum is the crc32 of zlib and gzip: every one in the
// file is what zlib computes over the bytes it covers (the journal takes
// its own from another implementation, ISA-L's).
TEST_F(CorruptionTest, ChecksumsAreZlibsCrc32) {
  auto zlib_crc = [this](int64_t offset, int64_t bytes, uint32_t crc = 0) {
    return static_cast<uint32_t>(crc32_z(
        crc, reinterpret_cast<const Bytef*>(bytes_.data() + offset), bytes));
  };
  auto stored = [this](int64_t offset) {
    uint32_t crc;
    std::memcpy(&crc, bytes_.data() + offset, sizeof(crc));
    return crc;
  };
  EXPECT_EQ(stored(offsetof(jf::FileHeader, header_crc)),
            zlib_crc(0, offsetof(jf::FileHeader, header_crc)));

  jf::SlotHeader slot;
  std::memcpy(&slot, bytes_.data() + Slot(1), sizeof(slot));
  ASSERT_EQ(slot.length, 2000u);
  EXPECT_EQ(slot.crc, zlib_crc(Slot(1) + jf::kSlotDataOffset, 2000,
                               zlib_crc(Slot(1) + 4, sizeof(slot) - 4)));

  for (int i = 0; i < 3; ++i) {
    jf::RecordHeader record;
    std::memcpy(&record, bytes_.data() + Log(record_offsets_[i]),
                sizeof(record));
    ASSERT_EQ(record.payload_bytes, 50u + 30 * i);
    EXPECT_EQ(record.crc, zlib_crc(Log(record_offsets_[i]) + 4,
                                   jf::RecordBytes(record.payload_bytes) - 4))
        << "record " << i;
  }
}

TEST_F(CorruptionTest, ScratchBytesAreNotState) {
  const int64_t offsets[] = {
      Log(tail_) + 40,  // the uncommitted record
      Log(tail_),       // its header
      Log(SmallOptions().log_capacity_bytes - 1),
      Slot(0) + 8,                           // the inactive slot
      Slot(1) + jf::kSlotDataOffset + 2000,  // past the snapshot's end
      1000,                                  // the header page's unused bytes
  };
  for (int64_t offset : offsets) {
    ASSERT_OK_AND_ASSIGN(RecoveredJournal recovered, Recover(Flipped(offset)));
    EXPECT_EQ(ContentOf(recovered), original_) << "offset " << offset;
  }
}

TEST_F(CorruptionTest, TruncatedOrResizedFileIsRefused) {
  const int64_t sizes[] = {0,
                           100,
                           jf::kPageBytes,
                           static_cast<int64_t>(bytes_.size()) - 4096,
                           static_cast<int64_t>(bytes_.size()) - 1,
                           static_cast<int64_t>(bytes_.size()) + 4096};
  for (int64_t size : sizes) {
    UniqueFd fd = MemfdWith(bytes_);
    ASSERT_EQ(ftruncate(fd.get(), size), 0);
    EXPECT_THAT(
        StateJournal::Open(std::move(fd)),
        StatusIs(absl::StatusCode::kDataLoss,
                 HasSubstr(absl::StrFormat("the file is %d bytes", size))))
        << size;
  }
}

TEST_F(CorruptionTest, UnreadableFormatsNameTheVersions) {
  const uint32_t versions[] = {StateJournal::kFormatVersion + 1, 7,
                               StateJournal::kMinReadableFormat - 1};
  for (uint32_t version : versions) {
    std::string bytes = bytes_;
    std::memcpy(bytes.data() + offsetof(jf::FileHeader, format_version),
                &version, sizeof(version));
    EXPECT_THAT(Recover(bytes),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr(absl::StrFormat(
                             "state journal format %d; this build reads %d..%d",
                             version, StateJournal::kMinReadableFormat,
                             StateJournal::kFormatVersion))));
  }
}

// 500 single-byte corruptions anywhere: each file opens to exactly the
// original content or is refused as damaged or unreadable; one in a byte
// that recovery reads as state is always refused.
TEST_F(CorruptionTest, RandomByteCorruptionNeverGoesUnnoticed) {
  const std::vector<std::pair<int64_t, int64_t>> state_ranges = {
      {0, sizeof(jf::FileHeader)},
      {jf::kCommitWordOffset, jf::kCommitWordOffset + 8},
      {Slot(1), Slot(1) + static_cast<int64_t>(sizeof(jf::SlotHeader))},
      {Slot(1) + jf::kSlotDataOffset, Slot(1) + jf::kSlotDataOffset + 2000},
      {Log(0), Log(tail_)},
  };
  int64_t state_bytes = 0;
  for (const auto& [begin, end] : state_ranges) state_bytes += end - begin;

  std::mt19937_64 random(7);
  int opened = 0;
  int refused = 0;
  for (int i = 0; i < 500; ++i) {
    // Half anywhere in the file (mostly scratch), half in the state.
    int64_t offset = 0;
    bool in_state = false;
    if (i % 2 == 0) {
      offset = static_cast<int64_t>(random() % bytes_.size());
      for (const auto& [begin, end] : state_ranges) {
        in_state |= offset >= begin && offset < end;
      }
    } else {
      int64_t pick = static_cast<int64_t>(random() % state_bytes);
      for (const auto& [begin, end] : state_ranges) {
        if (pick < end - begin) {
          offset = begin + pick;
          break;
        }
        pick -= end - begin;
      }
      in_state = true;
    }
    const uint8_t flip = static_cast<uint8_t>(1 + random() % 255);
    absl::StatusOr<RecoveredJournal> recovered = Recover(Flipped(offset, flip));
    SCOPED_TRACE(absl::StrFormat("offset %d ^ 0x%02x", offset, flip));
    if (recovered.ok()) {
      ++opened;
      EXPECT_FALSE(in_state) << "a corrupted state byte went unnoticed";
      EXPECT_EQ(ContentOf(*recovered), original_);
    } else {
      ++refused;
      EXPECT_TRUE(absl::IsDataLoss(recovered.status()) ||
                  absl::IsFailedPrecondition(recovered.status()))
          << recovered.status();
    }
  }
  std::printf("500 corruptions: %d opened unchanged, %d refused\n", opened,
              refused);
}

}  // namespace
}  // namespace pagealloc
