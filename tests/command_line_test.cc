// The command line of the real binaries: --help shows each program's own
// flags, --version the build, and every bad flag is refused before anything
// starts with a message naming the flag, its value and what is accepted,
// exit code 2; failures at run time (an address in use, a directory that
// is not one) exit 1 with errno's words and the way out.

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/status_matchers.h"
#include "tests/subprocess.h"

namespace pagealloc::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

struct Outcome {
  std::string status;  // "exited 2"
  std::string output;  // stdout and stderr
};

// Runs `binary` (a runfile path) with `args` to completion.
Outcome RunBinary(const std::string& binary,
                  const std::vector<std::string>& args) {
  static int runs = 0;
  const std::string log =
      absl::StrFormat("%s/run%d.log", ::testing::TempDir(), ++runs);
  std::vector<std::string> argv = {RunfilePath(binary)};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv, log);
  if (!process.ok()) return {process.status().ToString(), ""};
  absl::StatusOr<int> status = process->Wait(absl::Seconds(60));
  if (!status.ok()) return {status.status().ToString(), ReadLog(log)};
  return {DescribeWaitStatus(*status), ReadLog(log)};
}

// A TCP port on 127.0.0.1 held by a listening socket (no SO_REUSEPORT), so
// that nothing else can bind it while the test runs.
class HeldPort {
 public:
  HeldPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        listen(fd_, 1) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~HeldPort() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

struct Case {
  std::string name;
  std::string binary;
  std::vector<std::string> args;
  std::string status;
  std::vector<std::string> output;  // each must appear
};

// Runs each case's binary and checks its exit status and output.
void ExpectOutcomes(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Outcome run = RunBinary(c.binary, c.args);
    EXPECT_EQ(run.status, c.status) << run.output;
    for (const std::string& text : c.output) {
      EXPECT_THAT(run.output, HasSubstr(text));
    }
  }
}

constexpr char kServer[] = "server/pagealloc-server";
constexpr char kCli[] = "client/pagealloc-cli";
constexpr char kBench[] = "bench/pagealloc-bench";

