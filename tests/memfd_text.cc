#include "tests/memfd_text.h"

#include <sys/mman.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace pagealloc::testing {

UniqueFd MemfdWithText(const std::string& text) {
  UniqueFd fd(memfd_create("test-text", MFD_CLOEXEC));
  EXPECT_EQ(write(fd.get(), text.data(), text.size()),
            static_cast<ssize_t>(text.size()));
  return fd;
}

std::string ReadText(int fd) {
  char buffer[256];
  const ssize_t n = pread(fd, buffer, sizeof(buffer), 0);
  return n > 0 ? std::string(buffer, n) : std::string();
}

}  // namespace pagealloc::testing
