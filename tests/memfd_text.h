// Memfds holding a short text, for tests that pass descriptors between
// processes and check that the memory behind them is the same.

#ifndef PAGEALLOC_TESTS_MEMFD_TEXT_H_
#define PAGEALLOC_TESTS_MEMFD_TEXT_H_

#include <string>

#include "memory/unique_fd.h"

namespace pagealloc::testing {

// A memfd holding `text` (a test failure when it cannot be written).
UniqueFd MemfdWithText(const std::string& text);

// The first 256 bytes of the file behind `fd` ("" when none can be read).
std::string ReadText(int fd);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_MEMFD_TEXT_H_
