#include "memory/fd_passing.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace pagealloc {

absl::Status SendWithFds(int socket, absl::Span<const char> bytes,
                         absl::Span<const int> fds) {
  if (fds.size() > static_cast<size_t>(kMaxPassedFds)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d descriptors in one message; at most %d", fds.size(),
                        kMaxPassedFds));
  }
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  if (!fds.empty()) {
    const size_t fd_bytes = sizeof(int) * fds.size();
    message.msg_control = control;
    message.msg_controllen = CMSG_SPACE(fd_bytes);
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(fd_bytes);
    std::memcpy(CMSG_DATA(header), fds.data(), fd_bytes);
  }
  ssize_t sent;
  do {
    sent = sendmsg(socket, &message, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) {
    const int error = errno;
    const bool gone = error == EPIPE || error == ECONNRESET ||
                      error == ENOTCONN || error == EAGAIN ||
                      error == EWOULDBLOCK;
    return absl::Status(
        gone ? absl::StatusCode::kUnavailable : absl::StatusCode::kInternal,
        absl::StrFormat("sendmsg failed: %s", std::strerror(error)));
  }
  if (static_cast<size_t>(sent) != bytes.size()) {
    // A SOCK_SEQPACKET message goes whole or not at all.
    return absl::InternalError(
        absl::StrFormat("sendmsg sent %d of %d bytes", sent, bytes.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> ReceiveWithFds(int socket, absl::Span<char> buffer,
                                      int max_fds, std::vector<UniqueFd>* fds) {
  if (max_fds < 0 || max_fds > kMaxPassedFds) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_fds (%d) must be in [0, %d]", max_fds, kMaxPassedFds));
  }
  iovec iov{buffer.data(), buffer.size()};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  if (max_fds > 0) {
    message.msg_control = control;
    message.msg_controllen = CMSG_SPACE(sizeof(int) * max_fds);
  }
  // Without a control buffer the kernel closes whatever descriptors the
  // message carried and sets MSG_CTRUNC.
  ssize_t received;
  do {
    received = recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
  } while (received < 0 && errno == EINTR);
  if (received < 0) {
    const int error = errno;
    if (error == ECONNRESET) return 0;
    if (error == EAGAIN || error == EWOULDBLOCK) {
      return absl::UnavailableError("no message waiting");
    }
    return absl::InternalError(
        absl::StrFormat("recvmsg failed: %s", std::strerror(error)));
  }
  // Take every descriptor that arrived first, so that none leaks whatever
  // happens next.
  std::vector<UniqueFd> arrived;
  if (max_fds > 0) {
    for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
         header = CMSG_NXTHDR(&message, header)) {
      if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) {
        continue;
      }
      const size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(header) + i * sizeof(int), sizeof(int));
        arrived.emplace_back(fd);
      }
    }
  }
  if ((message.msg_flags & MSG_TRUNC) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a message longer than the %d bytes expected", buffer.size()));
  }
  if ((message.msg_flags & MSG_CTRUNC) != 0 ||
      arrived.size() > static_cast<size_t>(max_fds)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a message with more than the %d descriptors expected", max_fds));
  }
  for (UniqueFd& fd : arrived) fds->push_back(std::move(fd));
  return static_cast<size_t>(received);
}

}  // namespace pagealloc
