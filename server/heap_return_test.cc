#include "server/heap_return.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "gtest/gtest.h"

namespace pagealloc {
namespace {

// Resident pages of this process (/proc/self/statm's second field).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(HeapReturnTest, FreedMemoryInTheMiddleOfTheHeapGoesBack) {
  if (!kGlibcMalloc) {
    GTEST_SKIP() << "a sanitizer's allocator replaces glibc's malloc here";
  }
  // 64 MiB in 1 KiB blocks, touched, then all freed but the last: the free
  // memory sits below a live block, where malloc never trims by itself.
  constexpr int kBlocks = 64 << 10;
  std::vector<char*> blocks(kBlocks);
  for (char*& block : blocks) {
    block = static_cast<char*>(std::malloc(1024));
    std::memset(block, 1, 1024);
  }
  for (int i = 0; i + 1 < kBlocks; ++i) std::free(blocks[i]);
  const int64_t before = ResidentBytes();
  // Below the threshold: nothing happens.
  EXPECT_FALSE(ReturnFreeHeapMemory(int64_t{1} << 40).trimmed);
  const HeapReturn returned = ReturnFreeHeapMemory(16 << 20);
  EXPECT_TRUE(returned.trimmed);
  EXPECT_GE(returned.free_bytes, 60 << 20);
  const int64_t after = ResidentBytes();
  EXPECT_LE(after, before - (48 << 20)) << before << " -> " << after;
  std::free(blocks.back());
}

}  // namespace
}  // namespace pagealloc
