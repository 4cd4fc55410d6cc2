#include "tests/in_process_server.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace pagealloc::testing {

ServerOptions CpuTestOptions(int64_t num_pages, int64_t page_size,
                             int64_t ring_capacity_slots) {
  ServerOptions options;
  options.backend = "cpu";
  options.pool = {num_pages, page_size, FreePolicy::kLifo};
  options.sessions.lease = absl::Seconds(30);
  options.sessions.default_ring_capacity_slots = ring_capacity_slots;
  options.debug_checks = true;
  return options;
}

namespace {

constexpr char kSocketName[] = "server.sock";

}  // namespace

absl::StatusOr<std::unique_ptr<InProcessServer>> InProcessServer::Start(
    ServerOptions options) {
  // Unix socket paths are limited to 107 bytes and Bazel's TEST_TMPDIR is
  // longer: the socket gets a short directory of its own under /tmp.
  char pattern[] = "/tmp/pagealloc-test-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp for the server's socket: ",
                                            std::strerror(errno)));
  }
  const std::string dir = pattern;
  options.listen.push_back(absl::StrCat("unix://", dir, "/", kSocketName));
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
  absl::Status started = server.ok() ? (*server)->Start() : server.status();
  if (!started.ok()) {
    if (server.ok()) server->reset();  // stops what Create built
    rmdir(dir.c_str());
    return started;
  }
  return std::unique_ptr<InProcessServer>(
      new InProcessServer(*std::move(server), dir));
}

InProcessServer::InProcessServer(std::unique_ptr<Server> server,
                                 std::string socket_dir)
    : server_(std::move(server)),
      socket_dir_(std::move(socket_dir)),
      target_(absl::StrCat("unix://", socket_dir_, "/", kSocketName)),
      channel_(server_->InProcessChannel()) {}

InProcessServer::~InProcessServer() {
  Stop();
  // Shutdown removed the socket file; the directory was ours alone.
  rmdir(socket_dir_.c_str());
}

void InProcessServer::Stop() { server_->Shutdown(); }

std::unique_ptr<v1::PageAllocator::Stub> InProcessServer::NewStub() const {
  return v1::PageAllocator::NewStub(channel_);
}

absl::StatusOr<std::unique_ptr<Client>> InProcessServer::Connect(
    ClientOptions options) const {
  if (options.channel == nullptr && options.target.empty()) {
    options.channel = channel_;
  }
  if (options.client_name.empty()) options.client_name = "test";
  return Client::Connect(options);
}

void InProcessServerTest::StartServer(const ServerOptions& options) {
  StopServer();
  absl::StatusOr<std::unique_ptr<InProcessServer>> server =
      InProcessServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  stub_ = server_->NewStub();
}

void InProcessServerTest::StopServer() {
  stub_.reset();
  server_.reset();
}

}  // namespace pagealloc::testing
