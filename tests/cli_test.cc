// pagealloc-cli against a real daemon: Ctrl-C ends alloc's session at once,
// the daemon's death ends its hold with a message and exit code 1,
// free acts through the session file alloc wrote and says whether a page
// was never allocated or already freed, a resumable session outlives alloc
// and resume takes it back (or is told why not), and stats and watch print
// GetStatsResponse as JSON and list each session's transport and lease age.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/daemon_process.h"
#include "tests/daemon_stats.h"
#include "tests/status_matchers.h"
#include "tests/subprocess.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The lease is long: pages that come back during a test came back because
// the session was closed, not because its lease ran out.
constexpr char kLongLease[] = "--lease_ms=60000";

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/" + name;
}

struct Outcome {
  std::string status;
  std::string output;
};

// Runs `argv` to completion.
Outcome RunToEnd(const std::vector<std::string>& argv) {
  static int runs = 0;
  const std::string log = TempPath(absl::StrFormat("cli%d.log", ++runs));
  absl::StatusOr<Subprocess> cli = Subprocess::Start(argv, log);
  if (!cli.ok()) return {cli.status().ToString(), ""};
  absl::StatusOr<int> status = cli->Wait(absl::Seconds(30));
  if (!status.ok()) return {status.status().ToString(), ReadLog(log)};
  return {DescribeWaitStatus(*status), ReadLog(log)};
}

// Runs the CLI with `args` to completion.
Outcome Cli(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {RunfilePath("client/pagealloc-cli")};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunToEnd(argv);
}

// A running `alloc --hold_s`, with the pages it printed.
struct Holder {
  Subprocess process;
  std::string log;
  std::vector<int64_t> pages;
};

absl::StatusOr<Holder> StartHolder(const Daemon& daemon, int64_t tokens,
                                   const std::vector<std::string>& extra) {
  Holder holder;
  holder.log = TempPath(absl::StrFormat("holder%d.log", getpid()));
  unlink(holder.log.c_str());
  std::vector<std::string> argv = {
      RunfilePath("client/pagealloc-cli"), "--target=" + daemon.target, "alloc",
      absl::StrCat("--tokens=", tokens), "--hold_s=600"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv, holder.log);
  if (!process.ok()) return process.status();
  holder.process = *std::move(process);
  // "session N: ... (K pages): 1,2,3,4" then "holding the pages".
  std::string text;
  WaitFor(
      [&] {
        text = ReadLog(holder.log);
        return absl::StrContains(text, "holding the pages") ||
               !holder.process.running();
      },
      absl::Seconds(20));
  if (!absl::StrContains(text, "holding the pages")) {
    return absl::InternalError("alloc did not start holding:\n" + text);
  }
  const size_t colon = text.find("pages): ");
  const std::string list =
      text.substr(colon + 8, text.find('\n', colon) - colon - 8);
  for (absl::string_view page : absl::StrSplit(list, ',')) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(page, &id)) {
      return absl::InternalError("no page list in:\n" + text);
    }
    holder.pages.push_back(id);
  }
  return holder;
}

class CliSignalTest : public ::testing::TestWithParam<int> {};

TEST_P(CliSignalTest, EndsTheHoldAndReturnsThePagesAtOnce) {
  const int signal = GetParam();
  ASSERT_OK_AND_ASSIGN(Daemon daemon,
                       StartDaemon(absl::StrCat("signal", signal),
                                   {kLongLease, "--page_size=16"}));
  const std::string session_file = TempPath(absl::StrCat("s", signal));
  ASSERT_OK_AND_ASSIGN(
      Holder holder,
      StartHolder(daemon, 64, {"--session_file=" + session_file}));
  EXPECT_EQ(holder.pages.size(), 4u);
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse holding,
                       DaemonStats(daemon.target));
  EXPECT_EQ(holding.used_pages(), 4);
  struct stat st;
  ASSERT_EQ(stat(session_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);

  holder.process.Signal(signal);
  ASSERT_OK_AND_ASSIGN(int status, holder.process.Wait(absl::Seconds(20)));
  EXPECT_EQ(DescribeWaitStatus(status), "exited 0") << ReadLog(holder.log);
  EXPECT_THAT(ReadLog(holder.log), HasSubstr("closing the session"));
  // Closed by the client: the pages are back, well before the lease.
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse after, DaemonStats(daemon.target));
  EXPECT_EQ(after.used_pages(), 0);
  EXPECT_EQ(after.sessions_active(), 0);
  EXPECT_THAT(ReadLog(daemon.log_path), HasSubstr("closed by client"));
  EXPECT_THAT(ReadLog(daemon.log_path), Not(HasSubstr("lost its lease")));
  EXPECT_NE(stat(session_file.c_str(), &st), 0) << "session file left behind";
}

