#include "memory/shared_region.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/host_files.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

// A descriptor of our own to the region's memory, as a client receives one.
UniqueFd DupOf(const SharedRegion& region) {
  return UniqueFd(fcntl(region.fd(), F_DUPFD_CLOEXEC, 0));
}

TEST(SharedRegionTest, CreateZeroFillsAndFromFdSharesTheBytes) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> created,
                       SharedRegion::Create("pagealloc-test", 4096));
  EXPECT_EQ(created->bytes(), 4096u);
  ASSERT_GE(created->fd(), 0);
  const char* bytes = static_cast<const char*>(created->base());
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(bytes[i], 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> mapped,
                       SharedRegion::FromFd(DupOf(*created), 4096,
                                            SharedRegion::Access::kReadWrite));
  std::strcpy(static_cast<char*>(mapped->base()), "written by the client");
  EXPECT_STREQ(bytes, "written by the client");
  EXPECT_EQ(mapped->bytes(), 4096u);
  // The receiver keeps the mapping, not the descriptor.
  EXPECT_EQ(mapped->fd(), -1);
}

TEST(SharedRegionTest, ItHasNoNameInAnyFileSystem) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> created,
                       SharedRegion::Create("pagealloc-test-name", 64));
  char target[PATH_MAX] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(created->fd());
  ASSERT_GT(readlink(link.c_str(), target, sizeof(target) - 1), 0);
  EXPECT_STREQ(target, "/memfd:pagealloc-test-name (deleted)");
  struct stat st;
  EXPECT_NE(stat("/dev/shm/pagealloc-test-name", &st), 0);
}

TEST(SharedRegionTest, ItsPagesAreReservedAtCreation) {
  constexpr size_t kBytes = 1 << 20;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> created,
                       SharedRegion::Create("pagealloc-test", kBytes));
  // Nothing has touched the memory yet, and every page is taken already.
  struct stat st;
  ASSERT_EQ(fstat(created->fd(), &st), 0);
  EXPECT_EQ(st.st_size, static_cast<off_t>(kBytes));
  EXPECT_GE(static_cast<size_t>(st.st_blocks) * 512, kBytes);
}

TEST(SharedRegionTest, ItsSizeIsSealed) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> created,
                       SharedRegion::Create("pagealloc-test", 8192));
  // Whoever holds a descriptor (a client) cannot make another's mapping
  // fault by shrinking it, nor lift the seals.
  EXPECT_NE(ftruncate(created->fd(), 4096), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(created->fd(), 16384), 0);
  EXPECT_NE(fcntl(created->fd(), F_ADD_SEALS, F_SEAL_WRITE), 0);
  const int seals = fcntl(created->fd(), F_GET_SEALS);
  constexpr int kSealed = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  EXPECT_EQ(seals & kSealed, kSealed);
}

TEST(SharedRegionTest, MemoryThatCannotBeReservedIsResourceExhausted) {
  // A process file-size limit makes the reservation itself fail (EFBIG),
  // the way a full tmpfs (ENOSPC) or a memory cgroup at its limit (ENOMEM)
  // does, without mounting anything. What this shows: the memory is
  // reserved by Create, and a refusal there is RESOURCE_EXHAUSTED, not a
  // SIGBUS later.
  absl::StatusOr<std::unique_ptr<SharedRegion>> too_big, fits;
  {
    ::pagealloc::testing::ScopedFileSizeLimit limit(1 << 20);
    ASSERT_TRUE(limit.ok());
    too_big = SharedRegion::Create("pagealloc-test", 4 << 20);
    fits = SharedRegion::Create("pagealloc-test", 512 << 10);
  }
  EXPECT_THAT(too_big, StatusIs(absl::StatusCode::kResourceExhausted,
                                HasSubstr("cannot reserve 4194304 bytes")));
  EXPECT_OK(fits.status());
}

TEST(SharedRegionTest, CreateRefusesZeroBytes) {
  EXPECT_THAT(
      SharedRegion::Create("pagealloc-test", 0),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 bytes")));
}

TEST(SharedRegionTest, FromFdRefusesShortUnsealedAndMissingMemory) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> created,
                       SharedRegion::Create("pagealloc-test", 4096));
  EXPECT_THAT(SharedRegion::FromFd(DupOf(*created), 4097,
                                   SharedRegion::Access::kReadWrite),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("4096 bytes, smaller than the 4097")));
  // Memory that may shrink under the mapping (an unsealed memfd, as a
  // hostile peer could send) is refused.
  UniqueFd unsealed(memfd_create("unsealed", MFD_CLOEXEC));
  ASSERT_TRUE(unsealed.valid());
  ASSERT_EQ(ftruncate(unsealed.get(), 4096), 0);
  EXPECT_THAT(
      SharedRegion::FromFd(std::move(unsealed), 4096,
                           SharedRegion::Access::kReadWrite),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not sealed")));
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  UniqueFd write_end(pipe_fds[1]);
  EXPECT_THAT(
      SharedRegion::FromFd(UniqueFd(pipe_fds[0]), 1,
                           SharedRegion::Access::kReadOnly),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not sealed")));
  EXPECT_THAT(
      SharedRegion::FromFd(UniqueFd(), 1, SharedRegion::Access::kReadOnly),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("no descriptor")));
}

TEST(SharedRegionTest, ReadOnlyMappingCannotWrite) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> created,
                       SharedRegion::Create("pagealloc-test", 64));
  static_cast<char*>(created->base())[0] = 42;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> reader,
                       SharedRegion::FromFd(DupOf(*created), 64,
                                            SharedRegion::Access::kReadOnly));
  EXPECT_EQ(static_cast<const char*>(reader->base())[0], 42);
  EXPECT_DEATH(static_cast<volatile char*>(reader->base())[0] = 1, "");
}

}  // namespace
}  // namespace pagealloc
