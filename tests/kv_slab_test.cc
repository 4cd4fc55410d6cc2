// The daemon owning the KV memory: one slab per pool, handed to every
// session as a file descriptor over the memory socket (docs/design.md,
// section 11). In-process: Register describes the layout, two sessions see
// the same memory, the Register secret, sizing refusals, stats and
// metrics, --kv_scrub. Across processes: two writers fill their pages in
// every buffer, this test (a third process) checks every slot of the slab,
// then kills one writer and checks that the other's KV is intact and the
// killed one's pages came back; a third writer takes them and, scrubbed,
// finds them zero before it writes (unscrubbed, finds the killed one's
// bytes). On a GPU daemon (PAGEALLOC_TEST_BACKEND=cuda) the writers write
// with a kernel on their own streams, ordered only by the completion
// counter (tests/kv_writer.cc).

#include <signal.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/daemon_process.h"
#include "tests/daemon_stats.h"
#include "tests/in_process_server.h"
#include "tests/kv_pattern.h"
#include "tests/status_matchers.h"
#include "tests/subprocess.h"
#include "tests/wait_for.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::Daemon;
using ::pagealloc::testing::DaemonStats;
using ::pagealloc::testing::InProcessServer;
using ::pagealloc::testing::KvPattern;
using ::pagealloc::testing::ReadLog;
using ::pagealloc::testing::RunfilePath;
using ::pagealloc::testing::StartDaemon;
using ::pagealloc::testing::StatusIs;
using ::pagealloc::testing::Subprocess;
using ::pagealloc::testing::WaitFor;
using ::pagealloc::testing::WaitForStats;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kLayout[] = "mha:layers=2,kv_heads=2,head_dim=8,dtype=bf16";

ServerOptions KvOptions(int64_t num_pages = 32, bool scrub = false) {
  ServerOptions options;
  options.backend = "cpu";
  options.pool = {num_pages, 4, FreePolicy::kLifo};
  options.sessions.default_ring_capacity_slots = 1024;
  options.debug_checks = true;
  options.kv.layout = *ParseKvLayout(kLayout);
  options.kv.scrub = scrub;
  return options;
}

// Every byte of `bytes` at `at` in the slab, copied out.
std::vector<uint8_t> Read(const KvSlabView& slab, const void* at,
                          int64_t bytes) {
  std::vector<uint8_t> out(bytes);
  EXPECT_OK(slab.CopyFromSlab(out.data(), at, bytes));
  return out;
}

// Whether `page` holds zeros in every slot of every buffer.
bool PageIsZero(const KvSlabView& slab, int64_t page) {
  const int64_t page_size = slab.geometry().page_size;
  for (const KvBuffer& buffer : slab.buffers()) {
    const std::vector<uint8_t> bytes = Read(slab, buffer.slot(page * page_size),
                                            page_size * buffer.stride_bytes);
    for (uint8_t byte : bytes) {
      if (byte != 0) return false;
    }
  }
  return true;
}

