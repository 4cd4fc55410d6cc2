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
#include <string>
#include <thread>
#include <vector>

#include "client/pagealloc.h"
#include "gtest/gtest.h"

extern char** environ;

namespace {

// A pagealloc-server process on a private socket: 16 pages of 4 tokens.
class DaemonProcess {
 public:
  DaemonProcess() {
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
    ASSERT_TRUE(daemon_.started());
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

  int32_t Connect(pagealloc_client** client, int64_t ring_slots = 0) {
    pagealloc_client_options options;
    pagealloc_client_options_init(&options, sizeof(options));
    options.target = daemon_.target();
    options.client_name = "c-api-test";
    options.ring_capacity_slots = ring_slots;
    return pagealloc_connect(&options, client, &error_);
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

  pagealloc_stats Stats() {
    pagealloc_stats stats;
    std::memset(&stats, 0, sizeof(stats));
    stats.struct_size = sizeof(stats);
    EXPECT_EQ(pagealloc_get_stats(client_, &stats, &error_), PAGEALLOC_OK)
        << error_.message;
    return stats;
  }

  DaemonProcess daemon_;
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
  const pagealloc_allocation_view* view =
      pagealloc_allocation_get_view(allocation);
  std::vector<int64_t> slots(view->num_slots);
  ASSERT_EQ(pagealloc_copy_to_host(client_, view->all_slots, view->num_slots,
                                   slots.data(), &error_),
            PAGEALLOC_OK);
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

}  // namespace
