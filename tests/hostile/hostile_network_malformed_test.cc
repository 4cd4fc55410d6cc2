// Hostile network: bytes that are not the method's message, sent to every
// method of pagealloc.v1.PageAllocator through a generic stub over the
// daemon's Unix socket. Each is INVALID_ARGUMENT naming the message type,
// counted in the method's metrics, and the daemon keeps serving: a session
// registered before and one registered after allocate, and the pool is
// unchanged.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/pagealloc.pb.h"
#include "server/rpc_metrics.h"
#include "tests/in_process_server.h"
#include "tests/status_matchers.h"

namespace pagealloc::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kDeadline = absl::Seconds(20);

// Byte strings no message of the API parses from.
const std::vector<std::string>& Garbage() {
  static const auto* garbage = new std::vector<std::string>{
      // Field 1, length 16, then 3 bytes: the message ends inside a field.
      std::string("\x0a\x10"
                  "abc",
                  5),
      // A tag whose varint never ends within ten bytes.
      std::string(10, '\xff') + '\x01',
      // Field number 0 is reserved.
      std::string("\x00\x01", 2),
      // Wire type 7 does not exist.
      std::string("\x0f\x01", 2),
  };
  return *garbage;
}

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// A unary call with `request` as its raw body; returns its status.
grpc::Status UnaryCall(grpc::GenericStub& stub, const std::string& method,
                       const std::string& request) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kDeadline));
  const grpc::ByteBuffer body = Bytes(request);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &body, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  return status;
}

// Opens a KeepAlive stream, writes `message` as its first message and
// returns the stream's status.
class RawKeepAlive final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  grpc::Status Run(grpc::GenericStub& stub, const std::string& message) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + kDeadline));
    outgoing_ = Bytes(message);
    stub.PrepareBidiStreamingCall(&context_,
                                  "/pagealloc.v1.PageAllocator/KeepAlive",
                                  grpc::StubOptions(), this);
    StartWrite(&outgoing_);
    StartRead(&incoming_);
    StartCall();
    done_.WaitForNotification();
    return status_;
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }

 private:
  grpc::ClientContext context_;
  grpc::ByteBuffer outgoing_;
  grpc::ByteBuffer incoming_;
  grpc::Status status_;
  absl::Notification done_;
};

class HostileNetworkMalformedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.backend = "cpu";
    options.pool = {64, 4, FreePolicy::kLifo};
    ASSERT_OK_AND_ASSIGN(server_, InProcessServer::Start(options));
    channel_ = grpc::CreateChannel(server_->target(),
                                   grpc::InsecureChannelCredentials());
    stub_ = std::make_unique<grpc::GenericStub>(channel_);
  }

  std::unique_ptr<Client> ConnectOverSocket(const std::string& name) {
    ClientOptions options;
    options.target = server_->target();
    options.client_name = name;
    absl::StatusOr<std::unique_ptr<Client>> client = server_->Connect(options);
    EXPECT_OK(client.status());
    return client.ok() ? *std::move(client) : nullptr;
  }

  int64_t InvalidArgumentCount(Method method) {
    return server_->server().core().rpc_metrics().count(
        method, Transport::kGrpc, absl::StatusCode::kInvalidArgument);
  }

  std::unique_ptr<InProcessServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
};

