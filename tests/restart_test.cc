// A daemon restart loses nothing (docs/design.md, "A restart keeps the
// pool"): pagealloc-server runs with --keep_state under a service manager
// (tests/service_manager.h: systemd's fd store, as a unit's daemon sees
// it), eight clients allocate, write a KV pattern into their pages and
// free, and the daemon is SIGKILLed at random instants, hundreds of
// times (or stopped cleanly with SIGTERM, tens of times: a restart or an
// upgrade), and started again on the same socket with the descriptors the
// manager kept. After each restart every client carries on by itself
// (ClientOptions.reconnect_timeout) and checks:
//   - its session survived with exactly the pages it held (ListPages): an
//     operation answered before the kill is there, and one whose answer
//     the kill took was sent again by the client with its call id and
//     answered once (docs/design.md, "Retries by call id"): no call fails
//     because of a kill, and none is done twice;
//   - the KV it wrote into every page it holds is intact, byte for byte;
// and at the end every page is free or held by exactly one client, as the
// clients' own records say (the daemon checks its invariants after every
// batch too, --debug_checks). The journal's log is small, so snapshots
// are written (and killed into) all along. The time from each kill to
// each client's first answered call is measured and printed; the test
// does not depend on it.

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/admin.h"
#include "client/client.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/daemon_stats.h"
#include "tests/kv_pattern.h"
#include "tests/raw_session.h"
#include "tests/service_manager.h"
#include "tests/socket_dir.h"
#include "tests/status_matchers.h"
#include "tests/subprocess.h"
#include "tests/wait_for.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::DaemonStats;
using ::pagealloc::testing::DescribeWaitStatus;
using ::pagealloc::testing::FdStoreManager;
using ::pagealloc::testing::FencedFree;
using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::KvPatternByte;
using ::pagealloc::testing::MakeSocketDir;
using ::pagealloc::testing::OpenRawSession;
using ::pagealloc::testing::RawAllocPages;
using ::pagealloc::testing::RawSession;
using ::pagealloc::testing::ReadLog;
using ::pagealloc::testing::RunfilePath;
using ::pagealloc::testing::StatusIs;
using ::pagealloc::testing::Subprocess;
using ::pagealloc::testing::WaitFor;

constexpr int kClients = 8;
constexpr int64_t kPageSize = 4;
constexpr int64_t kNumPages = 512;
// Each client holds at most this many pages, so that the pool never runs
// out and every refusal is a bug.
constexpr int64_t kMaxPagesPerClient = kNumPages / kClients - 8;
constexpr char kLayout[] = "custom:kv=uint8:16,aux=uint8:8";

// Kills in a run: a few hundred, fewer where sanitizers slow everything
// down; PAGEALLOC_RESTART_KILLS overrides.
int KillsInRun() {
  if (const char* kills = std::getenv("PAGEALLOC_RESTART_KILLS")) {
    int n = 0;
    if (absl::SimpleAtoi(kills, &n) && n > 0) return n;
  }
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return 20;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  return 20;
#endif
#endif
  return 200;
}

// The daemon's socket and log, in a short private directory (a Unix
// socket path has 107 bytes).
struct DaemonPaths {
  std::string socket;
  std::string target;
  std::string log;
};

DaemonPaths MakePaths() {
  const std::string dir = MakeSocketDir("restart");
  const char* tmp = std::getenv("TEST_TMPDIR");
  DaemonPaths paths;
  paths.socket = dir + "/gpu0.sock";
  paths.target = "unix://" + paths.socket;
  // One log per case: later cases must not pass on an earlier one's lines.
  paths.log = std::string(tmp != nullptr ? tmp : dir.c_str()) + "/daemon-" +
              dir.substr(dir.rfind('/') + 1) + ".log";
  return paths;
}

std::vector<std::string> DaemonArgv(const DaemonPaths& paths) {
  // PAGEALLOC_TEST_BACKEND=cuda runs it on a GPU daemon: the slab in CUDA
  // virtual memory, kept in the store as its POSIX fd.
  const char* backend = std::getenv("PAGEALLOC_TEST_BACKEND");
  return {RunfilePath("server/pagealloc-server"),
          absl::StrFormat("--backend=%s", backend != nullptr ? backend : "cpu"),
          "--listen=" + paths.target, "--metrics_port=-1", "--keep_state",
          // Small, so that snapshots are written (and killed into) often.
          "--state_log_bytes=65536",
          absl::StrFormat("--num_pages=%d", kNumPages),
          absl::StrFormat("--page_size=%d", kPageSize),
          std::string("--kv_layout=") + kLayout, "--ring_capacity_slots=4096",
          "--lease_ms=60000", "--debug_checks",
          // Without a service manager: a keeper outlives the last daemon
          // of a case by this much.
          "--fd_keeper_linger_ms=10000"};
}

// One scheduler: its session, the pages it holds and what it wrote there.
class Worker {
 public:
  Worker(int index, const std::string& target)
      : index_(index), rng_(0x5eed + index) {
    ClientOptions options;
    options.target = target;
    options.client_name = absl::StrFormat("restart-%d", index);
    options.resumable = true;
    options.reconnect_timeout = absl::Seconds(60);
    options.reconnect_initial_backoff = absl::Milliseconds(5);
    options.reconnect_max_backoff = absl::Milliseconds(50);
    options.call_timeout = absl::Seconds(60);
    auto client = Client::Connect(options);
    EXPECT_OK(client.status());
    if (client.ok()) client_ = *std::move(client);
  }

  bool connected() const { return client_ != nullptr; }
  uint64_t session_id() const { return client_->session_id(); }
  const std::set<int64_t>& pages() const { return pages_; }

