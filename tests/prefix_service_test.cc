// Shared prefix pages through the daemon (CPU backend, memfd KV slab): a
// writer fills pages with its pattern and publishes them; a sibling matches
// and adopts them; the writer dies; the sibling reads the pattern intact;
// freed, the pages stay cached until an allocation that needs them evicts
// them. Hostile calls are refused with their index and change nothing.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/admin.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/in_process_server.h"
#include "tests/kv_pattern.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::InProcessServer;
using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::KvPattern;
using ::pagealloc::testing::StatusIs;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kLayout[] = "mha:layers=2,kv_heads=2,head_dim=8,dtype=bf16";
constexpr int64_t kPageSize = 4;

ServerOptions PrefixOptions(int64_t num_pages) {
  ServerOptions options;
  options.backend = "cpu";
  options.pool = {num_pages, kPageSize, FreePolicy::kLifo};
  options.pool.max_pinned_pages_per_owner = 2;
  options.sessions.default_ring_capacity_slots = 1024;
  options.debug_checks = true;
  options.kv.layout = *ParseKvLayout(kLayout);
  return options;
}

// A chain of `n` distinct 32-byte keys starting at `first`.
std::vector<std::string> Chain(int first, int n) {
  std::vector<std::string> keys;
  for (int k = 0; k < n; ++k) {
    std::string key(32, '\0');
    key[0] = static_cast<char>(first + k);
    key[31] = 'p';
    keys.push_back(key);
  }
  return keys;
}

// Allocates `pages` whole pages for `client` and writes its pattern into
// every slot of every buffer. Returns the page ids.
std::vector<int64_t> FillPages(Client& client, int64_t pages) {
  CallOptions inline_slots;
  inline_slots.return_inline = true;
  auto allocation = client.Alloc({pages * kPageSize}, inline_slots);
  EXPECT_OK(allocation.status());
  EXPECT_OK(allocation->status());
  const KvSlabView& slab = *client.kv_slab();
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < (*allocation)[0].count; ++i) {
    const int64_t slot = (*allocation)[0].slots[i];
    if (slot % kPageSize == 0) ids.push_back(slot / kPageSize);
    for (size_t b = 0; b < slab.buffers().size(); ++b) {
      const KvBuffer& buffer = slab.buffers()[b];
      const std::vector<uint8_t> pattern =
          KvPattern(client.session_id(), slot, b, buffer.stride_bytes);
      EXPECT_OK(slab.CopyToSlab(buffer.slot(slot), pattern.data(),
                                buffer.stride_bytes));
    }
  }
  return ids;
}

// Whether every slot of `page` holds `writer`'s pattern, as `reader` sees.
bool HoldsPattern(const Client& reader, uint64_t writer, int64_t page) {
  const KvSlabView& slab = *reader.kv_slab();
  for (int64_t slot = page * kPageSize; slot < (page + 1) * kPageSize; ++slot) {
    for (size_t b = 0; b < slab.buffers().size(); ++b) {
      const KvBuffer& buffer = slab.buffers()[b];
      std::vector<uint8_t> bytes(buffer.stride_bytes);
      if (!slab.CopyFromSlab(bytes.data(), buffer.slot(slot),
                             buffer.stride_bytes)
               .ok() ||
          bytes != KvPattern(writer, slot, b, buffer.stride_bytes)) {
        return false;
      }
    }
  }
  return true;
}

