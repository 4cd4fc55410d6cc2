#include "server/memory_budget.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Optional;

TEST(MemoryBudgetTest, ChargesWholeOrNotAtAllAndGivesBackOnDestruction) {
  MemoryBudget budget("host", "--session_memory", 100);
  absl::StatusOr<MemoryBudget::Charge> first = budget.Take(60, "a ring");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(budget.used(), 60);
  // 41 do not fit beside 60: refused with the numbers, nothing charged.
  EXPECT_THAT(budget.Take(41, "a ring of 5 slots"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("a ring of 5 slots needs 41 B (41 bytes) of "
                                 "host memory; 60 bytes are in use of a "
                                 "budget of 100")));
  EXPECT_EQ(budget.used(), 60);
  EXPECT_EQ(budget.refusals(), 1);
  {
    absl::StatusOr<MemoryBudget::Charge> second = budget.Take(40, "a channel");
    ASSERT_TRUE(second.ok());
    EXPECT_EQ(budget.used(), 100);
    // Moving a charge moves the bytes, not a copy of them.
    MemoryBudget::Charge moved = *std::move(second);
    EXPECT_EQ(moved.bytes(), 40);
    EXPECT_EQ(budget.used(), 100);
  }
  EXPECT_EQ(budget.used(), 60);
  first->Reset();
  EXPECT_EQ(budget.used(), 0);
  EXPECT_THAT(budget.Take(-1, "x"), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("negative")));
}

class CgroupLimitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::string(std::getenv("TEST_TMPDIR")) + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    mkdir(root_.c_str(), 0755);
  }
  void Write(const std::string& relative, const std::string& text) {
    std::string path = root_;
    for (size_t start = 1; start < relative.size();) {
      const size_t slash = relative.find('/', start);
      if (slash == std::string::npos) break;
      path = root_ + relative.substr(0, slash);
      mkdir(path.c_str(), 0755);
      start = slash + 1;
    }
    std::ofstream(root_ + relative) << text;
  }
  std::string root_;
};

TEST_F(CgroupLimitTest, ReadsCgroupV2MemoryMaxAndItsAncestors) {
  Write("/self_cgroup", "0::/kubepods/pod1/daemon\n");
  Write("/fs/kubepods/memory.max", "max\n");
  Write("/fs/kubepods/pod1/memory.max", "1073741824\n");
  Write("/fs/kubepods/pod1/daemon/memory.max", "max\n");
  EXPECT_THAT(CgroupMemoryLimit(root_ + "/self_cgroup", root_ + "/fs"),
              Optional(int64_t{1} << 30));
}

TEST_F(CgroupLimitTest, ReadsCgroupV1LimitInBytes) {
  Write("/self_cgroup", "5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n");
  Write("/fs/memory/docker/abc/memory.limit_in_bytes", "268435456\n");
  Write("/fs/memory/docker/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_THAT(CgroupMemoryLimit(root_ + "/self_cgroup", root_ + "/fs"),
              Optional(int64_t{256} << 20));
}

TEST_F(CgroupLimitTest, NoLimitIsNullopt) {
  Write("/self_cgroup", "4:memory:/a\n");
  Write("/fs/memory/a/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(CgroupMemoryLimit(root_ + "/self_cgroup", root_ + "/fs"),
            std::nullopt);
  EXPECT_EQ(CgroupMemoryLimit(root_ + "/missing", root_ + "/fs"), std::nullopt);
}

TEST(DefaultSessionBudgetTest, KeepsRoomForTheDaemonAndOthers) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  // A 1 GiB cgroup, no slab: a quarter kept for the daemon's heap.
  EXPECT_EQ(DefaultSessionBudget(BudgetMemory::kHost, 1024 * kMiB, 0),
            768 * kMiB);
  // Small rooms keep at least 64 MiB.
  EXPECT_EQ(DefaultSessionBudget(BudgetMemory::kHost, 128 * kMiB, 0),
            64 * kMiB);
  EXPECT_EQ(DefaultSessionBudget(BudgetMemory::kHost, 32 * kMiB, 0), 0);
  // The slab comes off first.
  EXPECT_EQ(DefaultSessionBudget(BudgetMemory::kHost, 1024 * kMiB, 512 * kMiB),
            384 * kMiB);
  // A GPU gives sessions an eighth of what the slab leaves.
  EXPECT_EQ(DefaultSessionBudget(BudgetMemory::kGpu, 1024 * kMiB, 512 * kMiB),
            64 * kMiB);
  EXPECT_EQ(DefaultSessionBudget(BudgetMemory::kGpu, 1, 2), 0);
}

}  // namespace
}  // namespace pagealloc