TEST_F(HostileNetworkMalformedTest, EveryUnaryMethodAnswersInvalidArgument) {
  std::unique_ptr<Client> before = ConnectOverSocket("before");
  ASSERT_NE(before, nullptr);
  const struct {
    Method method;
    const char* request_type;
  } kUnary[] = {
      {Method::kRegister, "RegisterRequest"},
      {Method::kAllocExtend, "AllocExtendRequest"},
      {Method::kAllocDecode, "AllocDecodeRequest"},
      {Method::kAlloc, "AllocRequest"},
      {Method::kFree, "FreeRequest"},
      {Method::kCheckpoint, "CheckpointRequest"},
      {Method::kRollback, "RollbackRequest"},
      {Method::kReleaseRing, "ReleaseRingRequest"},
      {Method::kGetStats, "GetStatsRequest"},
      {Method::kClearSession, "ClearSessionRequest"},
      {Method::kClearPool, "ClearPoolRequest"},
      {Method::kGetFreeLists, "GetFreeListsRequest"},
      {Method::kPublish, "PublishRequest"},
      {Method::kMatchPrefix, "MatchPrefixRequest"},
      {Method::kUnpinPrefix, "UnpinPrefixRequest"},
      {Method::kResetPrefixCache, "ResetPrefixCacheRequest"},
      {Method::kResume, "ResumeRequest"},
  };
  for (const auto& [method, request_type] : kUnary) {
    const std::string path =
        absl::StrFormat("/pagealloc.v1.PageAllocator/%s", MethodName(method));
    for (const std::string& garbage : Garbage()) {
      const grpc::Status status = UnaryCall(*stub_, path, garbage);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << path << ": " << status.error_code() << " "
          << status.error_message();
      EXPECT_THAT(status.error_message(),
                  HasSubstr(absl::StrFormat(
                      "the request is not a valid pagealloc.v1.%s message",
                      request_type)))
          << path;
    }
    EXPECT_EQ(InvalidArgumentCount(method),
              static_cast<int64_t>(Garbage().size()))
        << path;
  }

  // The daemon serves on: the earlier session and a new one allocate, and
  // every page is back when they are gone.
  ASSERT_OK_AND_ASSIGN(Allocation old_pages, before->Alloc({16}));
  EXPECT_OK(old_pages.status());
  std::unique_ptr<Client> after = ConnectOverSocket("after");
  ASSERT_NE(after, nullptr);
  ASSERT_OK_AND_ASSIGN(Allocation new_pages, after->Alloc({16}));
  EXPECT_OK(new_pages.status());
  before.reset();
  after.reset();
  EXPECT_EQ(server_->pool().Stats().free_pages, 64);
}

TEST_F(HostileNetworkMalformedTest, KeepAliveEndsWithInvalidArgument) {
  for (const std::string& garbage : Garbage()) {
    RawKeepAlive stream;
    const grpc::Status status = stream.Run(*stub_, garbage);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_code() << " " << status.error_message();
    EXPECT_THAT(status.error_message(),
                HasSubstr("not a valid pagealloc.v1.KeepAliveRequest"));
  }
  EXPECT_EQ(InvalidArgumentCount(Method::kKeepAlive),
            static_cast<int64_t>(Garbage().size()));
  // A well-formed message on a raw stream is still served (NOT_FOUND: no
  // such session).
  v1::KeepAliveRequest unknown;
  unknown.mutable_session()->set_session_id(12345);
  RawKeepAlive stream;
  EXPECT_EQ(stream.Run(*stub_, unknown.SerializeAsString()).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(HostileNetworkMalformedTest, RegisterRefusesNamesThatAreNotText) {
  // Field 1 (client_name) holding bytes that are not UTF-8: protobuf
  // refuses to parse a proto3 string like that.
  const grpc::Status not_utf8 =
      UnaryCall(*stub_, "/pagealloc.v1.PageAllocator/Register",
                std::string("\x0a\x03"
                            "a\xff"
                            "b",
                            5));
  EXPECT_EQ(not_utf8.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << not_utf8.error_message();
  // UTF-8 with a newline parses, and the daemon refuses it.
  v1::RegisterRequest forged;
  forged.set_client_name("tp0\n[critical] forged line");
  const grpc::Status newline =
      UnaryCall(*stub_, "/pagealloc.v1.PageAllocator/Register",
                forged.SerializeAsString());
  EXPECT_EQ(newline.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(newline.error_message(),
              HasSubstr("client_name has a control character (U+000A"));
  EXPECT_EQ(server_->server().core().Sessions().size(), 0u);
}

}  // namespace
}  // namespace pagealloc::testing
