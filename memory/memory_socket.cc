#include "memory/memory_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "memory/fd_passing.h"

namespace pagealloc {
namespace memory_socket {
namespace {

bool KnownMemoryKind(uint32_t kind) {
  switch (static_cast<MemoryKind>(kind)) {
    case MemoryKind::kChannel:
    case MemoryKind::kDoorbell:
    case MemoryKind::kRing:
    case MemoryKind::kKvSlab:
    case MemoryKind::kCudaRing:
    case MemoryKind::kCompletionCounter:
      return true;
  }
  return false;
}

absl::Span<const char> BytesOf(const void* data, size_t size) {
  return absl::MakeConstSpan(static_cast<const char*>(data), size);
}

}  // namespace

std::string MemorySocketPath(absl::string_view grpc_socket_path) {
  return absl::StrCat(grpc_socket_path, ".fd");
}

absl::StatusOr<Hello> MakeHello(uint64_t session_id, absl::string_view token) {
  if (token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a session token of %d bytes; the memory socket takes at most %d",
        token.size(), kMaxTokenBytes));
  }
  Hello hello{};
  hello.magic = kMagic;
  hello.version = kVersion;
  hello.session_id = session_id;
  hello.token_bytes = static_cast<uint32_t>(token.size());
  std::memcpy(hello.token, token.data(), token.size());
  return hello;
}

absl::StatusOr<Hello> ParseHello(absl::Span<const char> bytes) {
  if (bytes.size() != sizeof(Hello)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a hello of %d bytes; expected %d", bytes.size(), sizeof(Hello)));
  }
  Hello hello;
  std::memcpy(&hello, bytes.data(), sizeof(hello));
  if (hello.magic != kMagic || hello.version != kVersion) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a hello with magic 0x%x, version %d; this daemon speaks version %d",
        hello.magic, hello.version, kVersion));
  }
  if (hello.token_bytes > kMaxTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a hello with a token of %d bytes; at most %d",
                        hello.token_bytes, kMaxTokenBytes));
  }
  return hello;
}

DaemonMessage MakeHandoff(absl::Span<const MemoryEntry> entries) {
  DaemonMessage message{};
  message.magic = kMagic;
  message.version = kVersion;
  message.kind = static_cast<uint32_t>(MessageKind::kHandoff);
  const size_t n = std::min<size_t>(entries.size(), kMaxEntries);
  message.num_entries = static_cast<uint32_t>(n);
  std::copy_n(entries.begin(), n, message.entries);
  return message;
}

DaemonMessage MakeStatusMessage(MessageKind kind, const absl::Status& status) {
  DaemonMessage message{};
  message.magic = kMagic;
  message.version = kVersion;
  message.kind = static_cast<uint32_t>(kind);
  message.code = static_cast<int32_t>(status.code());
  const size_t n = std::min(status.message().size(), kMaxMessageBytes);
  message.message_bytes = static_cast<uint32_t>(n);
  std::memcpy(message.message, status.message().data(), n);
  return message;
}

absl::StatusOr<DaemonMessage> ParseDaemonMessage(absl::Span<const char> bytes,
                                                 size_t fds_received) {
  auto malformed = [](const std::string& what) {
    return absl::InternalError(absl::StrCat(
        "the daemon's memory socket sent a malformed message: ", what));
  };
  if (bytes.size() != sizeof(DaemonMessage)) {
    return malformed(absl::StrFormat("%d bytes; expected %d", bytes.size(),
                                     sizeof(DaemonMessage)));
  }
  DaemonMessage message;
  std::memcpy(&message, bytes.data(), sizeof(message));
  if (message.magic != kMagic || message.version != kVersion) {
    return malformed(
        absl::StrFormat("magic 0x%x, version %d; this client speaks version %d",
                        message.magic, message.version, kVersion));
  }
  message.message_bytes = std::min<uint32_t>(
      message.message_bytes, static_cast<uint32_t>(kMaxMessageBytes));
  switch (static_cast<MessageKind>(message.kind)) {
    case MessageKind::kHandoff:
      if (message.num_entries > kMaxEntries ||
          message.num_entries != fds_received) {
        return malformed(absl::StrFormat("%d entries with %d descriptors",
                                         message.num_entries, fds_received));
      }
      for (uint32_t i = 0; i < message.num_entries; ++i) {
        if (!KnownMemoryKind(message.entries[i].kind)) {
          return malformed(absl::StrFormat("entry %d of unknown kind %d", i,
                                           message.entries[i].kind));
        }
      }
      return message;
    case MessageKind::kRefused:
    case MessageKind::kEnded:
      if (fds_received != 0 || message.code <= 0 ||
          message.code >
              static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
        return malformed(absl::StrFormat("code %d with %d descriptors",
                                         message.code, fds_received));
      }
      return message;
  }
  return malformed(absl::StrFormat("unknown kind %d", message.kind));
}

absl::Status StatusOf(const DaemonMessage& message) {
  return absl::Status(
      static_cast<absl::StatusCode>(message.code),
      absl::string_view(message.message, std::min<size_t>(message.message_bytes,
                                                          kMaxMessageBytes)));
}

