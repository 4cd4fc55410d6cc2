// Attack: a session rewrites the header of its own fast channel. The
// daemon takes every capacity from its own records and reads each call
// field once (fast_channel/codec.h), so:
//   - rewriting the fields the daemon owns (magic, version, capacities,
//     poller_sleeping, session_ended, the answer's fields) changes nothing
//     the daemon does: a huge message_bytes with a call whose every request
//     is refused with a message writes nothing past the channel (before the
//     codec this overran the mapping into other sessions' channels);
//   - counts, kinds, option bits and ring positions out of range are
//     refused as a whole with INVALID_ARGUMENT naming the field;
// and in every case the daemon stays up, another session's calls are
// answered correctly, and the pool is unchanged.

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "fast_channel/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/hostile/hostile_channel_fixture.h"
#include "tests/status_matchers.h"

namespace pagealloc::testing {
namespace {

namespace fc = ::pagealloc::fast_channel;
using ::testing::HasSubstr;

constexpr int32_t kInvalidArgument =
    static_cast<int32_t>(absl::StatusCode::kInvalidArgument);

TEST_F(HostileChannelTest, RewrittenDaemonFieldsChangeNothingItDoes) {
  StartServer();
  auto victim = Connect("victim");
  ASSERT_NE(victim, nullptr);
  ASSERT_OK_AND_ASSIGN(Allocation held, victim->Alloc({8}));
  ASSERT_OK(held.status());
  // A quota of one page: every request below is refused, with a message.
  RawSession raw = OpenRaw("raw", /*quota_pages=*/1);
  ASSERT_NE(raw.header, nullptr);
  const PoolSnapshot before = PoolSnapshot::Of(pool());
  const int32_t max_requests = raw.registered.fast_channel().max_requests();
  const size_t total_bytes = raw.layout->total_bytes;

  // Everything the daemon wrote, rewritten to the worst values.
  raw.header->magic = 0;
  raw.header->version = 0xffffffff;
  raw.header->max_requests = INT_MAX;
  raw.header->message_bytes = INT_MAX;
  raw.header->poller_sleeping.store(0);
  raw.header->session_ended.store(0xffffffff);
  raw.header->end_reason_bytes = INT_MAX;
  raw.header->messages_used = INT_MAX;
  raw.header->num_results = -1;
  raw.header->call_code = -1;

  // A call whose every request is refused with a message: 64 requests of
  // 16 tokens (4 pages) each, over the session's quota.
  raw.WriteAlloc(max_requests, 16);
  raw.Post();
  ASSERT_TRUE(raw.Await());
  ASSERT_EQ(raw.header->call_code, 0) << raw.CallMessage();
  EXPECT_EQ(raw.header->num_results, max_requests);
  const int32_t* codes =
      reinterpret_cast<const int32_t*>(raw.base() + raw.layout->codes);
  for (int i = 0; i < max_requests; ++i) {
    EXPECT_EQ(codes[i],
              static_cast<int32_t>(absl::StatusCode::kResourceExhausted))
        << "request " << i;
  }
  // The messages stopped at the daemon's own capacity, not the header's.
  EXPECT_GE(raw.header->messages_used, 0);
  EXPECT_LE(raw.layout->messages + raw.header->messages_used, total_bytes);

  // The daemon is up, the victim's calls are answered correctly, and
  // nothing of the pool moved.
  EXPECT_EQ(PoolSnapshot::Of(pool()), before);
  for (int i = 0; i < 20; ++i) HonestRoundTrip(*victim);
  EXPECT_OK(victim->session_status());
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, victim->GetStats());
  EXPECT_EQ(stats.sessions_active(), 2);
  EXPECT_OK(pool().CheckInvariants());

