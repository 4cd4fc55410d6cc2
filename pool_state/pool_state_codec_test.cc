// The codec: every kind of record and a state with every field set round
// trip, in the newest formats and in the older ones (which drop what they
// cannot hold: the calls' tags before record format 4, each owner's latest
// call before state format 3); every truncation of their encodings, random
// byte flips and random bytes decode to an error or to some value, never a
// crash, and never an allocation beyond the input's size (counts are
// checked against the bytes left before anything is reserved: ASan would
// report a huge allocation).

#include "pool_state/pool_state_codec.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/pool_change_log.h"
#include "allocator/pool_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr PoolGeometry kGeometry{/*page_size=*/16, /*num_pages=*/40};

PrefixKey Key(int tag) {
  PrefixKey key{};
  key[0] = static_cast<uint8_t>(tag);
  key[17] = 0x3c;
  key[31] = static_cast<uint8_t>(255 - tag);
  return key;
}

// Compares two records field by field (requests by their recorded fields,
// destinations by whether they are null).
std::string ChangeDifference(const PoolChange& a, const PoolChange& b) {
  if (a.kind != b.kind) return "kind";
  if (a.owner != b.owner) return "owner";
  if (a.quota_pages != b.quota_pages) return "quota_pages";
  if (a.metadata != b.metadata) return "metadata";
  if (a.requests.size() != b.requests.size()) return "requests";
  for (size_t i = 0; i < a.requests.size(); ++i) {
    const AllocRequest& x = a.requests[i];
    const AllocRequest& y = b.requests[i];
    if (x.kind != y.kind || x.owner != y.owner || x.index != y.index ||
        x.prefix_len != y.prefix_len || x.seq_len != y.seq_len ||
        x.last_loc != y.last_loc ||
        (x.destination == nullptr) != (y.destination == nullptr)) {
      return absl::StrFormat("requests[%d]", i);
    }
  }
  if (a.calls.size() != b.calls.size()) return "calls";
  for (size_t i = 0; i < a.calls.size(); ++i) {
    if (a.calls[i].num_requests != b.calls[i].num_requests ||
        a.calls[i].all_or_nothing != b.calls[i].all_or_nothing ||
        a.calls[i].call != b.calls[i].call) {
      return absl::StrFormat("calls[%d]", i);
    }
  }
  if (a.call != b.call) return "call";
  if ((a.launch_failure == nullptr) != (b.launch_failure == nullptr) ||
      (a.launch_failure != nullptr && *a.launch_failure != *b.launch_failure)) {
    return "launch_failure";
  }
  if (!std::equal(a.pages.begin(), a.pages.end(), b.pages.begin(),
                  b.pages.end())) {
    return "pages";
  }
  if (!std::equal(a.shared_pages.begin(), a.shared_pages.end(),
                  b.shared_pages.begin(), b.shared_pages.end())) {
    return "shared_pages";
  }
  if (a.checkpoint_id != b.checkpoint_id) return "checkpoint_id";
  if (a.force != b.force) return "force";
  if (!std::equal(a.keys.begin(), a.keys.end(), b.keys.begin(), b.keys.end())) {
    return "keys";
  }
  if ((a.parent_key == nullptr) != (b.parent_key == nullptr) ||
      (a.parent_key != nullptr && *a.parent_key != *b.parent_key)) {
    return "parent_key";
  }
  if (a.pin != b.pin || a.adopt != b.adopt || a.refused != b.refused) {
    return "flags";
  }
  if (a.keys_looked_up != b.keys_looked_up || a.pages_found != b.pages_found) {
    return "match counts";
  }
  return "";
}

// One record of each kind, with the storage they point into.
struct Records {
  std::vector<AllocRequest> requests;
  std::vector<CallSpan> calls;
  absl::Status failure = absl::InternalError("the device fell off the bus");
  std::vector<int64_t> pages = {3, 9, 1, 40};
  std::vector<int64_t> shared = {7, 2};
  std::vector<PrefixKey> keys = {Key(1), Key(2), Key(3), Key(4)};
  PrefixKey parent = Key(99);
  std::string metadata = std::string("session\0id", 10) + "digest";
  std::vector<PoolChange> changes;