TEST(CommandLineTest, BadFlagsAreRefusedWithTheFlagTheValueAndTheRange) {
  const std::string u = "exited 2";
  const std::vector<Case> cases = {
      // Abseil's own parse errors exit 2 too.
      {"unknown flag",
       kServer,
       {"--no_such_flag"},
       u,
       {"Unknown command line flag 'no_such_flag'", "--help"}},
      // Malformed values, in our words: the flag, the value, what it takes.
      {"malformed value",
       kServer,
       {"--page_size=abc"},
       u,
       {"pagealloc-server: --page_size=abc is not an integer", "(tokens; ",
        "default 16)"}},
      {"malformed value, separate argument",
       kServer,
       {"--num_pages", "abc"},
       u,
       {"--num_pages=abc is not an integer", "(pages; default 0)"}},
      {"malformed bool",
       kServer,
       {"--fast_channel=maybe"},
       u,
       {"--fast_channel=maybe is not true or false (also 1 or 0, yes or no)"}},
      {"malformed value, cli",
       kCli,
       {"--interval_ms=1s", "watch"},
       u,
       {"pagealloc-cli: --interval_ms=1s is not an integer",
        "(milliseconds; default 1000)"}},
      {"positional argument",
       kServer,
       {"serve"},
       u,
       {"unexpected argument \"serve\""}},
      // Ranges.
      {"metrics port",
       kServer,
       {"--metrics_port=70000"},
       u,
       {"--metrics_port=70000 is out of range (accepted: 1..65535, 0 for any "
        "free port, -1 for none)"}},
      {"lease 0",
       kServer,
       {"--lease_ms=0"},
       u,
       {"--lease_ms=0 is out of range (accepted: 100..86400000 "
        "milliseconds)"}},
      {"page size 0",
       kServer,
       {"--page_size=0"},
       u,
       {"--page_size=0 is out of range (accepted: 1..1048576 tokens)"}},
      {"num_pages past 2^40 slots",
       kServer,
       {"--num_pages=99999999999999"},
       u,
       {"--num_pages=99999999999999 is out of range", "2^40 slots"}},
      {"pool_tokens below a page",
       kServer,
       {"--pool_tokens=3"},
       u,
       {"--pool_tokens=3 is out of range", "at least one page"}},
      {"pollers 0",
       kServer,
       {"--fast_channel_pollers=0"},
       u,
       {"--fast_channel_pollers=0 is out of range (accepted: 1..64 threads)"}},
      {"answer threads past 64",
       kServer,
       {"--grpc_answer_threads=65"},
       u,
       {"--grpc_answer_threads=65 is out of range (accepted: 0..64 threads)"}},
      {"batch tokens 0",
       kServer,
       {"--max_batch_tokens=0"},
       u,
       {"--max_batch_tokens=0 is out of range"}},
      {"sessions 0",
       kServer,
       {"--max_sessions=0"},
       u,
       {"--max_sessions=0 is out of range"}},
      {"quota past the pool",
       kServer,
       {"--num_pages=64", "--max_session_quota_pages=65"},
       u,
       {"--max_session_quota_pages=65 is out of range (accepted: 0..64"}},
      {"socket mode",
       kServer,
       {"--socket_mode=999"},
       u,
       {"--socket_mode=999 is out of range (accepted: an octal file mode"}},
      {"socket mode empty",
       kServer,
       {"--socket_mode="},
       u,
       {"--socket_mode= is out of range"}},
      // The KV memory.
      {"kv layout",
       kServer,
       {"--kv_layout=gqa:layers=1"},
       u,
       {"--kv_layout=gqa:layers=1: kind \"gqa\" is not mha, mla or custom"}},
      {"kv memory",
       kServer,
       {"--kv_layout=mla:layers=2,kv_lora_rank=512,rope_dim=64,dtype=bf16",
        "--kv_memory=lots"},
       u,
       {"--kv_memory=lots is neither a size"}},
      {"kv layout unsized",
       kServer,
       {"--kv_layout=mla:layers=2,kv_lora_rank=512,rope_dim=64,dtype=bf16"},
       u,
       {"--kv_layout needs --kv_memory"}},
      {"kv budget leaves no page",
       kServer,
       {"--backend=cpu", "--listen=unix:///tmp/pagealloc-kv-refused.sock",
        "--kv_layout=mha:layers=32,kv_heads=8,head_dim=128,dtype=bf16",
        "--kv_memory=1MiB", "--page_size=16"},
       u,
       {"a KV budget of 1.0 MiB (1048576 bytes) leaves no usable page",
        "64 buffers"}},
      {"kv scrub alone",
       kServer,
       {"--kv_scrub"},
       u,
       {"--kv_scrub needs --kv_layout"}},
      {"register secret unreadable",
       kServer,
       {"--register_secret_file=/nonexistent/secret"},
       u,
       {"--register_secret_file=/nonexistent/secret: cannot read it"}},
      // Choices and names.
      {"backend",
       kServer,
       {"--backend=gpu"},
       u,
       {"--backend=gpu is not one of auto, cuda, cpu"}},
      {"free policy",
       kServer,
       {"--free_policy=fifo"},
       u,
       {"--free_policy=fifo is not one of lifo, sorted"}},
      {"unknown log level",
       kServer,
       {"--log_level=LOUD"},
       u,
       {"--log_level=LOUD is not one of trace, debug, info"}},
      {"socket group",
       kServer,
       {"--socket_group=no-such-group-here"},
       u,
       {"--socket_group=no-such-group-here: no such group"}},
      {"tls without key",
       kServer,
       {"--tls_cert_file=/etc/hostname"},
       u,
       {"TLS needs both --tls_cert_file and --tls_key_file"}},
      {"tls file missing",
       kServer,
       {"--tls_cert_file=/nonexistent/cert.pem",
        "--tls_key_file=/nonexistent/key.pem"},
       u,
       {"--tls_cert_file=/nonexistent/cert.pem: cannot read it: No such file "
        "or directory"}},
      // Addresses.
      {"listen without a scheme",
       kServer,
       {"--listen=/tmp/x.sock"},
       u,
       {"--listen=/tmp/x.sock is not a gRPC address: did you mean "
        "unix:///tmp/x.sock?"}},
      {"listen with a relative unix path",
       kServer,
       {"--listen=unix://tmp/x.sock"},
       u,
       {"did you mean unix:///", "/tmp/x.sock?"}},
      {"listen without a port",
       kServer,
       {"--listen=localhost"},
       u,
       {"--listen=localhost is not a gRPC address (accepted: "
        "unix:///path.sock, or host:port"}},
      // Sizing: 2^40 - 1 pages of one token need 32 TiB of bookkeeping.
      {"pool larger than the host",
       kServer,
       {"--page_size=1", "--num_pages=1099511627775"},
       u,
       {"a pool of 1099511627775 pages", "needs 40.0 TiB of host memory",
        "available", "Sizing the pool"}},
      // The CLI.
      {"cli: no command", kCli, {}, u, {"which command?"}},
      {"cli: unknown command", kCli, {"stat"}, u, {"unknown command \"stat\""}},
      {"cli: unknown flag",
       kCli,
       {"--sesions", "stats"},
       u,
       {"Unknown command line flag 'sesions'"}},
      {"cli: target without a scheme",
       kCli,
       {"--target=/tmp/x.sock", "stats"},
       u,
       {"--target=/tmp/x.sock has no scheme: did you mean "
        "unix:///tmp/x.sock?"}},
      {"cli: output",
       kCli,
       {"--output=xml", "stats"},
       u,
       {"--output=xml is not text or json"}},
      {"cli: interval",
       kCli,
       {"--interval_ms=0", "watch"},
       u,
       {"--interval_ms=0 is out of range"}},
      {"cli: alloc without tokens",
       kCli,
       {"alloc"},
       u,
       {"alloc: --tokens=0 must be >= 1"}},
      {"cli: free without pages",
       kCli,
       {"free", "--session_file=/x"},
       u,
       {"free needs --pages"}},
      {"cli: free without a session",
       kCli,
       {"free", "--pages=1"},
       u,
       {"free needs the session: --session_file"}},
      {"cli: resumable alloc without a session file",
       kCli,
       {"alloc", "--tokens=4", "--resumable"},
       u,
       {"alloc --resumable needs --session_file"}},
      {"cli: resume without a session",
       kCli,
       {"resume"},
       u,
       {"resume needs the session: --session_file"}},
      {"cli: resume with a negative hold",
       kCli,
       {"resume", "--hold_s=-1"},
       u,
       {"resume: --hold_s=-1 must be >= 0"}},
      {"bench: unknown flag",
       kBench,
       {"--no_such_flag"},
       u,
       {"Unknown command line flag 'no_such_flag'"}},
  };
  ExpectOutcomes(cases);
}

