// The C ABI (client/pagealloc.h) end to end against a real daemon, through
// libpagealloc_client.so and nothing else of ours: this binary links the
// shared library and includes only its header. (It cannot use the daemon
// helpers of tests/, which link the C++ client and with it a second copy of
// the wire API's protobuf code; so it starts the daemon itself.)

#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/pagealloc.h"
#include "gtest/gtest.h"

extern char** environ;

namespace {

// A pagealloc-server process on a private socket: 16 pages of 4 tokens,
// and `extra` flags.
class DaemonProcess {
 public:
  explicit DaemonProcess(const std::vector<std::string>& extra) {
    char pattern[] = "/tmp/pagealloc-c-api-XXXXXX";
    dir_ = mkdtemp(pattern);
    target_ = "unix://" + dir_ + "/daemon.sock";
    const char* srcdir = std::getenv("TEST_SRCDIR");
    const char* workspace = std::getenv("TEST_WORKSPACE");
    const std::string binary =
        std::string(srcdir != nullptr ? srcdir : ".") + "/" +
        (workspace != nullptr ? workspace : "pagealloc") +
        "/server/pagealloc-server";
    const char* backend = std::getenv("PAGEALLOC_TEST_BACKEND");
    std::vector<std::string> args = {
        binary,
        std::string("--backend=") + (backend != nullptr ? backend : "cpu"),
        "--listen=" + target_,
        "--num_pages=16",
        "--page_size=4",
        "--metrics_host=127.0.0.1",
        "--metrics_port=0",
        "--log_level=warn"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, binary.c_str(), nullptr, nullptr, argv.data(),
                    environ) != 0) {
      pid_ = -1;
    }
  }
  ~DaemonProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    const std::string socket = dir_ + "/daemon.sock";
    unlink(socket.c_str());
    unlink((socket + ".fd").c_str());
    rmdir(dir_.c_str());
  }
  const char* target() const { return target_.c_str(); }
  bool started() const { return pid_ > 0; }

 private:
  std::string dir_;
  std::string target_;
  pid_t pid_ = -1;
};

class PageallocCApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(ExtraFlags());
    ASSERT_TRUE(daemon_->started());
    // The daemon answers once it listens: retry connecting, bounded.
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(20);
    int32_t code;
    do {
      code = Connect(&client_);
      if (code != PAGEALLOC_UNAVAILABLE) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } while (std::chrono::steady_clock::now() < deadline);
    ASSERT_EQ(code, PAGEALLOC_OK) << error_.message;
  }
  void TearDown() override { pagealloc_client_destroy(client_); }

  // The daemon's flags besides the pool's size.
  virtual std::vector<std::string> ExtraFlags() const { return {}; }

  int32_t Connect(pagealloc_client** client, int64_t ring_slots = 0) {
    pagealloc_client_options options;
    pagealloc_client_options_init(&options, sizeof(options));
    options.target = daemon_->target();
    options.client_name = "c-api-test";
    options.ring_capacity_slots = ring_slots;
    return pagealloc_connect(&options, client, &error_);
  }

  // Starts a reserve of low mark 4, aim and high mark 8 and waits for its
  // thread's first refill: while it holds 4 to 8 pages the thread leaves
  // it alone, so nothing lands on top between two calls of a test.
  // `stats`: the reserve's once it holds the 8 pages.
  void StartReserveOfEight(pagealloc_reserve** reserve,
                           pagealloc_reserve_stats* stats) {
    pagealloc_reserve_options options;
    pagealloc_reserve_options_init(&options, sizeof(options));
    options.initial_batch = 4;
    options.max_pages = 8;
    ASSERT_EQ(pagealloc_reserve_create(client_, &options, reserve, &error_),
              PAGEALLOC_OK)
        << error_.message;
    stats->struct_size = sizeof(*stats);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(20);
    do {
      ASSERT_EQ(pagealloc_reserve_get_stats(*reserve, stats, &error_),
                PAGEALLOC_OK)
          << error_.message;
      if (stats->pages == 8) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } while (std::chrono::steady_clock::now() < deadline);
    ASSERT_EQ(stats->pages, 8);
  }

  // Allocates whole pages for `tokens` and returns the handle.
  pagealloc_allocation* Alloc(std::vector<int64_t> tokens,
                              const pagealloc_call_options* options = nullptr,
                              pagealloc_client* client = nullptr) {
    pagealloc_allocation* allocation = nullptr;
    const int32_t code =
        pagealloc_alloc(client != nullptr ? client : client_, tokens.data(),
                        tokens.size(), options, &allocation, &error_);
    EXPECT_EQ(code, PAGEALLOC_OK) << error_.message;
    return allocation;
  }

  static std::vector<int64_t> Slots(const pagealloc_allocation* allocation) {
    const pagealloc_allocation_view* view =
        pagealloc_allocation_get_view(allocation);
    if (view->num_slots <= 0) return {};
    return std::vector<int64_t>(view->all_slots,
                                view->all_slots + view->num_slots);
  }

  // `allocation`'s slots, copied to the host through the C ABI (they may
  // be device memory).
  std::vector<int64_t> HostSlots(const pagealloc_allocation* allocation) {
    const pagealloc_allocation_view* view =
        pagealloc_allocation_get_view(allocation);
    std::vector<int64_t> slots(view->num_slots);
    EXPECT_EQ(pagealloc_copy_to_host(client_, view->all_slots, view->num_slots,
                                     slots.data(), &error_),
              PAGEALLOC_OK)
        << error_.message;
    return slots;
  }

  pagealloc_stats Stats() {
    pagealloc_stats stats;
    std::memset(&stats, 0, sizeof(stats));
    stats.struct_size = sizeof(stats);
    EXPECT_EQ(pagealloc_get_stats(client_, &stats, &error_), PAGEALLOC_OK)
        << error_.message;
    return stats;
  }

  std::unique_ptr<DaemonProcess> daemon_;
  pagealloc_client* client_ = nullptr;
  pagealloc_error error_;
};

std::vector<int64_t> Range(int64_t begin, int64_t end) {
  std::vector<int64_t> out;
  for (int64_t i = begin; i < end; ++i) out.push_back(i);
  return out;
}

TEST_F(PageallocCApiTest, SessionDescribesItself) {
  EXPECT_NE(pagealloc_session_id(client_), 0u);
  EXPECT_EQ(pagealloc_lease_ms(client_), 10000);
  EXPECT_EQ(pagealloc_session_status(client_, &error_), PAGEALLOC_OK);
  size_t token_length = 0;
  pagealloc_session_token(client_, &token_length);
  EXPECT_GT(token_length, 0u);
  pagealloc_pool_info pool;
  pagealloc_pool(client_, &pool);
  EXPECT_EQ(pool.page_size, 4);
  EXPECT_EQ(pool.num_pages, 16);
  EXPECT_STREQ(pool.free_policy, "lifo");
  int64_t capacity = 0;
  int32_t on_device = -1;
  EXPECT_NE(pagealloc_ring(client_, &capacity, &on_device), nullptr);
  EXPECT_EQ(capacity, 1 << 20);
  EXPECT_EQ(on_device, pool.backend == PAGEALLOC_BACKEND_CUDA ? 1 : 0);
}