TEST(PrefixServiceTest, ASiblingAdoptsWhatADeadWriterPublishedAndReadsItsKv) {
  ASSERT_OK_AND_ASSIGN(auto server, InProcessServer::Start(PrefixOptions(16)));
  ASSERT_OK_AND_ASSIGN(auto writer, server->Connect());
  ASSERT_OK_AND_ASSIGN(auto sibling, server->Connect());
  const uint64_t writer_id = writer->session_id();
  const std::vector<int64_t> pages = FillPages(*writer, 4);
  ASSERT_EQ(pages.size(), 4u);
  // Two pages it writes but does not publish come back when it dies.
  FillPages(*writer, 2);
  const std::vector<std::string> keys = Chain(1, 4);
  ASSERT_OK_AND_ASSIGN(Client::PublishResult published,
                       writer->Publish(pages, keys));
  EXPECT_THAT(published.pages, ElementsAreArray(pages));
  EXPECT_EQ(published.newly_published, 4);

  // The writer dies (its memory socket closing takes this path).
  ASSERT_TRUE(server->server().core().ReclaimSession(writer_id, "killed"));
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, sibling->GetStats());
  EXPECT_EQ(stats.prefix().cached_pages(), 4);
  EXPECT_EQ(stats.free_pages(), 12);

  std::vector<std::string> longer = keys;
  longer.push_back(Chain(9, 1)[0]);
  ASSERT_OK_AND_ASSIGN(std::vector<int64_t> adopted,
                       sibling->MatchPrefix(longer, /*adopt=*/true));
  EXPECT_THAT(adopted, ElementsAreArray(pages));
  for (int64_t page : adopted) {
    EXPECT_TRUE(HoldsPattern(*sibling, writer_id, page)) << "page " << page;
  }
  ASSERT_OK_AND_ASSIGN(stats, sibling->GetStats(/*include_sessions=*/true));
  EXPECT_EQ(stats.prefix().published_pages(), 4);
  EXPECT_EQ(stats.prefix().lookup_pages_total(), 5);
  EXPECT_EQ(stats.prefix().hit_pages_total(), 4);
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.sessions(0).shared_pages(), 4);

  // Freed, they stay cached; an allocation of every page evicts them.
  ASSERT_OK_AND_ASSIGN(int64_t freed, sibling->FreePages(adopted));
  EXPECT_EQ(freed, 4);
  ASSERT_OK_AND_ASSIGN(stats, sibling->GetStats());
  EXPECT_EQ(stats.prefix().evictable_pages(), 4);
  ASSERT_OK_AND_ASSIGN(Allocation all, sibling->Alloc({16 * kPageSize}));
  ASSERT_OK(all.status());
  ASSERT_OK_AND_ASSIGN(stats, sibling->GetStats());
  EXPECT_EQ(stats.prefix().evicted_for_allocation_total(), 4);
  EXPECT_EQ(stats.prefix().cached_pages(), 0);
  EXPECT_THAT(sibling->MatchPrefix(keys, false), IsOkAndHolds(IsEmpty()));
  EXPECT_OK(server->pool().CheckInvariants());
}

TEST(PrefixServiceTest, ResetEvictsCachedPagesAndKeepsHeldOnes) {
  ASSERT_OK_AND_ASSIGN(auto server, InProcessServer::Start(PrefixOptions(16)));
  ASSERT_OK_AND_ASSIGN(auto a, server->Connect());
  const std::vector<int64_t> pages = FillPages(*a, 3);
  ASSERT_OK(a->Publish(pages, Chain(1, 3), "", /*pin=*/false).status());
  ASSERT_OK(a->FreePages({pages[2]}).status());
  AdminOptions admin;
  admin.channel = server->channel();
  EXPECT_THAT(ResetDaemonPrefixCache(admin), IsOkAndHolds(1));
  EXPECT_THAT(a->MatchPrefix(Chain(1, 3), false),
              IsOkAndHolds(ElementsAreArray({pages[0], pages[1]})));
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, a->GetStats());
  EXPECT_EQ(stats.prefix().evicted_by_reset_total(), 1);
  EXPECT_EQ(stats.prefix().published_pages(), 2);
  EXPECT_EQ(stats.prefix().max_pinned_pages_per_session(), 2);
}