  // Runs operations until `stop`; failures are recorded (failures()).
  void Run(const std::atomic<bool>& stop, const std::atomic<int64_t>& kills,
           const std::atomic<int64_t>& killed_at_us) {
    while (!stop.load()) {
      const int64_t kill = kills.load();
      Step();
      if (kill != seen_kill_) {
        // The first answered call since a kill: time it, and check the
        // whole of this client's KV.
        if (last_ok_) {
          resume_us_.push_back(absl::ToUnixMicros(absl::Now()) -
                               killed_at_us.load());
          // The longest this client went without an answer, across the
          // stop: its outage (a handover's successor starts while the old
          // daemon still serves, so the time from its start overstates it).
          gap_us_.push_back(std::exchange(longest_gap_us_, 0));
          seen_kill_ = kill;
          CheckAllKv("after a restart");
          CheckExact();
        }
      }
    }
    Reconcile();
    CheckAllKv("at the end");
  }

  int64_t operations() const { return operations_; }
  // Calls answered so far (any thread may read it).
  int64_t answered() const { return answered_.load(); }
  int64_t unknown_outcomes() const { return unknown_outcomes_; }
  // Calls the client sent again after a restart (answered once).
  int64_t calls_sent_again() const { return client_->calls_sent_again(); }
  int64_t kv_bytes_checked() const { return kv_bytes_checked_; }
  const std::vector<int64_t>& resume_us() const { return resume_us_; }
  const std::vector<int64_t>& gap_us() const { return gap_us_; }
  const std::vector<std::string>& failures() const { return failures_; }
  absl::Status session_status() const { return client_->session_status(); }

 private:
  void Fail(std::string what) {
    if (failures_.size() < 20) {
      failures_.push_back(absl::StrFormat("client %d (session %d): %s", index_,
                                          client_->session_id(), what));
    }
  }

  // A call failed: which way, and whether its effect is unknown.
  void Answered() {
    last_ok_ = true;
    answered_++;
    const int64_t now = absl::ToUnixMicros(absl::Now());
    if (last_answer_us_ > 0) {
      longest_gap_us_ = std::max(longest_gap_us_, now - last_answer_us_);
    }
    last_answer_us_ = now;
  }