TEST(KvSlabTest, RegisterReturnsTheLayoutAndEverySessionMapsOneSlab) {
  ASSERT_OK_AND_ASSIGN(auto server, InProcessServer::Start(KvOptions()));
  ASSERT_OK_AND_ASSIGN(auto a, server->Connect());
  ASSERT_OK_AND_ASSIGN(auto b, server->Connect());
  const v1::KvSlab& wire = a->pool().kv_slab();
  EXPECT_EQ(wire.layout(), kLayout);
  EXPECT_EQ(wire.num_slots(), (32 + 1) * 4);
  EXPECT_EQ(wire.bytes_per_page(), 4 * 4 * (2 * 8 * 2));
  EXPECT_GT(wire.alignment(), 0);
  EXPECT_EQ(wire.bytes() % wire.alignment(), 0);
  EXPECT_FALSE(wire.scrub());
  ASSERT_EQ(wire.buffers_size(), 4);
  EXPECT_EQ(wire.buffers(1).name(), "v.0");
  EXPECT_EQ(wire.buffers(1).dtype(), "bf16");
  EXPECT_THAT(wire.buffers(1).element_shape(), ElementsAre(2, 8));
  EXPECT_EQ(wire.buffers(1).stride_bytes(), 32);
  EXPECT_EQ(wire.buffers(1).offset() % wire.alignment(), 0);

  const std::vector<KvBuffer>& buffers = a->kv_buffers();
  ASSERT_EQ(buffers.size(), 4u);
  for (size_t i = 0; i < buffers.size(); ++i) {
    EXPECT_EQ(buffers[i].name, wire.buffers(i).name());
    EXPECT_EQ(buffers[i].dtype, KvDtype::kBf16);
    EXPECT_THAT(buffers[i].element_shape, ElementsAre(2, 8));
    EXPECT_EQ(buffers[i].num_slots, 132);
    EXPECT_EQ(buffers[i].stride_bytes, 32);
    EXPECT_FALSE(buffers[i].on_device);
    EXPECT_EQ(static_cast<char*>(buffers[i].data) -
                  static_cast<char*>(a->kv_slab()->data()),
              wire.buffers(i).offset());
  }
  ASSERT_NE(a->kv_slab()->Find("k.1"), nullptr);
  EXPECT_EQ(a->kv_slab()->Find("q.0"), nullptr);
  // One memory: what one session writes at a slot, the other reads there.
  ASSERT_OK_AND_ASSIGN(Allocation allocation, a->Alloc({4}));
  ASSERT_OK(allocation.status());
  int64_t slot = 0;
  ASSERT_OK(a->CopyToHost(allocation[0].slots + 3, 1, &slot));
  const std::vector<uint8_t> pattern = KvPattern(a->session_id(), slot, 3, 32);
  ASSERT_OK(a->kv_slab()->CopyToSlab(a->kv_buffers()[3].slot(slot),
                                     pattern.data(), 32));
  EXPECT_EQ(Read(*b->kv_slab(), b->kv_buffers()[3].slot(slot), 32), pattern);
  // Outside the slab is refused.
  EXPECT_THAT(
      a->kv_slab()->CopyToSlab(a->kv_buffers()[3].slot(132), pattern.data(),
                               static_cast<int64_t>(wire.bytes())),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not inside")));
}

TEST(KvSlabTest, WithoutALayoutThereIsNoSlab) {
  ServerOptions options = KvOptions();
  options.kv.layout.reset();
  ASSERT_OK_AND_ASSIGN(auto server, InProcessServer::Start(options));
  ASSERT_OK_AND_ASSIGN(auto client, server->Connect());
  EXPECT_FALSE(client->pool().has_kv_slab());
  EXPECT_TRUE(client->kv_buffers().empty());
  EXPECT_EQ(client->kv_slab(), nullptr);
}

TEST(KvSlabTest, TheRegisterSecretIsRequiredWhenSet) {
  ServerOptions options = KvOptions();
  options.register_secret = "pool-secret";
  ASSERT_OK_AND_ASSIGN(auto server, InProcessServer::Start(options));
  EXPECT_THAT(server->Connect(),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("wrong or missing register_secret")));
  ClientOptions wrong;
  wrong.register_secret = "pool-secreT";
  EXPECT_THAT(server->Connect(wrong),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("wrong or missing register_secret")));
  ClientOptions right;
  right.register_secret = "pool-secret";
  ASSERT_OK_AND_ASSIGN(auto client, server->Connect(right));
  EXPECT_EQ(client->kv_buffers().size(), 4u);
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, client->GetStats());
  EXPECT_EQ(stats.sessions_active(), 1);
}

