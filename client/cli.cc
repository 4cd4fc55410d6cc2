// pagealloc-cli: an operator's view of a pagealloc daemon.
//
//   pagealloc-cli [--target=unix:///run/pagealloc/gpu0.sock] stats [--sessions]
//   (without --target: the first of /run/pagealloc/gpu0.sock and
//   $XDG_RUNTIME_DIR/pagealloc/gpu0.sock that exists, where the daemon
//   listens by default)
//   pagealloc-cli watch [--interval_ms=1000] [--count=N] [--output=json]
//   pagealloc-cli alloc --tokens=64 [--hold_s=0] [--session_file=PATH]
//                 [--resumable]
//   pagealloc-cli free --session_file=PATH --pages=3,4
//   pagealloc-cli resume --session_file=PATH [--hold_s=0] [--take_over]
//                 [--close]
//   pagealloc-cli prefix stats [--output=json] | prefix reset
//
// `alloc` opens its own session, allocates whole pages and prints them; the
// pages return to the pool when the CLI exits (after --hold_s, or at once on
// Ctrl-C or SIGTERM), or earlier through `free` from another shell, which
// reads the session file `alloc` wrote. With --resumable the session
// outlives the CLI (its exit, or its death) for the daemon's lease, and the
// file stays: `resume` takes the session back through it, shows that its
// pages survived, holds them, and leaves the session for another resume
// (or, with --close, ends it). A hold the daemon's death (or the session's
// end) cuts short says so and exits 1. Usage errors exit 2, failures 1.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/admin.h"
#include "client/client.h"
#include "common/command_line.h"
#include "common/grpc_status.h"
#include "common/socket_location.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "proto/pagealloc.grpc.pb.h"

ABSL_FLAG(std::string, target, "",
          "The daemon's gRPC address: unix:///path.sock or host:port. Empty: "
          "where pagealloc-server listens by default, "
          "/run/pagealloc/gpu0.sock, else "
          "$XDG_RUNTIME_DIR/pagealloc/gpu0.sock.");
ABSL_FLAG(std::string, output, "text",
          "stats, watch: text (a table for people) or json (GetStatsResponse "
          "in protobuf's JSON mapping with the proto's field names, one "
          "object a line; 64-bit counts are strings).");
ABSL_FLAG(bool, sessions, false, "stats: list sessions too.");
ABSL_FLAG(int64_t, interval_ms, 1000, "watch: refresh period.");
ABSL_FLAG(int64_t, count, 0,
          "watch: stop after this many refreshes (0: never).");
ABSL_FLAG(int64_t, tokens, 0,
          "alloc: tokens to allocate (a multiple of the page size).");
ABSL_FLAG(int64_t, hold_s, 0,
          "alloc, resume: keep the pages this long before exit (Ctrl-C or "
          "SIGTERM ends the hold at once).");
ABSL_FLAG(std::string, session_file, "",
          "alloc: write the session's id and token here (mode 0600; removed "
          "when alloc exits, unless --resumable); free, resume: act for that "
          "session.");
ABSL_FLAG(std::string, token_file, "",
          "alloc: write the raw session token here (mode 0600); free, "
          "resume: read it, with --session_id.");
ABSL_FLAG(uint64_t, session_id, 0,
          "free, resume: the session to act for (with --token_file).");
ABSL_FLAG(std::vector<std::string>, pages, {},
          "free: page ids to free, comma-separated.");
ABSL_FLAG(bool, resumable, false,
          "alloc: register the session resumable and leave it, with its "
          "pages, for the daemon's lease when the CLI exits or dies (needs "
          "--session_file or --token_file): `resume` takes it back.");
ABSL_FLAG(bool, take_over, false,
          "resume: take the session even from a process that holds it now "
          "(that process is told its session was taken).");
ABSL_FLAG(bool, close, false,
          "resume: end the session (its pages back to the pool) after the "
          "hold, instead of leaving it for another resume.");