// Every hostile prefix call, as a row: code, message, and a pool whose
// figures have not moved.
TEST(PrefixServiceTest, HostileCallsAreRefusedWithTheirIndexAndChangeNothing) {
  ASSERT_OK_AND_ASSIGN(auto server, InProcessServer::Start(PrefixOptions(16)));
  ASSERT_OK_AND_ASSIGN(auto a, server->Connect());
  ASSERT_OK_AND_ASSIGN(auto b, server->Connect());
  const std::vector<int64_t> mine = FillPages(*a, 3);
  const std::vector<int64_t> theirs = FillPages(*b, 1);
  ASSERT_OK(b->Publish(theirs, Chain(100, 1)).status());
  std::vector<std::string> short_key = Chain(1, 2);
  short_key[1].resize(31);
  std::vector<std::string> repeated = Chain(1, 2);
  repeated[1] = repeated[0];
  struct Row {
    std::string what;
    std::function<absl::Status()> call;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Row> rows = {
      {"short key",
       [&] {
         return a->Publish({mine[0], mine[1]}, short_key).status();
       },
       absl::StatusCode::kInvalidArgument, "keys[1] is 31 bytes"},
      {"repeated key",
       [&] {
         return a->Publish({mine[0], mine[1]}, repeated).status();
       },
       absl::StatusCode::kInvalidArgument, "keys[1] repeats keys[0]"},
      {"chain longer than the pool",
       [&] { return a->MatchPrefix(Chain(1, 17), true).status(); },
       absl::StatusCode::kInvalidArgument, "17 keys, more than the pool's 16"},
      {"bad parent key",
       [&] { return a->Publish({mine[0]}, Chain(1, 1), "short").status(); },
       absl::StatusCode::kInvalidArgument, "parent_key is 5 bytes"},
      {"another's page",
       [&] { return a->Publish({theirs[0]}, Chain(1, 1)).status(); },
       absl::StatusCode::kFailedPrecondition, "already shared"},
      {"a stranger's owned page",
       [&] { return b->Publish({mine[0]}, Chain(1, 1)).status(); },
       absl::StatusCode::kPermissionDenied, "belongs to another session"},
      {"one key short",
       [&] {
         return a->Publish({mine[0], mine[1]}, Chain(1, 1)).status();
       },
       absl::StatusCode::kInvalidArgument, "2 pages and 1 keys"},
      {"a reference it does not hold",
       [&] { return a->FreePages({theirs[0]}).status(); },
       absl::StatusCode::kPermissionDenied, "holds no reference"},
      {"unpin what it did not pin",
       [&] { return a->UnpinPrefix({theirs[0]}).status(); },
       absl::StatusCode::kInvalidArgument, "is not a page owner"},
      {"pins over the bound",
       [&] { return a->Publish(mine, Chain(1, 3), "", true).status(); },
       absl::StatusCode::kResourceExhausted, "over its bound of 2"},
  };
  ASSERT_OK_AND_ASSIGN(const v1::GetStatsResponse before,
                       a->GetStats(/*include_sessions=*/true));
  for (const Row& row : rows) {
    SCOPED_TRACE(row.what);
    EXPECT_THAT(row.call(), StatusIs(row.code, HasSubstr(row.message)));
    ASSERT_OK_AND_ASSIGN(const v1::GetStatsResponse after,
                         a->GetStats(/*include_sessions=*/true));
    EXPECT_EQ(after.used_pages(), before.used_pages());
    EXPECT_EQ(after.prefix().published_pages(),
              before.prefix().published_pages());
    EXPECT_EQ(after.prefix().pinned_pages(), before.prefix().pinned_pages());
    EXPECT_EQ(after.free_pages(), before.free_pages());
    EXPECT_OK(server->pool().CheckInvariants());
  }
  // The shared page is read-only: an extend into it is refused.
  ASSERT_OK(a->MatchPrefix(Chain(100, 1), true).status());
  auto write = a->AllocExtend({2}, {4}, {theirs[0] * kPageSize + 1});
  ASSERT_OK(write.status());
  EXPECT_THAT(write->status(), StatusIs(absl::StatusCode::kPermissionDenied,
                                        HasSubstr("read-only")));
}

}  // namespace
}  // namespace pagealloc