TEST(KvSlabTest, TheBudgetSizesThePoolAndTheImpossibleIsRefused) {
  ServerOptions options = KvOptions(/*num_pages=*/0);
  options.kv.budget = *ParseKvMemory("1MiB");
  ASSERT_OK_AND_ASSIGN(auto server, InProcessServer::Start(options));
  const KvSlab* slab = server->server().backend().kv_slab();
  ASSERT_NE(slab, nullptr);
  EXPECT_LE(slab->geometry.total_bytes, 1 << 20);
  EXPECT_GT(slab->geometry.num_pages, 1000);
  EXPECT_EQ(server->pool().geometry().num_pages, slab->geometry.num_pages);
  server->Stop();

  // More than the host has, no page left, --num_pages past the budget, no
  // size at all: each refused with its numbers.
  ServerOptions huge = KvOptions(0);
  huge.kv.budget = *ParseKvMemory("1000TiB");
  EXPECT_THAT(Server::Create(huge),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--kv_memory asks for 1000.0 TiB")));
  ServerOptions tiny = KvOptions(0);
  tiny.kv.budget = *ParseKvMemory("4KiB");
  EXPECT_THAT(Server::Create(tiny),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("leaves no usable page")));
  ServerOptions conflicting = KvOptions(100000);
  conflicting.kv.budget = *ParseKvMemory("1MiB");
  EXPECT_THAT(Server::Create(conflicting),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--num_pages=100000 with --kv_layout needs a "
                                 "KV slab of")));
  EXPECT_THAT(Server::Create(KvOptions(0)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("needs --kv_memory")));
  ServerOptions scrub_alone = KvOptions();
  scrub_alone.kv.layout.reset();
  scrub_alone.kv.scrub = true;
  EXPECT_THAT(Server::Create(scrub_alone),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--kv_scrub needs --kv_layout")));
}

TEST(KvSlabTest, StatsAndMetricsDescribeTheSlab) {
  ASSERT_OK_AND_ASSIGN(auto server,
                       InProcessServer::Start(KvOptions(32, /*scrub=*/true)));
  ASSERT_OK_AND_ASSIGN(auto client, server->Connect());
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, client->GetStats());
  const v1::KvSlab& slab = stats.pool().kv_slab();
  EXPECT_EQ(slab.buffers_size(), 4);
  EXPECT_EQ(slab.bytes_per_page(), 512);
  EXPECT_TRUE(slab.scrub());
  EXPECT_EQ(stats.kv_pages_scrubbed_total(), 0);
  const std::string metrics = server->server().metrics().Render();
  EXPECT_THAT(metrics, HasSubstr(absl::StrFormat("pagealloc_kv_slab_bytes %d",
                                                 slab.bytes())));
  EXPECT_THAT(metrics, HasSubstr("pagealloc_kv_slab_buffers 4"));
  EXPECT_THAT(metrics, HasSubstr("pagealloc_kv_slab_page_bytes 512"));
  EXPECT_THAT(metrics, HasSubstr("pagealloc_kv_slab_pages 32"));
  EXPECT_THAT(metrics, HasSubstr("pagealloc_kv_pages_scrubbed_total 0"));
}

// Session A fills every page and frees them; B then takes them all. With
// --kv_scrub B finds zeros; without, A's bytes (which is why it exists).
void HandOverEveryPage(bool scrub) {
  SCOPED_TRACE(scrub ? "scrub" : "no scrub");
  constexpr int64_t kPages = 16;
  ASSERT_OK_AND_ASSIGN(auto server,
                       InProcessServer::Start(KvOptions(kPages, scrub)));
  ASSERT_OK_AND_ASSIGN(auto a, server->Connect());
  ASSERT_OK_AND_ASSIGN(auto b, server->Connect());
  const KvSlabView& slab = *a->kv_slab();
  CallOptions inline_slots;
  inline_slots.return_inline = true;
  ASSERT_OK_AND_ASSIGN(Allocation taken, a->Alloc({kPages * 4}, inline_slots));
  ASSERT_OK(taken.status());
  for (int64_t i = 0; i < taken[0].count; ++i) {
    for (const KvBuffer& buffer : slab.buffers()) {
      const std::vector<uint8_t> ones(buffer.stride_bytes, 0xff);
      ASSERT_OK(slab.CopyToSlab(buffer.slot(taken[0].slots[i]), ones.data(),
                                buffer.stride_bytes));
    }
  }
  ASSERT_OK_AND_ASSIGN(int64_t freed, a->FreeSlots(absl::MakeConstSpan(
                                          taken[0].slots, taken[0].count)));
  ASSERT_EQ(freed, kPages);
  ASSERT_OK_AND_ASSIGN(Allocation given, b->Alloc({kPages * 4}, inline_slots));
  ASSERT_OK(given.status());
  for (int64_t page = 1; page <= kPages; ++page) {
    EXPECT_EQ(PageIsZero(*b->kv_slab(), page), scrub) << "page " << page;
  }
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, b->GetStats());
  EXPECT_EQ(stats.kv_pages_scrubbed_total(), scrub ? kPages : 0);
  // Pages going back to their last owner are not scrubbed again.
  ASSERT_OK(b->FreeSlots(absl::MakeConstSpan(given[0].slots, 4)).status());
  ASSERT_OK(b->Alloc({4}).status());
  ASSERT_OK_AND_ASSIGN(stats, b->GetStats());
  EXPECT_EQ(stats.kv_pages_scrubbed_total(), scrub ? kPages : 0);
}

