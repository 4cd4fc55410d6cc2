#include "tests/hostile/hostile_daemon.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/status_matchers.h"

namespace pagealloc::testing {

std::unique_ptr<Client> ConnectTo(const Daemon& daemon,
                                  const std::string& name) {
  ClientOptions options;
  options.target = daemon.target;
  options.client_name = name;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_OK(client.status());
  return client.ok() ? *std::move(client) : nullptr;
}

absl::Status RoundTrip(Client& client) {
  absl::StatusOr<Allocation> allocation = client.Alloc({16});
  if (!allocation.ok()) return allocation.status();
  if (!allocation->status().ok()) return allocation->status();
  int64_t slot = 0;
  if (absl::Status copied = client.CopyToHost((*allocation)[0].slots, 1, &slot);
      !copied.ok()) {
    return copied;
  }
  return client.FreeSlots({slot}).status();
}

int MetricsPort(const Daemon& daemon) {
  const std::string log = ReadLog(daemon.log_path);
  const size_t at = log.find("metrics on http://");
  if (at == std::string::npos) return -1;
  absl::string_view rest = absl::string_view(log).substr(at);
  const size_t colon = rest.find(':', std::strlen("metrics on http://"));
  const size_t slash = rest.find('/', colon);
  int port = -1;
  if (colon == absl::string_view::npos || slash == absl::string_view::npos ||
      !absl::SimpleAtoi(rest.substr(colon + 1, slash - colon - 1), &port)) {
    return -1;
  }
  return port;
}

std::pair<int, std::string> Get(int port, const std::string& path,
                                absl::Duration timeout) {
  httplib::Client http("127.0.0.1", port);
  const int64_t usec = absl::ToInt64Microseconds(timeout);
  http.set_connection_timeout(usec / 1000000, usec % 1000000);
  http.set_read_timeout(usec / 1000000, usec % 1000000);
  httplib::Result result = http.Get(path.c_str());
  if (!result) return {-1, httplib::to_string(result.error())};
  return {result->status, result->body};
}

double MetricSum(int port, absl::string_view name,
                 std::initializer_list<absl::string_view> labels) {
  const auto [status, body] = Get(port, "/metrics");
  if (status != 200) return -1;
  double total = 0;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (!absl::StartsWith(line, name)) continue;
    const absl::string_view rest = line.substr(name.size());
    if (rest.empty() || (rest[0] != '{' && rest[0] != ' ')) continue;
    bool matches = true;
    for (absl::string_view label : labels) {
      matches = matches && absl::StrContains(rest, label);
    }
    double value = 0;
    if (matches && absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) {
      total += value;
    }
  }
  return total;
}

UniqueFd ConnectUnix(const std::string& path, int type) {
  UniqueFd fd(socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (!fd.valid() || path.size() >= sizeof(address.sun_path)) return UniqueFd();
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&address),
              sizeof(address)) != 0) {
    fd.reset();
  }
  return fd;
}

bool ClosedByPeer(int fd) {
  char buffer[4096];
  while (true) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
  }
}

}  // namespace pagealloc::testing
