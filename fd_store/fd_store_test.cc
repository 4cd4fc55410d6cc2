#include "fd_store/fd_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::StatusIs;
using ::testing::_;
using ::testing::HasSubstr;

// The inode behind `fd`: two descriptors of one memfd share it.
ino_t InodeOf(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

UniqueFd MakeMemfd(const char* name) {
  return UniqueFd(memfd_create(name, MFD_CLOEXEC));
}

// What a service manager sees: the datagram socket $NOTIFY_SOCKET names,
// which receives each notification with its descriptors (SCM_RIGHTS), as
// systemd's manager does.
class NotifySocket {
 public:
  NotifySocket() {
    char dir[] = "/tmp/fd_store_test.XXXXXX";
    dir_ = mkdtemp(dir);
    path_ = dir_ + "/notify";
    fd_ = UniqueFd(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path_.c_str(), sizeof(address.sun_path) - 1);
    bound_ = bind(fd_.get(), reinterpret_cast<sockaddr*>(&address),
                  sizeof(address)) == 0;
    setenv("NOTIFY_SOCKET", path_.c_str(), 1);
  }
  ~NotifySocket() {
    unsetenv("NOTIFY_SOCKET");
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  bool bound() const { return bound_; }

  // Receives one notification (it was sent before this is called) and the
  // descriptor it carried, if any.
  std::string Receive(UniqueFd* passed) {
    char text[4096];
    iovec iov{text, sizeof(text)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    msghdr message{};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd_.get(), &message, MSG_DONTWAIT);
    if (n < 0) return "";
    for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr;
         c = CMSG_NXTHDR(&message, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c), sizeof(fd));
        passed->reset(fd);
      }
    }
    return std::string(text, n);
  }

 private:
  std::string dir_, path_;
  UniqueFd fd_;
  bool bound_ = false;
};

TEST(FdStoreTest, StoreSendsTheDescriptorUnderItsName) {
  NotifySocket manager;
  ASSERT_TRUE(manager.bound());
  ASSERT_TRUE(ServiceManagerListening());
  UniqueFd slab = MakeMemfd("slab");
  ASSERT_TRUE(slab.valid());
  ASSERT_OK(StoreFd("pagealloc-slab", slab.get()));
  UniqueFd received;
  EXPECT_EQ(manager.Receive(&received), "FDSTORE=1\nFDNAME=pagealloc-slab");
  ASSERT_TRUE(received.valid());
  // A duplicate of the same memory, not a copy.
  EXPECT_EQ(InodeOf(received.get()), InodeOf(slab.get()));

  ASSERT_OK(RemoveStoredFds("pagealloc-slab"));
  UniqueFd none;
  EXPECT_EQ(manager.Receive(&none), "FDSTOREREMOVE=1\nFDNAME=pagealloc-slab");
  EXPECT_FALSE(none.valid());

  ASSERT_OK(NotifyReady("serving"));
  EXPECT_EQ(manager.Receive(&none), "READY=1\nSTATUS=serving");
}

TEST(FdStoreTest, RefusesBadNamesAndAMissingManager) {
  {
    NotifySocket manager;
    UniqueFd fd = MakeMemfd("x");
    EXPECT_THAT(
        StoreFd("", fd.get()),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 to 255")));
    EXPECT_THAT(StoreFd("a:b", fd.get()),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("':'")));
    EXPECT_THAT(StoreFd("a b", fd.get()),
                StatusIs(absl::StatusCode::kInvalidArgument, _));
    EXPECT_THAT(StoreFd(std::string(256, 'a'), fd.get()),
                StatusIs(absl::StatusCode::kInvalidArgument, _));
    EXPECT_THAT(StoreFd("ok", -1),
                StatusIs(absl::StatusCode::kInvalidArgument, _));
  }
  ASSERT_FALSE(ServiceManagerListening());
  UniqueFd fd = MakeMemfd("x");
  EXPECT_THAT(StoreFd("slab", fd.get()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("NOTIFY_SOCKET")));
  EXPECT_OK(NotifyReady("no manager: nothing sent"));
}

// Runs `body` in a child whose descriptors 3.. are `count` memfds and whose
// environment passes them as a service manager does; returns the child's
// exit code (0: every check in `body` held).
template <typename Body>
int InChildWithPassedFds(int count, const char* names, Body body) {
  const pid_t pid = fork();
  if (pid == 0) {
    // Made above the targets first, so that no memfd lands on a target a
    // later dup2 would close.
    int made[8];
    for (int i = 0; i < count; ++i) {
      const int fd = memfd_create("passed", 0);
      made[i] = fcntl(fd, F_DUPFD, 100);
      close(fd);
      // A size tells the child which one it got back.
      if (made[i] < 0 || ftruncate(made[i], 4096 * (i + 1)) != 0) _exit(90);
    }
    for (int i = 0; i < count; ++i) {
      if (dup2(made[i], 3 + i) < 0) _exit(91);
      close(made[i]);
    }
    setenv("LISTEN_PID", std::to_string(getpid()).c_str(), 1);
    setenv("LISTEN_FDS", std::to_string(count).c_str(), 1);
    if (names != nullptr) setenv("LISTEN_FDNAMES", names, 1);
    _exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(FdStoreTest, TakesThePassedDescriptorsByName) {
  EXPECT_EQ(
      InChildWithPassedFds(
          2, "pagealloc-slab:pagealloc-state",
          [] {
            auto passed = TakePassedFds();
            if (!passed.ok() || passed->size() != 2) return 1;
            const auto slab = passed->find("pagealloc-slab");
            const auto state = passed->find("pagealloc-state");
            if (slab == passed->end() || state == passed->end()) return 2;
            struct stat st {};
            if (fstat(slab->second.get(), &st) != 0 || st.st_size != 4096) {
              return 3;
            }
            if (fstat(state->second.get(), &st) != 0 || st.st_size != 8192) {
              return 4;
            }
            // Close-on-exec, and the environment no longer names them.
            if ((fcntl(slab->second.get(), F_GETFD) & FD_CLOEXEC) == 0) {
              return 5;
            }
            if (std::getenv("LISTEN_FDS") != nullptr) return 6;
            // A second take finds none.
            auto again = TakePassedFds();
            return again.ok() && again->empty() ? 0 : 7;
          }),
      0);
}

TEST(FdStoreTest, RefusesTwoDescriptorsOfOneName) {
  EXPECT_EQ(InChildWithPassedFds(
                2, "slab:slab",
                [] {
                  auto passed = TakePassedFds();
                  return !passed.ok() && passed.status().code() ==
                                             absl::StatusCode::kInvalidArgument
                             ? 0
                             : 1;
                }),
            0);
}

TEST(FdStoreTest, NothingPassedIsEmpty) {
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_PID");
  auto passed = TakePassedFds();
  ASSERT_OK(passed.status());
  EXPECT_TRUE(passed->empty());
}

}  // namespace
}  // namespace pagealloc