  void Failed(const absl::Status& status, const char* what) {
    last_ok_ = false;
    if (absl::StrContains(status.message(), "whether it took effect is")) {
      // The client sends such a call again with its call id: a kill must
      // never leave a call's outcome unknown to its caller.
      ++unknown_outcomes_;
      reconcile_ = true;
      Fail(absl::StrFormat("%s was not answered across a restart: %s", what,
                           status.ToString()));
      return;
    }
    if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
      // Refused without effect (the daemon draining, a reconnect longer
      // than the call's timeout): the pages are as they were.
      reconcile_ = true;
      return;
    }
    Fail(absl::StrFormat("%s: %s", what, status.ToString()));
  }

  void Step() {
    ++operations_;
    if (reconcile_) {
      Reconcile();
      return;
    }
    const bool allocate =
        pages_.size() < 4 ||
        (pages_.size() + 4 <= static_cast<size_t>(kMaxPagesPerClient) &&
         rng_() % 2 == 0);
    if (allocate) {
      const int64_t n = 1 + rng_() % 4;
      const int64_t tokens[] = {n * kPageSize};
      absl::StatusOr<Allocation> allocation = client_->Alloc(tokens);
      if (!allocation.ok()) {
        maybe_allocated_ += n;
        return Failed(allocation.status(), "Alloc");
      }
      if (!(*allocation)[0].status.ok()) {
        return Fail("Alloc refused: " + (*allocation)[0].status.ToString());
      }
      // The slots are in the ring: device memory on the CUDA backend.
      const RequestSlots& slots = (*allocation)[0];
      std::vector<int64_t> host(slots.count);
      if (absl::Status copied =
              client_->CopyToHost(slots.slots, slots.count, host.data());
          !copied.ok()) {
        client_->Release(*allocation);
        return Fail("CopyToHost: " + copied.ToString());
      }
      std::vector<int64_t> got;
      for (int64_t i = 0; i < slots.count; i += kPageSize) {
        got.push_back(host[i] / kPageSize);
      }
      client_->Release(*allocation);
      for (int64_t page : got) {
        if (!pages_.insert(page).second) {
          Fail(absl::StrFormat("Alloc gave page %d, already held", page));
        }
        WriteKv(page);
      }
      Answered();
      return;
    }
    // Free 1..3 pages, KV checked first.
    std::vector<int64_t> chosen(pages_.begin(), pages_.end());
    std::shuffle(chosen.begin(), chosen.end(), rng_);
    chosen.resize(std::min<size_t>(chosen.size(), 1 + rng_() % 3));
    for (int64_t page : chosen) CheckKv(page, "before its free");
    absl::StatusOr<int64_t> freed = client_->FreePages(chosen);
    for (int64_t page : chosen) pages_.erase(page);
    if (!freed.ok()) {
      maybe_freed_.insert(chosen.begin(), chosen.end());
      return Failed(freed.status(), "FreePages");
    }
    Answered();
  }

  // After a restart: the session's pages as the daemon has them are
  // exactly the ones held (every call was answered once).
  void CheckExact() {
    if (reconcile_) return;
    absl::StatusOr<std::vector<int64_t>> owned = client_->ListPages();
    if (!owned.ok()) {
      // Another kill under it: checked after the next restart.
      if (!absl::IsUnavailable(owned.status())) {
        Fail("ListPages: " + owned.status().ToString());
      }
      return;
    }
    const std::set<int64_t> daemon(owned->begin(), owned->end());
    if (daemon != pages_) {
      Fail(absl::StrFormat(
          "after a restart the daemon holds %d pages for it, it holds %d "
          "(%d of the daemon's not its own)",
          daemon.size(), pages_.size(),
          std::count_if(daemon.begin(), daemon.end(),
                        [this](int64_t p) { return pages_.count(p) == 0; })));
    }
  }

  // After calls refused or not answered: the session's pages as the
  // daemon has them must be the ones held, give or take exactly those
  // calls.
  void Reconcile() {
    absl::StatusOr<std::vector<int64_t>> owned = client_->ListPages();
    if (!owned.ok()) {
      last_ok_ = false;
      if (!absl::IsUnavailable(owned.status()) &&
          !absl::IsDeadlineExceeded(owned.status())) {
        Fail("ListPages: " + owned.status().ToString());
      }
      return;
    }
    Answered();
    const std::set<int64_t> daemon(owned->begin(), owned->end());
    int64_t extra = 0;
    for (int64_t page : daemon) {
      if (pages_.count(page) != 0) continue;
      if (maybe_freed_.count(page) != 0) {
        // A free that never happened: still ours, KV and all.
        pages_.insert(page);
        CheckKv(page, "after a free whose answer was lost");
        continue;
      }
      ++extra;
      pages_.insert(page);
      WriteKv(page);  // an allocation whose answer was lost
    }
    if (extra > maybe_allocated_) {
      Fail(absl::StrFormat(
          "the daemon holds %d pages for it that no call of it could have "
          "taken (%d were asked for by calls whose answers were lost)",
          extra, maybe_allocated_));
    }
    for (auto it = pages_.begin(); it != pages_.end();) {
      if (daemon.count(*it) == 0) {
        Fail(absl::StrFormat("page %d, held, is not the session's", *it));
        it = pages_.erase(it);
      } else {
        ++it;
      }
    }
    maybe_allocated_ = 0;
    maybe_freed_.clear();
    reconcile_ = false;
  }

  // The page's slots of buffer `b`, as this client writes them.
  std::vector<uint8_t> Pattern(int64_t page, int b) const {
    const KvBuffer& buffer = client_->kv_buffers()[b];
    std::vector<uint8_t> bytes(kPageSize * buffer.stride_bytes);
    for (int64_t s = 0; s < kPageSize; ++s) {
      const int64_t slot = page * kPageSize + s;
      for (int64_t i = 0; i < buffer.stride_bytes; ++i) {
        bytes[s * buffer.stride_bytes + i] =
            KvPatternByte(client_->session_id(), slot, b, i);
      }
    }
    return bytes;
  }

  // Writes the pattern into every slot of `page` in every buffer (through
  // the slab view: host memory on the CPU backend, device memory on CUDA).
  void WriteKv(int64_t page) {
    for (int b = 0; b < static_cast<int>(client_->kv_buffers().size()); ++b) {
      const std::vector<uint8_t> bytes = Pattern(page, b);
      const absl::Status written = client_->kv_slab()->CopyToSlab(
          client_->kv_buffers()[b].slot(page * kPageSize), bytes.data(),
          bytes.size());
      if (!written.ok()) return Fail("CopyToSlab: " + written.ToString());
    }
  }

  void CheckKv(int64_t page, const char* when) {
    for (int b = 0; b < static_cast<int>(client_->kv_buffers().size()); ++b) {
      const std::vector<uint8_t> want = Pattern(page, b);
      std::vector<uint8_t> got(want.size());
      const absl::Status read = client_->kv_slab()->CopyFromSlab(
          got.data(), client_->kv_buffers()[b].slot(page * kPageSize),
          got.size());
      if (!read.ok()) return Fail("CopyFromSlab: " + read.ToString());
      if (got != want) {
        const size_t at =
            std::mismatch(got.begin(), got.end(), want.begin()).first -
            got.begin();
        return Fail(absl::StrFormat("KV of page %d (%s, byte %d) changed %s",
                                    page, client_->kv_buffers()[b].name, at,
                                    when));
      }
      kv_bytes_checked_ += got.size();
    }
  }

  void CheckAllKv(const char* when) {
    for (int64_t page : pages_) CheckKv(page, when);
  }

  const int index_;
  std::mt19937_64 rng_;
  std::unique_ptr<Client> client_;
  std::set<int64_t> pages_;
  // Calls whose answers a kill took: pages they asked for, pages they
  // freed.
  int64_t maybe_allocated_ = 0;
  std::set<int64_t> maybe_freed_;
  bool reconcile_ = false;
  bool last_ok_ = false;
  int64_t seen_kill_ = 0;
  int64_t operations_ = 0;
  std::atomic<int64_t> answered_{0};
  int64_t unknown_outcomes_ = 0;
  int64_t kv_bytes_checked_ = 0;
  std::vector<int64_t> resume_us_;
  int64_t last_answer_us_ = 0;
  int64_t longest_gap_us_ = 0;
  std::vector<int64_t> gap_us_;
  std::vector<std::string> failures_;
};

// How the daemon is stopped: SIGKILL (a crash, at any instant), SIGTERM
// (a clean stop, `systemctl restart`: it drains, and its sessions are kept
// for its successor, so each client resumes exactly as after a crash), both
// under a service manager that keeps the descriptors; or, with no service
// manager, where the daemon's descriptor keeper holds them (//fd_keeper),
// a successor started with --take_over, which the daemon is stopped for
// (//handover), or SIGKILL, after which a successor started with
// --take_over takes the pool from the keeper.
enum class Stop { kSigkill, kSigterm, kHandover, kSigkillKeeper };

// Without a service manager: whether the daemon on `target` answers.
// The descriptor keeper daemon `daemon` spawned (its child running
// --internal_fd_keeper), or 0 while it has none.
pid_t KeeperOf(pid_t daemon) {
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return 0;
  pid_t found = 0;
  while (dirent* entry = readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid)) continue;
    std::ifstream stat(absl::StrFormat("/proc/%d/stat", pid));
    std::string line;
    std::getline(stat, line);
    // pid (comm) state ppid ...: comm may hold spaces, so after its ')'.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> fields =
        absl::StrSplit(line.substr(close + 2), ' ');
    int parent = 0;
    if (fields.size() < 2 || !absl::SimpleAtoi(fields[1], &parent) ||
        parent != daemon) {
      continue;
    }
    std::ifstream cmdline(absl::StrFormat("/proc/%d/cmdline", pid));
    const std::string args((std::istreambuf_iterator<char>(cmdline)),
                           std::istreambuf_iterator<char>());
    if (args.find("--internal_fd_keeper") != std::string::npos) found = pid;
  }
  closedir(proc);
  return found;
}