TEST_F(PageallocCApiTest, ExtendAndDecodeGiveTheSeedsSlots) {
  pagealloc_allocation* first = Alloc({4});  // page 1
  const bool on_device = pagealloc_allocation_get_view(first)->on_device;
  pagealloc_allocation_destroy(first);
  if (on_device) GTEST_SKIP() << "reads slots on the host: CPU backend only";
  // Page 1 holds the 2-token prefix in slots 4, 5; extend to 11 tokens.
  const int64_t prefix[] = {2}, seq[] = {11}, last[] = {5};
  pagealloc_allocation* extended = nullptr;
  ASSERT_EQ(pagealloc_alloc_extend(client_, prefix, 1, seq, 1, last, 1, nullptr,
                                   &extended, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(Slots(extended), Range(6, 15));
  const pagealloc_allocation_view* view =
      pagealloc_allocation_get_view(extended);
  EXPECT_EQ(view->num_requests, 1);
  EXPECT_EQ(view->codes[0], 0);
  EXPECT_EQ(view->counts[0], 9);
  EXPECT_EQ(view->new_pages[0], 2);
  EXPECT_STREQ(view->messages[0], "");
  EXPECT_EQ(view->slots[0], view->all_slots);
  EXPECT_GT(view->ring_end, 0);

  const int64_t seqs[] = {12, 13}, lasts[] = {14, 15};
  pagealloc_allocation* decoded = nullptr;
  ASSERT_EQ(pagealloc_alloc_decode(client_, seqs, 2, lasts, 2, nullptr,
                                   &decoded, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(Slots(decoded), (std::vector<int64_t>{15, 16}));
  pagealloc_allocation_destroy(extended);
  pagealloc_allocation_destroy(decoded);
}

TEST_F(PageallocCApiTest, ShortageRefusesOneRequest) {
  pagealloc_allocation* allocation = Alloc({32, 64, 8});
  const pagealloc_allocation_view* view =
      pagealloc_allocation_get_view(allocation);
  EXPECT_EQ(view->codes[0], PAGEALLOC_OK);
  EXPECT_EQ(view->codes[1], PAGEALLOC_RESOURCE_EXHAUSTED);
  EXPECT_EQ(view->codes[2], PAGEALLOC_OK);
  EXPECT_EQ(view->num_refused, 1);
  EXPECT_EQ(view->slots[1], nullptr);
  EXPECT_EQ(view->counts[1], 0);
  EXPECT_NE(std::strstr(view->messages[1], "needs 16 pages"), nullptr)
      << view->messages[1];
  // The refused request keeps its 64-slot place in the ring.
  EXPECT_EQ(view->num_slots, -1);
  EXPECT_EQ(view->all_slots, nullptr);
  EXPECT_EQ(view->slots[2], view->slots[0] + 32 + 64);
  EXPECT_EQ(pagealloc_allocation_status(allocation, &error_),
            PAGEALLOC_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::strstr(error_.message, "needs 16 pages"), nullptr);
  EXPECT_EQ(Stats().used_pages, 10);
  pagealloc_allocation_destroy(allocation);
}

TEST_F(PageallocCApiTest, BadArgumentsFailTheCall) {
  pagealloc_allocation* allocation = nullptr;
  const int64_t prefix[] = {4}, seq[] = {1}, last[] = {-1};
  EXPECT_EQ(pagealloc_alloc_extend(client_, prefix, 1, seq, 1, last, 1, nullptr,
                                   &allocation, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(error_.code, PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "seq_lens[0] (1)"), nullptr)
      << error_.message;
  EXPECT_EQ(allocation, nullptr);
  // Lengths that differ are the daemon's to refuse.
  const int64_t two[] = {0, 0};
  EXPECT_EQ(pagealloc_alloc_extend(client_, two, 2, seq, 1, two, 2, nullptr,
                                   &allocation, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(pagealloc_alloc(client_, nullptr, 3, nullptr, &allocation, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "num_tokens is NULL"), nullptr);
  EXPECT_EQ(Stats().used_pages, 0);
}

TEST_F(PageallocCApiTest, OptionStructuresAreVersionedBySize) {
  // A caller built against a later header, with a field this library does
  // not know set: refused, naming it.
  struct Later {
    pagealloc_call_options known;
    int64_t unknown;
  } later;
  std::memset(&later, 0, sizeof(later));
  pagealloc_call_options_init(&later.known, sizeof(later));
  EXPECT_EQ(later.known.struct_size, sizeof(later));
  later.unknown = 1;
  pagealloc_allocation* allocation = nullptr;
  const int64_t tokens[] = {4};
  EXPECT_EQ(
      pagealloc_alloc(client_, tokens, 1, &later.known, &allocation, &error_),
      PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "does not know"), nullptr);
  // Left zero, the unknown field is fine.
  later.unknown = 0;
  EXPECT_EQ(
      pagealloc_alloc(client_, tokens, 1, &later.known, &allocation, &error_),
      PAGEALLOC_OK);
  pagealloc_allocation_destroy(allocation);
  // An older caller's smaller stats structure gets only what it knows.
  unsigned char buffer[sizeof(pagealloc_stats) + 8];
  std::memset(buffer, 0xab, sizeof(buffer));
  pagealloc_stats* old_stats = reinterpret_cast<pagealloc_stats*>(buffer);
  old_stats->struct_size = offsetof(pagealloc_stats, used_pages);
  ASSERT_EQ(pagealloc_get_stats(client_, old_stats, &error_), PAGEALLOC_OK);
  EXPECT_EQ(old_stats->pool.num_pages, 16);
  EXPECT_EQ(buffer[offsetof(pagealloc_stats, used_pages)], 0xab);
}

TEST_F(PageallocCApiTest, FreeCheckpointRollback) {
  pagealloc_allocation* allocation = Alloc({8});  // pages 1, 2
  std::vector<int64_t> slots = HostSlots(allocation);
  EXPECT_EQ(slots, Range(4, 12));
  int64_t freed = -1;
  EXPECT_EQ(pagealloc_free_slots(client_, slots.data(), 5, &freed, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(freed, 2);
  const int64_t page_one[] = {1};
  EXPECT_EQ(pagealloc_free_pages(client_, page_one, 1, &freed, &error_),
            PAGEALLOC_FAILED_PRECONDITION);
  EXPECT_NE(std::strstr(error_.message, "double free"), nullptr);
  int64_t returned = -1;
  EXPECT_EQ(pagealloc_rollback(client_, &returned, &error_),
            PAGEALLOC_FAILED_PRECONDITION);
  ASSERT_EQ(pagealloc_checkpoint(client_, &error_), PAGEALLOC_OK);
  pagealloc_allocation* later = Alloc({12});
  ASSERT_EQ(pagealloc_rollback(client_, &returned, &error_), PAGEALLOC_OK);
  EXPECT_EQ(returned, 3);
  EXPECT_EQ(Stats().used_pages, 0);
  pagealloc_allocation_destroy(allocation);
  pagealloc_allocation_destroy(later);
}

TEST_F(PageallocCApiTest, FreesFencedOnAStreamWaitForTheSessionsReleaseWord) {
  pagealloc_allocation* allocation = Alloc({8});  // pages 1, 2
  const int64_t page_one[] = {1}, page_two[] = {2};
  int64_t freed = -1;
  // Value 5 has not been queued: page 1 stays the session's, pending.
  ASSERT_EQ(
      pagealloc_free_pages_after(client_, page_one, 1, 0, 5, &freed, &error_),
      PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(freed, 1);
  EXPECT_EQ(Stats().used_pages, 2);
  EXPECT_EQ(pagealloc_free_pages(client_, page_one, 1, &freed, &error_),
            PAGEALLOC_FAILED_PRECONDITION);
  EXPECT_NE(std::strstr(error_.message, "double free"), nullptr);
  // On the CPU backend a stream free writes the word (1) at once.
  ASSERT_EQ(pagealloc_free_pages_on_stream(client_, page_two, 1, 0, nullptr,
                                           &freed, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(Stats().used_pages, 1);
  uint64_t value = 0;
  for (uint64_t expected = 2; expected <= 5; ++expected) {
    ASSERT_EQ(pagealloc_queue_release(client_, nullptr, &value, &error_),
              PAGEALLOC_OK);
    EXPECT_EQ(value, expected);
  }
  // The word is at 5: the next launch frees page 1 first and hands it out.
  pagealloc_allocation* again = Alloc({4});
  EXPECT_EQ(HostSlots(again), Range(4, 8));
  EXPECT_EQ(Stats().used_pages, 1);
  EXPECT_EQ(pagealloc_free_pages_on_stream(client_, page_two, 1, 7, nullptr,
                                           &freed, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  pagealloc_allocation_destroy(allocation);
  pagealloc_allocation_destroy(again);
}

TEST_F(PageallocCApiTest, AReserveHandsOutTheSessionsPages) {
  pagealloc_reserve_options options;
  pagealloc_reserve_options_init(&options, sizeof(options));
  EXPECT_EQ(options.initial_batch, 8);
  options.initial_batch = 2;
  options.max_pages = 8;
  options.tick_us = 0;
  pagealloc_reserve* reserve = nullptr;
  ASSERT_EQ(pagealloc_reserve_create(client_, &options, &reserve, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "tick (0) > 0"), nullptr);
  options.tick_us = 1000;
  ASSERT_EQ(pagealloc_reserve_create(client_, &options, &reserve, &error_),
            PAGEALLOC_OK)
      << error_.message;

  int64_t pages[3] = {0, 0, 0};
  ASSERT_EQ(pagealloc_reserve_take(reserve, 3, pages, &error_), PAGEALLOC_OK)
      << error_.message;
  for (const int64_t page : pages) {
    EXPECT_GE(page, 1);
    EXPECT_LE(page, 16);
  }
  // The pages are the session's: its own free of one is accepted by the
  // daemon (the reserve no longer holds it).
  int64_t freed = -1;
  ASSERT_EQ(pagealloc_free_pages(client_, &pages[2], 1, &freed, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(freed, 1);
  ASSERT_EQ(pagealloc_reserve_put(reserve, pages, 2, &error_), PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(pagealloc_reserve_put(reserve, pages, 1, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "not handed out"), nullptr);
  EXPECT_EQ(
      pagealloc_reserve_put_on_stream(reserve, pages, 1, nullptr, &error_),
      PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "not handed out"), nullptr);

  pagealloc_reserve_stats stats;
  stats.struct_size = sizeof(stats);
  ASSERT_EQ(pagealloc_reserve_get_stats(reserve, &stats, &error_),
            PAGEALLOC_OK);
  // The page freed straight to the daemon is still counted as handed out:
  // the reserve only knows what passed through it.
  EXPECT_EQ(stats.handed_out, 1);
  EXPECT_EQ(stats.takes, 1);
  EXPECT_GE(stats.refills, 1);
  // A smaller (older) structure gets the fields that fit.
  pagealloc_reserve_stats small;
  std::memset(&small, 0xff, sizeof(small));
  small.struct_size = offsetof(pagealloc_reserve_stats, batch);
  ASSERT_EQ(pagealloc_reserve_get_stats(reserve, &small, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(small.handed_out, 1);
  EXPECT_EQ(small.batch, -1);  // untouched

  pagealloc_reserve_destroy(reserve);  // its pages go back to the pool
  EXPECT_EQ(Stats().used_pages, 0);
}

// ABI 1.6: a peek names the pages the next take hands out, in its order,
// and takes nothing.
TEST_F(PageallocCApiTest, AReservePeekNamesWhatTheNextTakeHandsOut) {
  pagealloc_reserve* reserve = nullptr;
  pagealloc_reserve_stats stats;
  ASSERT_NO_FATAL_FAILURE(StartReserveOfEight(&reserve, &stats));

  int64_t count = -1;
  std::vector<int64_t> peeked(3, -1);
  ASSERT_EQ(pagealloc_reserve_peek(reserve, peeked.data(), peeked.size(),
                                   &count, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(count, 3);
  // Nothing taken: the same pages again, the counts as they were.
  std::vector<int64_t> again(3, -1);
  ASSERT_EQ(pagealloc_reserve_peek(reserve, again.data(), again.size(), &count,
                                   &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(again, peeked);
  pagealloc_reserve_stats after;
  after.struct_size = sizeof(after);
  ASSERT_EQ(pagealloc_reserve_get_stats(reserve, &after, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(after.pages, 8);
  EXPECT_EQ(after.handed_out, 0);
  EXPECT_EQ(after.takes, stats.takes);
  // No room: nothing written, and `pages` may be NULL.
  ASSERT_EQ(pagealloc_reserve_peek(reserve, nullptr, 0, &count, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(count, 0);

  std::vector<int64_t> taken(3, -1);
  ASSERT_EQ(pagealloc_reserve_take(reserve, 3, taken.data(), &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(taken, peeked);
  // More room than the reserve holds: its 5 pages, the rest untouched.
  std::vector<int64_t> wide(16, -1);
  ASSERT_EQ(pagealloc_reserve_peek(reserve, wide.data(), wide.size(), &count,
                                   &error_),
            PAGEALLOC_OK);
  ASSERT_EQ(count, 5);
  EXPECT_EQ(wide[5], -1);
  std::vector<int64_t> rest(5, -1);
  ASSERT_EQ(pagealloc_reserve_take(reserve, 5, rest.data(), &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(rest, std::vector<int64_t>(wide.begin(), wide.begin() + 5));

  // Argument errors.
  EXPECT_EQ(pagealloc_reserve_peek(nullptr, wide.data(), wide.size(), &count,
                                   &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "reserve is NULL"), nullptr);
  EXPECT_EQ(pagealloc_reserve_peek(reserve, wide.data(), wide.size(), nullptr,
                                   &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "count is NULL"), nullptr);
  count = -1;
  EXPECT_EQ(pagealloc_reserve_peek(reserve, nullptr, 2, &count, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "pages is NULL with 2 entries"),
            nullptr);
  EXPECT_EQ(count, -1);  // untouched

  pagealloc_reserve_destroy(reserve);
}

// ABI 1.10: a take of what the reserve holds, up to the room given, with
// no round trip (tests/page_reserve_test.cc has the empty reserve's).
TEST_F(PageallocCApiTest, AReserveTakeHeldTakesOnlyWhatItHolds) {
  pagealloc_reserve* reserve = nullptr;
  pagealloc_reserve_stats stats;
  ASSERT_NO_FATAL_FAILURE(StartReserveOfEight(&reserve, &stats));

  int64_t count = -1;
  std::vector<int64_t> peeked(8, -1);
  ASSERT_EQ(pagealloc_reserve_peek(reserve, peeked.data(), peeked.size(),
                                   &count, &error_),
            PAGEALLOC_OK);
  ASSERT_EQ(count, 8);
  std::vector<int64_t> first(3, -1);
  ASSERT_EQ(pagealloc_reserve_take_held(reserve, first.data(), first.size(),
                                        &count, &error_),
            PAGEALLOC_OK)
      << error_.message;
  ASSERT_EQ(count, 3);
  EXPECT_EQ(first, std::vector<int64_t>(peeked.begin(), peeked.begin() + 3));
  // More room than the reserve holds: its 5 pages, the room beyond left
  // alone, and no round trip for the rest.
  std::vector<int64_t> rest(16, -1);
  ASSERT_EQ(pagealloc_reserve_take_held(reserve, rest.data(), rest.size(),
                                        &count, &error_),
            PAGEALLOC_OK)
      << error_.message;
  ASSERT_EQ(count, 5);
  EXPECT_EQ(std::vector<int64_t>(rest.begin(), rest.begin() + 5),
            std::vector<int64_t>(peeked.begin() + 3, peeked.end()));
  EXPECT_EQ(rest[5], -1);
  pagealloc_reserve_stats after;
  after.struct_size = sizeof(after);
  ASSERT_EQ(pagealloc_reserve_get_stats(reserve, &after, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(after.handed_out, 8);
  EXPECT_EQ(after.takes, stats.takes + 2);
  EXPECT_EQ(after.sync_refills, 0);
  // No room: none, and `pages` may be NULL.
  ASSERT_EQ(pagealloc_reserve_take_held(reserve, nullptr, 0, &count, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(count, 0);
  // Handed out as a take's pages are: a put takes them back.
  ASSERT_EQ(pagealloc_reserve_put(reserve, first.data(), first.size(), &error_),
            PAGEALLOC_OK)
      << error_.message;
  ASSERT_EQ(pagealloc_reserve_put(reserve, rest.data(), 5, &error_),
            PAGEALLOC_OK)
      << error_.message;

  // Argument errors.
  EXPECT_EQ(pagealloc_reserve_take_held(nullptr, rest.data(), rest.size(),
                                        &count, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "reserve is NULL"), nullptr);
  EXPECT_EQ(pagealloc_reserve_take_held(reserve, rest.data(), rest.size(),
                                        nullptr, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "count is NULL"), nullptr);
  count = -1;
  EXPECT_EQ(pagealloc_reserve_take_held(reserve, nullptr, 2, &count, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "pages is NULL with 2 entries"),
            nullptr);
  EXPECT_EQ(count, -1);  // untouched
  pagealloc_reserve_destroy(reserve);
  EXPECT_EQ(Stats().used_pages, 0);
}

// ABI 1.10: pages put under go behind every page the reserve holds, in
// the order given, with or without a release fence.
TEST_F(PageallocCApiTest, AReservePutUnderQueuesBehindWhatItHolds) {
  pagealloc_reserve* reserve = nullptr;
  pagealloc_reserve_stats stats;
  ASSERT_NO_FATAL_FAILURE(StartReserveOfEight(&reserve, &stats));
  int64_t count = -1;
  std::vector<int64_t> before(8, -1);
  ASSERT_EQ(pagealloc_reserve_peek(reserve, before.data(), before.size(),
                                   &count, &error_),
            PAGEALLOC_OK);
  ASSERT_EQ(count, 8);

  std::vector<int64_t> taken(3, -1);
  ASSERT_EQ(pagealloc_reserve_take(reserve, 3, taken.data(), &error_),
            PAGEALLOC_OK)
      << error_.message;
  ASSERT_EQ(pagealloc_reserve_put_under(reserve, taken.data(), 3, nullptr,
                                        /*fence=*/0, &error_),
            PAGEALLOC_OK)
      << error_.message;
  std::vector<int64_t> after(8, -1);
  ASSERT_EQ(pagealloc_reserve_peek(reserve, after.data(), after.size(), &count,
                                   &error_),
            PAGEALLOC_OK);
  std::vector<int64_t> expected(before.begin() + 3, before.end());
  expected.insert(expected.end(), taken.begin(), taken.end());
  EXPECT_EQ(after, expected);

  // Fenced on a stream (the CPU backend writes the release at once).
  ASSERT_EQ(pagealloc_reserve_take(reserve, 2, taken.data(), &error_),
            PAGEALLOC_OK);
  ASSERT_EQ(pagealloc_reserve_put_under(reserve, taken.data(), 2, nullptr,
                                        /*fence=*/1, &error_),
            PAGEALLOC_OK)
      << error_.message;
  ASSERT_EQ(pagealloc_reserve_peek(reserve, after.data(), after.size(), &count,
                                   &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(std::vector<int64_t>(after.end() - 2, after.end()),
            std::vector<int64_t>(taken.begin(), taken.begin() + 2));

  // A page it did not hand out: refused, nothing put.
  EXPECT_EQ(pagealloc_reserve_put_under(reserve, taken.data(), 1, nullptr,
                                        /*fence=*/0, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "not handed out"), nullptr);
  EXPECT_EQ(pagealloc_reserve_put_under(nullptr, taken.data(), 1, nullptr,
                                        /*fence=*/0, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "reserve is NULL"), nullptr);
  ASSERT_EQ(pagealloc_reserve_get_stats(reserve, &stats, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(stats.pages, 8);
  EXPECT_EQ(stats.handed_out, 0);
  pagealloc_reserve_destroy(reserve);
  EXPECT_EQ(Stats().used_pages, 0);
}

// ABI 1.11: a copy of device slots to the host names both buffers (the
// copy itself runs in tests/gpu/copy_to_host_test.cc).
TEST_F(PageallocCApiTest, ACopyToTheHostRefusesANullBuffer) {
  int64_t slot = 7;
  EXPECT_EQ(pagealloc_copy_to_host_async(&slot, sizeof(slot), nullptr, nullptr,
                                         &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "NULL"), nullptr) << error_.message;
  EXPECT_GE(pagealloc_abi_version() & 0xFFFF, 11u);
}

TEST_F(PageallocCApiTest, AReserveExpandsSlotsInProcess) {
  pagealloc_allocation* probe = Alloc({4});
  const bool on_device = pagealloc_allocation_get_view(probe)->on_device;
  pagealloc_allocation_destroy(probe);
  if (on_device) GTEST_SKIP() << "host last_loc and slots: CPU backend only";
  pagealloc_reserve_options options;
  pagealloc_reserve_options_init(&options, sizeof(options));
  options.initial_batch = 2;
  options.max_pages = 8;
  pagealloc_reserve* reserve = nullptr;
  ASSERT_EQ(pagealloc_reserve_create(client_, &options, &reserve, &error_),
            PAGEALLOC_OK)
      << error_.message;
  int64_t prefix_page = 0;
  ASSERT_EQ(pagealloc_reserve_take(reserve, 1, &prefix_page, &error_),
            PAGEALLOC_OK)
      << error_.message;

  // A 2-token prefix in prefix_page, extended to 11 tokens: 2 slots in the
  // prefix's page, then two new pages of the reserve from their first slot.
  const int64_t prefix[] = {2}, seq[] = {11}, last[] = {prefix_page * 4 + 1};
  std::vector<int64_t> out(10, -7);
  int64_t slots = -1;
  ASSERT_EQ(pagealloc_reserve_alloc_extend(reserve, PAGEALLOC_MEMORY_HOST, 1,
                                           prefix, seq, last, out.data(),
                                           nullptr, &slots, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(slots, 9);
  EXPECT_EQ(out[0], prefix_page * 4 + 2);
  EXPECT_EQ(out[1], prefix_page * 4 + 3);
  const int64_t q = out[2] / 4, r = out[6] / 4;
  EXPECT_NE(q, prefix_page);
  EXPECT_NE(r, q);
  EXPECT_EQ(std::vector<int64_t>(out.begin() + 2, out.begin() + 9),
            (std::vector<int64_t>{q * 4, q * 4 + 1, q * 4 + 2, q * 4 + 3, r * 4,
                                  r * 4 + 1, r * 4 + 2}));
  EXPECT_EQ(out[9], -7);
  // ABI 1.5: the pages the call took, in the order its slots use them; a
  // short buffer gets the first of them and the whole count.
  int64_t taken[4] = {-1, -1, -1, -1};
  int64_t count = -1;
  ASSERT_EQ(pagealloc_reserve_last_expansion_pages(
                reserve, PAGEALLOC_MEMORY_HOST, taken, 4, &count, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(count, 2);
  EXPECT_EQ(std::vector<int64_t>(taken, taken + 3),
            (std::vector<int64_t>{q, r, -1}));
  taken[0] = -1;
  ASSERT_EQ(pagealloc_reserve_last_expansion_pages(
                reserve, PAGEALLOC_MEMORY_HOST, taken, 1, &count, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(count, 2);
  EXPECT_EQ(taken[0], q);
  // No device call yet: none taken there.
  ASSERT_EQ(pagealloc_reserve_last_expansion_pages(
                reserve, PAGEALLOC_MEMORY_DEVICE, nullptr, 0, &count, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(count, 0);
  // A decode continues the last page.
  const int64_t seqs[] = {12}, lasts[] = {r * 4 + 2};
  ASSERT_EQ(pagealloc_reserve_alloc_decode(reserve, PAGEALLOC_MEMORY_HOST, 1,
                                           seqs, lasts, out.data(), nullptr,
                                           &slots, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(slots, 1);
  EXPECT_EQ(out[0], r * 4 + 3);

  // Refusals name the request and change nothing.
  pagealloc_reserve_stats before;
  before.struct_size = sizeof(before);
  ASSERT_EQ(pagealloc_reserve_get_stats(reserve, &before, &error_),
            PAGEALLOC_OK);
  const int64_t bad_prefix[] = {12};
  slots = -1;
  EXPECT_EQ(pagealloc_reserve_alloc_extend(reserve, PAGEALLOC_MEMORY_HOST, 1,
                                           bad_prefix, seq, last, out.data(),
                                           nullptr, &slots, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "seq_lens[0] (11) < prefix_lens[0]"),
            nullptr)
      << error_.message;
  EXPECT_EQ(
      pagealloc_reserve_alloc_decode(reserve, 7, 1, seqs, lasts, out.data(),
                                     nullptr, &slots, &error_),
      PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "memory (7)"), nullptr);
  EXPECT_EQ(pagealloc_reserve_alloc_decode(reserve, PAGEALLOC_MEMORY_HOST, 1,
                                           nullptr, lasts, out.data(), nullptr,
                                           &slots, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(slots, -1);
  // A refused call took nothing.
  ASSERT_EQ(pagealloc_reserve_last_expansion_pages(
                reserve, PAGEALLOC_MEMORY_HOST, taken, 4, &count, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(count, 0);
  EXPECT_EQ(pagealloc_reserve_last_expansion_pages(reserve, 7, taken, 4, &count,
                                                   &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  pagealloc_reserve_stats after;
  after.struct_size = sizeof(after);
  ASSERT_EQ(pagealloc_reserve_get_stats(reserve, &after, &error_),
            PAGEALLOC_OK);
  // (The reserve's own thread may refill meanwhile; what it handed out
  // moves only with the caller's calls.)
  EXPECT_EQ(after.handed_out, before.handed_out);
  EXPECT_EQ(after.takes, before.takes);
  EXPECT_EQ(pagealloc_reserve_take_device_error(reserve, &error_),
            PAGEALLOC_OK);
  pagealloc_reserve_destroy(reserve);
}

TEST_F(PageallocCApiTest, ReleaseLetsTheRingBeReused) {
  pagealloc_client* small = nullptr;
  ASSERT_EQ(Connect(&small, /*ring_slots=*/16), PAGEALLOC_OK);
  pagealloc_allocation* a = Alloc({8}, nullptr, small);
  pagealloc_allocation* b = Alloc({8}, nullptr, small);
  const int64_t* ring = pagealloc_ring(small, nullptr, nullptr);
  EXPECT_EQ(pagealloc_allocation_get_view(a)->all_slots, ring);
  EXPECT_EQ(pagealloc_allocation_get_view(b)->all_slots, ring + 8);
  pagealloc_allocation* full = nullptr;
  const int64_t tokens[] = {4};
  EXPECT_EQ(pagealloc_alloc(small, tokens, 1, nullptr, &full, &error_),
            PAGEALLOC_RESOURCE_EXHAUSTED);
  pagealloc_release(small, b);  // and a before it
  ASSERT_EQ(pagealloc_flush_release(small, &error_), PAGEALLOC_OK);
  pagealloc_allocation* c = Alloc({8}, nullptr, small);
  EXPECT_EQ(pagealloc_allocation_get_view(c)->all_slots, ring);
  // Inline results live in their handle.
  pagealloc_call_options inline_options;
  pagealloc_call_options_init(&inline_options, sizeof(inline_options));
  inline_options.return_inline = 1;
  pagealloc_allocation* d = Alloc({4}, &inline_options, small);
  const pagealloc_allocation_view* view = pagealloc_allocation_get_view(d);
  EXPECT_EQ(view->on_device, 0);
  EXPECT_EQ(view->ring_end, 0);
  EXPECT_EQ(view->num_slots, 4);
  EXPECT_TRUE(view->all_slots < ring || view->all_slots >= ring + 16);
  for (pagealloc_allocation* x : {a, b, c, d}) pagealloc_allocation_destroy(x);
  pagealloc_client_destroy(small);
}

TEST_F(PageallocCApiTest, CloseEndsTheSession) {
  pagealloc_client* other = nullptr;
  ASSERT_EQ(Connect(&other), PAGEALLOC_OK);
  pagealloc_allocation_destroy(Alloc({8}, nullptr, other));
  EXPECT_EQ(Stats().used_pages, 2);
  EXPECT_EQ(pagealloc_order_after_completion(other, nullptr, &error_),
            PAGEALLOC_OK);
  ASSERT_EQ(pagealloc_close(other, &error_), PAGEALLOC_OK);
  EXPECT_EQ(pagealloc_close(other, &error_), PAGEALLOC_OK);
  EXPECT_EQ(pagealloc_session_status(other, &error_),
            PAGEALLOC_FAILED_PRECONDITION);
  EXPECT_NE(std::strstr(error_.message, "closed"), nullptr);
  pagealloc_allocation* allocation = nullptr;
  const int64_t tokens[] = {4};
  EXPECT_EQ(pagealloc_alloc(other, tokens, 1, nullptr, &allocation, &error_),
            PAGEALLOC_FAILED_PRECONDITION);
  EXPECT_EQ(pagealloc_checkpoint(other, &error_),
            PAGEALLOC_FAILED_PRECONDITION);
  const pagealloc_stats stats = Stats();
  EXPECT_EQ(stats.used_pages, 0);
  EXPECT_EQ(stats.sessions_active, 1);
  pagealloc_client_destroy(other);
}

// ABI 1.7 -------------------------------------------------------------

// A resumable session detached by one handle is taken back by another with
// its id and token, pages and all; a wrong token and bad reconnect options
// are refused. A program built against ABI 1.6 (the options without the
// 1.7 fields) connects as before.
TEST_F(PageallocCApiTest, AResumableSessionIsDetachedAndResumed) {
  pagealloc_client_options options;
  pagealloc_client_options_init(&options, sizeof(options));
  EXPECT_EQ(options.resumable, 0);
  EXPECT_EQ(options.reconnect_timeout_ms, -1);
  EXPECT_EQ(options.reconnect_initial_backoff_ms, 50);
  EXPECT_EQ(options.reconnect_max_backoff_ms, 1000);
  options.target = daemon_->target();
  options.client_name = "resumable";
  options.resumable = 1;
  pagealloc_client* first = nullptr;
  ASSERT_EQ(pagealloc_connect(&options, &first, &error_), PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(pagealloc_session_resumable(first), 1);
  EXPECT_EQ(pagealloc_session_resumable(client_), 0);
  EXPECT_EQ(pagealloc_link_epoch(first), 0u);
  EXPECT_EQ(pagealloc_reconnecting(first), 0);
  pagealloc_allocation* allocation = Alloc({8}, nullptr, first);
  ASSERT_NE(allocation, nullptr);
  EXPECT_EQ(pagealloc_allocation_get_view(allocation)->link_epoch, 0u);
  pagealloc_allocation_destroy(allocation);
  const uint64_t id = pagealloc_session_id(first);
  size_t length = 0;
  const char* token = pagealloc_session_token(first, &length);
  const std::string kept(token, length);
  EXPECT_EQ(pagealloc_detach(client_, &error_), PAGEALLOC_FAILED_PRECONDITION);
  EXPECT_NE(std::strstr(error_.message, "not resumable"), nullptr);
  ASSERT_EQ(pagealloc_detach(first, &error_), PAGEALLOC_OK) << error_.message;
  EXPECT_EQ(pagealloc_session_status(first, &error_),
            PAGEALLOC_FAILED_PRECONDITION);
  EXPECT_NE(std::strstr(error_.message, "detached"), nullptr);
  pagealloc_client_destroy(first);  // leaves the session
  EXPECT_EQ(Stats().used_pages, 2);
  EXPECT_EQ(Stats().sessions_active, 2);

  pagealloc_client* resumed = nullptr;
  std::string wrong = kept;
  wrong[0] ^= 1;
  EXPECT_EQ(pagealloc_resume(&options, id, wrong.data(), wrong.size(), 0,
                             &resumed, &error_),
            PAGEALLOC_UNAUTHENTICATED);
  EXPECT_EQ(resumed, nullptr);
  EXPECT_EQ(pagealloc_resume(&options, id, nullptr, 3, 0, &resumed, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  pagealloc_client_options bad = options;
  bad.reconnect_timeout_ms = -2;
  EXPECT_EQ(pagealloc_resume(&bad, id, kept.data(), kept.size(), 0, &resumed,
                             &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "reconnect_timeout_ms (-2)"), nullptr);
  ASSERT_EQ(pagealloc_resume(&options, id, kept.data(), kept.size(), 0,
                             &resumed, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(pagealloc_session_id(resumed), id);
  EXPECT_EQ(pagealloc_session_resumable(resumed), 1);
  const std::vector<int64_t> pages = {1, 2};
  int64_t freed = 0;
  ASSERT_EQ(pagealloc_free_pages(resumed, pages.data(), pages.size(), &freed,
                                 &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(freed, 2);
  EXPECT_EQ(Stats().used_pages, 0);
  ASSERT_EQ(pagealloc_close(resumed, &error_), PAGEALLOC_OK);
  pagealloc_client_destroy(resumed);
  EXPECT_EQ(Stats().sessions_active, 1);

  // ABI 1.6's options: the fields up to map_kv_slab's pair.
  pagealloc_client_options older;
  std::memset(&older, 0, sizeof(older));
  pagealloc_client_options_init(&older,
                                offsetof(pagealloc_client_options, resumable));
  older.target = daemon_->target();
  pagealloc_client* old_program = nullptr;
  ASSERT_EQ(pagealloc_connect(&older, &old_program, &error_), PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(pagealloc_session_resumable(old_program), 0);
  pagealloc_client_destroy(old_program);
}

// ABI 1.1 -------------------------------------------------------------

// The free list's front (up to `n` entries) and the parked pages.
struct FreeLists {
  std::vector<int64_t> free, parked;
  int64_t free_count = -1, parked_count = -1;
};

FreeLists ReadFreeLists(pagealloc_client* client, int64_t n) {
  FreeLists out;
  out.free.resize(n);
  out.parked.resize(n);
  pagealloc_free_lists lists;
  pagealloc_free_lists_init(&lists, sizeof(lists));
  lists.free_pages = out.free.data();
  lists.free_capacity = n;
  lists.parked_pages = out.parked.data();
  lists.parked_capacity = n;
  pagealloc_error error;
  EXPECT_EQ(pagealloc_get_free_lists(client, &lists, &error), PAGEALLOC_OK)
      << error.message;
  out.free.resize(lists.num_free);
  out.parked.resize(lists.num_parked);
  out.free_count = lists.free_count;
  out.parked_count = lists.parked_count;
  return out;
}

TEST_F(PageallocCApiTest, AllOrNothingRefusesEveryRequestAndChangesNothing) {
  pagealloc_call_options options;
  pagealloc_call_options_init(&options, sizeof(options));
  EXPECT_EQ(options.all_or_nothing, 0);
  options.all_or_nothing = 1;
  // 8 pages fit, 16 more do not: neither request is served.
  pagealloc_allocation* refused = Alloc({32, 64}, &options);
  const pagealloc_allocation_view* view =
      pagealloc_allocation_get_view(refused);
  EXPECT_EQ(view->codes[0], PAGEALLOC_RESOURCE_EXHAUSTED);
  EXPECT_EQ(view->codes[1], PAGEALLOC_RESOURCE_EXHAUSTED);
  EXPECT_EQ(view->num_refused, 2);
  EXPECT_EQ(view->counts[0], 0);
  EXPECT_EQ(Stats().used_pages, 0);
  EXPECT_EQ(ReadFreeLists(client_, 16).free, Range(1, 17));
  // Without the option the first request is served.
  pagealloc_allocation* partial = Alloc({32, 64});
  EXPECT_EQ(pagealloc_allocation_get_view(partial)->num_refused, 1);
  EXPECT_EQ(Stats().used_pages, 8);
  // A batch that fits is served whole with the option.
  pagealloc_allocation* fits = Alloc({16, 16}, &options);
  EXPECT_EQ(pagealloc_allocation_get_view(fits)->num_refused, 0);
  EXPECT_EQ(Stats().used_pages, 16);
  for (pagealloc_allocation* x : {refused, partial, fits}) {
    pagealloc_allocation_destroy(x);
  }
}

TEST_F(PageallocCApiTest, FreeOrderShowsInTheFreeLists) {
  pagealloc_allocation* allocation = Alloc({4, 4, 4});  // pages 1, 2, 3
  pagealloc_allocation_destroy(allocation);
  const FreeLists fresh = ReadFreeLists(client_, 4);
  EXPECT_EQ(fresh.free, Range(4, 8));
  EXPECT_EQ(fresh.free_count, 13);
  EXPECT_EQ(fresh.parked_count, 0);
  // Slots of page 3, then of page 1, put back ascending.
  const int64_t slots[] = {12, 13, 4, 5};
  int64_t freed = -1;
  ASSERT_EQ(
      pagealloc_free_slots_in_order(
          client_, slots, 4, PAGEALLOC_FREE_ORDER_ASCENDING, &freed, &error_),
      PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(freed, 2);
  EXPECT_EQ(ReadFreeLists(client_, 3).free, (std::vector<int64_t>{1, 3, 4}));
  // Taken again (pages 1, 3), then freed by page id in first appearance.
  pagealloc_allocation_destroy(Alloc({8}));
  const int64_t pages[] = {3, 1};
  ASSERT_EQ(pagealloc_free_pages_in_order(client_, pages, 2,
                                          PAGEALLOC_FREE_ORDER_FIRST_APPEARANCE,
                                          &freed, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(ReadFreeLists(client_, 3).free, (std::vector<int64_t>{3, 1, 4}));
  // The pool's default under --semantics=pagealloc: first appearance.
  pagealloc_allocation_destroy(Alloc({8}));
  const int64_t again[] = {4, 12};
  ASSERT_EQ(
      pagealloc_free_slots_in_order(
          client_, again, 2, PAGEALLOC_FREE_ORDER_DEFAULT, &freed, &error_),
      PAGEALLOC_OK);
  EXPECT_EQ(ReadFreeLists(client_, 2).free, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(
      pagealloc_free_pages_in_order(client_, pages, 2, 7, &freed, &error_),
      PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(error_.message, "order (7)"), nullptr)
      << error_.message;
  // A structure too small for the answers is refused.
  pagealloc_free_lists lists;
  pagealloc_free_lists_init(&lists, sizeof(lists));
  lists.struct_size = offsetof(pagealloc_free_lists, num_free);
  EXPECT_EQ(pagealloc_get_free_lists(client_, &lists, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
}

TEST_F(PageallocCApiTest, CheckpointIdsRollBackAndEnd) {
  uint64_t outer = 0, inner = 0;
  ASSERT_EQ(pagealloc_checkpoint_id(client_, &outer, &error_), PAGEALLOC_OK)
      << error_.message;
  pagealloc_allocation_destroy(Alloc({4}));
  ASSERT_EQ(pagealloc_checkpoint_id(client_, &inner, &error_), PAGEALLOC_OK);
  EXPECT_NE(outer, 0u);
  EXPECT_NE(inner, outer);
  pagealloc_allocation_destroy(Alloc({8}));
  int64_t returned = -1;
  ASSERT_EQ(pagealloc_rollback_to(client_, outer, &returned, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(returned, 3);
  EXPECT_EQ(ReadFreeLists(client_, 16).free, Range(1, 17));
  // The inner checkpoint ended with the rollback to the outer one.
  EXPECT_EQ(pagealloc_rollback_to(client_, inner, &returned, &error_),
            PAGEALLOC_FAILED_PRECONDITION);
  EXPECT_EQ(error_.code, PAGEALLOC_FAILED_PRECONDITION);
  // The outer one stays: roll back to it again.
  pagealloc_allocation_destroy(Alloc({4}));
  ASSERT_EQ(pagealloc_rollback_to(client_, outer, &returned, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(returned, 1);
  // 0 is the latest checkpoint, as pagealloc_rollback.
  ASSERT_EQ(pagealloc_rollback_to(client_, 0, &returned, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(returned, 0);
  EXPECT_EQ(pagealloc_rollback(client_, &returned, &error_),
            PAGEALLOC_FAILED_PRECONDITION);
}

TEST_F(PageallocCApiTest, ListPagesGivesTheSessionsPages) {
  size_t count = 7;
  EXPECT_EQ(pagealloc_list_pages(client_, nullptr, 0, &count, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(count, 0u);
  pagealloc_allocation_destroy(Alloc({8}));
  // Too little room: the count says how much is needed, nothing written.
  int64_t pages[4] = {-1, -1, -1, -1};
  EXPECT_EQ(pagealloc_list_pages(client_, pages, 1, &count, &error_),
            PAGEALLOC_OUT_OF_RANGE);
  EXPECT_EQ(count, 2u);
  EXPECT_EQ(pages[0], -1);
  ASSERT_EQ(pagealloc_list_pages(client_, pages, 4, &count, &error_),
            PAGEALLOC_OK)
      << error_.message;
  ASSERT_EQ(count, 2u);
  EXPECT_LT(pages[0], pages[1]);
  EXPECT_EQ(pagealloc_list_pages(client_, nullptr, 4, &count, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_EQ(pagealloc_list_pages(client_, pages, 4, nullptr, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  // Nothing was sent again: the daemon never restarted.
  EXPECT_EQ(pagealloc_calls_sent_again(client_), 0u);
  EXPECT_EQ(pagealloc_calls_sent_again(nullptr), 0u);
}

TEST_F(PageallocCApiTest, ClearSessionAndClearPool) {
  pagealloc_client* other = nullptr;
  ASSERT_EQ(Connect(&other), PAGEALLOC_OK);
  pagealloc_allocation_destroy(Alloc({8}));
  pagealloc_allocation_destroy(Alloc({4}, nullptr, other));
  pagealloc_admin_options admin;
  pagealloc_admin_options_init(&admin, sizeof(admin));
  EXPECT_EQ(admin.timeout_ms, 5000);
  admin.target = daemon_->target();
  int64_t freed = -1;
  EXPECT_EQ(pagealloc_admin_clear_pool(&admin, 0, &freed, &error_),
            PAGEALLOC_FAILED_PRECONDITION);
  EXPECT_EQ(freed, -1);
  // Forcing needs the daemon's --allow_forced_clear.
  EXPECT_EQ(pagealloc_admin_clear_pool(&admin, 1, &freed, &error_),
            PAGEALLOC_PERMISSION_DENIED);
  uint64_t checkpoint = 0;
  ASSERT_EQ(pagealloc_checkpoint_id(client_, &checkpoint, &error_),
            PAGEALLOC_OK);
  ASSERT_EQ(pagealloc_clear_session(client_, &freed, &error_), PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(freed, 2);
  EXPECT_EQ(Stats().used_pages, 1);
  // The clear ended the session's checkpoints.
  EXPECT_EQ(pagealloc_rollback_to(client_, checkpoint, nullptr, &error_),
            PAGEALLOC_FAILED_PRECONDITION);
  ASSERT_EQ(pagealloc_clear_session(other, &freed, &error_), PAGEALLOC_OK);
  EXPECT_EQ(freed, 1);
  // Nobody owns a page: the session's clear reset the list.
  EXPECT_EQ(ReadFreeLists(client_, 16).free, Range(1, 17));
  ASSERT_EQ(pagealloc_admin_clear_pool(&admin, 0, &freed, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(freed, 0);
  // The admin read needs no session.
  std::vector<int64_t> front(2);
  pagealloc_free_lists lists;
  pagealloc_free_lists_init(&lists, sizeof(lists));
  lists.free_pages = front.data();
  lists.free_capacity = 2;
  ASSERT_EQ(pagealloc_admin_get_free_lists(&admin, &lists, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(lists.num_free, 2);
  EXPECT_EQ(lists.num_parked, 0);
  EXPECT_EQ(lists.free_count, 16);
  EXPECT_EQ(front, (std::vector<int64_t>{1, 2}));
  admin.target = "unix:///nonexistent/pagealloc-c-api-test.sock";
  EXPECT_EQ(pagealloc_admin_clear_pool(&admin, 0, &freed, &error_),
            PAGEALLOC_UNAVAILABLE);
  pagealloc_client_destroy(other);
}

// ABI 1.4: a session publishes its pages under 32-byte keys, another
// matches and adopts them, frees them to the cache, and an operator's
// reset evicts them; a key of another length cannot be passed (the count
// is of keys), a repeated key is refused naming its index.
TEST_F(PageallocCApiTest, PublishMatchAdoptAndResetSharedPages) {
  pagealloc_client* other = nullptr;
  ASSERT_EQ(Connect(&other), PAGEALLOC_OK);
  pagealloc_allocation* allocation = Alloc({8});
  const std::vector<int64_t> slots = HostSlots(allocation);
  pagealloc_allocation_destroy(allocation);
  const std::vector<int64_t> pages = {slots[0] / 4, slots[4] / 4};
  std::vector<uint8_t> keys(2 * PAGEALLOC_PREFIX_KEY_BYTES, 0);
  keys[0] = 1;
  keys[PAGEALLOC_PREFIX_KEY_BYTES] = 2;
  std::vector<int64_t> published(2, -1);
  std::vector<uint8_t> existing(2, 9);
  int64_t newly = -1;
  ASSERT_EQ(
      pagealloc_publish(client_, pages.data(), keys.data(), 2, nullptr, 0,
                        published.data(), existing.data(), &newly, &error_),
      PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(published, pages);
  EXPECT_EQ(existing, (std::vector<uint8_t>{0, 0}));
  EXPECT_EQ(newly, 2);
  std::vector<int64_t> found(2, -1);
  int64_t matched = -1;
  ASSERT_EQ(pagealloc_match_prefix(other, keys.data(), 2, /*adopt=*/1,
                                   found.data(), &matched, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(matched, 2);
  EXPECT_EQ(found, pages);
  int64_t freed = 0;
  ASSERT_EQ(pagealloc_free_pages(other, found.data(), 2, &freed, &error_),
            PAGEALLOC_OK);
  ASSERT_EQ(pagealloc_free_pages(client_, pages.data(), 2, &freed, &error_),
            PAGEALLOC_OK);
  // ABI 1.5: the stats count the two pages cached and the match's hits.
  pagealloc_stats stats;
  stats.struct_size = sizeof(stats);
  ASSERT_EQ(pagealloc_get_stats(other, &stats, &error_), PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(stats.prefix_published_pages, 0);
  EXPECT_EQ(stats.prefix_cached_pages, 2);
  EXPECT_EQ(stats.prefix_evictable_pages, 2);
  EXPECT_EQ(stats.prefix_pinned_pages, 0);
  EXPECT_EQ(stats.prefix_lookup_pages_total, 2);
  EXPECT_EQ(stats.prefix_hit_pages_total, 2);
  // keys[0] twice.
  std::vector<uint8_t> repeated(2 * PAGEALLOC_PREFIX_KEY_BYTES, 0);
  repeated[0] = repeated[PAGEALLOC_PREFIX_KEY_BYTES] = 1;
  EXPECT_EQ(pagealloc_match_prefix(other, repeated.data(), 2, 0, found.data(),
                                   &matched, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  EXPECT_NE(std::string(error_.message).find("keys[1] repeats keys[0]"),
            std::string::npos)
      << error_.message;
  pagealloc_admin_options admin;
  pagealloc_admin_options_init(&admin, sizeof(admin));
  admin.target = daemon_->target();
  int64_t evicted = -1;
  ASSERT_EQ(pagealloc_admin_reset_prefix_cache(&admin, &evicted, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(evicted, 2);
  ASSERT_EQ(pagealloc_match_prefix(other, keys.data(), 2, 0, found.data(),
                                   &matched, &error_),
            PAGEALLOC_OK);
  EXPECT_EQ(matched, 0);
  pagealloc_client_destroy(other);
}

TEST_F(PageallocCApiTest, CompletionValuesGrowAndOrderAfterAcceptsThem) {
  pagealloc_allocation* first = Alloc({4});
  pagealloc_allocation* second = Alloc({4});
  const uint64_t a = pagealloc_allocation_get_view(first)->completion_value;
  const uint64_t b = pagealloc_allocation_get_view(second)->completion_value;
  EXPECT_GT(a, 0u);
  EXPECT_GT(b, a);
  EXPECT_EQ(pagealloc_order_after(client_, second, nullptr, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(pagealloc_order_after(client_, nullptr, nullptr, &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  pagealloc_allocation_destroy(first);
  pagealloc_allocation_destroy(second);
}

TEST_F(PageallocCApiTest, AbiOneZeroCallersKeepWorking) {
  // A program built against ABI 1.0 passes the structures as they were.
  pagealloc_client_options options;
  pagealloc_client_options_init(
      &options, offsetof(pagealloc_client_options, register_secret));
  EXPECT_EQ(options.struct_size,
            offsetof(pagealloc_client_options, register_secret));
  options.target = daemon_->target();
  pagealloc_client* old = nullptr;
  ASSERT_EQ(pagealloc_connect(&options, &old, &error_), PAGEALLOC_OK)
      << error_.message;
  pagealloc_call_options call;
  pagealloc_call_options_init(&call,
                              offsetof(pagealloc_call_options, all_or_nothing));
  call.return_inline = 1;
  pagealloc_allocation* allocation = Alloc({4}, &call, old);
  EXPECT_EQ(pagealloc_allocation_get_view(allocation)->num_slots, 4);
  pagealloc_allocation_destroy(allocation);
  pagealloc_stats stats;
  std::memset(&stats, 0xab, sizeof(stats));
  stats.struct_size = offsetof(pagealloc_stats, semantics);
  ASSERT_EQ(pagealloc_get_stats(old, &stats, &error_), PAGEALLOC_OK);
  EXPECT_EQ(stats.used_pages, 1);
  EXPECT_EQ(static_cast<unsigned char>(stats.semantics[0]), 0xab);
  pagealloc_client_destroy(old);
}

class PageallocCApiSglangTest : public PageallocCApiTest {
  std::vector<std::string> ExtraFlags() const override {
    return {"--semantics=sglang"};
  }
};

TEST_F(PageallocCApiSglangTest, PoolNamesItsSemanticsAndFreesAscending) {
  EXPECT_STREQ(pagealloc_pool_semantics(client_), "sglang");
  EXPECT_STREQ(Stats().semantics, "sglang");
  pagealloc_allocation_destroy(Alloc({4, 4, 4}));  // pages 1, 2, 3
  // SGLang's free: the distinct pages ascending, whatever the slots' order.
  const int64_t slots[] = {12, 13, 4, 5};
  int64_t freed = -1;
  ASSERT_EQ(pagealloc_free_slots(client_, slots, 4, &freed, &error_),
            PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(ReadFreeLists(client_, 3).free, (std::vector<int64_t>{1, 3, 4}));
}

TEST_F(PageallocCApiTest, DefaultPoolSemantics) {
  EXPECT_STREQ(pagealloc_pool_semantics(client_), "pagealloc");
  EXPECT_STREQ(Stats().semantics, "pagealloc");
  EXPECT_STREQ(pagealloc_pool_semantics(nullptr), "");
}

class PageallocCApiKvTest : public PageallocCApiTest {
  std::vector<std::string> ExtraFlags() const override {
    return {"--kv_layout=custom:layers=2,k=bf16:2x4,v=fp32:3"};
  }
};

pagealloc_kv_buffer GetBuffer(pagealloc_client* client, int64_t index) {
  pagealloc_kv_buffer buffer;
  std::memset(&buffer, 0, sizeof(buffer));
  buffer.struct_size = sizeof(buffer);
  pagealloc_error error;
  EXPECT_EQ(pagealloc_kv_buffer_get(client, index, &buffer, &error),
            PAGEALLOC_OK)
      << error.message;
  return buffer;
}

TEST_F(PageallocCApiKvTest, BuffersDescribeTheLayout) {
  ASSERT_EQ(pagealloc_kv_buffer_count(client_), 4);
  int64_t slab_bytes = 0;
  int32_t slab_on_device = -1;
  char* slab = static_cast<char*>(
      pagealloc_kv_slab(client_, &slab_bytes, &slab_on_device));
  ASSERT_NE(slab, nullptr);
  const char* names[] = {"k.0", "v.0", "k.1", "v.1"};
  for (int64_t i = 0; i < 4; ++i) {
    const pagealloc_kv_buffer b = GetBuffer(client_, i);
    const bool is_k = i % 2 == 0;
    EXPECT_STREQ(b.name, names[i]);
    EXPECT_STREQ(b.dtype, is_k ? "bf16" : "fp32");
    EXPECT_EQ(b.dtype_bytes, is_k ? 2 : 4);
    EXPECT_EQ(b.num_slots, (16 + 1) * 4);
    EXPECT_EQ(b.stride_bytes, is_k ? 2 * 4 * 2 : 3 * 4);
    ASSERT_EQ(b.rank, is_k ? 2 : 1);
    EXPECT_EQ(b.element_shape[0], is_k ? 2 : 3);
    if (is_k) {
      EXPECT_EQ(b.element_shape[1], 4);
    }
    EXPECT_EQ(b.on_device, slab_on_device);
    EXPECT_GE(static_cast<char*>(b.data), slab);
    EXPECT_LE(static_cast<char*>(b.data) + b.num_slots * b.stride_bytes,
              slab + slab_bytes);
    EXPECT_EQ(pagealloc_kv_buffer_find(client_, names[i]), i);
  }
  EXPECT_EQ(pagealloc_kv_buffer_find(client_, "k.2"), -1);
  EXPECT_EQ(pagealloc_kv_buffer_find(client_, nullptr), -1);
  pagealloc_kv_buffer buffer;
  buffer.struct_size = sizeof(buffer);
  EXPECT_EQ(pagealloc_kv_buffer_get(client_, 4, &buffer, &error_),
            PAGEALLOC_OUT_OF_RANGE);
  EXPECT_EQ(pagealloc_kv_buffer_get(client_, -1, &buffer, &error_),
            PAGEALLOC_OUT_OF_RANGE);
}

TEST_F(PageallocCApiKvTest, SessionsShareTheSlab) {
  pagealloc_client* reader = nullptr;
  ASSERT_EQ(Connect(&reader), PAGEALLOC_OK);
  pagealloc_allocation* allocation = Alloc({4});  // page 1: slots 4..7
  const std::vector<int64_t> slots = HostSlots(allocation);
  ASSERT_EQ(slots.size(), 4u);
  const pagealloc_kv_buffer mine = GetBuffer(client_, 3);  // v.1
  const pagealloc_kv_buffer theirs = GetBuffer(reader, 3);
  const float written[3] = {1.5f, -2.0f, 3.25f};
  char* at = static_cast<char*>(mine.data) + slots[2] * mine.stride_bytes;
  ASSERT_EQ(
      pagealloc_kv_copy_to_slab(client_, at, written, sizeof(written), &error_),
      PAGEALLOC_OK)
      << error_.message;
  float read[3] = {0, 0, 0};
  const char* from =
      static_cast<const char*>(theirs.data) + slots[2] * theirs.stride_bytes;
  ASSERT_EQ(
      pagealloc_kv_copy_from_slab(reader, read, from, sizeof(read), &error_),
      PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(std::memcmp(read, written, sizeof(read)), 0);
  // Past the slab's end.
  int64_t slab_bytes = 0;
  char* slab =
      static_cast<char*>(pagealloc_kv_slab(reader, &slab_bytes, nullptr));
  EXPECT_EQ(pagealloc_kv_copy_from_slab(reader, read, slab + slab_bytes - 4,
                                        sizeof(read), &error_),
            PAGEALLOC_INVALID_ARGUMENT);
  pagealloc_allocation_destroy(allocation);
  pagealloc_client_destroy(reader);
}

TEST_F(PageallocCApiKvTest, ASessionMayGoWithoutTheSlab) {
  pagealloc_client_options options;
  pagealloc_client_options_init(&options, sizeof(options));
  EXPECT_EQ(options.map_kv_slab, 1);
  options.target = daemon_->target();
  options.map_kv_slab = 0;
  pagealloc_client* bare = nullptr;
  ASSERT_EQ(pagealloc_connect(&options, &bare, &error_), PAGEALLOC_OK)
      << error_.message;
  EXPECT_EQ(pagealloc_kv_buffer_count(bare), 0);
  EXPECT_EQ(pagealloc_kv_slab(bare, nullptr, nullptr), nullptr);
  char byte = 0;
  EXPECT_EQ(pagealloc_kv_copy_to_slab(bare, &byte, &byte, 1, &error_),
            PAGEALLOC_FAILED_PRECONDITION);
  // An ABI 1.0 caller's options map the slab (the default).
  pagealloc_client_options old;
  pagealloc_client_options_init(
      &old, offsetof(pagealloc_client_options, register_secret));
  old.target = daemon_->target();
  pagealloc_client* mapped = nullptr;
  ASSERT_EQ(pagealloc_connect(&old, &mapped, &error_), PAGEALLOC_OK);
  EXPECT_EQ(pagealloc_kv_buffer_count(mapped), 4);
  pagealloc_client_destroy(bare);
  pagealloc_client_destroy(mapped);
}

}  // namespace