namespace pagealloc {
namespace {

const CommandLineSpec kCommandLine = {
    "pagealloc-cli",
    "pagealloc-cli: an operator's view of a pagealloc daemon.\n"
    "  pagealloc-cli [--target=ADDRESS] stats [--sessions] [--output=json]\n"
    "  pagealloc-cli [--target=ADDRESS] watch [--interval_ms=1000] "
    "[--output=json]\n"
    "  pagealloc-cli [--target=ADDRESS] alloc --tokens=N [--hold_s=S] "
    "[--session_file=F] [--resumable]\n"
    "  pagealloc-cli free --session_file=F --pages=P1,P2\n"
    "  pagealloc-cli resume --session_file=F [--hold_s=S] [--take_over] "
    "[--close]\n"
    "  pagealloc-cli [--target=ADDRESS] prefix stats [--output=json]\n"
    "  pagealloc-cli [--target=ADDRESS] prefix reset",
    "client/cli.cc",
    {
        {"daemon", {{"target", "gRPC address"}, {"output", "text or json"}}},
        {"stats and watch",
         {{"sessions"},
          {"interval_ms", "milliseconds"},
          {"count", "refreshes"}}},
        {"alloc", {{"tokens", "tokens"}, {"hold_s", "seconds"}, {"resumable"}}},
        {"free", {{"pages", "page ids"}}},
        {"resume", {{"take_over"}, {"close"}}},
        {"session (alloc writes it, free and resume read it)",
         {{"session_file", "path"},
          {"token_file", "path"},
          {"session_id", "id"}}},
    },
    {}};

[[noreturn]] void Usage(absl::string_view message) {
  ExitUsage(kCommandLine.program, message);
}

// Fills an empty `target` with the socket where pagealloc-server listens by
// default; false, with the places looked at on stderr, when none is there.
bool ResolveTarget(std::string* target) {
  if (!target->empty()) return true;
  absl::StatusOr<std::string> found = FindDaemonTarget(0);
  if (!found.ok()) {
    std::cerr << kCommandLine.program << ": " << found.status().message()
              << " (--target)\n";
    return false;
  }
  *target = *std::move(found);
  return true;
}

// The daemon's address: --target, else found once where pagealloc-server
// listens by default (exits 1, saying where it looked, when it is not
// there). Called after a command's usage checks, so usage errors come first.
const std::string& DaemonTarget() {
  static const std::string* const target = [] {
    auto* resolved = new std::string(absl::GetFlag(FLAGS_target));
    if (!ResolveTarget(resolved)) std::exit(kExitFailure);
    return resolved;
  }();
  return *target;
}

bool JsonOutput() { return absl::GetFlag(FLAGS_output) == "json"; }

absl::StatusOr<v1::GetStatsResponse> FetchStats(bool sessions) {
  AdminOptions options;
  options.target = DaemonTarget();
  return GetDaemonStats(options, sessions);
}

std::string Bar(double fraction, int width) {
  const int filled = static_cast<int>(fraction * width + 0.5);
  return "[" + std::string(filled, '#') + std::string(width - filled, '.') +
         "]";
}

// One line of JSON: protobuf's mapping of the response, every field shown
// (zeros included) under the proto's own names.
std::string Json(const v1::GetStatsResponse& stats) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = false;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  const auto status =
      google::protobuf::util::MessageToJsonString(stats, &out, options);
  if (!status.ok()) {
    return absl::StrFormat("{\"error\": \"%s\"}",
                           absl::CEscape(status.ToString()));
  }
  return out;
}

void PrintStats(const v1::GetStatsResponse& s) {
  const v1::PoolInfo& p = s.pool();
  const double used = p.num_pages() > 0
                          ? static_cast<double>(s.used_pages()) / p.num_pages()
                          : 0;
  std::printf(
      "backend      %s%s\n", p.backend() == v1::BACKEND_CUDA ? "cuda" : "cpu",
      p.backend() == v1::BACKEND_CUDA
          ? absl::StrFormat(" (gpu %d, %s)", p.gpu(), p.device_uuid()).c_str()
          : "");
  std::printf("pool         %lld pages x %lld tokens, %s policy\n",
              static_cast<long long>(p.num_pages()),
              static_cast<long long>(p.page_size()), p.free_policy().c_str());
  std::printf("usage        %s %5.1f%%\n", Bar(used, 40).c_str(), 100 * used);
  std::printf("pages        %lld used, %lld free, %lld parked\n",
              static_cast<long long>(s.used_pages()),
              static_cast<long long>(s.free_pages()),
              static_cast<long long>(s.parked_pages()));
  std::printf("sessions     %lld active\n",
              static_cast<long long>(s.sessions_active()));
  std::printf(
      "totals       %lld slots and %lld pages allocated, %lld pages "
      "freed, %lld out-of-pages refusals, %lld launches, %lld sorts\n",
      static_cast<long long>(s.slots_allocated_total()),
      static_cast<long long>(s.pages_allocated_total()),
      static_cast<long long>(s.pages_freed_total()),
      static_cast<long long>(s.out_of_pages_total()),
      static_cast<long long>(s.launches_total()),
      static_cast<long long>(s.free_list_sorts_total()));
  if (s.sessions_size() > 0) {
    std::printf("\n%-18s %-20s %8s %8s %-12s %9s %15s %s\n", "SESSION",
                "CLIENT", "PAGES", "QUOTA", "TRANSPORT", "LEASE AGE",
                "RING USED", "CHECKPOINT");
    for (const v1::SessionStats& session : s.sessions()) {
      std::printf(
          "%-18llu %-20s %8lld %8s %-12s %9s %7lld/%-7lld %s\n",
          static_cast<unsigned long long>(session.session_id()),
          session.client_name().c_str(),
          static_cast<long long>(session.pages_owned()),
          session.quota_pages() > 0
              ? absl::StrCat(session.quota_pages()).c_str()
              : "-",
          session.fast_channel() ? "fast channel" : "gRPC",
          absl::StrFormat("%.1fs", session.lease_age_ms() / 1000.0).c_str(),
          static_cast<long long>(session.ring_reserved_slots()),
          static_cast<long long>(session.ring_capacity_slots()),
          session.checkpoint_active() ? "yes" : "no");
    }
  }
}

int Stats() {
  absl::StatusOr<v1::GetStatsResponse> stats =
      FetchStats(absl::GetFlag(FLAGS_sessions));
  if (!stats.ok()) {
    std::cerr << "stats: " << stats.status() << "\n";
    return kExitFailure;
  }
  if (JsonOutput()) {
    std::printf("%s\n", Json(*stats).c_str());
  } else {
    PrintStats(*stats);
  }
  return 0;
}

// `prefix stats`: the shared prefix pages; `prefix reset`: evict every
// cached, unpinned one.
int Prefix(absl::string_view what) {
  if (what == "reset") {
    AdminOptions options;
    options.target = DaemonTarget();
    absl::StatusOr<int64_t> evicted = ResetDaemonPrefixCache(options);
    if (!evicted.ok()) {
      std::cerr << "prefix reset: " << evicted.status() << "\n";
      return kExitFailure;
    }
    std::printf("prefix cache reset: %lld cached pages evicted\n",
                static_cast<long long>(*evicted));
    return 0;
  }
  absl::StatusOr<v1::GetStatsResponse> stats = FetchStats(false);
  if (!stats.ok()) {
    std::cerr << "prefix stats: " << stats.status() << "\n";
    return kExitFailure;
  }
  const v1::PrefixStats& p = stats->prefix();
  if (JsonOutput()) {
    v1::GetStatsResponse only;
    *only.mutable_prefix() = p;
    *only.mutable_pool() = stats->pool();
    std::printf("%s\n", Json(only).c_str());
    return 0;
  }
  const int64_t page_size = stats->pool().page_size();
  std::printf(
      "shared pages %lld published, %lld cached, %lld pinned, %lld "
      "evictable\n",
      static_cast<long long>(p.published_pages()),
      static_cast<long long>(p.cached_pages()),
      static_cast<long long>(p.pinned_pages()),
      static_cast<long long>(p.evictable_pages()));
  std::printf("hits         %lld of %lld tokens looked up (%.1f%%)\n",
              static_cast<long long>(p.hit_pages_total() * page_size),
              static_cast<long long>(p.lookup_pages_total() * page_size),
              p.lookup_pages_total() > 0
                  ? 100.0 * p.hit_pages_total() / p.lookup_pages_total()
                  : 0.0);
  std::printf(
      "totals       %lld published, %lld already there, %lld adopted; "
      "evicted %lld by allocations, %lld by resets\n",
      static_cast<long long>(p.published_total()),
      static_cast<long long>(p.publish_existing_total()),
      static_cast<long long>(p.adopted_pages_total()),
      static_cast<long long>(p.evicted_for_allocation_total()),
      static_cast<long long>(p.evicted_by_reset_total()));
  std::printf("pin bound    %lld pages per session\n",
              static_cast<long long>(p.max_pinned_pages_per_session()));
  return 0;
}

int Watch() {
  const int64_t count = absl::GetFlag(FLAGS_count);
  const bool json = JsonOutput();
  for (int64_t i = 0; count == 0 || i < count; ++i) {
    if (i > 0) {
      absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_interval_ms)));
    }
    absl::StatusOr<v1::GetStatsResponse> stats = FetchStats(true);
    if (json) {
      // One object a line; an unreachable daemon is a line on stderr.
      if (stats.ok()) {
        std::printf("%s\n", Json(*stats).c_str());
      } else {
        std::fprintf(stderr, "daemon unreachable: %s\n",
                     stats.status().ToString().c_str());
      }
      std::fflush(stdout);
      continue;
    }
    if (isatty(STDOUT_FILENO)) std::printf("\033[H\033[2J");
    std::printf("pagealloc %s   %s\n\n", DaemonTarget().c_str(),
                absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone())
                    .c_str());
    if (!stats.ok()) {
      std::printf("daemon unreachable: %s\n",
                  stats.status().ToString().c_str());
    } else {
      PrintStats(*stats);
    }
    std::fflush(stdout);
  }
  return 0;
}