  // The forged session_ended is never read back: the attacker's session
  // goes on being served.
  raw.WriteAlloc(1, 4);
  raw.header->release_ring_up_to = raw.header->ring_end;
  raw.Post();
  ASSERT_TRUE(raw.Await());
  EXPECT_EQ(raw.header->call_code, 0) << raw.CallMessage();
  EXPECT_EQ(pool().Stats().used_pages, before.used_pages + 1);
}

// One malformed call: which field, what value, what the refusal names.
struct Malformed {
  std::string name;
  uint32_t kind = static_cast<uint32_t>(fc::CallKind::kDecode);
  int32_t num_requests = 1;
  int32_t num_free_first = 0;
  uint32_t options = 0;
  std::string message;
};

// Writes `bad` into the raw channel's header, posts it and waits for the
// answer, which must be INVALID_ARGUMENT with bad.message in its text.
void PostRefused(RawSession& raw, const Malformed& bad) {
  raw.header->kind = bad.kind;
  raw.header->num_requests = bad.num_requests;
  raw.header->num_free_first = bad.num_free_first;
  raw.header->options = bad.options;
  raw.Post();
  ASSERT_TRUE(raw.Await());
  EXPECT_EQ(raw.header->call_code, kInvalidArgument);
  EXPECT_THAT(raw.CallMessage(), HasSubstr(bad.message));
}

TEST_F(HostileChannelTest, OutOfRangeCountsKindsAndOptionsAreRefused) {
  StartServer();
  auto victim = Connect("victim");
  ASSERT_NE(victim, nullptr);
  RawSession raw = OpenRaw();
  ASSERT_NE(raw.header, nullptr);
  const PoolSnapshot before = PoolSnapshot::Of(pool());
  const uint32_t decode = static_cast<uint32_t>(fc::CallKind::kDecode);
  const std::vector<Malformed> table = {
      {"negative count", decode, -1, 0, 0, "num_requests (-1)"},
      {"smallest count", decode, INT_MIN, 0, 0, "num_requests (-2147483648)"},
      {"one past the capacity", decode, 65, 0, 0, "num_requests (65)"},
      {"largest count", decode, INT_MAX, 0, 0, "num_requests (2147483647)"},
      {"negative free_first", decode, 1, -1, 0, "num_free_first (-1)"},
      {"free_first past the capacity", decode, 1, 65, 0, "num_free_first (65)"},
      {"kind 0", 0, 1, 0, 0, "unknown call kind 0"},
      {"kind past the last", 9, 1, 0, 0, "unknown call kind 9"},
      {"largest kind", 0xffffffff, 1, 0, 0, "unknown call kind"},
      {"unknown option bit", decode, 1, 0, 1u << 7, "unknown option bits 0x80"},
      {"every option bit", decode, 1, 0, 0xffffffff, "unknown option bits"},
  };
  for (const Malformed& bad : table) {
    SCOPED_TRACE(bad.name);
    ASSERT_NO_FATAL_FAILURE(PostRefused(raw, bad));
    EXPECT_EQ(PoolSnapshot::Of(pool()), before);
    HonestRoundTrip(*victim);
  }
  // Requests whose values the decoder refuses, and ring positions out of
  // range, are refused the same way, with the field named.
  raw.header->kind = decode;
  raw.header->num_requests = 1;
  raw.header->num_free_first = 0;
  raw.header->options = 0;
  raw.array(raw.layout->in1)[0] = -5;
  raw.array(raw.layout->in2)[0] = -1;
  raw.Post();
  ASSERT_TRUE(raw.Await());
  EXPECT_EQ(raw.header->call_code, kInvalidArgument);
  EXPECT_THAT(raw.CallMessage(), HasSubstr("seq_lens[0]"));
  for (const int64_t up_to : {int64_t{-1}, INT64_MIN, INT64_MAX}) {
    SCOPED_TRACE(absl::StrFormat("release_ring_up_to %d", up_to));
    raw.WriteAlloc(1, 4);
    raw.header->release_ring_up_to = up_to;
    raw.Post();
    ASSERT_TRUE(raw.Await());
    EXPECT_NE(raw.header->call_code, 0);
    EXPECT_THAT(raw.CallMessage(), HasSubstr("release_ring_up_to"));
  }
  EXPECT_EQ(PoolSnapshot::Of(pool()), before);
  EXPECT_OK(pool().CheckInvariants());
  // And the attacker's channel still serves a well-formed call.
  raw.WriteAlloc(1, 4);
  raw.header->release_ring_up_to = 0;
  raw.Post();
  ASSERT_TRUE(raw.Await());
  EXPECT_EQ(raw.header->call_code, 0);
}

// A prefix match (kMatchPrefix) posted by hand: every count and option a
// client writes is bounded before a key is read, and the chain is checked
// by the core as a gRPC one is. Each refusal leaves the pool as it was (no
// reference taken, nothing evicted) and another session's calls answered.
TEST_F(HostileChannelTest, MalformedPrefixMatchesAreRefusedAndAdoptNothing) {
  ServerOptions options = DefaultOptions();
  // Fewer pages than the channel holds keys (64): a chain longer than the
  // pool then fits in the channel, and only the core can refuse it.
  options.pool.num_pages = 16;
  StartServer(options);
  auto victim = Connect("victim");
  ASSERT_NE(victim, nullptr);
  // The victim publishes two pages, which a well-formed match adopts.
  CallOptions inline_slots;
  inline_slots.return_inline = true;
  ASSERT_OK_AND_ASSIGN(Allocation written, victim->Alloc({8}, inline_slots));
  ASSERT_OK(written[0].status);
  const std::vector<int64_t> published = {written[0].slots[0] / 4,
                                          written[0].slots[4] / 4};
  std::vector<std::string> keys;
  for (int i = 0; i < 64; ++i) {
    std::string key(fc::kKeyBytes, 'h');
    key[0] = static_cast<char>(i);
    keys.push_back(key);
  }
  ASSERT_OK(victim->Publish(published, {keys[0], keys[1]}).status());

  RawSession raw = OpenRaw();
  ASSERT_NE(raw.header, nullptr);
  char* const key_area = raw.base() + raw.layout->keys();
  for (int i = 0; i < 64; ++i) {
    std::memcpy(key_area + i * fc::kKeyBytes, keys[i].data(), fc::kKeyBytes);
  }
  const PoolSnapshot before = PoolSnapshot::Of(pool());
  const int64_t adopted_before = pool().Stats().prefix_pages_adopted;
  const uint32_t match = static_cast<uint32_t>(fc::CallKind::kMatchPrefix);
  const uint32_t decode = static_cast<uint32_t>(fc::CallKind::kDecode);
  const std::vector<Malformed> table = {
      {"negative key count", match, -1, 0, fc::kAdopt,
       "num_requests (-1) is outside [0, 64]"},
      {"smallest key count", match, INT_MIN, 0, fc::kAdopt,
       "num_requests (-2147483648)"},
      {"one key past the key area", match, 65, 0, fc::kAdopt,
       "the key area holds 64 keys of 32 bytes (2048 bytes)"},
      // 2^26 keys are 2^31 key bytes: past int32, were they multiplied so.
      {"key bytes past int32", match, 1 << 26, 0, fc::kAdopt,
       "num_requests (67108864)"},
      {"largest key count", match, INT_MAX, 0, fc::kAdopt,
       "num_requests (2147483647)"},
      {"an allocation's option bit", match, 2, 0,
       fc::kAdopt | fc::kAllOrNothing,
       "option bits 0x4 do not apply to call kind 8"},
      {"a free's order bit", match, 2, 0, fc::kFreeAscending,
       "option bits 0x8 do not apply to call kind 8"},
      {"unknown option bit", match, 2, 0, 1u << 7, "unknown option bits 0x80"},
      {"adopt on a decode", decode, 1, 0, fc::kAdopt,
       "option bits 0x20 do not apply to call kind 2"},
      {"chain longer than the pool", match, 17, 0, fc::kAdopt,
       "17 keys, more than the pool's 16"},
  };
  auto check_unchanged = [&] {
    EXPECT_EQ(PoolSnapshot::Of(pool()), before);
    EXPECT_EQ(pool().Stats().prefix_pages_adopted, adopted_before);
    EXPECT_OK(pool().CheckInvariants());
    HonestRoundTrip(*victim);
  };
  for (const Malformed& bad : table) {
    SCOPED_TRACE(bad.name);
    ASSERT_NO_FATAL_FAILURE(PostRefused(raw, bad));
    EXPECT_EQ(raw.header->op_value, 0);
    check_unchanged();
  }
  // A key repeated in the chain is refused by the core, naming both.
  std::memcpy(key_area + 2 * fc::kKeyBytes, keys[0].data(), fc::kKeyBytes);
  ASSERT_NO_FATAL_FAILURE(PostRefused(
      raw,
      {"repeated key", match, 3, 0, fc::kAdopt, "keys[2] repeats keys[0]"}));
  check_unchanged();

  // The attacker's channel still serves a well-formed match: the victim's
  // two pages, adopted (the third key is nobody's).
  std::memcpy(key_area + 2 * fc::kKeyBytes, keys[2].data(), fc::kKeyBytes);
  raw.Post();
  ASSERT_TRUE(raw.Await());
  ASSERT_EQ(raw.header->call_code, 0) << raw.CallMessage();
  ASSERT_EQ(raw.header->op_value, 2);
  const int64_t* found = raw.array(raw.layout->new_pages);
  EXPECT_EQ(std::vector<int64_t>(found, found + 2), published);
  EXPECT_EQ(pool().Stats().prefix_pages_adopted, adopted_before + 2);
  EXPECT_EQ(pool().Stats().owners.at(raw.id()).shared_pages, 2);
  // The victim still finds its pages, and its calls are answered.
  EXPECT_THAT(victim->MatchPrefix({keys[0], keys[1]}, /*adopt=*/false),
              IsOkAndHolds(published));
  HonestRoundTrip(*victim);
  EXPECT_OK(pool().CheckInvariants());
}

}  // namespace
}  // namespace pagealloc::testing