  Records() {
    int64_t slot = 0;
    for (int i = 0; i < 9; ++i) {
      AllocRequest r;
      r.kind = static_cast<RequestKind>(i % 3);
      r.owner = 1 + i % 2;
      r.index = i;
      r.prefix_len = 17 * i - 5;
      r.seq_len = 1 << (i + 20);
      r.last_loc = i == 4 ? -1 : 100 + i;
      r.destination = i == 6 ? nullptr : &slot;
      requests.push_back(r);
    }
    // The first and the last call tagged, the last a retry.
    calls = {{4, true, {11, false}}, {0, false, {}}, {5, false, {12, true}}};
    auto add = [this](PoolChangeKind kind) -> PoolChange& {
      PoolChange& c = changes.emplace_back();
      c.kind = kind;
      c.owner = 0x0123456789abcdefULL;
      return c;
    };
    PoolChange& add_owner = add(PoolChangeKind::kAddOwner);
    add_owner.quota_pages = 12;
    add_owner.metadata = metadata;
    add(PoolChangeKind::kRemoveOwner);
    PoolChange& allocate = add(PoolChangeKind::kAllocate);
    allocate.owner = kNoOwner;
    allocate.requests = requests;
    allocate.calls = calls;
    PoolChange& failed = add(PoolChangeKind::kAllocate);
    failed.owner = kNoOwner;
    failed.requests = absl::MakeConstSpan(requests).subspan(2, 3);
    failed.launch_failure = &failure;
    PoolChange& free = add(PoolChangeKind::kFree);
    free.pages = pages;
    free.shared_pages = shared;
    free.call = {0xfedcba9876543210ULL, true};
    add(PoolChangeKind::kCheckpoint).call = {21, false};
    PoolChange& rollback = add(PoolChangeKind::kRollback);
    rollback.checkpoint_id = 77;
    rollback.call = {22, true};
    add(PoolChangeKind::kClearOwner).call = {23, true};
    PoolChange& clear_pool = add(PoolChangeKind::kClearPool);
    clear_pool.owner = kNoOwner;
    clear_pool.force = true;
    PoolChange& publish = add(PoolChangeKind::kPublish);
    publish.pages = pages;
    publish.keys = keys;
    publish.parent_key = &parent;
    publish.pin = true;
    PoolChange& publish_root = add(PoolChangeKind::kPublish);
    publish_root.pages = absl::MakeConstSpan(pages).subspan(0, 1);
    publish_root.keys = absl::MakeConstSpan(keys).subspan(0, 1);
    PoolChange& adopt = add(PoolChangeKind::kMatchPrefix);
    adopt.adopt = true;
    adopt.keys_looked_up = 6;
    adopt.pages_found = 4;
    adopt.pages = pages;
    PoolChange& refused = add(PoolChangeKind::kMatchPrefix);
    refused.adopt = true;
    refused.refused = true;
    refused.keys_looked_up = 5;
    refused.pages_found = 2;
    PoolChange& match = add(PoolChangeKind::kMatchPrefix);
    match.keys_looked_up = 3;
    add(PoolChangeKind::kUnpin).pages = shared;
    add(PoolChangeKind::kResetPrefixCache).owner = kNoOwner;
    PoolChange& await_release = add(PoolChangeKind::kAwaitRelease);
    await_release.pages = pages;
    await_release.call = {24, false};
  }
};

// Whether records of `kind` carry a tag (record format 4 on): kAllocate's
// per call, these in PoolChange.call.
bool Tagged(PoolChangeKind kind) {
  switch (kind) {
    case PoolChangeKind::kAllocate:
    case PoolChangeKind::kFree:
    case PoolChangeKind::kCheckpoint:
    case PoolChangeKind::kRollback:
    case PoolChangeKind::kClearOwner:
    case PoolChangeKind::kAwaitRelease:
      return true;
    default:
      return false;
  }
}

// `change` as a record format before 4 keeps it: every call untagged.
// The result's calls point into `calls`.
PoolChange Untagged(const PoolChange& change, std::vector<CallSpan>* calls) {
  PoolChange untagged = change;
  untagged.call = CallTag{};
  calls->assign(change.calls.begin(), change.calls.end());
  for (CallSpan& call : *calls) call.call = CallTag{};
  untagged.calls = *calls;
  return untagged;
}