// Whether the daemon on `target` answers calls.
bool Serving(const std::string& target) {
  return WaitFor([&] { return DaemonStats(target).ok(); }, absl::Seconds(30),
                 absl::Milliseconds(2));
}

// Without a service manager: whether the daemon on `target` answers calls
// and successors (last of all, its keeper listens on the handover socket).
bool ServingAndKept(const std::string& target) {
  const std::string handover =
      std::string(absl::StripPrefix(target, "unix://")) + ".handover";
  return Serving(target) &&
         WaitFor([&] { return access(handover.c_str(), F_OK) == 0; },
                 absl::Seconds(30), absl::Milliseconds(2));
}

class RestartTest : public ::testing::TestWithParam<Stop> {};

TEST_P(RestartTest, StopUnderLoadLosesNoPageAndNoKvByte) {
  const Stop stop_kind = GetParam();
  const bool handover = stop_kind == Stop::kHandover;
  const bool no_manager = handover || stop_kind == Stop::kSigkillKeeper;
  const int stop_signal =
      stop_kind == Stop::kSigkill || stop_kind == Stop::kSigkillKeeper
          ? SIGKILL
          : SIGTERM;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FdStoreManager> manager,
                       FdStoreManager::Create());
  const DaemonPaths paths = MakePaths();
  const std::vector<std::string> argv = DaemonArgv(paths);
  std::vector<std::string> successor_argv = argv;
  successor_argv.push_back("--take_over");
  Subprocess daemon;
  if (handover) {
    {
      // --take_over with no daemon to take over is refused, never a
      // fresh pool on the sockets.
      ASSERT_OK_AND_ASSIGN(Subprocess alone,
                           Subprocess::Start(successor_argv, paths.log));
      ASSERT_OK_AND_ASSIGN(const int status, alone.Wait(absl::Seconds(60)));
      EXPECT_NE(status, 0);
      EXPECT_THAT(ReadLog(paths.log),
                  ::testing::HasSubstr("no daemon answers handovers"));
    }
    ASSERT_OK_AND_ASSIGN(daemon, Subprocess::Start(argv, paths.log));
    ASSERT_TRUE(ServingAndKept(paths.target)) << ReadLog(paths.log);
    // A successor that cannot take this state over (a pool of other
    // flags) refuses before the daemon stops: it exits, and the daemon
    // serves on, untouched.
    std::vector<std::string> other = successor_argv;
    other.push_back(absl::StrFormat("--page_size=%d", 2 * kPageSize));
    ASSERT_OK_AND_ASSIGN(Subprocess refused,
                         Subprocess::Start(other, paths.log));
    ASSERT_OK_AND_ASSIGN(const int status, refused.Wait(absl::Seconds(60)));
    EXPECT_NE(status, 0);
    EXPECT_TRUE(daemon.running());
    const std::string log = ReadLog(paths.log);
    EXPECT_THAT(
        log, ::testing::HasSubstr("refused, and the running daemon serves on"));
    EXPECT_THAT(log, ::testing::HasSubstr("page_size"));
    // (The keeper logs the refusal on its own thread.)
    EXPECT_TRUE(WaitFor(
        [&] {
          return ReadLog(paths.log).find(
                     "a successor did not take the pool over") !=
                 std::string::npos;
        },
        absl::Seconds(30)))
        << ReadLog(paths.log);
    ASSERT_TRUE(ServingAndKept(paths.target)) << log;
  } else if (no_manager) {
    ASSERT_OK_AND_ASSIGN(daemon, Subprocess::Start(argv, paths.log));
    ASSERT_TRUE(ServingAndKept(paths.target)) << ReadLog(paths.log);
  } else {
    ASSERT_OK_AND_ASSIGN(daemon, manager->Start(argv, paths.log));
    ASSERT_TRUE(manager->WaitReady(absl::Seconds(30))) << ReadLog(paths.log);
    EXPECT_EQ(manager->stored("pagealloc-slab"), 1) << ReadLog(paths.log);
    EXPECT_EQ(manager->stored("pagealloc-state"), 1) << ReadLog(paths.log);
  }

  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < kClients; ++i) {
    workers.push_back(std::make_unique<Worker>(i, paths.target));
    ASSERT_TRUE(workers.back()->connected());
  }
  std::atomic<bool> stop{false};
  std::atomic<int64_t> kills{0};
  std::atomic<int64_t> killed_at_us{0};
  std::vector<std::thread> threads;
  for (auto& worker : workers) {
    threads.emplace_back(
        [&, w = worker.get()] { w->Run(stop, kills, killed_at_us); });
  }

  // A clean stop waits for the calls in flight, and a start without a
  // service manager checks the journal through a successor's handover
  // first: a tenth as many.
  const int run_kills = stop_kind == Stop::kSigkill
                            ? KillsInRun()
                            : std::max(KillsInRun() / 10, 3);
  std::mt19937_64 rng(42);
  std::vector<int64_t> restart_us;
  auto answered = [&] {
    std::vector<int64_t> counts;
    for (auto& worker : workers) counts.push_back(worker->answered());
    return counts;
  };
  for (int k = 0; k < run_kills; ++k) {
    // Every client carries on by itself: each has had a call answered by
    // this daemon before the next kill (bounded: a client that does not
    // is a failure, not a wait).
    const std::vector<int64_t> before = answered();
    const bool carried_on = WaitFor(
        [&] {
          const std::vector<int64_t> now = answered();
          for (size_t i = 0; i < now.size(); ++i) {
            if (now[i] <= before[i]) return false;
          }
          return true;
        },
        absl::Seconds(60), absl::Microseconds(200));
    if (!carried_on) {
      std::string stuck;
      const std::vector<int64_t> now = answered();
      for (size_t i = 0; i < now.size(); ++i) {
        if (now[i] > before[i]) continue;
        absl::StrAppendFormat(&stuck, "  client %d: session %s\n", i,
                              workers[i]->session_status().ToString());
      }
      FAIL() << "after restart " << k << " not every client had a call "
             << "answered within 60 s:\n"
             << stuck << ReadLog(paths.log);
    }
    if (stop_kind == Stop::kSigkillKeeper && k == 1) {
      // A keeper killed while its daemon runs is replaced, so that the
      // daemon's next crash keeps the pool too.
      // The daemon's keeper, once the daemon has seen it listen.
      pid_t keeper = 0;
      ASSERT_TRUE(WaitFor(
          [&] {
            keeper = KeeperOf(daemon.pid());
            return keeper != 0 && ReadLog(paths.log).find(absl::StrFormat(
                                      "descriptor keeper pid %d holds",
                                      keeper)) != std::string::npos;
          },
          absl::Seconds(30)))
          << ReadLog(paths.log);
      ASSERT_EQ(kill(keeper, SIGKILL), 0);
      const std::string replaced = absl::StrFormat(
          "the descriptor keeper (pid %d) was lost; pid", keeper);
      ASSERT_TRUE(WaitFor(
          [&] {
            return ReadLog(paths.log).find(replaced) != std::string::npos;
          },
          absl::Seconds(30)))
          << ReadLog(paths.log);
      pid_t replacement = 0;
      EXPECT_TRUE(WaitFor(
          [&] {
            replacement = KeeperOf(daemon.pid());
            return replacement != 0 && replacement != keeper;
          },
          absl::Seconds(30)));
    }
    // Then a random instant in their load.
    absl::SleepFor(absl::Microseconds(rng() % 20000));
    killed_at_us = absl::ToUnixMicros(absl::Now());
    if (handover) {
      // The successor asks, checks the state, and the daemon stops and
      // exits; then the successor serves.
      ASSERT_OK_AND_ASSIGN(Subprocess successor,
                           Subprocess::Start(successor_argv, paths.log));
      ASSERT_OK_AND_ASSIGN(const int status, daemon.Wait(absl::Seconds(60)));
      ASSERT_EQ(status, 0) << DescribeWaitStatus(status);
      kills = k + 1;
      daemon = std::move(successor);
      ASSERT_TRUE(ServingAndKept(paths.target)) << "handover " << k + 1 << ":\n"
                                                << ReadLog(paths.log);
    } else if (no_manager) {
      // A crash: the keeper holds the pool until the successor takes it.
      daemon.Signal(SIGKILL);
      ASSERT_OK(daemon.Wait(absl::Seconds(10)).status());
      kills = k + 1;
      if (k == 0) {
        // A start without --take_over would put a fresh pool in the kept
        // one's place: refused, and the keeper keeps it.
        ASSERT_OK_AND_ASSIGN(Subprocess fresh,
                             Subprocess::Start(argv, paths.log));
        ASSERT_OK_AND_ASSIGN(const int status, fresh.Wait(absl::Seconds(60)));
        EXPECT_NE(status, 0);
        EXPECT_THAT(ReadLog(paths.log),
                    ::testing::HasSubstr("the descriptor keeper of one that "
                                         "died, holds a kept pool"));
      }
      ASSERT_OK_AND_ASSIGN(daemon,
                           Subprocess::Start(successor_argv, paths.log));
      ASSERT_TRUE(ServingAndKept(paths.target)) << "restart " << k + 1 << ":\n"
                                                << ReadLog(paths.log);
    } else {
      daemon.Signal(stop_signal);
      ASSERT_OK(daemon.Wait(absl::Seconds(10)).status());
      kills = k + 1;
      ASSERT_OK_AND_ASSIGN(daemon, manager->Start(argv, paths.log));
      ASSERT_TRUE(manager->WaitReady(absl::Seconds(30)))
          << "restart " << k + 1 << ":\n"
          << ReadLog(paths.log);
    }
    restart_us.push_back(absl::ToUnixMicros(absl::Now()) - killed_at_us);
    if (no_manager) continue;
    // Still one slab and one state: the same descriptors, never a second.
    ASSERT_EQ(manager->stored("pagealloc-slab"), 1);
    ASSERT_EQ(manager->stored("pagealloc-state"), 1);
  }
  // Let every client get an answer from the last daemon, then stop them.
  absl::SleepFor(absl::Milliseconds(200));
  stop = true;
  for (std::thread& thread : threads) thread.join();

  const std::string log = ReadLog(paths.log);
  EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("is not used")));
  EXPECT_THAT(log,
              ::testing::Not(::testing::HasSubstr("can no longer be kept")));
  if (stop_signal == SIGTERM) {  // a drain, not a crash
    EXPECT_THAT(log, ::testing::HasSubstr("kept for the successor"));
  }
  if (no_manager) {
    EXPECT_THAT(log, ::testing::HasSubstr("handing the pool over to pid"));
    EXPECT_THAT(log, ::testing::HasSubstr("descriptor keeper pid"));
  }
  if (stop_kind == Stop::kSigkillKeeper) {
    EXPECT_THAT(log, ::testing::HasSubstr("the daemon is gone: its pool is "
                                          "kept for a successor"));
  }

  // Every page is free or held by exactly one client, as the clients say.
  std::map<int64_t, int> holder;
  int64_t operations = 0, unknown = 0, kv_bytes = 0, sent_again = 0;
  std::vector<int64_t> resume_us, gap_us;
  for (int i = 0; i < kClients; ++i) {
    Worker& w = *workers[i];
    for (const std::string& failure : w.failures()) ADD_FAILURE() << failure;
    EXPECT_OK(w.session_status()) << "client " << i;
    for (int64_t page : w.pages()) {
      EXPECT_TRUE(holder.emplace(page, i).second)
          << "page " << page << " held by clients " << holder[page] << " and "
          << i;
    }
    operations += w.operations();
    unknown += w.unknown_outcomes();
    sent_again += w.calls_sent_again();
    kv_bytes += w.kv_bytes_checked();
    resume_us.insert(resume_us.end(), w.resume_us().begin(),
                     w.resume_us().end());
    gap_us.insert(gap_us.end(), w.gap_us().begin(), w.gap_us().end());
  }
  AdminOptions admin;
  admin.target = paths.target;
  ASSERT_OK_AND_ASSIGN(v1::GetFreeListsResponse lists,
                       GetDaemonFreeLists(admin, 2 * kNumPages));
  std::set<int64_t> free(lists.free_pages().begin(), lists.free_pages().end());
  free.insert(lists.parked_pages().begin(), lists.parked_pages().end());
  for (int64_t page = 1; page <= kNumPages; ++page) {
    EXPECT_NE(holder.count(page) + free.count(page), 0u)
        << "page " << page << " is neither free nor held";
    EXPECT_LE(holder.count(page) + free.count(page), 1u)
        << "page " << page << " is free and held";
  }
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, DaemonStats(paths.target));
  EXPECT_EQ(stats.sessions_size(), kClients);

  std::sort(resume_us.begin(), resume_us.end());
  std::sort(gap_us.begin(), gap_us.end());
  std::sort(restart_us.begin(), restart_us.end());
  auto at = [](const std::vector<int64_t>& v, double q) {
    return v.empty() ? -1.0 : v[static_cast<size_t>(q * (v.size() - 1))] / 1e3;
  };
  std::printf(
      "restart_test: %d %s, %d clients, %lld operations (%lld sent again "
      "after a kill and answered once, %lld not answered); %lld KV bytes "
      "read back intact; kill to "
      "the daemon's READY p50 %.1f ms p99 %.1f ms; kill to a client's first "
      "answered call p50 %.1f ms p99 %.1f ms (%zu resumes); a client's "
      "longest wait between two answers across a stop p50 %.1f ms p99 %.1f "
      "ms\n",
      run_kills,
      handover
          ? "handovers"
          : (stop_signal == SIGKILL
                 ? (no_manager ? "SIGKILLs (descriptor keeper)" : "SIGKILLs")
                 : "SIGTERMs"),
      kClients, static_cast<long long>(operations),
      static_cast<long long>(sent_again), static_cast<long long>(unknown),
      static_cast<long long>(kv_bytes), at(restart_us, 0.5),
      at(restart_us, 0.99), at(resume_us, 0.5), at(resume_us, 0.99),
      resume_us.size(), at(gap_us, 0.5), at(gap_us, 0.99));
  daemon.Signal(SIGTERM);
  EXPECT_OK(daemon.Wait(absl::Seconds(30)).status());
}