// Failures at run time exit 1 and say why in errno's words, with the way
// out; the fatal error shows whatever --log_level says (in any case).
TEST(CommandLineTest, FailuresAtStartSayWhyAndExit1) {
  HeldPort held;
  ASSERT_NE(held.port(), 0);
  const std::string port = absl::StrCat(held.port());
  const std::string socket = absl::StrFormat("/tmp/pagealloc-cmdline-%d.sock",
                                             static_cast<int>(getpid()));
  const std::vector<std::string> cpu = {"--backend=cpu", "--metrics_port=-1"};
  const auto with = [&cpu](std::vector<std::string> args) {
    args.insert(args.begin(), cpu.begin(), cpu.end());
    return args;
  };
  const std::string f = "exited 1";
  const std::vector<Case> cases = {
      {"grpc port in use",
       kServer,
       with({"--listen=127.0.0.1:" + port}),
       f,
       {"could not listen on 127.0.0.1:" + port,
        "127.0.0.1:" + port + ": Address already in use"}},
      {"metrics port in use",
       kServer,
       {"--backend=cpu", "--listen=unix://" + socket,
        "--metrics_host=127.0.0.1", "--metrics_port=" + port},
       f,
       {"cannot serve metrics on 127.0.0.1:" + port +
            ": Address already in use (another process listens there)",
        "own --metrics_port"}},
      {"socket directory is a file",
       kServer,
       with({"--listen=unix:///dev/null/gpu0.sock"}),
       f,
       {"cannot create sockets in /dev/null: Not a directory",
        "--listen=unix:///tmp/pagealloc.sock"}},
      {"socket directory missing",
       kServer,
       with({"--listen=unix:///nonexistent-pagealloc/sub/gpu0.sock"}),
       f,
       {"cannot start: NOT_FOUND: cannot create the socket directory "
        "/nonexistent-pagealloc/sub: No such file or directory"}},
      {"upper-case level, fatal error shown",
       kServer,
       with({"--log_level=WARN", "--listen=unix:///dev/null/gpu0.sock"}),
       f,
       {"[critical] cannot start:", "Not a directory"}},
      {"logging off, fatal error shown",
       kServer,
       with({"--log_level=off", "--listen=unix:///dev/null/gpu0.sock"}),
       f,
       {"pagealloc-server: cannot start:", "Not a directory"}},
      {"cli: no daemon",
       kCli,
       {"--target=unix:///tmp/pagealloc-no-daemon-here.sock", "stats"},
       f,
       {"stats: UNAVAILABLE"}},
  };
  ExpectOutcomes(cases);
  // The daemon that could not serve metrics took its socket with it.
  struct stat st;
  EXPECT_NE(stat(socket.c_str(), &st), 0) << socket << " was left behind";
}

