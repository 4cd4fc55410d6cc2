#include "fast_channel/codec.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace fast_channel {
namespace {

using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// One channel's memory, as the daemon would create it (zeroed).
class CodecTest : public ::testing::Test {
 protected:
  static constexpr Capacity kCapacity{/*max_requests=*/8,
                                      /*message_bytes=*/64};

  CodecTest()
      : bytes_(ChannelLayout(kCapacity.max_requests, kCapacity.message_bytes)
                   .total_bytes),
        // Zeroed and aligned as a fresh mapping is (the header is
        // alignas(64)).
        memory_(static_cast<char*>(std::aligned_alloc(64, bytes_)), &std::free),
        daemon_((std::memset(memory_.get(), 0, bytes_), memory_.get()),
                kCapacity),
        client_(memory_.get(), kCapacity) {
    daemon_.Initialize();
  }

  const size_t bytes_;
  std::unique_ptr<char, decltype(&std::free)> memory_;
  ChannelCodec daemon_;
  ChannelCodec client_;
};

TEST_F(CodecTest, ValidateCapacityRefusesTinyChannels) {
  EXPECT_THAT(ValidateCapacity({0, 64}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_requests (0)")));
  EXPECT_THAT(ValidateCapacity({1, 63}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("message_bytes (63)")));
  EXPECT_OK(ValidateCapacity({1, 64}));
}

TEST_F(CodecTest, ANewChannelAsksForItsDoorbellUntilThePollerSaysOtherwise) {
  // The poller that will serve a new channel may be asleep.
  EXPECT_TRUE(client_.PollerSleeping());
  daemon_.SetPollerSleeping(false);
  EXPECT_FALSE(client_.PollerSleeping());
  daemon_.SetPollerSleeping(true);
  EXPECT_TRUE(client_.PollerSleeping());
}

TEST_F(CodecTest, ClientAcceptsTheHeaderTheDaemonWrote) {
  EXPECT_OK(client_.CheckHeader());
  ChannelCodec other(memory_.get(), {4, 64});
  EXPECT_THAT(other.CheckHeader(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("does not match")));
  daemon_.header()->version = kVersion + 1;
  EXPECT_THAT(
      client_.CheckHeader(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("version")));
}

TEST_F(CodecTest, ExtendCallRoundTrips) {
  const std::vector<int64_t> prefix = {0, 4}, seq = {3, 9}, last = {-1, 7};
  const std::vector<int64_t> free_first = {5};
  ASSERT_OK(client_.PostCall(
      {CallKind::kExtend, kCheckpointFirst, 12, prefix, seq, last, free_first},
      /*seq=*/1));
  EXPECT_EQ(daemon_.PostedSeq(), 1u);
  TakenCall call;
  ASSERT_OK(daemon_.TakeCall(&call));
  EXPECT_EQ(call.kind, CallKind::kExtend);
  EXPECT_EQ(call.options, kCheckpointFirst);
  EXPECT_EQ(call.release_ring_up_to, 12);
  EXPECT_EQ(call.num_requests, 2);
  EXPECT_THAT(call.in0, ElementsAre(0, 4));
  EXPECT_THAT(call.in1, ElementsAre(3, 9));
  EXPECT_THAT(call.in2, ElementsAre(-1, 7));
  EXPECT_THAT(call.free_first, ElementsAre(5));
}

TEST_F(CodecTest, AFreeCarriesItsReleaseValueAndNoOtherKindDoes) {
  const std::vector<int64_t> pages = {2, 3};
  CallView free_call{CallKind::kFreePages, 0, 0, {}, pages, {}, {}};
  free_call.release_value = 41;
  ASSERT_OK(client_.PostCall(free_call, 1));
  TakenCall call;
  ASSERT_OK(daemon_.TakeCall(&call));
  EXPECT_EQ(call.release_value, 41u);
  // A value left in the header means nothing to an allocation call.
  const std::vector<int64_t> seq = {3}, last = {7};
  ASSERT_OK(client_.PostCall({CallKind::kDecode, 0, 0, {}, seq, last, {}}, 2));
  daemon_.header()->release_value = 99;
  ASSERT_OK(daemon_.TakeCall(&call));
  EXPECT_EQ(call.release_value, 0u);
  // The word the client's stream writes is what the daemon reads.
  EXPECT_EQ(daemon_.ReadReleaseWord(), 0u);
  client_.release_word()->store(7);
  EXPECT_EQ(daemon_.ReadReleaseWord(), 7u);
}

TEST_F(CodecTest, ACallCarriesItsIdAndARetryNeedsOne) {
  const std::vector<int64_t> seq = {3}, last = {7};
  CallView decode{CallKind::kDecode, kRetry, 0, {}, seq, last, {}};
  decode.call_id = 12;
  ASSERT_OK(client_.PostCall(decode, 1));
  TakenCall call;
  ASSERT_OK(daemon_.TakeCall(&call));
  EXPECT_EQ(call.call_id, 12u);
  EXPECT_EQ(call.options & kRetry, kRetry);
  // A retry without an id is refused.
  decode.call_id = 0;
  ASSERT_OK(client_.PostCall(decode, 2));
  EXPECT_THAT(daemon_.TakeCall(&call),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("without a call_id")));
  // A match carries none, whatever the header says, and may not retry.
  const std::string keys(kKeyBytes, 'k');
  CallView match{CallKind::kMatchPrefix, 0, 0, {}, {}, {}, {}};
  match.keys = keys;
  ASSERT_OK(client_.PostCall(match, 3));
  daemon_.header()->call_id = 99;
  ASSERT_OK(daemon_.TakeCall(&call));
  EXPECT_EQ(call.call_id, 0u);
  daemon_.header()->options = kRetry;
  EXPECT_THAT(daemon_.TakeCall(&call),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0x40")));
}

TEST_F(CodecTest, TakenCallIsACopyTheClientCannotChange) {
  const std::vector<int64_t> seq = {3}, last = {7};
  ASSERT_OK(client_.PostCall({CallKind::kDecode, 0, 0, {}, seq, last, {}}, 1));
  TakenCall call;
  ASSERT_OK(daemon_.TakeCall(&call));
  // The client scribbles over the whole channel after the daemon took it.
  std::memset(memory_.get() + sizeof(ChannelHeader), 0xff,
              bytes_ - sizeof(ChannelHeader));
  EXPECT_THAT(call.in1, ElementsAre(3));
  EXPECT_THAT(call.in2, ElementsAre(7));
  EXPECT_THAT(call.in0, IsEmpty());
}

TEST_F(CodecTest, OperationsCarryOnlyTheirArrays) {
  const std::vector<int64_t> pages = {2, 3};
  ASSERT_OK(
      client_.PostCall({CallKind::kFreePages, 0, 0, {}, pages, {}, {}}, 1));
  TakenCall call;
  ASSERT_OK(daemon_.TakeCall(&call));
  EXPECT_THAT(call.in1, ElementsAre(2, 3));
  EXPECT_THAT(call.free_first, IsEmpty());
  // A checkpoint ignores whatever counts the header holds.
  ASSERT_OK(client_.PostCall({CallKind::kCheckpoint, 0, 0, {}, {}, {}, {}}, 2));
  daemon_.header()->num_requests = -5;
  daemon_.header()->num_free_first = 1 << 30;
  ASSERT_OK(daemon_.TakeCall(&call));
  EXPECT_EQ(call.num_requests, 0);
  EXPECT_THAT(call.in1, IsEmpty());
}

// A rollback carries nothing (the latest checkpoint) or a checkpoint id; a
// free carries its order in the option bits.
TEST_F(CodecTest, RollbackCarriesACheckpointIdAndFreeItsOrder) {
  const std::vector<int64_t> id = {3};
  ASSERT_OK(client_.PostCall({CallKind::kRollback, 0, 0, {}, id, {}, {}}, 1));
  TakenCall call;
  ASSERT_OK(daemon_.TakeCall(&call));
  EXPECT_THAT(call.in1, ElementsAre(3));
  ASSERT_OK(client_.PostCall({CallKind::kRollback, 0, 0, {}, {}, {}, {}}, 2));
  ASSERT_OK(daemon_.TakeCall(&call));
  EXPECT_THAT(call.in1, IsEmpty());
  const std::vector<int64_t> slots = {8, 4};
  ASSERT_OK(client_.PostCall(
      {CallKind::kFreeSlots, kFreeAscending, 0, {}, slots, {}, {}}, 3));
  ASSERT_OK(daemon_.TakeCall(&call));
  EXPECT_EQ(call.options, kFreeAscending);
  ASSERT_OK(client_.PostCall(
      {CallKind::kAlloc, kAllOrNothing, 0, {}, slots, {}, {}}, 4));
  ASSERT_OK(daemon_.TakeCall(&call));
  EXPECT_EQ(call.options, kAllOrNothing);
}

// kKeyBytes-long keys, distinct: `first`, `first` + 1, ...
std::vector<std::string> Keys(int first, int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) {
    std::string key(kKeyBytes, 'k');
    key[0] = static_cast<char>(first + i);
    keys.push_back(key);
  }
  return keys;
}

TEST_F(CodecTest, AMatchCarriesItsKeysAndItsAnswerThePagesFound) {
  const std::vector<std::string> keys = Keys(1, 3);
  const std::string packed = absl::StrJoin(keys, "");
  CallView match;
  match.kind = CallKind::kMatchPrefix;
  match.options = kAdopt;
  match.keys = packed;
  ASSERT_OK(client_.PostCall(match, 1));
  // Counts a match does not use mean nothing to it.
  daemon_.header()->num_free_first = 1 << 30;
  TakenCall call;
  ASSERT_OK(daemon_.TakeCall(&call));
  EXPECT_EQ(call.kind, CallKind::kMatchPrefix);
  EXPECT_EQ(call.options, kAdopt);
  EXPECT_EQ(call.num_requests, 3);
  ASSERT_EQ(call.keys.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(call.key(i), keys[i]) << i;
  EXPECT_THAT(call.in0, IsEmpty());
  EXPECT_THAT(call.in1, IsEmpty());
  EXPECT_THAT(call.free_first, IsEmpty());
  // A copy: the client scribbling over its key area changes nothing taken.
  std::memset(memory_.get() + sizeof(ChannelHeader), 0xff,
              bytes_ - sizeof(ChannelHeader));
  EXPECT_EQ(call.key(2), keys[2]);

  // The longest prefix found: two pages of three keys.
  const std::vector<int64_t> pages = {7, 3};
  ASSERT_OK(daemon_.WriteMatchedPages(pages));
  daemon_.Publish(1);
  EXPECT_OK(client_.CallStatus());
  EXPECT_THAT(client_.ReadMatchedPages(3), IsOkAndHolds(ElementsAre(7, 3)));
  // None found is an answer too.
  ASSERT_OK(daemon_.WriteMatchedPages({}));
  EXPECT_THAT(client_.ReadMatchedPages(3), IsOkAndHolds(IsEmpty()));
  // A count the client did not ask for is not believed.
  for (const int64_t hostile : {int64_t{-1}, int64_t{4}, int64_t{1} << 40}) {
    daemon_.header()->op_value = hostile;
    EXPECT_THAT(client_.ReadMatchedPages(3),
                StatusIs(absl::StatusCode::kInternal, HasSubstr("malformed")))
        << hostile;
  }
  // The daemon writes no more pages than the channel holds.
  const std::vector<int64_t> nine(9, 1);
  EXPECT_THAT(daemon_.WriteMatchedPages(nine),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("9 pages")));
}

// The client stores only the key lines that differ from the last call's
// and the daemon only the answer lines that differ: what each side reads
// is the new call and the new answer whatever the last ones were.
TEST_F(CodecTest, AMatchAfterAnotherReadsAsItsOwn) {
  const std::vector<std::string> first = Keys(1, 5);
  std::vector<std::string> second = first;
  second[2] = Keys(40, 1)[0];  // one key changed in place
  second.push_back(Keys(50, 1)[0]);
  const std::vector<std::vector<std::string>> chains = {
      first, second, first, {first[0]}, second};
  uint32_t seq = 0;
  for (const std::vector<std::string>& chain : chains) {
    const std::string packed = absl::StrJoin(chain, "");
    CallView match;
    match.kind = CallKind::kMatchPrefix;
    match.keys = packed;
    ASSERT_OK(client_.PostCall(match, ++seq));
    TakenCall call;
    ASSERT_OK(daemon_.TakeCall(&call));
    ASSERT_EQ(call.keys.size(), chain.size()) << seq;
    for (size_t i = 0; i < chain.size(); ++i) {
      EXPECT_EQ(call.key(i), chain[i]) << seq << " " << i;
    }
    // Pages that differ from the last answer's in some places, not others.
    std::vector<int64_t> pages(chain.size());
    for (size_t i = 0; i < chain.size(); ++i) {
      pages[i] =
          static_cast<int64_t>(seq % 2 == 0 || i % 3 == 0 ? i + 1 : 100 + i);
    }
    ASSERT_OK(daemon_.WriteMatchedPages(pages));
    daemon_.Publish(seq);
    EXPECT_OK(client_.CallStatus());
    ASSERT_OK_AND_ASSIGN(const absl::Span<const int64_t> read,
                         client_.ReadMatchedPages(chain.size()));
    EXPECT_EQ(std::vector<int64_t>(read.begin(), read.end()), pages) << seq;
  }
}

TEST_F(CodecTest, ClientPostsOnlyWellFormedMatches) {
  std::string keys = absl::StrJoin(Keys(1, 2), "");
  keys.pop_back();
  CallView match;
  match.kind = CallKind::kMatchPrefix;
  match.keys = keys;
  EXPECT_THAT(client_.PostCall(match, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("are 63 bytes, not a whole number of 32")));
  const std::string nine = absl::StrJoin(Keys(1, 9), "");
  match.keys = nine;
  EXPECT_THAT(
      client_.PostCall(match, 1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 8")));
  // The keys take the int64 arrays' memory: a match carries nothing else,
  // and nothing else carries keys.
  const std::string two = absl::StrJoin(Keys(1, 2), "");
  const std::vector<int64_t> values = {1};
  match.keys = two;
  match.in1 = values;
  EXPECT_THAT(
      client_.PostCall(match, 1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keys only")));
  CallView decode{CallKind::kDecode, 0, 0, {}, values, values, {}};
  decode.keys = two;
  EXPECT_THAT(client_.PostCall(decode, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("only a fast-channel match carries keys")));
  EXPECT_EQ(daemon_.PostedSeq(), 0u);
}

TEST_F(CodecTest, ClientCannotPostMoreThanTheCapacity) {
  const std::vector<int64_t> nine(9, 1);
  EXPECT_THAT(
      client_.PostCall({CallKind::kAlloc, 0, 0, {}, nine, {}, {}}, 1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 8")));
  EXPECT_EQ(daemon_.PostedSeq(), 0u);
}

// Every field a hostile client can set, at the edges; the daemon's codec
// refuses each with a message naming it and copies nothing.
struct HostileHeader {
  const char* name;
  uint32_t kind;
  int32_t num_requests;
  uint32_t options;
  int32_t num_free_first;
  const char* message;
};

class HostileHeaderTest : public CodecTest,
                          public ::testing::WithParamInterface<HostileHeader> {
};

TEST_P(HostileHeaderTest, IsRefused) {
  const HostileHeader& hostile = GetParam();
  ChannelHeader* h = daemon_.header();
  h->kind = hostile.kind;
  h->num_requests = hostile.num_requests;
  h->options = hostile.options;
  h->num_free_first = hostile.num_free_first;
  // The capacity the header claims is never believed.
  h->max_requests = std::numeric_limits<int32_t>::max();
  h->message_bytes = std::numeric_limits<int32_t>::max();
  TakenCall call;
  EXPECT_THAT(
      daemon_.TakeCall(&call),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(hostile.message)));
  EXPECT_TRUE(call.in0_storage.empty() && call.in1_storage.empty());
  EXPECT_TRUE(call.key_storage.empty());
}

INSTANTIATE_TEST_SUITE_P(
    Fields, HostileHeaderTest,
    ::testing::Values(
        HostileHeader{"kind_zero", 0, 1, 0, 0, "unknown call kind 0"},
        HostileHeader{"kind_huge", 0xffffffff, 1, 0, 0, "unknown call kind"},
        HostileHeader{"negative_requests", 2, -1, 0, 0, "num_requests (-1)"},
        HostileHeader{"too_many_requests", 1, 9, 0, 0, "num_requests (9)"},
        HostileHeader{"int_max_requests", 3, std::numeric_limits<int>::max(), 0,
                      0, "is outside [0, 8]"},
        HostileHeader{"negative_free_first", 2, 1, 0, -3,
                      "num_free_first (-3)"},
        HostileHeader{"too_many_free_first", 1, 1, 0, 9, "num_free_first (9)"},
        HostileHeader{"unknown_options", 2, 1, 0x80, 0,
                      "unknown option bits 0x80"},
        // A match's keys: their count is all that says where they end (a
        // key is kKeyBytes long), so every count that would read past the
        // key area is refused, including those whose byte count overflows
        // 32 bits.
        HostileHeader{"match_negative_keys", 8, -1, kAdopt, 0,
                      "num_requests (-1) is outside [0, 8]: the key area"},
        HostileHeader{"match_smallest_count", 8,
                      std::numeric_limits<int>::min(), kAdopt, 0,
                      "num_requests (-2147483648)"},
        HostileHeader{"match_one_key_past_the_area", 8, 9, 0, 0,
                      "the key area holds 8 keys of 32 bytes (256 bytes)"},
        HostileHeader{"match_key_bytes_past_int32", 8, 1 << 26, kAdopt, 0,
                      "num_requests (67108864)"},
        HostileHeader{"match_int_max_keys", 8, std::numeric_limits<int>::max(),
                      kAdopt, 0, "num_requests (2147483647)"},
        HostileHeader{"match_with_an_allocation_option", 8, 1,
                      kAdopt | kAllOrNothing, 0,
                      "option bits 0x4 do not apply to call kind 8"},
        HostileHeader{"adopt_on_a_decode", 2, 1, kAdopt, 0,
                      "option bits 0x20 do not apply to call kind 2"},
        HostileHeader{"kind_past_the_last", 9, 1, 0, 0, "unknown call kind 9"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST_F(CodecTest, PerRequestAnswerRoundTrips) {
  daemon_.BeginResults();
  daemon_.Accepted(0, /*ring_offset=*/16, /*count=*/3, /*new_pages=*/1);
  daemon_.Refused(1, absl::ResourceExhaustedError("out of pages"));
  daemon_.Accepted(2, 19, 1, 0);
  daemon_.FinishResults(3, /*ring_end=*/20, /*pages_freed_first=*/2,
                        /*batch_requests=*/40, /*launch_id=*/7,
                        /*completion_value=*/0x123456789abcdef0);
  daemon_.Publish(5);
  EXPECT_TRUE(client_.Answered(5));
  EXPECT_OK(client_.CallStatus());
  AllocAnswerView answer;
  ASSERT_OK(client_.ReadAllocAnswer(3, &answer));
  EXPECT_THAT(
      answer.codes,
      ElementsAre(0, static_cast<int>(absl::StatusCode::kResourceExhausted),
                  0));
  EXPECT_THAT(answer.ring_offsets, ElementsAre(16, 0, 19));
  EXPECT_THAT(answer.counts, ElementsAre(3, 0, 1));
  EXPECT_THAT(answer.new_pages, ElementsAre(1, 0, 0));
  EXPECT_THAT(answer.messages, ElementsAre("out of pages"));
  EXPECT_EQ(answer.ring_end, 20);
  EXPECT_EQ(answer.pages_freed_first, 2);
  EXPECT_EQ(answer.batch_requests, 40);
  EXPECT_EQ(answer.launch_id, 7u);
  EXPECT_EQ(answer.completion_value, 0x123456789abcdef0u);
  EXPECT_THAT(client_.ReadAllocAnswer(4, &answer),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("3 results")));
}

TEST_F(CodecTest, MessagesStayInsideTheMessageAreaWhateverTheHeaderSays) {
  // A client claims a huge message area; the daemon writes within its own.
  daemon_.header()->message_bytes = std::numeric_limits<int32_t>::max();
  const std::string long_message(100, 'x');
  daemon_.BeginResults();
  for (int i = 0; i < kCapacity.max_requests; ++i) {
    daemon_.Refused(i, absl::InvalidArgumentError(long_message));
  }
  daemon_.FinishResults(kCapacity.max_requests, 0, 0, 0, 0, 0);
  EXPECT_LE(daemon_.header()->messages_used, kCapacity.message_bytes);
  // Past the message area the memory is untouched (zero).
  const ChannelLayout layout(kCapacity.max_requests, kCapacity.message_bytes);
  const char* bytes = memory_.get();
  for (size_t at = layout.messages + kCapacity.message_bytes; at < bytes_;
       ++at) {
    ASSERT_EQ(bytes[at], 0) << at;
  }
  AllocAnswerView answer;
  daemon_.header()->message_bytes = kCapacity.message_bytes;
  ASSERT_OK(client_.ReadAllocAnswer(kCapacity.max_requests, &answer));
  ASSERT_EQ(answer.messages.size(), 8u);
  EXPECT_EQ(answer.messages[0], std::string(60, 'x'));  // 64 - 4 bytes
  EXPECT_EQ(answer.messages[7], "(message truncated by the fast channel)");
}

TEST_F(CodecTest, WholeCallRefusalAndOperationValue) {
  daemon_.WriteRefusal(absl::NotFoundError("session 3 is gone"));
  daemon_.Publish(1);
  EXPECT_THAT(client_.CallStatus(),
              StatusIs(absl::StatusCode::kNotFound, "session 3 is gone"));
  daemon_.WriteOpValue(12);
  daemon_.Publish(2);
  EXPECT_OK(client_.CallStatus());
  EXPECT_EQ(client_.OpValue(), 12);
}

TEST_F(CodecTest, ClientClampsAHostileMessageLength) {
  daemon_.WriteRefusal(absl::InternalError("boom"));
  daemon_.header()->messages_used = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(client_.CallStatus().message().size(),
            static_cast<size_t>(kCapacity.message_bytes));
}

// The stale-answer fence: clear while the session lives; once the daemon
// ends it, set with the reason (cut to the room there is), whatever the
// answer in the channel says.
TEST_F(CodecTest, EndingTheSessionIsSeenAfterAnyAnswer) {
  daemon_.WriteOpValue(3);
  daemon_.Publish(1);
  EXPECT_FALSE(client_.SessionEnded());
  EXPECT_EQ(client_.EndReason(), "");
  daemon_.EndSession("lost its lease");
  EXPECT_OK(client_.CallStatus());  // the answer itself still says OK
  EXPECT_TRUE(client_.SessionEnded());
  EXPECT_EQ(client_.EndReason(), "lost its lease");

  // A reason longer than the room is cut (a fresh channel: written once).
  std::memset(memory_.get(), 0, bytes_);
  daemon_.Initialize();
  daemon_.EndSession(std::string(500, 'r'));
  EXPECT_EQ(client_.EndReason(), std::string(kEndReasonBytes, 'r'));
}

TEST_F(CodecTest, AHeaderTheDaemonFreedReadsAsAnEndedSession) {
  daemon_.WriteOpValue(3);
  daemon_.Publish(1);
  // The daemon frees an ended session's header page after a while, even
  // where the client still maps it: the client's mapping reads zeros.
  std::memset(memory_.get(), 0, bytes_);
  EXPECT_TRUE(client_.SessionEnded());
  EXPECT_EQ(client_.EndReason(),
            "the daemon has freed the channel of the ended session");
}

TEST_F(CodecTest, ClientClampsAHostileEndReasonLength) {
  daemon_.EndSession("closed by client");
  for (const int32_t bytes :
       {-1, kEndReasonBytes + 1, std::numeric_limits<int32_t>::max()}) {
    daemon_.header()->end_reason_bytes = bytes;
    EXPECT_LE(client_.EndReason().size(), static_cast<size_t>(kEndReasonBytes));
  }
}

TEST_F(CodecTest, AnAskForTheReserveIsSeenAndAnswered) {
  const uint32_t bell = client_.reserve_bell()->load();
  EXPECT_TRUE(client_.ReclaimAnswered(client_.ReclaimSeq()));
  daemon_.AskForReserve(12);
  EXPECT_NE(client_.reserve_bell()->load(), bell);
  const uint32_t seq = client_.ReclaimSeq();
  EXPECT_EQ(seq, 1u);
  EXPECT_EQ(client_.ReclaimPages(), 12);
  EXPECT_FALSE(client_.ReclaimAnswered(seq));
  EXPECT_FALSE(daemon_.ReadReserveHints().answered);
  client_.ReportReserve(5, 2, 1);
  client_.AnswerReclaim(seq);
  const ChannelCodec::ReserveHints hints = daemon_.ReadReserveHints();
  EXPECT_TRUE(hints.answered);
  EXPECT_EQ(hints.pages, 5);
  EXPECT_EQ(hints.refills, 2);
  EXPECT_EQ(hints.returns, 1);
}

TEST_F(CodecTest, DaemonClampsHostileReserveHints) {
  client_.ReportReserve(-7, std::numeric_limits<int64_t>::min(), -1);
  const ChannelCodec::ReserveHints hints = daemon_.ReadReserveHints();
  EXPECT_EQ(hints.pages, 0);
  EXPECT_EQ(hints.refills, 0);
  EXPECT_EQ(hints.returns, 0);
}

}  // namespace
}  // namespace fast_channel
}  // namespace pagealloc
