#include "kept_state/session_record.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

KeptSession Example() {
  KeptSession session;
  session.token_digest = DigestToken("a session token");
  session.client_name = "sglang-scheduler-tp0";
  session.quota_pages = 4096;
  session.resumable = true;
  return session;
}

TEST(SessionRecordTest, RoundTrips) {
  const KeptSession session = Example();
  ASSERT_OK_AND_ASSIGN(KeptSession decoded,
                       DecodeKeptSession(EncodeKeptSession(session)));
  EXPECT_EQ(decoded, session);
  KeptSession plain;
  ASSERT_OK_AND_ASSIGN(decoded, DecodeKeptSession(EncodeKeptSession(plain)));
  EXPECT_EQ(decoded, plain);
}

TEST(SessionRecordTest, DigestIsSha256) {
  // SHA-256("abc"), FIPS 180-2's first example.
  const TokenDigest digest = DigestToken("abc");
  EXPECT_EQ(digest[0], 0xba);
  EXPECT_EQ(digest[1], 0x78);
  EXPECT_EQ(digest[31], 0xad);
  EXPECT_NE(DigestToken("abd"), digest);
}

TEST(SessionRecordTest, RefusesEveryTruncationAndBadHeader) {
  const std::string bytes = EncodeKeptSession(Example());
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_THAT(DecodeKeptSession(bytes.substr(0, n)),
                StatusIs(absl::StatusCode::kDataLoss, ::testing::_))
        << n;
  }
  EXPECT_THAT(DecodeKeptSession(bytes + "x"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("header says")));
  std::string version = bytes;
  version[0] = 2;
  EXPECT_THAT(DecodeKeptSession(version),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("version 2")));
  std::string flags = bytes;
  flags[1] = 0x4;
  EXPECT_THAT(DecodeKeptSession(flags),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("flags")));
  std::string quota = bytes;
  quota[11] = static_cast<char>(0x80);
  EXPECT_THAT(DecodeKeptSession(quota),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("quota")));
}

}  // namespace
}  // namespace pagealloc