TEST(KvSlabTest, ScrubZeroesPagesHandedToAnotherSession) {
  HandOverEveryPage(/*scrub=*/true);
}

TEST(KvSlabTest, WithoutScrubAPageKeepsItsLastOwnersBytes) {
  HandOverEveryPage(/*scrub=*/false);
}

// ---- Across processes.

// A writer process and what it reported.
struct Writer {
  Subprocess process;
  std::string log;
  uint64_t session = 0;
  std::set<int64_t> pages;
};

// Starts kv_writer for `pages` pages, with `flags` added, and waits for
// its report. INTERNAL, with its log, when it exits without one.
absl::StatusOr<Writer> StartWriter(const Daemon& daemon, int index,
                                   int64_t pages,
                                   const std::vector<std::string>& flags = {}) {
  Writer writer;
  writer.log = absl::StrFormat("%s.writer%d", daemon.log_path, index);
  std::vector<std::string> argv = {
      RunfilePath("tests/kv_writer"), "--target=" + daemon.target,
      absl::StrFormat("--pages=%d", pages), "--hold_ms=120000"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv, writer.log);
  if (!process.ok()) return process.status();
  writer.process = *std::move(process);
  if (!WaitFor(
          [&] {
            return ReadLog(writer.log).find("READY") != std::string::npos ||
                   !writer.process.running();
          },
          absl::Seconds(60))) {
    return absl::DeadlineExceededError("kv_writer: no READY: " +
                                       ReadLog(writer.log));
  }
  for (absl::string_view line : absl::StrSplit(ReadLog(writer.log), '\n')) {
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ');
    if (words[0] == "SESSION" && words.size() == 2) {
      if (!absl::SimpleAtoi(words[1], &writer.session)) break;
    } else if (words[0] == "PAGES") {
      for (size_t i = 1; i < words.size(); ++i) {
        int64_t page = 0;
        if (absl::SimpleAtoi(words[i], &page)) writer.pages.insert(page);
      }
    }
  }
  if (writer.session == 0 ||
      static_cast<int64_t>(writer.pages.size()) != pages) {
    return absl::InternalError("kv_writer reported: " + ReadLog(writer.log));
  }
  return writer;
}