// Writes `content` to `path` with mode 0600, whatever mode a file already
// there had.
absl::Status WriteSecret(const std::string& path, const std::string& content) {
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int error = errno;  // a missing directory is NOT_FOUND
    return absl::Status(
        absl::ErrnoToStatusCode(error),
        absl::StrFormat("cannot write %s: %s", path, std::strerror(error)));
  }
  const bool written =
      fchmod(fd, 0600) == 0 && write(fd, content.data(), content.size()) ==
                                   static_cast<ssize_t>(content.size());
  const int error = errno;
  close(fd);
  if (!written) {
    return absl::PermissionDeniedError(
        absl::StrFormat("cannot write %s: %s", path, std::strerror(error)));
  }
  return absl::OkStatus();
}

// The session file: "key value" lines, the token in hex.
std::string SessionFileText(const Client& client, const std::string& target) {
  return absl::StrFormat(
      "# pagealloc-cli alloc (pid %d): a live session; the token is secret\n"
      "target %s\nsession_id %d\ntoken %s\n",
      getpid(), target, client.session_id(),
      absl::BytesToHexString(client.session_token()));
}

struct SessionCredentials {
  std::string target;  // from the session file; "" when not known
  uint64_t id = 0;
  std::string token;
};

absl::StatusOr<SessionCredentials> ReadSessionFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrFormat("cannot read %s: %s (alloc removes it when it exits)",
                        path, std::strerror(errno)));
  }
  SessionCredentials ref;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> words =
        absl::StrSplit(line, absl::MaxSplits(' ', 1));
    if (words.size() != 2 || line.front() == '#') continue;
    if (words[0] == "target") ref.target = words[1];
    if (words[0] == "session_id" && !absl::SimpleAtoi(words[1], &ref.id)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: session_id \"%s\" is not a number", path, words[1]));
    }
    if (words[0] == "token") ref.token = absl::HexStringToBytes(words[1]);
  }
  if (ref.id == 0 || ref.token.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is not a session file (no session_id and token lines)", path));
  }
  return ref;
}