PoolState RichState() {
  PoolState s;
  s.num_pages = kGeometry.num_pages;
  s.page_size = kGeometry.page_size;
  s.free_policy = FreePolicy::kSorted;
  s.semantics = Semantics::kSglang;
  s.scrub = true;
  s.max_pinned_pages_per_owner = 6;
  s.ring_head = 13;
  s.free_pages = {5, 6, 7, 1, 2};
  s.parked_pages = {30, 3};
  s.owner_of.assign(s.num_pages + 1, kNoOwner);
  s.allocated_once.assign(s.num_pages + 1, false);
  s.last_owner.assign(s.num_pages + 1, kNoOwner);
  for (int64_t p = 8; p <= 20; ++p) {
    s.owner_of[p] = p % 2 == 0 ? 4 : ~OwnerId{0};
    s.allocated_once[p] = true;
    s.last_owner[p] = 4 + p % 3;
  }
  s.allocated_once[40] = true;  // the last bit of the bitmap's last byte
  PoolOwnerState& a = s.owners.emplace_back();
  a.id = 4;
  a.quota_pages = 10;
  a.metadata = "client=sglang-0";
  a.next_checkpoint_id = 9;
  a.checkpoints = {{3, 0}, {8, 2}};
  a.given_log = {8, 10, 12, 8, 14, 16, 18, 20, 9};
  a.given_live = {false, true, true, true, true, false, true, true, false};
  a.refs = {{9, 2}, {11, 1}};
  a.pins = {9, 13};
  a.awaiting_release = {12, 9, 10};
  // Not consistent calls (CreateFromState's to check): every field set.
  PoolKeptCall& first = a.kept_calls.emplace_back();
  first.id = 7;
  first.parts = kCallFree;
  first.freed = 2;
  PoolKeptCall& last = a.kept_calls.emplace_back();
  last.id = 0x0102030405060708ULL;
  last.parts = kCallAllocate | kCallFree | kCallCheckpoint | 0x40;
  last.freed = 3;
  last.checkpoint_id = 8;
  last.returned = -5;
  last.pages = {14, 16, 40, 1};
  PoolOwnerState& b = s.owners.emplace_back();
  b.id = 0xfffffffffffffff0ULL;
  for (int k = 0; k < 3; ++k) {
    PrefixEntryState& e = s.prefix_entries.emplace_back();
    e.page = 9 + 2 * k;
    e.key = Key(k);
    e.has_parent = k > 0;
    if (k > 0) e.parent = Key(k - 1);
    e.count = 2 - k;
    e.pins = k == 2 ? 1 : 0;
  }
  s.prefix_lru = {11, 13};
  PoolCounters& c = s.counters;
  c.slots_allocated = 1;
  c.pages_allocated = 2;
  c.pages_freed = 3;
  c.out_of_pages_refusals = 4;
  c.quota_refusals = 5;
  c.free_list_sorts = 6;
  c.batches_executed = 7;
  c.pages_scrubbed = 8;
  c.prefix_pages_published = 9;
  c.prefix_publish_existing = 10;
  c.prefix_lookup_pages = 11;
  c.prefix_hit_pages = 12;
  c.prefix_pages_adopted = 13;
  c.prefix_evicted_for_allocation = 14;
  c.prefix_evicted_by_reset = 15;
  c.prefix_cleared = int64_t{1} << 62;
  return s;
}

TEST(PoolStateCodecTest, EveryKindOfRecordRoundTrips) {
  Records records;
  DecodedPoolChange decoded;
  std::string bytes;
  for (const PoolChange& change : records.changes) {
    SCOPED_TRACE(PoolChangeKindName(change.kind));
    bytes.clear();
    EncodePoolChange(change, &bytes);
    EXPECT_EQ(bytes.size(), EncodedPoolChangeSize(change));
    ASSERT_OK(DecodePoolChange(bytes, kGeometry, &decoded));
    EXPECT_EQ(ChangeDifference(change, decoded.change()), "");
    // A request with a destination is decoded pointing at the stand-in.
    for (const AllocRequest& request : decoded.change().requests) {
      if (request.destination != nullptr) {
        EXPECT_EQ(request.destination, RecordedDestination());
      }
    }
  }
}

// Format 4 adds a tag of 9 bytes to each call of an allocation and to
// each free, checkpoint, rollback, clear and fence, after the fields
// format 3 has; the tags round trip, retries and all.
TEST(PoolStateCodecTest, Format4TagsTheCalls) {
  Records records;
  DecodedPoolChange decoded;
  int tagged = 0;
  for (const PoolChange& change : records.changes) {
    SCOPED_TRACE(PoolChangeKindName(change.kind));
    std::string bytes;
    EncodePoolChange(change, &bytes, 4);
    std::string format3;
    EncodePoolChange(change, &format3, 3);
    const size_t tags = change.kind == PoolChangeKind::kAllocate
                            ? change.calls.size()
                        : Tagged(change.kind) ? 1
                                              : 0;
    EXPECT_EQ(bytes.size(), format3.size() + 9 * tags);
    EXPECT_EQ(bytes.size(), EncodedPoolChangeSize(change, 4));
    ASSERT_OK(DecodePoolChange(bytes, kGeometry, &decoded));
    EXPECT_EQ(ChangeDifference(decoded.change(), change), "");
    if (Tagged(change.kind) && change.kind != PoolChangeKind::kAllocate) {
      // The tag comes last: u64 id, bool retry.
      uint64_t id = 0;
      std::memcpy(&id, bytes.data() + bytes.size() - 9, 8);
      EXPECT_EQ(id, change.call.id);
      EXPECT_EQ(bytes.back(), change.call.retry ? 1 : 0);
      EXPECT_EQ(bytes.substr(1, format3.size() - 1), format3.substr(1));
    }
    if (Tagged(change.kind) &&
        (change.call.id != 0 ||
         std::any_of(change.calls.begin(), change.calls.end(),
                     [](const CallSpan& c) { return c.call.id != 0; }))) {
      ++tagged;
    }
  }
  EXPECT_EQ(tagged, 6);  // every kind that has a tag
  // An allocation's calls: 18 bytes each, the tag after all_or_nothing.
  const PoolChange& allocate = records.changes[2];
  ASSERT_EQ(allocate.kind, PoolChangeKind::kAllocate);
  std::string bytes;
  EncodePoolChange(allocate, &bytes);
  const size_t calls_at = 2 + 4 + 4 + 1 + allocate.requests.size() * 42;
  ASSERT_EQ(bytes.size(), calls_at + 3 * 18);
  for (size_t i = 0; i < 3; ++i) {
    const char* call = bytes.data() + calls_at + 18 * i;
    int64_t num_requests = 0;
    uint64_t id = 0;
    std::memcpy(&num_requests, call, 8);
    std::memcpy(&id, call + 9, 8);
    EXPECT_EQ(num_requests, allocate.calls[i].num_requests) << i;
    EXPECT_EQ(call[8], allocate.calls[i].all_or_nothing ? 1 : 0) << i;
    EXPECT_EQ(id, allocate.calls[i].call.id) << i;
    EXPECT_EQ(call[17], allocate.calls[i].call.retry ? 1 : 0) << i;
  }
}