INSTANTIATE_TEST_SUITE_P(SigintAndSigterm, CliSignalTest,
                         ::testing::Values(SIGINT, SIGTERM));

// The daemon dies under a hold: alloc says so at once and exits 1, and the
// session file (of a session that no longer exists) is gone.
TEST(CliTest, AHoldEndsWithAMessageWhenTheDaemonDies) {
  ASSERT_OK_AND_ASSIGN(Daemon daemon, StartDaemon("dies", {kLongLease}));
  const std::string session_file = TempPath("dying-session");
  ASSERT_OK_AND_ASSIGN(
      Holder holder,
      StartHolder(daemon, 16, {"--session_file=" + session_file}));
  daemon.process.Signal(SIGKILL);
  // The hold is 600 s: only the daemon's death ends it within this bound.
  ASSERT_OK_AND_ASSIGN(int status, holder.process.Wait(absl::Seconds(30)));
  EXPECT_EQ(DescribeWaitStatus(status), "exited 1") << ReadLog(holder.log);
  EXPECT_THAT(ReadLog(holder.log),
              HasSubstr("ended during the hold: UNAVAILABLE: "));
  EXPECT_THAT(ReadLog(holder.log), HasSubstr("its pages are no longer held"));
  struct stat st;
  EXPECT_NE(stat(session_file.c_str(), &st), 0) << "the session file stayed";
}

TEST(CliTest, FreeActsThroughTheSessionFileAndSaysWhyAPageIsFree) {
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon("free", {kLongLease, "--page_size=16", "--num_pages=256"}));
  const std::string session_file = TempPath("free.session");
  const std::string token_file = TempPath("free.token");
  ASSERT_OK_AND_ASSIGN(Holder holder,
                       StartHolder(daemon, 64,
                                   {"--session_file=" + session_file,
                                    "--token_file=" + token_file}));
  ASSERT_EQ(holder.pages.size(), 4u);
  const std::string first = absl::StrCat(holder.pages[0]);

  // The session file carries the daemon's address: no --target needed.
  Outcome freed =
      Cli({"free", "--session_file=" + session_file, "--pages=" + first});
  EXPECT_EQ(freed.status, "exited 0") << freed.output;
  EXPECT_THAT(freed.output, HasSubstr("1 page freed\n"));
  Outcome again =
      Cli({"free", "--session_file=" + session_file, "--pages=" + first});
  EXPECT_EQ(again.status, "exited 1");
  EXPECT_THAT(again.output,
              HasSubstr(absl::StrFormat("page %s was already freed (double "
                                        "free)",
                                        first)));
  Outcome never =
      Cli({"free", "--session_file=" + session_file, "--pages=200"});
  EXPECT_EQ(never.status, "exited 1");
  EXPECT_THAT(never.output, HasSubstr("page 200 was never allocated"));
  EXPECT_THAT(never.output, Not(HasSubstr("double free")));

  // The session id and raw token file still work.
  std::ifstream session_text(session_file);
  std::string line;
  std::string id;
  while (std::getline(session_text, line)) {
    if (absl::StartsWith(line, "session_id ")) id = line.substr(11);
  }
  ASSERT_FALSE(id.empty());
  Outcome by_id = Cli({"--target=" + daemon.target, "free",
                       "--session_id=" + id, "--token_file=" + token_file,
                       absl::StrCat("--pages=", holder.pages[1])});
  EXPECT_EQ(by_id.status, "exited 0") << by_id.output;
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse stats, DaemonStats(daemon.target));
  EXPECT_EQ(stats.used_pages(), 2);
  holder.process.Signal(SIGTERM);
  ASSERT_OK(holder.process.Wait(absl::Seconds(20)).status());
  Outcome gone =
      Cli({"free", "--session_file=" + session_file, "--pages=" + first});
  EXPECT_EQ(gone.status, "exited 1");
  EXPECT_THAT(gone.output, HasSubstr("alloc removes it when it exits"));
}