// The session `command` acts for: --session_file, else --session_id and
// --token_file (a usage error without either), and in `*target` the
// daemon's address: the session file's, unless --target says otherwise.
absl::StatusOr<SessionCredentials> SessionFromFlags(absl::string_view command,
                                                    std::string* target) {
  SessionCredentials session;
  *target = absl::GetFlag(FLAGS_target);
  if (const std::string path = absl::GetFlag(FLAGS_session_file);
      !path.empty()) {
    ASSIGN_OR_RETURN(session, ReadSessionFile(path));
    // The session's daemon, unless --target says otherwise.
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag("target");
    if (!session.target.empty() &&
        flag->CurrentValue() == flag->DefaultValue()) {
      *target = session.target;
    }
  } else if (absl::GetFlag(FLAGS_session_id) != 0 &&
             !absl::GetFlag(FLAGS_token_file).empty()) {
    session.id = absl::GetFlag(FLAGS_session_id);
    const std::string path = absl::GetFlag(FLAGS_token_file);
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(
          absl::StrFormat("cannot read %s: %s", path, std::strerror(errno)));
    }
    std::stringstream token;
    token << in.rdbuf();
    session.token = token.str();
  } else {
    Usage(absl::StrFormat(
        "%s needs the session: --session_file (written by alloc), or "
        "--session_id and --token_file",
        command));
  }
  if (!ResolveTarget(target)) std::exit(kExitFailure);
  return session;
}