INSTANTIATE_TEST_SUITE_P(Stops, RestartTest,
                         ::testing::Values(Stop::kSigkill, Stop::kSigterm,
                                           Stop::kHandover,
                                           Stop::kSigkillKeeper),
                         [](const ::testing::TestParamInfo<Stop>& info) {
                           switch (info.param) {
                             case Stop::kSigkill:
                               return std::string("Sigkill");
                             case Stop::kSigterm:
                               return std::string("Sigterm");
                             case Stop::kHandover:
                               return std::string("Handover");
                             case Stop::kSigkillKeeper:
                               return std::string("SigkillKeeper");
                           }
                           return std::string("Unknown");
                         });

// A free that waits for its session's release fence keeps its pages the
// session's until the fence passes. The daemon dies before it does: the
// restarted daemon knows those pages were freed (the kept state marks them
// as awaiting release), keeps them the session's (its GPU work may still
// read them) and frees them when the session resumes, as a live daemon
// frees them at a Resume; its client waits for its fences before it
// resumes (Client's reconnect).
// A daemon under a service manager and one resumable session of it, opened
// by hand (tests/raw_session.h): the cases below drive the session's calls
// themselves and kill the daemon between them.
struct ManagedDaemon {
  std::unique_ptr<FdStoreManager> manager;
  DaemonPaths paths;
  std::vector<std::string> argv;
  Subprocess daemon;
  std::unique_ptr<v1::PageAllocator::Stub> stub;
  RawSession raw;
};