// The id and token a session file holds.
struct SessionFile {
  uint64_t id = 0;
  std::string token;
};
SessionFile ReadSessionFile(const std::string& path) {
  SessionFile file;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "session_id ")) {
      EXPECT_TRUE(absl::SimpleAtoi(line.substr(11), &file.id)) << line;
    }
    if (absl::StartsWith(line, "token ")) {
      file.token = absl::HexStringToBytes(line.substr(6));
    }
  }
  return file;
}

v1::SessionStats SessionLine(const v1::GetStatsResponse& stats, uint64_t id) {
  for (const v1::SessionStats& session : stats.sessions()) {
    if (session.session_id() == id) return session;
  }
  return v1::SessionStats();
}

// A resumable session outlives the process that opened it: alloc
// --resumable, SIGKILLed during its hold, leaves the session (detached)
// with its pages, and another process takes it back with Client::Resume
// through the session file and frees them.
TEST(CliTest, AResumableSessionSurvivesItsProcessAndIsResumed) {
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon, StartDaemon("resumable", {kLongLease, "--page_size=16"}));
  const std::string session_file = TempPath("resumable.session");
  ASSERT_OK_AND_ASSIGN(
      Holder holder,
      StartHolder(daemon, 64,
                  {"--session_file=" + session_file, "--resumable"}));
  ASSERT_EQ(holder.pages.size(), 4u);
  const SessionFile file = ReadSessionFile(session_file);
  ASSERT_NE(file.id, 0u);
  holder.process.Signal(SIGKILL);
  ASSERT_OK(holder.process.Wait(absl::Seconds(20)).status());
  ASSERT_OK_AND_ASSIGN(
      v1::GetStatsResponse kept,
      WaitForStats(
          daemon.target,
          [&](const v1::GetStatsResponse& s) {
            const v1::SessionStats line = SessionLine(s, file.id);
            return line.session_id() == file.id && !line.connected();
          },
          absl::Seconds(10)));
  EXPECT_EQ(kept.sessions_active(), 1);
  EXPECT_EQ(kept.used_pages(), 4);
  EXPECT_EQ(SessionLine(kept, file.id).pages_owned(), 4);
  EXPECT_TRUE(SessionLine(kept, file.id).resumable());
  EXPECT_THAT(ReadLog(daemon.log_path), HasSubstr("kept for a Resume"));

  ClientOptions options;
  options.target = daemon.target;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> resumed,
                       Client::Resume(options, file.id, file.token));
  EXPECT_TRUE(SessionLine(*DaemonStats(daemon.target), file.id).connected());
  EXPECT_THAT(resumed->FreePages(holder.pages), IsOkAndHolds(4));
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse freed, DaemonStats(daemon.target));
  EXPECT_EQ(freed.used_pages(), 0);
  EXPECT_EQ(freed.free_pages(), freed.pool().num_pages());
  ASSERT_OK(resumed->Close());
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse closed, DaemonStats(daemon.target));
  EXPECT_EQ(closed.sessions_active(), 0);
}

