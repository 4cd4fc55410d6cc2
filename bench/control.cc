#include "bench/control.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace pagealloc::bench {

absl::StatusOr<Control*> MapControl(const std::string& path, bool create) {
  const int fd =
      open(path.c_str(), create ? O_RDWR | O_CREAT | O_TRUNC : O_RDWR, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path));
  // A new file is zero-filled: go, stop and every state start at 0.
  if (create && ftruncate(fd, sizeof(Control)) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("ftruncate ", path));
  }
  void* base =
      mmap(nullptr, sizeof(Control), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap ", path));
  }
  return static_cast<Control*>(base);
}

void UnmapControl(Control* control) { munmap(control, sizeof(Control)); }

}  // namespace pagealloc::bench
