// InProcessServer: a real pagealloc::Server in the test's own process, for
// tests that call the service without starting the daemon binary.
//
//   ServerOptions options;
//   options.backend = "cpu";
//   options.pool = {64, 4, FreePolicy::kLifo};
//   ASSERT_OK_AND_ASSIGN(auto server, InProcessServer::Start(options));
//   ASSERT_OK_AND_ASSIGN(auto client, server->Connect());
//   ... server->pool() ..., server->server().core() ...,
//   ... DaemonStats(server->target()) ...
//
// Start adds a private Unix socket to the server's listen addresses, so a
// test can use both transports: Connect and NewStub go through the
// in-process channel (no socket, no gRPC message size limit), target() is
// the socket (what a separate process or a fresh channel dials).
//
// Clients and stubs on the in-process channel must be gone before Stop or
// the destructor: gRPC (1.51) crashes when a call starts on an in-process
// channel whose server has shut down, and a Client starts one on its own
// (its KeepAlive stream). Clients over target() just see UNAVAILABLE.
//
// This class is thread-safe (as Server is).

#ifndef PAGEALLOC_TESTS_IN_PROCESS_SERVER_H_
#define PAGEALLOC_TESTS_IN_PROCESS_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/pagealloc.grpc.pb.h"
#include "server/server.h"

namespace pagealloc::testing {

// The daemon most tests start: the CPU backend, a lifo pool of `num_pages`
// pages of `page_size` tokens, leases of 30 s (no test waits on one),
// rings of `ring_capacity_slots` slots and the pool's debug checks on.
ServerOptions CpuTestOptions(int64_t num_pages, int64_t page_size,
                             int64_t ring_capacity_slots = 1024);

class InProcessServer {
 public:
  // Creates and starts a Server with `options` plus a Unix socket in a
  // fresh private directory. Returns Server::Create's or Server::Start's
  // error (nothing is left running or on disk then).
  static absl::StatusOr<std::unique_ptr<InProcessServer>> Start(
      ServerOptions options);

  // Stops the server (see Stop) and removes the socket's directory.
  ~InProcessServer();

  InProcessServer(const InProcessServer&) = delete;
  InProcessServer& operator=(const InProcessServer&) = delete;

  // Drains and stops the server (Server::Shutdown): the socket goes away and
  // calls over it fail with UNAVAILABLE. Idempotent. REQUIRES: no client
  // or stub on channel() is left (see above).
  void Stop();

  // "unix:///tmp/pagealloc-test-XXXXXX/server.sock".
  const std::string& target() const { return target_; }
  // The in-process channel (one for the server's lifetime).
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // A raw stub on the in-process channel.
  std::unique_ptr<v1::PageAllocator::Stub> NewStub() const;

  // Connects a client with `options`. Unless options.channel or
  // options.target is set it uses the in-process channel; client_name
  // defaults to "test".
  absl::StatusOr<std::unique_ptr<Client>> Connect(
      ClientOptions options = {}) const;

  Server& server() { return *server_; }
  PagePool& pool() { return server_->pool(); }

 private:
  InProcessServer(std::unique_ptr<Server> server, std::string socket_dir);

  std::unique_ptr<Server> server_;
  const std::string socket_dir_;
  const std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
};

// A fixture around one InProcessServer and a raw stub on its channel.
class InProcessServerTest : public ::testing::Test {
 protected:
  // Stops the running server, if any, and starts one with `options`.
  void StartServer(const ServerOptions& options);
  // Stops and destroys the server; the stub on its channel goes first.
  // Clients on the channel must be gone already (see above).
  void StopServer();

  std::unique_ptr<InProcessServer> server_;
  std::unique_ptr<v1::PageAllocator::Stub> stub_;
};

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_IN_PROCESS_SERVER_H_