// Formats 1 to 3 (a journal taken over from a build of journal format 3 or
// older keeps its format) cannot hold the tags: their records are written
// without them, every kind that the format holds, and decode untagged.
TEST(PoolStateCodecTest, FormatsBefore4DropTheTags) {
  Records records;
  DecodedPoolChange decoded;
  for (uint8_t format = 1; format <= 3; ++format) {
    for (const PoolChange& change : records.changes) {
      SCOPED_TRACE(absl::StrFormat("format %d, %s", format,
                                   PoolChangeKindName(change.kind)));
      if (!PoolChangeFormatHolds(format, change.kind)) continue;
      EXPECT_FALSE(PoolChangeFormatHoldsTags(format));
      std::vector<CallSpan> calls;
      const PoolChange untagged = Untagged(change, &calls);
      std::string bytes;
      EncodePoolChange(change, &bytes, format);
      EXPECT_EQ(bytes.size(), EncodedPoolChangeSize(change, format));
      std::string without;
      EncodePoolChange(untagged, &without, format);
      EXPECT_EQ(bytes, without);
      ASSERT_OK(DecodePoolChange(bytes, kGeometry, &decoded));
      if (change.kind == PoolChangeKind::kMatchPrefix && format == 1) {
        continue;  // holds the keys, not what was found
      }
      EXPECT_EQ(ChangeDifference(decoded.change(), untagged), "");
      EXPECT_EQ(decoded.change().call, CallTag());
      for (const CallSpan& call : decoded.change().calls) {
        EXPECT_EQ(call.call, CallTag());
      }
    }
  }
  EXPECT_TRUE(PoolChangeFormatHoldsTags(4));
}

// A retry names the call it retries: a tag that says retry with call id 0
// is no tag a pool wrote (DATA_LOSS), nor is a retry byte other than 0 or
// 1. The encoder writes an untagged call's retry flag as 0 (the pool keeps
// nothing of an untagged call), so that what it writes always decodes.
TEST(PoolStateCodecTest, ARetryWithoutACallIdIsRefused) {
  Records records;
  DecodedPoolChange decoded;
  for (const PoolChange& change : records.changes) {
    // (An allocation of no calls, the whole batch one call, has no tag.)
    if (!Tagged(change.kind) ||
        (change.kind == PoolChangeKind::kAllocate && change.calls.empty())) {
      continue;
    }
    SCOPED_TRACE(PoolChangeKindName(change.kind));
    std::string bytes;
    EncodePoolChange(change, &bytes);
    // The record's last tag: the last call's, or the record's own.
    const size_t tag_at = bytes.size() - 9;
    std::string no_id = bytes;
    std::memset(no_id.data() + tag_at, 0, 8);
    no_id.back() = 1;
    EXPECT_THAT(DecodePoolChange(no_id, kGeometry, &decoded),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr("a retry without a call id")));
    std::string bad_bool = bytes;
    bad_bool.back() = 2;
    EXPECT_THAT(
        DecodePoolChange(bad_bool, kGeometry, &decoded),
        StatusIs(absl::StatusCode::kDataLoss, HasSubstr("out of range")));
    // No id and no retry: an untagged call.
    no_id.back() = 0;
    ASSERT_OK(DecodePoolChange(no_id, kGeometry, &decoded));
  }

  PoolChange free;
  free.kind = PoolChangeKind::kFree;
  free.owner = 3;
  free.call = {0, true};
  std::string bytes;
  EncodePoolChange(free, &bytes);
  EXPECT_EQ(bytes.back(), 0);
  ASSERT_OK(DecodePoolChange(bytes, kGeometry, &decoded));
  EXPECT_EQ(decoded.change().call, CallTag());
  const std::vector<CallSpan> calls = {{0, false, {0, true}}};
  PoolChange allocate;
  allocate.kind = PoolChangeKind::kAllocate;
  allocate.calls = calls;
  bytes.clear();
  EncodePoolChange(allocate, &bytes);
  EXPECT_EQ(bytes.back(), 0);
  ASSERT_OK(DecodePoolChange(bytes, kGeometry, &decoded));
  EXPECT_EQ(decoded.change().calls[0].call, CallTag());
}