// Blocks SIGINT and SIGTERM in this thread and every thread started after
// (the client library's), so that they wait for Hold's sigtimedwait.
sigset_t BlockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// How often Hold looks at the session: the client library learns of the
// daemon's death at once (its memory socket closes) and says so in
// session_status(), which has no waiter to block on; a tenth of a second
// is soon enough for a person and costs nothing.
constexpr absl::Duration kHoldCheck = absl::Milliseconds(100);

// Waits `hold`, until SIGINT or SIGTERM, or until the session ends under
// it (the daemon died or ended it). Returns the signal, or 0.
int Hold(const sigset_t& signals, absl::Duration hold, const Client& client) {
  const absl::Time until = absl::Now() + hold;
  while (absl::Now() < until && client.session_status().ok()) {
    const timespec wait =
        absl::ToTimespec(std::min(until - absl::Now(), kHoldCheck));
    const int signal = sigtimedwait(&signals, nullptr, &wait);
    if (signal > 0) return signal;
  }
  return 0;
}

// Holds the session's pages `hold_s` seconds (Hold), then ends the session
// (its pages back to the pool at once, its files removed by `remove_files`)
// or, when `leave`, detaches it: the daemon keeps it, pages and all, for
// its lease, and the files stay for `resume`. Returns the exit code.
int HoldAndLeave(const sigset_t& signals, int64_t hold, Client& client,
                 bool leave, const std::function<void()>& remove_files,
                 absl::string_view command) {
  if (hold > 0) {
    std::printf("holding the pages for %llds (Ctrl-C %s)\n",
                static_cast<long long>(hold),
                leave ? "ends the hold" : "returns them");
    std::fflush(stdout);
    if (const int signal = Hold(signals, absl::Seconds(hold), client);
        signal != 0) {
      std::printf("%s: %s the session\n", strsignal(signal),
                  leave ? "leaving" : "closing");
    }
    if (const absl::Status ended = client.session_status(); !ended.ok()) {
      // A session taken over (ABORTED) lives on, held by another process:
      // its files still name it.
      if (!absl::IsAborted(ended)) remove_files();
      std::cerr << command << ": session " << client.session_id()
                << " ended during the hold: " << ended
                << " (its pages are no longer held)\n";
      return kExitFailure;
    }
  }
  if (leave) {
    const absl::Status detached = client.Detach();
    if (!detached.ok()) {
      std::cerr << command << ": leaving the session: " << detached << "\n";
      return kExitFailure;
    }
    std::printf(
        "session %llu left with its pages for a resume within its lease "
        "(%lld ms)\n",
        static_cast<unsigned long long>(client.session_id()),
        static_cast<long long>(client.lease_ms()));
    return 0;
  }
  // Ends the session now: its pages go back to the pool at once rather
  // than when its lease runs out.
  const absl::Status closed = client.Close();
  remove_files();
  if (!closed.ok()) {
    std::cerr << command << ": closing the session: " << closed << "\n";
    return kExitFailure;
  }
  std::printf("session %llu closed: its pages are back in the pool\n",
              static_cast<unsigned long long>(client.session_id()));
  return 0;
}