// resume shows what survived, holds it like alloc and leaves it for another
// resume, or ends it with --close; it says why it cannot take a session
// that is held (--take_over takes it) or gone.
TEST(CliTest, ResumeShowsWhatSurvivedAndLeavesOrClosesTheSession) {
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon("resume", {kLongLease, "--page_size=16", "--num_pages=64"}));
  const std::string session_file = TempPath("resume.session");
  Outcome alloc = Cli({"--target=" + daemon.target, "alloc", "--tokens=64",
                       "--session_file=" + session_file, "--resumable"});
  ASSERT_EQ(alloc.status, "exited 0") << alloc.output;
  EXPECT_THAT(alloc.output, HasSubstr("left with its pages for a resume"));
  struct stat st;
  ASSERT_EQ(stat(session_file.c_str(), &st), 0) << "the session file went";
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse left, DaemonStats(daemon.target));
  EXPECT_EQ(left.used_pages(), 4);
  EXPECT_EQ(left.sessions_active(), 1);

  Outcome resume = Cli({"resume", "--session_file=" + session_file});
  EXPECT_EQ(resume.status, "exited 0") << resume.output;
  EXPECT_THAT(resume.output, HasSubstr("4 pages survived"));
  EXPECT_THAT(resume.output, HasSubstr("resumable"));
  EXPECT_THAT(resume.output, HasSubstr("left with its pages for a resume"));

  // Held by another process: refused, unless taken over.
  ASSERT_OK_AND_ASSIGN(
      Subprocess holding,
      Subprocess::Start({RunfilePath("client/pagealloc-cli"), "resume",
                         "--session_file=" + session_file, "--hold_s=600"},
                        TempPath("resume-holder.log")));
  ASSERT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(ReadLog(TempPath("resume-holder.log")),
                                 "holding the pages");
      },
      absl::Seconds(20)))
      << ReadLog(TempPath("resume-holder.log"));
  Outcome refused = Cli({"resume", "--session_file=" + session_file});
  EXPECT_EQ(refused.status, "exited 1");
  EXPECT_THAT(refused.output, HasSubstr("is still connected"));
  EXPECT_THAT(refused.output, HasSubstr("--take_over"));
  Outcome taken =
      Cli({"resume", "--session_file=" + session_file, "--take_over"});
  EXPECT_EQ(taken.status, "exited 0") << taken.output;
  ASSERT_OK_AND_ASSIGN(int held, holding.Wait(absl::Seconds(20)));
  EXPECT_EQ(DescribeWaitStatus(held), "exited 1");
  EXPECT_THAT(ReadLog(TempPath("resume-holder.log")),
              HasSubstr("ended during the hold: ABORTED"));

  Outcome closing =
      Cli({"resume", "--session_file=" + session_file, "--close"});
  EXPECT_EQ(closing.status, "exited 0") << closing.output;
  EXPECT_THAT(closing.output, HasSubstr("its pages are back in the pool"));
  ASSERT_OK_AND_ASSIGN(v1::GetStatsResponse closed, DaemonStats(daemon.target));
  EXPECT_EQ(closed.used_pages(), 0);
  EXPECT_EQ(closed.sessions_active(), 0);
  EXPECT_NE(stat(session_file.c_str(), &st), 0) << "the session file stayed";

  // A session that was not resumable went with its process.
  const std::string plain_file = TempPath("plain.session");
  ASSERT_OK_AND_ASSIGN(
      Holder plain, StartHolder(daemon, 16, {"--session_file=" + plain_file}));
  plain.process.Signal(SIGKILL);
  ASSERT_OK(plain.process.Wait(absl::Seconds(20)).status());
  ASSERT_OK(WaitUntilEmpty(daemon.target, absl::Seconds(10)).status());
  Outcome lost = Cli({"resume", "--session_file=" + plain_file});
  EXPECT_EQ(lost.status, "exited 1");
  EXPECT_THAT(lost.output, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(lost.output, HasSubstr("one that was not resumable went"));
}