TEST(PoolStateCodecTest, RecordsAppendToTheCallersBuffer) {
  Records records;
  std::string bytes = "head";
  EncodePoolChange(records.changes[2], &bytes);
  const size_t first = bytes.size();
  EncodePoolChange(records.changes[4], &bytes);
  EXPECT_EQ(bytes.substr(0, 4), "head");
  DecodedPoolChange decoded;
  ASSERT_OK(DecodePoolChange(absl::string_view(bytes).substr(4, first - 4),
                             kGeometry, &decoded));
  EXPECT_EQ(ChangeDifference(records.changes[2], decoded.change()), "");
  ASSERT_OK(DecodePoolChange(absl::string_view(bytes).substr(first), kGeometry,
                             &decoded));
  EXPECT_EQ(ChangeDifference(records.changes[4], decoded.change()), "");
}

TEST(PoolStateCodecTest, StateRoundTrips) {
  for (const bool scrub : {true, false}) {
    PoolState state = RichState();
    state.scrub = scrub;
    if (!scrub) state.last_owner.clear();
    std::string bytes;
    EncodePoolState(state, &bytes);
    ASSERT_OK_AND_ASSIGN(const PoolState decoded,
                         DecodePoolState(bytes, kGeometry));
    EXPECT_EQ(FirstDifference(state, decoded), "");
    EXPECT_EQ(decoded, state);
  }
}

// State format 1 (a journal taken over from a build of journal format 2 or
// older keeps it) is format 2 without the owners' pages awaiting release:
// written without them (and without their latest calls, which format 2
// lacks too), and read by this build.
TEST(PoolStateCodecTest, StateFormat1LeavesOutThePagesAwaitingRelease) {
  const PoolState state = RichState();
  std::string bytes;
  EncodePoolState(state, &bytes, 1);
  std::string format2;
  EncodePoolState(state, &format2, 2);
  EXPECT_EQ(bytes[4], 1);
  EXPECT_EQ(
      format2.size() - bytes.size(),
      8 * state.owners.size() + 8 * state.owners[0].awaiting_release.size());
  ASSERT_OK_AND_ASSIGN(const PoolState decoded,
                       DecodePoolState(bytes, kGeometry));
  PoolState expected = state;
  for (PoolOwnerState& owner : expected.owners) {
    owner.awaiting_release.clear();
    owner.kept_calls.clear();
  }
  EXPECT_EQ(FirstDifference(decoded, expected), "");
}

// State format 3 keeps each owner's latest calls after its pages awaiting
// release: a 4-byte count, then 52 bytes a call and 8 a page. Format 2 (a
// journal taken over from a build of journal format 3 keeps it) is format
// 3 without them: written without them, and read by this build with every
// owner's kept calls empty.
TEST(PoolStateCodecTest, StateFormat3KeepsEachOwnersLatestCalls) {
  const PoolState state = RichState();
  ASSERT_EQ(state.owners[0].kept_calls.size(), 2u);
  ASSERT_FALSE(state.owners[0].kept_calls[1].pages.empty());
  std::string newest;
  EncodePoolState(state, &newest);
  EXPECT_EQ(newest[4], 3);
  ASSERT_OK_AND_ASSIGN(const PoolState decoded,
                       DecodePoolState(newest, kGeometry));
  EXPECT_EQ(decoded.owners[0].kept_calls, state.owners[0].kept_calls);
  EXPECT_TRUE(decoded.owners[1].kept_calls.empty());
  EXPECT_EQ(FirstDifference(decoded, state), "");

  std::string bytes;
  EncodePoolState(state, &bytes, 2);
  EXPECT_EQ(bytes[4], 2);
  EXPECT_EQ(newest.size() - bytes.size(),
            4 * state.owners.size() + (8 + 4 + 8 + 8 + 8 + 8 + 8) * 2 +
                8 * state.owners[0].kept_calls[1].pages.size());
  ASSERT_OK_AND_ASSIGN(const PoolState older,
                       DecodePoolState(bytes, kGeometry));
  PoolState expected = state;
  for (PoolOwnerState& owner : expected.owners) owner.kept_calls.clear();
  EXPECT_EQ(FirstDifference(older, expected), "");
  // The pages awaiting release are still there.
  EXPECT_EQ(older.owners[0].awaiting_release, state.owners[0].awaiting_release);
}