int Alloc() {
  const int64_t tokens = absl::GetFlag(FLAGS_tokens);
  if (tokens < 1)
    Usage(absl::StrFormat("alloc: --tokens=%d must be >= 1", tokens));
  const int64_t hold = absl::GetFlag(FLAGS_hold_s);
  if (hold < 0) Usage(absl::StrFormat("alloc: --hold_s=%d must be >= 0", hold));
  const bool resumable = absl::GetFlag(FLAGS_resumable);
  if (resumable && absl::GetFlag(FLAGS_session_file).empty() &&
      absl::GetFlag(FLAGS_token_file).empty()) {
    Usage(
        "alloc --resumable needs --session_file (or --token_file): resume "
        "takes the session back through it");
  }
  const sigset_t signals = BlockTerminationSignals();
  ClientOptions options;
  options.target = DaemonTarget();
  options.client_name = "pagealloc-cli";
  options.resumable = resumable;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) {
    std::cerr << "alloc: " << client.status() << "\n";
    return kExitFailure;
  }
  const absl::Time start = absl::Now();
  CallOptions call;
  call.return_inline = true;
  absl::StatusOr<Allocation> allocation = (*client)->Alloc({tokens}, call);
  const absl::Duration took = absl::Now() - start;
  if (!allocation.ok()) {
    std::cerr << "alloc: " << allocation.status() << "\n";
    return kExitFailure;
  }
  if (!allocation->status().ok()) {
    std::cerr << "alloc: " << allocation->status() << "\n";
    return kExitFailure;
  }
  const RequestSlots& r = (*allocation)[0];
  const int64_t page_size = (*client)->pool().page_size();
  std::vector<int64_t> pages;
  for (int64_t i = 0; i < r.count; i += page_size) {
    pages.push_back(r.slots[i] / page_size);
  }
  std::printf(
      "session %llu: %lld slots in %s (%lld pages): %s\n",
      static_cast<unsigned long long>((*client)->session_id()),
      static_cast<long long>(r.count), absl::FormatDuration(took).c_str(),
      static_cast<long long>(r.new_pages), absl::StrJoin(pages, ",").c_str());
  // The files describe a live session: they go when it ends.
  std::vector<std::string> written;
  const auto remove_files = [&written] {
    for (const std::string& path : written) unlink(path.c_str());
  };
  if (const std::string path = absl::GetFlag(FLAGS_session_file);
      !path.empty()) {
    const absl::Status status =
        WriteSecret(path, SessionFileText(**client, options.target));
    if (!status.ok()) {
      std::cerr << "alloc: " << status.message() << "\n";
      return kExitFailure;
    }
    written.push_back(path);
    std::printf("session written to %s (mode 0600): %s --session_file=%s\n",
                path.c_str(), resumable ? "free or resume" : "free",
                path.c_str());
  }
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    const absl::Status status = WriteSecret(path, (*client)->session_token());
    if (!status.ok()) {
      std::cerr << "alloc: " << status.message() << "\n";
      remove_files();
      return kExitFailure;
    }
    written.push_back(path);
    std::printf("session token written to %s (mode 0600)\n", path.c_str());
  }
  return HoldAndLeave(signals, hold, **client, resumable, remove_files,
                      "alloc");
}

int Free() {
  std::vector<int64_t> pages;
  for (const std::string& text : absl::GetFlag(FLAGS_pages)) {
    int64_t page;
    if (!absl::SimpleAtoi(text, &page)) {
      Usage(absl::StrFormat("free: --pages: \"%s\" is not a page id", text));
    }
    pages.push_back(page);
  }
  if (pages.empty()) Usage("free needs --pages (page ids, comma-separated)");
  std::string target;
  absl::StatusOr<SessionCredentials> session =
      SessionFromFlags("free", &target);
  if (!session.ok()) {
    std::cerr << "free: " << session.status().message() << "\n";
    return kExitFailure;
  }
  v1::FreeRequest request;
  request.mutable_session()->set_session_id(session->id);
  request.mutable_session()->set_session_token(session->token);
  request.mutable_pages()->Add(pages.begin(), pages.end());
  v1::FreeResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  auto stub = v1::PageAllocator::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  absl::Status status =
      FromGrpcStatus(stub->Free(&context, request, &response));
  if (!status.ok()) {
    std::cerr << "free: " << status << "\n";
    if (absl::IsNotFound(status)) {
      std::cerr << "(the session ends when the alloc that opened it exits)\n";
    }
    return kExitFailure;
  }
  std::printf("%lld %s freed\n", static_cast<long long>(response.pages_freed()),
              response.pages_freed() == 1 ? "page" : "pages");
  return 0;
}

