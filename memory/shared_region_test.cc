#include "memory/shared_region.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

std::string UniqueName() {
  std::random_device random;
  return absl::StrFormat("/pagealloc-test.%d.%08x", getpid(), random());
}

bool NameExists(const std::string& name) {
  struct stat st;
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

TEST(SharedRegionTest, CreateZeroFillsAndOpenSharesTheBytes) {
  const std::string name = UniqueName();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> created,
                       SharedRegion::Create(name, 4096, 0600));
  const char* bytes = static_cast<const char*>(created->base());
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(bytes[i], 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> opened,
                       SharedRegion::Open(name, 4096));
  std::strcpy(static_cast<char*>(opened->base()), "written by the client");
  EXPECT_STREQ(bytes, "written by the client");
  EXPECT_EQ(opened->bytes(), 4096u);
}

TEST(SharedRegionTest, ModeIsExactWhateverTheUmask) {
  const std::string name = UniqueName();
  const mode_t old_umask = umask(0077);
  auto created = SharedRegion::Create(name, 64, 0660);
  umask(old_umask);
  ASSERT_OK(created.status());
  struct stat st;
  ASSERT_EQ(stat(("/dev/shm" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

TEST(SharedRegionTest, CreatorRemovesTheNameOnUnlinkAndDestruction) {
  const std::string name = UniqueName();
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> created,
                         SharedRegion::Create(name, 64, 0600));
    EXPECT_TRUE(NameExists(name));
    created->Unlink();
    EXPECT_FALSE(NameExists(name));
    // The mapping stays usable after the name is gone.
    static_cast<char*>(created->base())[63] = 1;
  }
  const std::string other = UniqueName();
  { ASSERT_OK(SharedRegion::Create(other, 64, 0600).status()); }
  EXPECT_FALSE(NameExists(other));
}

TEST(SharedRegionTest, OpenerLeavesTheNameAlone) {
  const std::string name = UniqueName();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> created,
                       SharedRegion::Create(name, 64, 0600));
  { ASSERT_OK(SharedRegion::Open(name, 64).status()); }
  EXPECT_TRUE(NameExists(name));
}

TEST(SharedRegionTest, RefusesExistingMissingAndShortRegions) {
  const std::string name = UniqueName();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> created,
                       SharedRegion::Create(name, 64, 0600));
  EXPECT_THAT(SharedRegion::Create(name, 64, 0600),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("shm_open")));
  EXPECT_THAT(SharedRegion::Open(name, 65),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("smaller than the 65 bytes")));
  EXPECT_THAT(SharedRegion::Open(UniqueName(), 1),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("cannot open shared memory")));
}

TEST(SharedRegionTest, ReadOnlyOpenCannotWrite) {
  const std::string name = UniqueName();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SharedRegion> created,
                       SharedRegion::Create(name, 64, 0600));
  static_cast<char*>(created->base())[0] = 42;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<SharedRegion> reader,
      SharedRegion::Open(name, 64, SharedRegion::Access::kReadOnly));
  EXPECT_EQ(static_cast<const char*>(reader->base())[0], 42);
  EXPECT_DEATH(static_cast<volatile char*>(reader->base())[0] = 1, "");
}

}  // namespace
}  // namespace pagealloc