// Checks every slot of the slab: a writer's pages hold exactly its pattern
// in every buffer, every other page (page 0 and free pages) zeros. Pages
// in `skip` are not looked at.
void CheckSlab(const KvSlabView& slab,
               const std::vector<const Writer*>& writers,
               const std::set<int64_t>& skip = {}) {
  const int64_t page_size = slab.geometry().page_size;
  std::map<int64_t, const Writer*> owner;
  for (const Writer* writer : writers) {
    for (int64_t page : writer->pages) owner[page] = writer;
  }
  int64_t checked = 0;
  for (size_t b = 0; b < slab.buffers().size(); ++b) {
    const KvBuffer& buffer = slab.buffers()[b];
    const std::vector<uint8_t> all =
        Read(slab, buffer.data, buffer.num_slots * buffer.stride_bytes);
    const std::vector<uint8_t> zero(buffer.stride_bytes, 0);
    for (int64_t slot = 0; slot < buffer.num_slots; ++slot) {
      const int64_t page = slot / page_size;
      if (skip.count(page)) continue;
      const std::vector<uint8_t> held(
          all.begin() + slot * buffer.stride_bytes,
          all.begin() + (slot + 1) * buffer.stride_bytes);
      auto it = owner.find(page);
      const std::vector<uint8_t> expected =
          it == owner.end()
              ? zero
              : KvPattern(it->second->session, slot, static_cast<int>(b),
                          buffer.stride_bytes);
      ASSERT_EQ(held, expected)
          << "buffer " << buffer.name << " slot " << slot << " (page " << page
          << ", " << (it == owner.end() ? "free or page 0" : "a writer's")
          << ")";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

// Two writers fill their pages; this process checks the whole slab, kills
// the first writer, checks that the second's KV is intact and the dead
// one's pages came back, then starts a third writer that takes every free
// page and checks, before writing each slot, that it reads zero. With
// --kv_scrub it must (the dead writer's pages are zeroed in the launch that
// hands them over; on the CUDA backend the third writer's kernel is ordered
// after that launch only by the completion counter); without, the dead
// writer's bytes are still there and the third writer must say so.
void WritersShareOneSlabAndAKilledOneLeavesTheOthersIntact(bool scrub) {
  SCOPED_TRACE(scrub ? "scrub" : "no scrub");
  // A custom layout with uneven strides.
  std::vector<std::string> flags = {
      "--kv_layout=custom:layers=2,k=bf16:2x4,v=fp32:3,s=uint8:9",
      "--num_pages=200", "--page_size=4", "--lease_ms=60000", "--debug_checks"};
  if (scrub) flags.push_back("--kv_scrub");
  ASSERT_OK_AND_ASSIGN(Daemon daemon,
                       StartDaemon(scrub ? "kv-slab-scrub" : "kv-slab", flags));
  ASSERT_OK_AND_ASSIGN(Writer first, StartWriter(daemon, 1, 24));
  ASSERT_OK_AND_ASSIGN(Writer second, StartWriter(daemon, 2, 40));
  ClientOptions options;
  options.target = daemon.target;
  options.client_name = "checker";
  ASSERT_OK_AND_ASSIGN(auto checker, Client::Connect(options));
  const KvSlabView& slab = *checker->kv_slab();
  ASSERT_EQ(slab.buffers().size(), 6u);
  EXPECT_EQ(slab.buffers()[5].name, "s.1");
  const int64_t num_pages = checker->pool().num_pages();
  ASSERT_EQ(num_pages, 200);
  CheckSlab(slab, {&first, &second});

  first.process.Signal(SIGKILL);
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats,
                       WaitForStats(
                           daemon.target,
                           [](const v1::GetStatsResponse& s) {
                             return s.sessions_active() == 2 &&
                                    s.used_pages() == 40;
                           },
                           absl::Seconds(30)));
  ASSERT_EQ(stats.sessions_active(), 2) << ReadLog(daemon.log_path);
  ASSERT_EQ(stats.used_pages(), 40);
  EXPECT_EQ(stats.free_pages(), num_pages - 40);
  // The survivor's KV is untouched; the dead writer's bytes stay in its
  // (now free) pages until they are handed out again.
  CheckSlab(slab, {&first, &second});

  // A third writer takes every free page, the dead writer's among them.
  absl::StatusOr<Writer> third =
      StartWriter(daemon, 3, num_pages - 40, {"--expect_zero"});
  if (!scrub) {
    EXPECT_THAT(third, StatusIs(absl::StatusCode::kInternal,
                                HasSubstr("were not zero before it wrote")));
    EXPECT_TRUE(second.process.running());
    return;
  }
  ASSERT_OK(third.status());
  CheckSlab(slab, {&second, &*third});
  ASSERT_OK_AND_ASSIGN(stats, DaemonStats(daemon.target));
  EXPECT_EQ(stats.kv_pages_scrubbed_total(), 24);
  EXPECT_EQ(stats.free_pages(), 0);
  EXPECT_TRUE(second.process.running());
}

TEST(KvSlabProcessTest, WritersShareOneSlabAndAKilledOnesPagesComeBackZeroed) {
  WritersShareOneSlabAndAKilledOneLeavesTheOthersIntact(/*scrub=*/true);
}

TEST(KvSlabProcessTest,
     WithoutScrubTheNextWriterFindsTheKilledOnesBytesBeforeWriting) {
  WritersShareOneSlabAndAKilledOneLeavesTheOthersIntact(/*scrub=*/false);
}

}  // namespace
}  // namespace pagealloc