// `resume`: takes back the session of a session file (or --session_id and
// --token_file), shows what it holds, holds it like alloc, then leaves it
// for another resume (a resumable session) or, with --close (or when it is
// not resumable), ends it.
int Resume() {
  const int64_t hold = absl::GetFlag(FLAGS_hold_s);
  if (hold < 0) {
    Usage(absl::StrFormat("resume: --hold_s=%d must be >= 0", hold));
  }
  std::string target;
  absl::StatusOr<SessionCredentials> session =
      SessionFromFlags("resume", &target);
  if (!session.ok()) {
    std::cerr << "resume: " << session.status().message() << "\n";
    return kExitFailure;
  }
  const sigset_t signals = BlockTerminationSignals();
  ClientOptions options;
  options.target = target;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Resume(
      options, session->id, session->token, absl::GetFlag(FLAGS_take_over));
  if (!client.ok()) {
    std::cerr << "resume: " << client.status() << "\n";
    if (absl::IsNotFound(client.status())) {
      std::cerr << "(a resumable session lives for its lease after its "
                   "process; one that was not resumable went with it)\n";
    } else if (absl::IsFailedPrecondition(client.status())) {
      std::cerr << "(--take_over takes it from the process that holds it)\n";
    }
    return kExitFailure;
  }
  const absl::Duration took = absl::Now() - start;
  // What survived: the daemon's own figures for the session.
  absl::StatusOr<v1::GetStatsResponse> stats =
      (*client)->GetStats(/*include_sessions=*/true);
  if (!stats.ok()) {
    std::cerr << "resume: " << stats.status() << "\n";
    return kExitFailure;
  }
  const v1::SessionStats* mine = nullptr;
  for (const v1::SessionStats& s : stats->sessions()) {
    if (s.session_id() == (*client)->session_id()) mine = &s;
  }
  if (mine == nullptr) {
    std::cerr << "resume: session " << (*client)->session_id()
              << " is not in the daemon's stats\n";
    return kExitFailure;
  }
  std::printf(
      "session %llu (%s) resumed in %s: %lld pages survived, quota %s, %d "
      "checkpoints%s\n",
      static_cast<unsigned long long>(mine->session_id()),
      mine->client_name().c_str(), absl::FormatDuration(took).c_str(),
      static_cast<long long>(mine->pages_owned()),
      mine->quota_pages() > 0 ? absl::StrCat(mine->quota_pages()).c_str()
                              : "none",
      mine->checkpoints(), mine->resumable() ? ", resumable" : "");
  const bool leave = (*client)->resumable() && !absl::GetFlag(FLAGS_close);
  const std::string path = absl::GetFlag(FLAGS_session_file);
  const auto remove_files = [&path] {
    if (!path.empty()) unlink(path.c_str());
  };
  return HoldAndLeave(signals, hold, **client, leave, remove_files, "resume");
}

}  // namespace
}  // namespace pagealloc

int main(int argc, char** argv) {
  using pagealloc::Usage;
  std::vector<char*> args =
      pagealloc::ParseCommandLine(argc, argv, pagealloc::kCommandLine);
  const std::string target = absl::GetFlag(FLAGS_target);
  if (const std::string hint = pagealloc::UnixSchemeHint(target);
      !hint.empty()) {
    Usage(absl::StrFormat("--target=%s has no scheme: %s", target, hint));
  }
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output != "text" && output != "json") {
    Usage(absl::StrFormat("--output=%s is not text or json", output));
  }
  if (const int64_t interval = absl::GetFlag(FLAGS_interval_ms);
      interval < 10 || interval > 86400000) {
    Usage(absl::StrFormat(
        "--interval_ms=%d is out of range (accepted: 10..86400000 "
        "milliseconds)",
        interval));
  }
  if (absl::GetFlag(FLAGS_count) < 0) {
    Usage(absl::StrFormat("--count=%d must be >= 0 (0: never stop)",
                          absl::GetFlag(FLAGS_count)));
  }
  const bool prefix = args.size() >= 2 && std::string(args[1]) == "prefix";
  if (prefix && (args.size() != 3 || (std::string(args[2]) != "stats" &&
                                      std::string(args[2]) != "reset"))) {
    Usage("prefix takes one of stats, reset");
  }
  if (prefix) return pagealloc::Prefix(args[2]);
  if (args.size() != 2) {
    Usage(args.size() < 2
              ? "which command? stats, watch, alloc, free, resume or prefix"
              : absl::StrFormat("one command at a time; also got \"%s\"",
                                args[2]));
  }
  const std::string command = args[1];
  if (command == "stats") return pagealloc::Stats();
  if (command == "watch") return pagealloc::Watch();
  if (command == "alloc") return pagealloc::Alloc();
  if (command == "free") return pagealloc::Free();
  if (command == "resume") return pagealloc::Resume();
  Usage(absl::StrFormat(
      "unknown command \"%s\" (stats, watch, alloc, free, resume, prefix)",
      command));
}