absl::StatusOr<SessionMemory> ReceiveSessionMemory(const std::string& path,
                                                   uint64_t session_id,
                                                   absl::string_view token,
                                                   absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  sockaddr_un address{};
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::UnavailableError(
        absl::StrFormat("no usable memory socket path (\"%s\")", path));
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  UniqueFd connection(
      socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!connection.valid()) {
    return absl::InternalError(
        absl::StrFormat("socket() failed: %s", std::strerror(errno)));
  }
  // A non-blocking connect to a Unix socket completes at once or fails;
  // EAGAIN means the daemon's backlog is full for now.
  while (connect(connection.get(), reinterpret_cast<sockaddr*>(&address),
                 sizeof(address)) != 0) {
    const int error = errno;
    if (error == EINTR) continue;
    if (error == EAGAIN && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
      continue;
    }
    return absl::UnavailableError(
        absl::StrFormat("cannot connect to the daemon's memory socket %s: %s",
                        path, std::strerror(error)));
  }
  absl::StatusOr<Hello> hello = MakeHello(session_id, token);
  if (!hello.ok()) return hello.status();
  if (absl::Status sent =
          SendWithFds(connection.get(), BytesOf(&*hello, sizeof(Hello)), {});
      !sent.ok()) {
    return absl::UnavailableError(absl::StrFormat(
        "the daemon's memory socket %s: %s", path, sent.message()));
  }
  pollfd ready{connection.get(), POLLIN, 0};
  int polled;
  do {
    const int64_t left_ms =
        std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    polled =
        poll(&ready, 1, static_cast<int>(std::min<int64_t>(left_ms, 1 << 30)));
  } while (polled < 0 && errno == EINTR);
  if (polled == 0) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "the daemon's memory socket %s did not answer within %s", path,
        absl::FormatDuration(timeout)));
  }
  DaemonMessage message;
  std::vector<UniqueFd> fds;
  absl::StatusOr<size_t> received = ReceiveWithFds(
      connection.get(),
      absl::MakeSpan(reinterpret_cast<char*>(&message), sizeof(message)),
      kMaxEntries, &fds);
  if (!received.ok()) {
    return absl::InternalError(
        absl::StrFormat("the daemon's memory socket %s: %s", path,
                        received.status().message()));
  }
  if (*received == 0) {
    return absl::UnavailableError(absl::StrFormat(
        "the daemon's memory socket %s closed without answering", path));
  }
  absl::StatusOr<DaemonMessage> parsed =
      ParseDaemonMessage(BytesOf(&message, *received), fds.size());
  if (!parsed.ok()) return parsed.status();
  if (parsed->kind != static_cast<uint32_t>(MessageKind::kHandoff)) {
    return StatusOf(*parsed);
  }
  SessionMemory memory;
  for (uint32_t i = 0; i < parsed->num_entries; ++i) {
    const MemoryEntry& entry = parsed->entries[i];
    UniqueFd* slot = nullptr;
    switch (static_cast<MemoryKind>(entry.kind)) {
      case MemoryKind::kChannel:
        slot = &memory.channel;
        memory.channel_bytes = entry.bytes;
        break;
      case MemoryKind::kDoorbell:
        slot = &memory.doorbell;
        break;
      case MemoryKind::kRing:
        slot = &memory.ring;
        memory.ring_bytes = entry.bytes;
        break;
      case MemoryKind::kCudaRing:
        slot = &memory.cuda_ring;
        memory.cuda_ring_bytes = entry.bytes;
        break;
      case MemoryKind::kCompletionCounter:
        slot = &memory.completion_counter;
        memory.completion_counter_bytes = entry.bytes;
        break;
      case MemoryKind::kKvSlab:
        slot = &memory.kv_slab;
        memory.kv_slab_bytes = entry.bytes;
        break;
    }
    if (slot->valid()) {
      return absl::InternalError(absl::StrFormat(
          "the daemon's memory socket sent memory of kind %d twice",
          entry.kind));
    }
    *slot = std::move(fds[i]);
  }
  // From now on the connection is only waited on (poll) and read once it
  // is readable: make reads block, so that one read gets the end message.
  const int flags = fcntl(connection.get(), F_GETFL);
  if (flags < 0 || fcntl(connection.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrFormat(
        "fcntl on the memory socket failed: %s", std::strerror(errno)));
  }
  memory.connection = std::move(connection);
  return memory;
}

absl::Status ReadSessionEnd(int connection, bool* went_away) {
  if (went_away != nullptr) *went_away = false;
  DaemonMessage message;
  std::vector<UniqueFd> none;
  absl::StatusOr<size_t> received = ReceiveWithFds(
      connection,
      absl::MakeSpan(reinterpret_cast<char*>(&message), sizeof(message)), 0,
      &none);
  if (received.ok() && *received > 0) {
    absl::StatusOr<DaemonMessage> parsed =
        ParseDaemonMessage(BytesOf(&message, *received), 0);
    if (parsed.ok() &&
        parsed->kind == static_cast<uint32_t>(MessageKind::kEnded)) {
      return StatusOf(*parsed);
    }
  }
  if (went_away != nullptr) *went_away = true;
  return absl::UnavailableError(
      "the daemon went away (its memory socket closed): the session and its "
      "slots are gone");
}

}  // namespace memory_socket
}  // namespace pagealloc
