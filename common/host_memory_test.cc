#include "common/host_memory.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

TEST(HostMemoryTest, ReadsMemAvailableInBytes) {
  EXPECT_THAT(ParseMemAvailable("MemTotal:       16318480 kB\n"
                                "MemFree:          938452 kB\n"
                                "MemAvailable:   11534336 kB\n"
                                "Buffers:          391232 kB\n"),
              IsOkAndHolds(int64_t{11534336} * 1024));
  EXPECT_THAT(ParseMemAvailable("MemAvailable: 0 kB"), IsOkAndHolds(0));
}

TEST(HostMemoryTest, RefusesWhatIsNotANumberOfKib) {
  EXPECT_THAT(ParseMemAvailable("MemTotal: 1 kB\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has no MemAvailable")));
  for (const char* bad :
       {"MemAvailable: -4 kB", "MemAvailable: 12", "MemAvailable: x kB",
        "MemAvailable: 99999999999999999999 kB"}) {
    EXPECT_THAT(ParseMemAvailable(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("is not a number of kB")))
        << bad;
  }
}

// Linux only (the suite runs there): the host's own figure parses.
TEST(HostMemoryTest, ReadsThisHost) {
  absl::StatusOr<int64_t> bytes = AvailableHostBytes();
  ASSERT_OK(bytes.status());
  EXPECT_GT(*bytes, 0);
}

}  // namespace
}  // namespace pagealloc