TEST(CliTest, StatsAndWatchPrintJsonAndSessionColumns) {
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon("json", {kLongLease, "--page_size=16", "--num_pages=512"}));
  ASSERT_OK_AND_ASSIGN(Holder holder, StartHolder(daemon, 32, {}));

  Outcome json = Cli(
      {"--target=" + daemon.target, "stats", "--sessions", "--output=json"});
  ASSERT_EQ(json.status, "exited 0") << json.output;
  v1::GetStatsResponse parsed;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(json.output, &parsed).ok())
      << json.output;
  EXPECT_EQ(parsed.pool().num_pages(), 512);
  EXPECT_EQ(parsed.used_pages(), 2);
  ASSERT_EQ(parsed.sessions_size(), 1);
  EXPECT_EQ(parsed.sessions(0).client_name(), "pagealloc-cli");
  EXPECT_EQ(parsed.sessions(0).pages_owned(), 2);
  // Field names as in the proto, zeros included.
  EXPECT_THAT(json.output, HasSubstr("\"parked_pages\""));
  EXPECT_THAT(json.output, HasSubstr("\"lease_age_ms\""));

  Outcome watch = Cli({"--target=" + daemon.target, "watch", "--count=2",
                       "--interval_ms=10", "--output=json"});
  ASSERT_EQ(watch.status, "exited 0") << watch.output;
  std::vector<std::string> lines =
      absl::StrSplit(watch.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << watch.output;
  for (const std::string& object : lines) {
    v1::GetStatsResponse each;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(object, &each).ok())
        << object;
    EXPECT_EQ(each.sessions_size(), 1);
  }

  Outcome text = Cli({"--target=" + daemon.target, "stats", "--sessions"});
  ASSERT_EQ(text.status, "exited 0") << text.output;
  for (const char* column : {"CLIENT", "PAGES", "QUOTA", "TRANSPORT",
                             "LEASE AGE", "pagealloc-cli"}) {
    EXPECT_THAT(text.output, HasSubstr(column));
  }
  EXPECT_THAT(
      text.output,
      HasSubstr(parsed.sessions(0).fast_channel() ? "fast channel" : "gRPC"));
  holder.process.Signal(SIGINT);
  ASSERT_OK(holder.process.Wait(absl::Seconds(20)).status());
}

// `prefix stats` shows the shared pages, `prefix reset` evicts the cached
// ones; a wrong subcommand is a usage error.
TEST(CliTest, PrefixStatsAndResetShowAndEvictSharedPages) {
  ASSERT_OK_AND_ASSIGN(
      Daemon daemon,
      StartDaemon("prefix", {kLongLease, "--backend=cpu", "--page_size=16",
                             "--num_pages=64", "--prefix_max_pinned_pages=8"}));
  {
    ClientOptions options;
    options.target = daemon.target;
    options.client_name = "publisher";
    ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
    ASSERT_OK_AND_ASSIGN(Allocation pages, client->Alloc({32}));
    ASSERT_OK(pages.status());
    std::vector<int64_t> ids(2);
    ASSERT_OK(client->CopyToHost(pages[0].slots, 1, &ids[0]));
    ASSERT_OK(client->CopyToHost(pages[0].slots + 16, 1, &ids[1]));
    for (int64_t& id : ids) id /= 16;
    ASSERT_OK(client->Publish(ids, {std::string(32, 'a'), std::string(32, 'b')})
                  .status());
    ASSERT_OK(client->Close());  // its published pages stay cached
  }
  Outcome stats = Cli({"--target=" + daemon.target, "prefix", "stats"});
  ASSERT_EQ(stats.status, "exited 0") << stats.output;
  EXPECT_THAT(stats.output, HasSubstr("0 published, 2 cached, 0 pinned, 2 "
                                      "evictable"));
  EXPECT_THAT(stats.output, HasSubstr("8 pages per session"));
  Outcome json =
      Cli({"--target=" + daemon.target, "prefix", "stats", "--output=json"});
  ASSERT_EQ(json.status, "exited 0") << json.output;
  v1::GetStatsResponse parsed;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(json.output, &parsed).ok())
      << json.output;
  EXPECT_EQ(parsed.prefix().cached_pages(), 2);
  Outcome reset = Cli({"--target=" + daemon.target, "prefix", "reset"});
  ASSERT_EQ(reset.status, "exited 0") << reset.output;
  EXPECT_THAT(reset.output, HasSubstr("2 cached pages evicted"));
  Outcome wrong = Cli({"--target=" + daemon.target, "prefix", "drop"});
  EXPECT_EQ(wrong.status, "exited 2") << wrong.output;
  EXPECT_THAT(wrong.output, HasSubstr("prefix takes one of stats, reset"));
}