// The latest call's pages are bounded like every other list of pages: by
// the pool's pages, and by the bytes left before anything is reserved.
TEST(PoolStateCodecTest, ALatestCallsPagesAreBounded) {
  std::string state;
  EncodePoolState(RichState(), &state);
  // Owner 4's latest call: its id, then 44 bytes on its pages' count.
  const uint64_t id = 0x0102030405060708ULL;
  const size_t id_at = state.find(std::string(
      reinterpret_cast<const char*>(&id), sizeof(id)));  // little-endian
  ASSERT_NE(id_at, std::string::npos);
  const size_t count_at = id_at + 8 + 4 + 8 + 8 + 8 + 8;
  uint64_t count = 0;
  std::memcpy(&count, state.data() + count_at, 8);
  ASSERT_EQ(count, RichState().owners[0].kept_calls[1].pages.size());

  auto with_count = [&](uint64_t n, size_t keep) {
    std::string bytes = state.substr(0, keep);
    std::memcpy(bytes.data() + count_at, &n, 8);
    return bytes;
  };
  // More pages than the pool has.
  EXPECT_THAT(DecodePoolState(with_count(kGeometry.num_pages + 1, state.size()),
                              kGeometry),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("owner kept call pages at byte")));
  EXPECT_THAT(
      DecodePoolState(with_count(~uint64_t{0}, state.size()), kGeometry),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("out of range")));
  // As many as the pool has, with the bytes of two.
  EXPECT_THAT(
      DecodePoolState(with_count(kGeometry.num_pages, count_at + 8 + 16),
                      kGeometry),
      StatusIs(absl::StatusCode::kDataLoss,
               HasSubstr("owner kept call pages at byte")));
  EXPECT_THAT(
      DecodePoolState(with_count(kGeometry.num_pages, count_at + 8 + 16),
                      kGeometry),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  // Owners are bounded by format 3's smallest owner (68 bytes: format 2's
  // 64 and the kept calls' count): in a state of no owners and empty
  // lists, the 144 bytes after the owners' count (the prefix index's two
  // counts and the counters) cannot hold three.
  PoolState empty;
  empty.num_pages = kGeometry.num_pages;
  empty.page_size = kGeometry.page_size;
  std::string few;
  EncodePoolState(empty, &few);
  const size_t owners_at = 48 + 8 + 8 + 8 * (kGeometry.num_pages + 1) + 6;
  ASSERT_EQ(few.size(), owners_at + 8 + 8 + 8 + 16 * 8);
  few[owners_at] = 3;
  EXPECT_THAT(
      DecodePoolState(few, kGeometry),
      StatusIs(absl::StatusCode::kDataLoss,
               AllOf(HasSubstr("owners at byte"), HasSubstr("truncated"))));
}

TEST(PoolStateCodecTest, RefusesOtherVersionsGeometriesAndTrailingBytes) {
  std::string state;
  EncodePoolState(RichState(), &state);
  EXPECT_THAT(
      DecodePoolState(state, {16, 41}),
      StatusIs(absl::StatusCode::kDataLoss,
               HasSubstr("a pool of 40 pages of 16; this pool has 41")));
  std::string newer = state;
  newer[4] = 4;
  EXPECT_THAT(DecodePoolState(newer, kGeometry),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("format version 4; this decoder reads "
                                 "versions 1..3")));
  EXPECT_THAT(DecodePoolState(state + "x", kGeometry),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("1 bytes past the state")));
  EXPECT_THAT(
      DecodePoolState("PPSU" + state.substr(4), kGeometry),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not a pool state")));

  Records records;
  std::string change;
  EncodePoolChange(records.changes[0], &change);
  DecodedPoolChange decoded;
  change[0] = 9;
  EXPECT_THAT(DecodePoolChange(change, kGeometry, &decoded),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("format version 9")));
  change[0] = 5;
  EXPECT_THAT(DecodePoolChange(change, kGeometry, &decoded),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("format version 5; this decoder reads "
                                 "versions 1..4")));
  change[0] = kPoolChangeFormatVersion;
  change[1] = 14;
  EXPECT_THAT(
      DecodePoolChange(change, kGeometry, &decoded),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("unknown kind 14")));
  // Pages awaiting release came with format 3: a record of format 2 that
  // says it is one is no record a build of format 2 could have written.
  std::string awaiting;
  EncodePoolChange(records.changes.back(), &awaiting);
  ASSERT_EQ(records.changes.back().kind, PoolChangeKind::kAwaitRelease);
  ASSERT_OK(DecodePoolChange(awaiting, kGeometry, &decoded));
  awaiting[0] = 2;
  EXPECT_THAT(DecodePoolChange(awaiting, kGeometry, &decoded),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("unknown kind 13 in format 2")));
  EXPECT_FALSE(PoolChangeFormatHolds(2, PoolChangeKind::kAwaitRelease));
  EXPECT_TRUE(PoolChangeFormatHolds(2, PoolChangeKind::kUnpin));
  change[1] = 1;
  EXPECT_THAT(
      DecodePoolChange(change + std::string(1, '\0'), kGeometry, &decoded),
      StatusIs(absl::StatusCode::kDataLoss,
               HasSubstr("1 bytes past the record")));
}