// Starts the daemon and opens the session `name`; failures are fatal to
// the test (check with ASSERT_NO_FATAL_FAILURE).
void StartManagedDaemon(const std::string& name, ManagedDaemon* m) {
  ASSERT_OK_AND_ASSIGN(m->manager, FdStoreManager::Create());
  m->paths = MakePaths();
  m->argv = DaemonArgv(m->paths);
  ASSERT_OK_AND_ASSIGN(m->daemon, m->manager->Start(m->argv, m->paths.log));
  ASSERT_TRUE(m->manager->WaitReady(absl::Seconds(30)))
      << ReadLog(m->paths.log);
  m->stub = v1::PageAllocator::NewStub(
      grpc::CreateChannel(m->paths.target, grpc::InsecureChannelCredentials()));
  m->raw = OpenRawSession(*m->stub, name, /*quota_pages=*/0,
                          /*resumable=*/true);
  ASSERT_NE(m->raw.header, nullptr);
}

TEST(RestartFenceTest, PagesAwaitingTheirFenceAtACrashAreFreedAtTheResume) {
  ManagedDaemon m;
  ASSERT_NO_FATAL_FAILURE(StartManagedDaemon("fenced", &m));
  FdStoreManager* const manager = m.manager.get();
  const DaemonPaths& paths = m.paths;
  const std::vector<std::string>& argv = m.argv;
  Subprocess& daemon = m.daemon;
  std::unique_ptr<v1::PageAllocator::Stub>& stub = m.stub;
  RawSession& raw = m.raw;
  // Five pages, three freed behind the fence and two kept.
  const std::vector<int64_t> pages = RawAllocPages(*stub, raw, 5, kPageSize);
  ASSERT_EQ(pages.size(), 5u);
  const std::vector<int64_t> fenced(pages.begin(), pages.begin() + 3);
  ASSERT_OK(FencedFree(*stub, raw, fenced, /*value=*/1));
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, DaemonStats(paths.target));
  EXPECT_EQ(stats.used_pages(), 5);

  daemon.Signal(SIGKILL);
  ASSERT_OK(daemon.Wait(absl::Seconds(10)).status());
  ASSERT_OK_AND_ASSIGN(daemon, manager->Start(argv, paths.log));
  ASSERT_TRUE(manager->WaitReady(absl::Seconds(30))) << ReadLog(paths.log);
  // (A channel to the dead daemon may fail its first call.)
  ASSERT_TRUE(Serving(paths.target)) << ReadLog(paths.log);
  // Still the session's: its GPU work may be reading them.
  ASSERT_OK_AND_ASSIGN(stats, DaemonStats(paths.target));
  EXPECT_EQ(stats.used_pages(), 5);

  // The session's stream passes the fence (in the old channel, which the
  // new daemon never sees), then its client resumes.
  raw.header->release_word.store(1, std::memory_order_release);
  stub = v1::PageAllocator::NewStub(
      grpc::CreateChannel(paths.target, grpc::InsecureChannelCredentials()));
  v1::ResumeRequest resume;
  resume.mutable_session()->set_session_id(raw.id());
  resume.mutable_session()->set_session_token(raw.registered.session_token());
  v1::RegisterResponse resumed;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  ASSERT_TRUE(stub->Resume(&context, resume, &resumed).ok());
  // The fenced pages go free; the two kept stay the session's.
  EXPECT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<v1::GetStatsResponse> now = DaemonStats(paths.target);
        return now.ok() && now->used_pages() == 2;
      },
      absl::Seconds(30)))
      << ReadLog(paths.log);
  EXPECT_THAT(ReadLog(paths.log),
              ::testing::HasSubstr("3 pages freed with a fence before the "
                                   "daemon's restart are freed now"));
  daemon.Signal(SIGTERM);
  EXPECT_OK(daemon.Wait(absl::Seconds(30)).status());
}

