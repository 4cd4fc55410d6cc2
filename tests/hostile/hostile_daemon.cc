#include "tests/hostile/hostile_daemon.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/status_matchers.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace

std::unique_ptr<Client> ConnectTo(const Daemon& daemon,
                                  const std::string& name) {
  ClientOptions options;
  options.target = daemon.target;
  options.client_name = name;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_OK(client.status());
  return client.ok() ? *std::move(client) : nullptr;
}

// Allocates a page and frees it: the session works end to end.
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

// The metrics port the daemon logged ("metrics on http://H:P/metrics"), or
// -1 while it has not.
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

double MetricValue(int port, const std::string& series) {
  const auto [status, body] = Get(port, "/metrics");
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (!absl::StartsWith(line, series + " ")) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
  }
  return -1;
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

UniqueFd RawConnect(const Daemon& daemon) {
  return ConnectUnix(daemon.socket_path, SOCK_STREAM);
}

Fate FateOf(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return Fate::kServed;
  if (n == 0) return Fate::kClosedAtOnce;
  return Fate::kPending;
}

absl::StatusOr<std::vector<UniqueFd>> FloodUntilRefused(const Daemon& daemon,
                                                        int most) {
  std::vector<UniqueFd> flood;
  Fate fate = Fate::kServed;
  while (fate == Fate::kServed && static_cast<int>(flood.size()) < most) {
    flood.push_back(RawConnect(daemon));
    if (!flood.back().valid()) {
      return absl::FailedPreconditionError("the test ran out of descriptors");
    }
    const int fd = flood.back().get();
    if (!WaitFor([&] { return (fate = FateOf(fd)) != Fate::kPending; },
                 kHostileWait)) {
      return absl::FailedPreconditionError("a connection was left pending");
    }
  }
  if (fate != Fate::kClosedAtOnce) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%d connections and none refused", flood.size()));
  }
  return flood;
}

std::unique_ptr<v1::PageAllocator::Stub> RawStub(const Daemon& daemon) {
  grpc::ChannelArguments arguments;
  // A channel of its own, not shared with another stub's connection.
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return v1::PageAllocator::NewStub(grpc::CreateCustomChannel(
      daemon.target, grpc::InsecureChannelCredentials(), arguments));
}

absl::StatusOr<v1::RegisterResponse> RawRegister(v1::PageAllocator::Stub& stub,
                                                 const std::string& name,
                                                 int64_t ring_capacity_slots,
                                                 bool fast_channel) {
  v1::RegisterRequest request;
  request.set_client_name(name);
  request.set_ring_capacity_slots(ring_capacity_slots);
  request.set_fast_channel(fast_channel);
  v1::RegisterResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(30));
  const grpc::Status status = stub.Register(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  return response;
}

std::optional<ChildMemoryCgroup> ChildMemoryCgroup::Create(
    const std::string& name, int64_t limit_bytes, std::string* why) {
  // Our own cgroup: "0::/path" (v2) and "N:memory:/path" (v1).
  std::string v2_path, v1_path;
  bool has_v1 = false;
  for (absl::string_view line :
       absl::StrSplit(ReadText("/proc/self/cgroup"), '\n')) {
    std::vector<std::string> fields =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    if (fields[0] == "0" && fields[1].empty()) v2_path = fields[2];
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == "memory") {
        v1_path = fields[2];
        has_v1 = true;
      }
    }
  }
  const std::string child = absl::StrFormat("pagealloc-%s-%d", name, getpid());
  std::vector<std::string> tried;
  for (const std::string& root :
       {std::string("/sys/fs/cgroup"), std::string("/sys/fs/cgroup/unified")}) {
    const std::string parent = root + (v2_path == "/" ? "" : v2_path);
    if (v2_path.empty() ||
        !absl::StrContains(ReadText(parent + "/cgroup.controllers"),
                           "memory")) {
      tried.push_back(parent + ": no cgroup v2 memory controller");
      continue;
    }
    // The memory controller must be on for children; a cgroup with
    // processes of its own cannot enable it (v2's no-internal-process
    // rule), which we leave as is and report.
    WriteText(parent + "/cgroup.subtree_control", "+memory");
    const std::string dir = parent + "/" + child;
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      tried.push_back(absl::StrFormat("mkdir %s: %s", dir, strerror(errno)));
      continue;
    }
    if (!WriteText(dir + "/memory.max", absl::StrCat(limit_bytes)) ||
        !WriteText(dir + "/memory.swap.max", "0")) {
      tried.push_back(dir + ": cannot set memory.max");
      rmdir(dir.c_str());
      continue;
    }
    return ChildMemoryCgroup(dir, /*v2=*/true);
  }
  if (has_v1) {
    const std::string parent =
        "/sys/fs/cgroup/memory" + (v1_path == "/" ? "" : v1_path);
    const std::string dir = parent + "/" + child;
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      tried.push_back(absl::StrFormat("mkdir %s: %s", dir, strerror(errno)));
    } else if (!WriteText(dir + "/memory.limit_in_bytes",
                          absl::StrCat(limit_bytes))) {
      tried.push_back(dir + ": cannot set memory.limit_in_bytes");
      rmdir(dir.c_str());
    } else {
      // No swap to escape to, where the kernel accounts it.
      WriteText(dir + "/memory.memsw.limit_in_bytes",
                absl::StrCat(limit_bytes));
      WriteText(dir + "/memory.swappiness", "0");
      return ChildMemoryCgroup(dir, /*v2=*/false);
    }
  }
  *why = absl::StrJoin(tried, "; ");
  return std::nullopt;
}

ChildMemoryCgroup::~ChildMemoryCgroup() {
  if (dir_.empty()) return;
  // The daemon is reaped by its Subprocess before this runs; a cgroup
  // empties a moment after its last process exits.
  WaitFor([&] { return rmdir(dir_.c_str()) == 0 || errno != EBUSY; },
          kHostileWait);
}

std::vector<std::string> ChildMemoryCgroup::Wrapper() const {
  return {
      "/bin/sh", "-c",
      absl::StrFormat("echo $$ > %s/cgroup.procs && exec \"$0\" \"$@\"", dir_)};
}

int64_t ChildMemoryCgroup::OomKills() const {
  const std::string text =
      ReadText(dir_ + (v2_ ? "/memory.events" : "/memory.oom_control"));
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    int64_t kills = 0;
    if (absl::ConsumePrefix(&line, "oom_kill ") &&
        absl::SimpleAtoi(line, &kills)) {
      return kills;
    }
  }
  return 0;
}

}  // namespace pagealloc::testing