// A match records what its walk found: an adopt 8 bytes a page it took,
// a plain match or a refused adopt no page at all, however long the chain
// (format 1 recorded 32 bytes a key).
TEST(PoolStateCodecTest, AMatchRecordHoldsThePagesItTookNotItsKeys) {
  std::vector<int64_t> pages(2048);
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = 1 + i;
  PoolChange adopt;
  adopt.kind = PoolChangeKind::kMatchPrefix;
  adopt.owner = 3;
  adopt.adopt = true;
  adopt.keys_looked_up = 2050;
  adopt.pages_found = 2048;
  adopt.pages = pages;
  std::string bytes;
  EncodePoolChange(adopt, &bytes);
  EXPECT_EQ(bytes.size(), 2 + 8 + 1 + 1 + 3 * 4 + 2048 * 8);
  DecodedPoolChange decoded;
  ASSERT_OK(DecodePoolChange(bytes, {16, 4096}, &decoded));
  EXPECT_EQ(ChangeDifference(decoded.change(), adopt), "");

  PoolChange plain = adopt;
  plain.adopt = false;
  plain.pages = {};
  bytes.clear();
  EncodePoolChange(plain, &bytes);
  EXPECT_EQ(bytes.size(), 2 + 8 + 1 + 1 + 3 * 4);
  ASSERT_OK(DecodePoolChange(bytes, {16, 4096}, &decoded));
  EXPECT_EQ(ChangeDifference(decoded.change(), plain), "");

  // More found than looked up, or more looked up than the pool has pages,
  // is no record.
  bytes[2 + 8 + 1 + 1 + 4] = '\x05';  // pages_found 2053 > 2050
  bytes[2 + 8 + 1 + 1 + 5] = '\x08';
  EXPECT_THAT(DecodePoolChange(bytes, {16, 4096}, &decoded),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("pages_found")));
  EXPECT_THAT(DecodePoolChange(bytes, {16, 2049}, &decoded),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("pages_found")));
}

// Records of format 1, which a kept state of an earlier release holds
// (and this build appends to it), encode and decode: every kind as in
// format 3 (untagged) but a match, which holds the keys the caller gave
// (and Replay walks them).
TEST(PoolStateCodecTest, RecordsOfFormat1StillDecode) {
  Records records;
  DecodedPoolChange decoded;
  for (const PoolChange& change : records.changes) {
    if (change.kind == PoolChangeKind::kMatchPrefix ||
        !PoolChangeFormatHolds(1, change.kind)) {
      continue;
    }
    std::string bytes;
    EncodePoolChange(change, &bytes, 1);
    std::string format3;
    EncodePoolChange(change, &format3, 3);
    EXPECT_EQ(bytes.substr(1), format3.substr(1))
        << PoolChangeKindName(change.kind);
    ASSERT_EQ(bytes[0], 1);
    ASSERT_OK(DecodePoolChange(bytes, kGeometry, &decoded));
    std::vector<CallSpan> calls;
    EXPECT_EQ(ChangeDifference(decoded.change(), Untagged(change, &calls)), "")
        << PoolChangeKindName(change.kind);
  }
  std::string match("\x01\x0a", 2);
  match += std::string("\x07\x00\x00\x00\x00\x00\x00\x00", 8);  // owner
  match += std::string("\x01\x00", 2);  // adopt, not refused
  match += std::string("\x02\x00\x00\x00", 4);
  for (int tag : {5, 6}) {
    const PrefixKey key = Key(tag);
    match.append(reinterpret_cast<const char*>(key.data()), key.size());
  }
  ASSERT_OK(DecodePoolChange(match, kGeometry, &decoded));
  const PoolChange& change = decoded.change();
  EXPECT_EQ(change.kind, PoolChangeKind::kMatchPrefix);
  EXPECT_EQ(change.owner, 7u);
  EXPECT_TRUE(change.adopt);
  EXPECT_FALSE(change.refused);
  const std::vector<PrefixKey> keys = {Key(5), Key(6)};
  EXPECT_TRUE(std::equal(change.keys.begin(), change.keys.end(), keys.begin(),
                         keys.end()));
  EXPECT_TRUE(change.pages.empty());
  EXPECT_EQ(change.keys_looked_up, 0);
  std::string again;
  EncodePoolChange(change, &again, 1);
  EXPECT_EQ(again, match);
  EXPECT_THAT(
      DecodePoolChange(match.substr(0, match.size() - 1), kGeometry, &decoded),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("key")));
}