// Without --listen an unprivileged daemon listens under $XDG_RUNTIME_DIR;
// the CLI without --target looks where the daemon would listen, in the
// same order, finds it there, and, with no daemon, says where it looked.
// The daemon and the CLI run as nobody when the test runs as root, from a
// copy under /tmp (nobody cannot reach Bazel's runfiles in root's home).
TEST(CliTest, WithoutATargetFindsTheDaemonsFallbackSocket) {
  struct stat st;
  if (stat("/run/pagealloc/gpu0.sock", &st) == 0) {
    GTEST_SKIP() << "a daemon listens on /run/pagealloc/gpu0.sock here";
  }
  char made[] = "/tmp/pagealloc-cli-xdg-XXXXXX";
  ASSERT_NE(mkdtemp(made), nullptr);
  const std::string root = made;
  ASSERT_EQ(chmod(root.c_str(), 0755), 0);
  const std::string runtime = root + "/xdg";
  const std::string empty_runtime = root + "/empty";
  std::vector<std::string> as_user;
  for (const std::string& dir : {runtime, empty_runtime}) {
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
    if (geteuid() == 0) {
      ASSERT_EQ(chown(dir.c_str(), 65534, 65534), 0);
    }
  }
  if (geteuid() == 0) {
    as_user = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
               "--clear-groups"};
  } else if (access("/run/pagealloc", W_OK) == 0 ||
             (stat("/run/pagealloc", &st) != 0 && access("/run", W_OK) == 0)) {
    GTEST_SKIP() << "this user may create sockets in /run/pagealloc";
  }
  const auto copy = [&root](const std::string& binary) {
    const std::string to = root + "/" + binary.substr(binary.rfind('/') + 1);
    std::ifstream in(RunfilePath(binary), std::ios::binary);
    std::ofstream(to, std::ios::binary) << in.rdbuf();
    chmod(to.c_str(), 0755);
    return to;
  };
  const std::string server = copy("server/pagealloc-server");
  const std::string cli = copy("client/pagealloc-cli");
  const auto command = [&as_user](const std::string& xdg,
                                  std::vector<std::string> args) {
    std::vector<std::string> argv = as_user;
    argv.push_back("/usr/bin/env");
    argv.push_back("XDG_RUNTIME_DIR=" + xdg);
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  };
  const std::string log = root + "/server.log";
  ASSERT_OK_AND_ASSIGN(
      Subprocess daemon,
      Subprocess::Start(
          command(runtime, {server, "--backend=cpu", "--num_pages=64",
                            "--metrics_port=-1", kLongLease}),
          log));
  const std::string socket = runtime + "/pagealloc/gpu0.sock";
  WaitFor([&] { return stat(socket.c_str(), &st) == 0 || !daemon.running(); },
          absl::Seconds(20));
  ASSERT_EQ(stat(socket.c_str(), &st), 0) << ReadLog(log);
  EXPECT_THAT(ReadLog(log), HasSubstr("clients look there too"));

  // watch's header names the daemon it found.
  const Outcome found = RunToEnd(
      command(runtime, {cli, "watch", "--count=1", "--interval_ms=10"}));
  EXPECT_EQ(found.status, "exited 0") << found.output;
  EXPECT_THAT(found.output, HasSubstr("pagealloc unix://" + socket + " "));

  const Outcome missing = RunToEnd(command(empty_runtime, {cli, "stats"}));
  EXPECT_EQ(missing.status, "exited 1") << missing.output;
  EXPECT_THAT(missing.output,
              HasSubstr("pagealloc-cli: no pagealloc daemon socket for GPU 0: "
                        "looked at /run/pagealloc/gpu0.sock (No such file or "
                        "directory), " +
                        empty_runtime +
                        "/pagealloc/gpu0.sock (No such file or directory)"));

  daemon.Signal(SIGTERM);
  ASSERT_OK_AND_ASSIGN(int status, daemon.Wait(absl::Seconds(20)));
  EXPECT_EQ(DescribeWaitStatus(status), "exited 0") << ReadLog(log);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace pagealloc::testing