// Tagged calls over gRPC, as a client sends them, with the daemon killed
// after their answers: each retry is answered as the call was, once.
class RetrySession {
 public:
  RetrySession(const std::string& target, RawSession* raw)
      : target_(target), raw_(raw) {
    Redial();
  }
  void Redial() {
    stub_ = v1::PageAllocator::NewStub(
        grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  }
  v1::PageAllocator::Stub& stub() { return *stub_; }
  v1::SessionRef Ref(uint64_t call_id, bool retry) const {
    v1::SessionRef ref;
    ref.set_session_id(raw_->id());
    ref.set_session_token(raw_->registered.session_token());
    ref.set_call_id(call_id);
    ref.set_retry(retry);
    return ref;
  }
  static std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    return context;
  }
  // An Alloc of `pages` whole pages, inline: the pages, or the call's
  // status (a request refused is the call's status here).
  absl::StatusOr<std::vector<int64_t>> Alloc(int64_t pages, uint64_t call_id,
                                             bool retry) {
    v1::AllocRequest request;
    *request.mutable_session() = Ref(call_id, retry);
    request.add_num_tokens(pages * kPageSize);
    request.mutable_options()->set_return_inline(true);
    v1::AllocResponse response;
    RETURN_IF_ERROR(
        FromGrpcStatus(stub_->Alloc(Context().get(), request, &response)));
    if (response.results_size() != 1) {
      return absl::InternalError(response.ShortDebugString());
    }
    const v1::RequestResult& result = response.results(0);
    if (result.code() != 0) {
      return absl::Status(static_cast<absl::StatusCode>(result.code()),
                          result.message());
    }
    std::vector<int64_t> ids;
    for (int i = 0; i < result.slots_size(); i += kPageSize) {
      ids.push_back(result.slots(i) / kPageSize);
    }
    return ids;
  }
  absl::StatusOr<int64_t> Free(const std::vector<int64_t>& pages,
                               uint64_t call_id, bool retry) {
    v1::FreeRequest request;
    *request.mutable_session() = Ref(call_id, retry);
    for (int64_t page : pages) request.add_pages(page);
    v1::FreeResponse response;
    RETURN_IF_ERROR(
        FromGrpcStatus(stub_->Free(Context().get(), request, &response)));
    return response.pages_freed();
  }
  absl::StatusOr<uint64_t> Checkpoint(uint64_t call_id, bool retry) {
    v1::CheckpointRequest request;
    *request.mutable_session() = Ref(call_id, retry);
    v1::CheckpointResponse response;
    RETURN_IF_ERROR(
        FromGrpcStatus(stub_->Checkpoint(Context().get(), request, &response)));
    return response.checkpoint_id();
  }
  absl::StatusOr<std::vector<int64_t>> ListPages() {
    v1::ListPagesRequest request;
    *request.mutable_session() = Ref(0, false);
    v1::ListPagesResponse response;
    RETURN_IF_ERROR(
        FromGrpcStatus(stub_->ListPages(Context().get(), request, &response)));
    return std::vector<int64_t>(response.pages().begin(),
                                response.pages().end());
  }
  absl::StatusOr<v1::RegisterResponse> Resume() {
    Redial();
    v1::ResumeRequest request;
    *request.mutable_session() = Ref(0, false);
    v1::RegisterResponse response;
    RETURN_IF_ERROR(
        FromGrpcStatus(stub_->Resume(Context().get(), request, &response)));
    return response;
  }