// Counts are checked against the geometry and the bytes left before
// anything is reserved: a short record claiming 2^32 - 1 requests, or a
// free of more pages than the pool has, is refused at once.
TEST(PoolStateCodecTest, CountsAreBoundedBeforeAnythingIsReserved) {
  DecodedPoolChange decoded;
  const std::string huge_batch = std::string("\x01\x03\xff\xff\xff\xff", 6) +
                                 std::string("\x00\x00\x00\x00\x00", 5);
  EXPECT_THAT(DecodePoolChange(huge_batch, kGeometry, &decoded),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("do not fit in the bytes left")));
  std::string big_free("\x01\x04", 2);
  big_free += std::string(8, '\x01');              // owner
  big_free += std::string("\x29\x00\x00\x00", 4);  // 41 pages > 40
  big_free += std::string(4, '\x00') + std::string(41 * 8, '\x02');
  EXPECT_THAT(DecodePoolChange(big_free, kGeometry, &decoded),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("out of range")));
  std::string state;
  EncodePoolState(RichState(), &state);
  // The free list's count, 8 bytes after the header.
  const size_t free_count_at = 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8;
  for (int b = 0; b < 8; ++b) state[free_count_at + b] = '\xff';
  EXPECT_THAT(DecodePoolState(state, kGeometry),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("free_pages")));
}

// Every prefix of a valid encoding is refused: each field is read only when
// its bytes are there.
TEST(PoolStateCodecTest, EveryTruncationIsRefused) {
  Records records;
  DecodedPoolChange decoded;
  for (const PoolChange& change : records.changes) {
    std::string bytes;
    EncodePoolChange(change, &bytes);
    for (size_t n = 0; n < bytes.size(); ++n) {
      const absl::Status status = DecodePoolChange(
          absl::string_view(bytes).substr(0, n), kGeometry, &decoded);
      ASSERT_EQ(status.code(), absl::StatusCode::kDataLoss)
          << PoolChangeKindName(change.kind) << " cut at " << n << ": "
          << status;
    }
  }
  std::string state;
  EncodePoolState(RichState(), &state);
  for (size_t n = 0; n < state.size(); ++n) {
    const auto decoded_state =
        DecodePoolState(absl::string_view(state).substr(0, n), kGeometry);
    ASSERT_EQ(decoded_state.status().code(), absl::StatusCode::kDataLoss)
        << "cut at " << n << ": " << decoded_state.status();
  }
}

// Random flips of valid encodings, and random bytes behind a valid header,
// decode to an error or to a value, which then encodes back to the same
// bytes (the encoding is canonical: strict bools, zero padding bits).
TEST(PoolStateCodecTest, RandomFlipsAndBytesNeverCrash) {
  std::mt19937_64 rng(20240611);
  Records records;
  DecodedPoolChange decoded;
  std::vector<std::string> changes;
  for (const PoolChange& change : records.changes) {
    EncodePoolChange(change, &changes.emplace_back());
  }
  std::string state;
  EncodePoolState(RichState(), &state);
  int64_t refused = 0;
  int64_t accepted = 0;
  for (int round = 0; round < 20000; ++round) {
    const bool of_state = round % 4 == 0;
    std::string bytes = of_state ? state : changes[round % changes.size()];
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
    }
    if (round % 7 == 0) bytes.resize(rng() % (bytes.size() + 1));
    if (of_state) {
      const auto decoded_state = DecodePoolState(bytes, kGeometry);
      if (!decoded_state.ok()) {
        ++refused;
        continue;
      }
      ++accepted;
      std::string again;
      EncodePoolState(*decoded_state, &again, static_cast<uint8_t>(bytes[4]));
      ASSERT_EQ(again, bytes) << "round " << round;
    } else {
      if (!DecodePoolChange(bytes, kGeometry, &decoded).ok()) {
        ++refused;
        continue;
      }
      ++accepted;
      std::string again;
      EncodePoolChange(decoded.change(), &again,
                       static_cast<uint8_t>(bytes[0]));
      ASSERT_EQ(again, bytes) << "round " << round;
    }
  }
  EXPECT_GT(refused, 1000);
  EXPECT_GT(accepted, 1000);
  // Random bytes after a valid version and each kind.
  for (int round = 0; round < 20000; ++round) {
    std::string bytes(2 + rng() % 120, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    bytes[0] = static_cast<char>(
        kMinPoolChangeFormatVersion +
        round / kMaxPoolChangeKind %
            (kPoolChangeFormatVersion - kMinPoolChangeFormatVersion + 1));
    bytes[1] = static_cast<char>(1 + round % kMaxPoolChangeKind);
    (void)DecodePoolChange(bytes, kGeometry, &decoded);
    std::string state_bytes = state.substr(0, 64);
    for (size_t i = 64; i < 64 + rng() % 600; ++i) {
      state_bytes.push_back(static_cast<char>(rng()));
    }
    (void)DecodePoolState(state_bytes, kGeometry);
  }
}

}  // namespace
}  // namespace pagealloc
