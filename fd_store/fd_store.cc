#include "fd_store/fd_store.h"

#include <fcntl.h>
#include <systemd/sd-daemon.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pagealloc {
namespace {

absl::Status CheckName(absl::string_view name) {
  if (name.empty() || name.size() > 255) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fd store name '%s': must be 1 to 255 characters", name));
  }
  for (char c : name) {
    if (c < 0x21 || c > 0x7e || c == ':') {
      return absl::InvalidArgumentError(absl::StrFormat(
          "fd store name '%s': only printable ASCII without ':' or spaces",
          name));
    }
  }
  return absl::OkStatus();
}

absl::Status Notify(const std::string& state, const int* fds, unsigned n) {
  if (!ServiceManagerListening()) {
    return absl::FailedPreconditionError(
        "no service manager listens ($NOTIFY_SOCKET is not set)");
  }
  // unset_environment 0: the daemon notifies again later (READY=1, more
  // descriptors).
  const int rc = sd_pid_notify_with_fds(0, 0, state.c_str(), fds, n);
  if (rc < 0) {
    return absl::UnavailableError(
        absl::StrFormat("sd_notify(%s): %s", state, std::strerror(-rc)));
  }
  if (rc == 0) {
    return absl::FailedPreconditionError(
        "no service manager listens ($NOTIFY_SOCKET is not set)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<absl::flat_hash_map<std::string, UniqueFd>> TakePassedFds() {
  absl::flat_hash_map<std::string, UniqueFd> passed;
  char** names = nullptr;
  // unset_environment 1: the variables describe this process only.
  const int n = sd_listen_fds_with_names(1, &names);
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the descriptors passed at start ($LISTEN_FDS, $LISTEN_FDNAMES): %s",
        std::strerror(-n)));
  }
  absl::Status status = absl::OkStatus();
  for (int i = 0; i < n; ++i) {
    const int fd = SD_LISTEN_FDS_START + i;
    UniqueFd owned(fd);
    // The daemon starts no children that should hold its slab.
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    std::string name = names != nullptr && names[i] != nullptr
                           ? std::string(names[i])
                           : std::string("unknown");
    if (status.ok() && passed.contains(name)) {
      status = absl::InvalidArgumentError(absl::StrFormat(
          "two descriptors passed at start are named '%s'", name));
    }
    passed.emplace(std::move(name), std::move(owned));
  }
  if (names != nullptr) {
    for (int i = 0; i < n; ++i) std::free(names[i]);
    std::free(names);
  }
  if (!status.ok()) return status;
  return passed;
}

bool ServiceManagerListening() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  return socket != nullptr && socket[0] != '\0';
}

absl::Status StoreFd(absl::string_view name, int fd) {
  if (absl::Status valid = CheckName(name); !valid.ok()) return valid;
  if (fd < 0) return absl::InvalidArgumentError("StoreFd: no descriptor");
  return Notify(absl::StrCat("FDSTORE=1\nFDNAME=", name), &fd, 1);
}

absl::Status RemoveStoredFds(absl::string_view name) {
  if (absl::Status valid = CheckName(name); !valid.ok()) return valid;
  return Notify(absl::StrCat("FDSTOREREMOVE=1\nFDNAME=", name), nullptr, 0);
}

absl::Status NotifyReady(absl::string_view status) {
  if (!ServiceManagerListening()) return absl::OkStatus();
  return Notify(absl::StrCat("READY=1\nSTATUS=", status), nullptr, 0);
}

}  // namespace pagealloc
