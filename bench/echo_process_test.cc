#include "bench/echo_process.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "bench/workload.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/status_matchers.h"
#include "tests/subprocess.h"

namespace pagealloc::bench {
namespace {

using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

std::string TestDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string Bench() { return testing::RunfilePath("bench/pagealloc-bench"); }

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  ASSERT_NE(file, nullptr) << path;
  std::fputs(text.c_str(), file);
  ASSERT_EQ(std::fclose(file), 0);
}

TEST(EchoAnswerTest, NamesParseBack) {
  for (EchoAnswer answer : {EchoAnswer::kInline, EchoAnswer::kHandedOff}) {
    EXPECT_THAT(ParseEchoAnswer(EchoAnswerName(answer)), IsOkAndHolds(answer));
  }
  EXPECT_EQ(EchoAnswerName(EchoAnswer::kHandedOff), "handed_off");
  EXPECT_THAT(ParseEchoAnswer("handed-off"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad answer 'handed-off'")));
}

TEST(EchoTargetTest, WrittenTargetReadsBackWithNothingLeftBeside) {
  const std::string path = TestDir() + "/written.target";
  ASSERT_OK(WriteEchoTarget(path, "unix:///tmp/pagealloc-echo-x/echo.sock"));
  EXPECT_THAT(ReadEchoTarget(path),
              IsOkAndHolds("unix:///tmp/pagealloc-echo-x/echo.sock"));
  EXPECT_FALSE(Exists(path + ".partial"));
}

TEST(EchoTargetTest, MissingFileIsNotFound) {
  EXPECT_THAT(
      ReadEchoTarget(TestDir() + "/no-such.target"),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such.target")));
}

TEST(EchoTargetTest, AnythingButOneUnixLineIsDataLoss) {
  const std::string path = TestDir() + "/bad.target";
  for (const char* text :
       {"", "unix:///tmp/a/echo.sock", "unix://\n", "localhost:50051\n",
        "unix:///tmp/a/echo.sock\nunix:///tmp/b/echo.sock\n"}) {
    WriteFile(path, text);
    EXPECT_THAT(ReadEchoTarget(path),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("is not one")))
        << "'" << text << "'";
  }
}

TEST(EchoServerProcessTest, ChildServesAndRemovesItsSocketWhenStopped) {
  EchoServer::Options options;
  options.handoff_spin = absl::Microseconds(50);
  ASSERT_OK_AND_ASSIGN(
      EchoServerProcess child,
      EchoServerProcess::Start(Bench(), TestDir(), EchoAnswer::kHandedOff,
                               options));
  EXPECT_NE(child.pid(), getpid());
  const std::string target = child.target();
  const std::string socket(absl::StripPrefix(target, "unix://"));
  EXPECT_TRUE(Exists(socket)) << socket;

  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(health->Check(&context, {}, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  Workload w;
  w.batch = 8;
  w.max_seq_len = 64;
  ASSERT_OK_AND_ASSIGN(
      EchoCalls calls,
      MeasureEchoCalls(target, EchoCall::kAllocDecode, w, 2, 0.05, 1));
  EXPECT_GT(calls.histogram.count(), 0);

  ASSERT_OK(child.Stop());
  EXPECT_FALSE(Exists(socket)) << socket;
  EXPECT_FALSE(Exists(TestDir() + "/echo-handed_off.target"));
}

TEST(EchoServerProcessTest, ChildThatExitsAtStartIsUnavailableWithItsLog) {
  // /bin/false takes the flags, writes nothing and exits 1.
  EXPECT_THAT(EchoServerProcess::Start("/bin/false", TestDir(),
                                       EchoAnswer::kInline, {}),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("(inline) did not start: it exited 1")));
}

TEST(EchoServerProcessTest, ChildOfAnEndedParentExitsAtStart) {
  // The child is told its parent is the test's own parent: as when the
  // benchmark ends before the child asked for its signal.
  const std::string log = TestDir() + "/orphan.log";
  const std::string target_file = TestDir() + "/orphan.target";
  ASSERT_OK_AND_ASSIGN(
      testing::Subprocess child,
      testing::Subprocess::Start(
          {Bench(), "--echo_server", "--echo_target_file=" + target_file,
           absl::StrCat("--echo_parent_pid=", getppid())},
          log));
  ASSERT_OK_AND_ASSIGN(int status, child.Wait(absl::Seconds(30)));
  EXPECT_EQ(testing::DescribeWaitStatus(status), "exited 1");
  EXPECT_THAT(testing::ReadLog(log), HasSubstr("has ended"));
  EXPECT_FALSE(Exists(target_file));
}

}  // namespace
}  // namespace pagealloc::bench