TEST(CommandLineTest, ServerHelpListsItsOwnFlagsByGroupWithDefaults) {
  const Outcome run = RunBinary(kServer, {"--help"});
  EXPECT_EQ(run.status, "exited 0") << run.output;
  for (const char* group :
       {"\npool:\n", "\nKV memory:\n", "\nmemory and sessions:\n",
        "\ntransport:\n", "\nsecurity:\n", "\nbatching:\n", "\nlogging:\n",
        "\nmetrics:\n"}) {
    EXPECT_THAT(run.output, HasSubstr(group));
  }
  EXPECT_THAT(run.output, HasSubstr("  --lease_ms=10000  (milliseconds)\n"));
  EXPECT_THAT(run.output, HasSubstr("  --num_pages=0  (pages)\n"));
  EXPECT_THAT(run.output, HasSubstr("  --metrics_port=9464  (TCP port)\n"));
  // Every flag of server/main.cc is in a group.
  EXPECT_THAT(run.output, Not(HasSubstr("\nother:\n")));
  // Abseil's and gRPC's flags are for --helpfull.
  EXPECT_THAT(run.output, Not(HasSubstr("--flagfile")));
  EXPECT_THAT(run.output, Not(HasSubstr("--helpfull=")));
  const Outcome filtered = RunBinary(kServer, {"--help=lease"});
  EXPECT_EQ(filtered.status, "exited 0");
  EXPECT_THAT(filtered.output, HasSubstr("--lease_ms=10000"));
  EXPECT_THAT(filtered.output, Not(HasSubstr("  --page_size=")));
}

TEST(CommandLineTest, CliAndBenchHelpListTheirOwnFlags) {
  const Outcome cli = RunBinary(kCli, {"--help"});
  EXPECT_EQ(cli.status, "exited 0") << cli.output;
  for (const char* flag :
       {"--target=\"\"  (gRPC address)", "/run/pagealloc/gpu0.sock, else",
        "$XDG_RUNTIME_DIR/pagealloc/gpu0.sock", "--output=text",
        "--session_file=\"\"", "--hold_s=0  (seconds)", "--pages=\"\""}) {
    EXPECT_THAT(cli.output, HasSubstr(flag));
  }
  EXPECT_THAT(cli.output, Not(HasSubstr("\nother:\n")));
  EXPECT_THAT(cli.output, Not(HasSubstr("--flagfile")));
  const Outcome bench = RunBinary(kBench, {"--help"});
  EXPECT_EQ(bench.status, "exited 0") << bench.output;
  EXPECT_THAT(bench.output, HasSubstr("--sweep_clients=\"\""));
  EXPECT_THAT(bench.output, Not(HasSubstr("--worker_index")));
  EXPECT_THAT(bench.output, Not(HasSubstr("--flagfile")));
}

TEST(CommandLineTest, VersionSaysVersionCommitAndBackends) {
  for (const char* binary : {kServer, kCli, kBench}) {
    SCOPED_TRACE(binary);
    const Outcome run = RunBinary(binary, {"--version"});
    EXPECT_EQ(run.status, "exited 0") << run.output;
    EXPECT_THAT(run.output, ContainsRegex("^pagealloc-[a-z]+ [0-9]+\\.[0-9]+"
                                          "\\.[0-9]+\n"));
    EXPECT_THAT(
        run.output,
        ContainsRegex("\ncommit   ([0-9a-f]{12}(-modified)?|unknown)\n"));
    EXPECT_THAT(run.output, ContainsRegex("\nbackends cpu(, cuda| \\(built "
                                          "without CUDA)"));
  }
}

}  // namespace
}  // namespace pagealloc::testing
