#include "unix_socket/listen.h"

#include <grp.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace pagealloc {
namespace {

// Makes `path` bindable for a socket of `options.type` (ListenOnUnixSocket).
absl::Status PrepareSocketPath(const std::string& path,
                               const UnixListenOptions& options) {
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const absl::Status usable =
        CheckSocketDirectory(path.substr(0, slash), options.directory_mode);
    if (!usable.ok()) {
      return absl::Status(
          usable.code(),
          absl::StrFormat(
              "%s; choose a socket in a directory this user may "
              "write%s, or create that directory for this user "
              "first",
              usable.message(),
              options.socket_advice.empty()
                  ? ""
                  : absl::StrCat(" (", options.socket_advice, ")")));
    }
  }
  sockaddr_un address{};
  if (path.empty()) {
    return absl::InvalidArgumentError("an empty socket path");
  }
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "socket path %s is %d bytes long; Unix sockets allow at most %d", path,
        path.size(), sizeof(address.sun_path) - 1));
  }
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s exists and is not a socket; refusing to replace it", path));
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  // A probe of another type than the listener's is refused (EPROTOTYPE)
  // even by a live one, which would then be taken for stale.
  const UniqueFd probe(socket(AF_UNIX, options.type | SOCK_CLOEXEC, 0));
  if (probe.valid() &&
      connect(probe.get(), reinterpret_cast<sockaddr*>(&address),
              sizeof(address)) == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "another process is serving on %s; refusing to start over it", path));
  }
  Logger("server")->warn("removing stale socket {}", path);
  if (unlink(path.c_str()) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "cannot remove stale socket %s: %s", path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status SetSocketPermissions(const std::string& path, mode_t mode,
                                  const std::string& group) {
  if (chmod(path.c_str(), mode) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "chmod %o %s failed: %s", mode, path, std::strerror(errno)));
  }
  if (group.empty()) return absl::OkStatus();
  struct group* entry = getgrnam(group.c_str());
  if (entry == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--socket_group: no group named %s", group));
  }
  if (chown(path.c_str(), static_cast<uid_t>(-1), entry->gr_gid) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "chown :%s %s failed: %s", group, path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckSocketDirectory(const std::string& dir, mode_t mode) {
  if (mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) {
    const int error = errno;
    return absl::Status(
        absl::ErrnoToStatusCode(error),
        absl::StrFormat("cannot create the socket directory %s: %s", dir,
                        std::strerror(error)));
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    const int error = errno;
    return absl::Status(
        absl::ErrnoToStatusCode(error),
        absl::StrFormat("cannot use %s: %s", dir, std::strerror(error)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot create sockets in %s: %s", dir, std::strerror(ENOTDIR)));
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    const int error = errno;
    return absl::PermissionDeniedError(absl::StrFormat(
        "cannot create sockets in %s: %s (the directory belongs to uid %d, "
        "mode %04o; this process runs as uid %d)",
        dir, std::strerror(error), st.st_uid, st.st_mode & 07777, geteuid()));
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> ListenOnUnixSocket(const std::string& path,
                                            const UnixListenOptions& options) {
  if (absl::Status prepared = PrepareSocketPath(path, options);
      !prepared.ok()) {
    return prepared;
  }
  UniqueFd listener(socket(
      AF_UNIX,
      options.type | SOCK_CLOEXEC | (options.nonblocking ? SOCK_NONBLOCK : 0),
      0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  if (!listener.valid() ||
      bind(listener.get(), reinterpret_cast<sockaddr*>(&address),
           sizeof(address)) != 0) {
    return absl::UnavailableError(absl::StrFormat("could not listen on %s: %s",
                                                  path, std::strerror(errno)));
  }
  if (absl::Status permitted =
          SetSocketPermissions(path, options.mode, options.group);
      !permitted.ok()) {
    unlink(path.c_str());
    return permitted;
  }
  if (listen(listener.get(), SOMAXCONN) != 0) {
    const int error = errno;
    unlink(path.c_str());
    return absl::UnavailableError(absl::StrFormat("could not listen on %s: %s",
                                                  path, std::strerror(error)));
  }
  return listener;
}

}  // namespace pagealloc
