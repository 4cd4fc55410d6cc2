#include "tests/service_manager.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {

absl::StatusOr<std::unique_ptr<FdStoreManager>> FdStoreManager::Create() {
  char pattern[] = "/tmp/pagealloc-manager-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
  }
  const std::string dir = pattern;
  UniqueFd socket_fd(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = dir + "/notify";
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  if (!socket_fd.valid() ||
      bind(socket_fd.get(), reinterpret_cast<sockaddr*>(&address),
           sizeof(address)) != 0) {
    return absl::InternalError(
        absl::StrFormat("notify socket %s: %s", path, strerror(errno)));
  }
  // Many descriptors per message are possible; a big buffer keeps every
  // notification of a run queued until Drain.
  const int bytes = 1 << 20;
  setsockopt(socket_fd.get(), SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  return std::unique_ptr<FdStoreManager>(
      new FdStoreManager(dir, std::move(socket_fd)));
}

FdStoreManager::~FdStoreManager() {
  unlink(socket_path().c_str());
  rmdir(dir_.c_str());
}

absl::StatusOr<Subprocess> FdStoreManager::Start(
    const std::vector<std::string>& argv, const std::string& log_path) {
  Drain();
  ready_ = false;
  SpawnOptions options;
  std::vector<std::string> names;
  for (const auto& [name, fds] : store_) {
    for (const UniqueFd& fd : fds) {
      options.passed_fds.push_back(fd.get());
      names.push_back(name);
    }
  }
  options.environment.push_back("NOTIFY_SOCKET=" + socket_path());
  if (!names.empty()) {
    options.environment.push_back(
        absl::StrCat("LISTEN_FDS=", options.passed_fds.size()));
    options.environment.push_back("LISTEN_FDNAMES=" +
                                  absl::StrJoin(names, ":"));
  }
  // $LISTEN_PID must be the service's own pid: the shell's, which exec
  // keeps.
  std::vector<std::string> wrapped = {"/bin/sh", "-c",
                                      "LISTEN_PID=$$ exec \"$@\"", "sh"};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return Subprocess::Start(wrapped, log_path, options);
}

int FdStoreManager::Drain() {
  int read = 0;
  while (true) {
    char text[4096];
    iovec iov{text, sizeof(text) - 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 32)];
    msghdr message{};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    const ssize_t n =
        recvmsg(socket_.get(), &message, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) return read;
    ++read;
    std::vector<UniqueFd> fds;
    for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr;
         c = CMSG_NXTHDR(&message, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
        // Above the range a start passes to, so that no dup2 of the
        // passing lands on another stored descriptor.
        fds.emplace_back(fcntl(fd, F_DUPFD_CLOEXEC, 200));
        close(fd);
      }
    }
    bool store = false, remove = false, ready = false;
    std::string name = "stored";
    for (absl::string_view line :
         absl::StrSplit(absl::string_view(text, n), '\n')) {
      if (line == "FDSTORE=1") store = true;
      if (line == "FDSTOREREMOVE=1") remove = true;
      if (line == "READY=1") ready = true;
      if (absl::StartsWith(line, "FDNAME=")) {
        name = std::string(line.substr(7));
      }
    }
    if (ready) ready_ = true;
    if (remove) store_.erase(name);
    if (store) {
      for (UniqueFd& fd : fds) store_[name].push_back(std::move(fd));
    }
  }
}

bool FdStoreManager::WaitReady(absl::Duration timeout) {
  return WaitFor(
      [this] {
        Drain();
        return ready_;
      },
      timeout, absl::Milliseconds(2));
}

std::vector<std::string> FdStoreManager::stored_names() const {
  std::vector<std::string> names;
  for (const auto& [name, fds] : store_) names.push_back(name);
  return names;
}

int FdStoreManager::stored(const std::string& name) const {
  auto it = store_.find(name);
  return it == store_.end() ? 0 : static_cast<int>(it->second.size());
}

int FdStoreManager::stored_fd(const std::string& name) const {
  auto it = store_.find(name);
  return it == store_.end() || it->second.empty() ? -1
                                                  : it->second.front().get();
}

}  // namespace pagealloc::testing