 private:
  const std::string target_;
  RawSession* const raw_;
  std::unique_ptr<v1::PageAllocator::Stub> stub_;
};

std::vector<int64_t> Sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(RestartRetryTest, CallsSentAgainAfterAKillAreAnsweredOnce) {
  ManagedDaemon m;
  ASSERT_NO_FATAL_FAILURE(StartManagedDaemon("retried", &m));
  FdStoreManager* const manager = m.manager.get();
  const DaemonPaths& paths = m.paths;
  const std::vector<std::string>& argv = m.argv;
  Subprocess& daemon = m.daemon;
  RawSession& raw = m.raw;
  EXPECT_TRUE(raw.registered.retries_kept());
  RetrySession session(paths.target, &raw);
  auto restart = [&] {
    daemon.Signal(SIGKILL);
    ASSERT_OK(daemon.Wait(absl::Seconds(10)).status());
    ASSERT_OK_AND_ASSIGN(daemon, manager->Start(argv, paths.log));
    ASSERT_TRUE(manager->WaitReady(absl::Seconds(30))) << ReadLog(paths.log);
    ASSERT_TRUE(Serving(paths.target)) << ReadLog(paths.log);
  };

  // Calls 1 to 3 answered, then the daemon dies: their answers could have
  // been lost with it.
  ASSERT_OK_AND_ASSIGN(const std::vector<int64_t> first,
                       session.Alloc(3, /*call_id=*/1, /*retry=*/false));
  ASSERT_EQ(first.size(), 3u);
  ASSERT_OK_AND_ASSIGN(const int64_t freed,
                       session.Free({first[0]}, /*call_id=*/2, false));
  EXPECT_EQ(freed, 1);
  ASSERT_OK_AND_ASSIGN(const uint64_t checkpoint,
                       session.Checkpoint(/*call_id=*/3, false));
  restart();
  ASSERT_OK_AND_ASSIGN(v1::RegisterResponse resumed, session.Resume());
  EXPECT_EQ(resumed.last_call_id(), 3u);
  EXPECT_TRUE(resumed.retries_kept());

  // The calls sent again are answered as they were, not done again: the
  // daemon keeps a session's latest four.
  ASSERT_OK_AND_ASSIGN(const uint64_t again, session.Checkpoint(3, true));
  EXPECT_EQ(again, checkpoint);
  EXPECT_THAT(session.Free({first[0]}, 2, true), IsOkAndHolds(1));
  // An allocation whose page a later call freed cannot run again.
  EXPECT_THAT(session.Alloc(3, 1, true),
              StatusIs(absl::StatusCode::kAborted,
                       ::testing::HasSubstr("no longer the session's")));
  // A retry needs an id.
  EXPECT_THAT(session.Free({first[1]}, 0, true),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  std::vector<int64_t> held(first.begin() + 1, first.end());
  ASSERT_OK_AND_ASSIGN(std::vector<int64_t> listed, session.ListPages());
  EXPECT_EQ(Sorted(listed), Sorted(held));

  // An allocation whose answer a kill took: sent again, it is given its
  // pages again (the same ones: nothing ran in between), and holds them
  // once.
  ASSERT_OK_AND_ASSIGN(const std::vector<int64_t> second,
                       session.Alloc(2, /*call_id=*/4, false));
  restart();
  ASSERT_OK_AND_ASSIGN(resumed, session.Resume());
  EXPECT_EQ(resumed.last_call_id(), 4u);
  ASSERT_OK_AND_ASSIGN(const std::vector<int64_t> second_again,
                       session.Alloc(2, 4, true));
  EXPECT_EQ(second_again, second);
  held.insert(held.end(), second.begin(), second.end());
  ASSERT_OK_AND_ASSIGN(listed, session.ListPages());
  EXPECT_EQ(Sorted(listed), Sorted(held));
  // And once more, with no restart between: still held once.
  ASSERT_OK_AND_ASSIGN(const std::vector<int64_t> third_try,
                       session.Alloc(2, 4, true));
  EXPECT_EQ(third_try, second);
  ASSERT_OK_AND_ASSIGN(listed, session.ListPages());
  EXPECT_EQ(Sorted(listed), Sorted(held));

  // A free whose answer a kill took: answered with its count, not refused
  // as a double free.
  ASSERT_OK_AND_ASSIGN(const int64_t freed_second,
                       session.Free(second, /*call_id=*/5, false));
  EXPECT_EQ(freed_second, 2);
  restart();
  ASSERT_OK(session.Resume().status());
  ASSERT_OK_AND_ASSIGN(const int64_t freed_again,
                       session.Free(second, 5, true));
  EXPECT_EQ(freed_again, 2);
  ASSERT_OK_AND_ASSIGN(listed, session.ListPages());
  EXPECT_EQ(Sorted(listed),
            Sorted(std::vector<int64_t>(first.begin() + 1, first.end())));
  // Four later calls push a call out: whether it took effect is unknown.
  for (uint64_t id = 6; id <= 9; ++id) {
    ASSERT_OK(session.Checkpoint(id, false).status());
  }
  EXPECT_THAT(session.Free(second, 5, true),
              StatusIs(absl::StatusCode::kAborted,
                       ::testing::HasSubstr("later calls 6..9")));
  // A retry of a call that never reached the daemon runs.
  ASSERT_OK_AND_ASSIGN(const std::vector<int64_t> fresh,
                       session.Alloc(1, /*call_id=*/10, /*retry=*/true));
  EXPECT_EQ(fresh.size(), 1u);
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, DaemonStats(paths.target));
  EXPECT_EQ(stats.used_pages(), 3);
  daemon.Signal(SIGTERM);
  EXPECT_OK(daemon.Wait(absl::Seconds(30)).status());
}

}  // namespace
}  // namespace pagealloc
