#include "server/scheduling_policy.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace pagealloc {
namespace {

int64_t Us(absl::Duration d) { return absl::ToInt64Microseconds(d); }

// The cells of `row` after the first, each ending in " |".
std::string Cells(const SchedulingRow& row) {
  return absl::StrCat(" ", row.situation, " | ", row.drives, " | ", row.spins,
                      " | ", row.answers, " | ", row.flags, " |");
}

absl::Status Refuse(absl::string_view flag, int64_t value,
                    absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("--%s=%d: %s", flag, value, why));
}

}  // namespace

SchedulingPolicy::Settings SchedulingPolicy::DefaultsForMachine(unsigned cpus) {
  // A spinning driver takes fast-channel calls while a launch runs and
  // gathers more calls per launch with several clients (docs/performance.md
  // has its throughput against the submitting thread driving), but on a
  // small machine it takes a core the clients and the poller need. Only a
  // spinning thread gathers cheaply: a sleeping one would take every launch
  // over from the submitters, one wake-up each.
  Settings settings;
  settings.batcher.min_batch_calls = 4;
  if (cpus >= kMinCpusForSpinning) {
    settings.batcher.spin = kDefaultBatcherSpin;
    settings.batcher.batch_window = kDefaultBatchWindow;
  }
  return settings;
}

SchedulingPolicy::Settings SchedulingPolicy::SettingsFromFlags(
    const Flags& flags, unsigned cpus) {
  Settings settings = DefaultsForMachine(cpus);
  Batcher::Options& batcher = settings.batcher;
  batcher.max_batch_requests = flags.max_batch_requests;
  batcher.max_batch_tokens = flags.max_batch_tokens;
  batcher.min_batch_calls = flags.batch_min_calls;
  if (flags.batcher_spin_us >= 0) {
    batcher.spin = absl::Microseconds(flags.batcher_spin_us);
  }
  // Only a spinning batcher thread gathers by default, whatever the CPU
  // count chose for the window.
  batcher.batch_window =
      flags.batch_window_us >= 0 ? absl::Microseconds(flags.batch_window_us)
      : batcher.spin > absl::ZeroDuration() ? kDefaultBatchWindow
                                            : absl::ZeroDuration();
  settings.fast_channel = flags.fast_channel;
  settings.fast_channel_spin = absl::Microseconds(flags.fast_channel_spin_us);
  settings.fast_channel_pollers = flags.fast_channel_pollers;
  settings.grpc_answer_threads = flags.grpc_answer_threads;
  return settings;
}

absl::StatusOr<SchedulingPolicy> SchedulingPolicy::Create(
    const Settings& settings) {
  const Batcher::Options& batcher = settings.batcher;
  if (batcher.max_batch_requests < 1) {
    return Refuse("max_batch_requests", batcher.max_batch_requests,
                  "a launch needs room for one request");
  }
  if (batcher.max_batch_tokens < 1) {
    return Refuse("max_batch_tokens", batcher.max_batch_tokens,
                  "a launch needs room for one slot");
  }
  if (batcher.min_batch_calls < 0) {
    return Refuse("batch_min_calls", batcher.min_batch_calls,
                  "cannot wait for fewer than 0 calls");
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, absl::Duration>{"batcher_spin_us", batcher.spin},
        {"batch_window_us", batcher.batch_window},
        {"fast_channel_spin_us", settings.fast_channel_spin}}) {
    if (value < absl::ZeroDuration()) {
      return Refuse(flag, Us(value), "a duration cannot be negative");
    }
  }
  if (settings.fast_channel && settings.fast_channel_pollers < 1) {
    return Refuse("fast_channel_pollers", settings.fast_channel_pollers,
                  "the fast channel needs a poller (or --fast_channel=false)");
  }
  if (settings.grpc_answer_threads < 0) {
    return Refuse("grpc_answer_threads", settings.grpc_answer_threads,
                  "cannot start fewer than 0 threads");
  }
  SchedulingPolicy policy(settings);
  if (!policy.batcher_spins() && settings.grpc_answer_threads > 0) {
    // Without a spinning batcher thread a gRPC handler drives (or the
    // woken batcher thread does) and sends its own answer: there is no
    // launch to hand answers away from.
    policy.settings_.grpc_answer_threads = 0;
    policy.notes_.push_back(absl::StrFormat(
        "--grpc_answer_threads=%d starts no thread: only a spinning batcher "
        "thread (--batcher_spin_us > 0) hands gRPC answers over",
        settings.grpc_answer_threads));
  }
  if (policy.batcher_spins() && batcher.lone_client_drives &&
      !policy.lone_client_drives()) {
    // The batcher tracks the active sessions only with a window and min
    // calls, so it cannot tell a lone client without them.
    policy.settings_.batcher.lone_client_drives = false;
    policy.notes_.push_back(absl::StrFormat(
        "a lone client's poller does not drive its own calls: that needs "
        "--batch_window_us > 0 (is %d) and --batch_min_calls > 0 (is %d); "
        "the batcher thread drives every launch",
        Us(batcher.batch_window), batcher.min_batch_calls));
  }
  return policy;
}

LaunchDriver SchedulingPolicy::driver() const {
  // A window is waited out by the batcher thread, and a spinning thread
  // is the one that catches work without a wake-up.
  return batcher_spins() ||
                 settings_.batcher.batch_window > absl::ZeroDuration()
             ? LaunchDriver::kBatcherThread
             : LaunchDriver::kSubmitter;
}

Batcher::Options SchedulingPolicy::BatcherOptions(bool debug_checks) const {
  Batcher::Options options = settings_.batcher;
  options.debug_checks = options.debug_checks || debug_checks;
  return options;
}

std::vector<SchedulingRow> SchedulingPolicy::Rows() const {
  const Batcher::Options& b = settings_.batcher;
  const std::string pollers =
      absl::StrFormat("%s up to %d us after each call",
                      settings_.fast_channel_pollers == 1
                          ? std::string("the poller")
                          : absl::StrFormat("each of the %d pollers",
                                            settings_.fast_channel_pollers),
                      Us(settings_.fast_channel_spin));
  const std::string batcher_spin = absl::StrFormat(
      "the batcher thread up to %d us after each launch", Us(b.spin));
  const std::string gathering =
      b.batch_window > absl::ZeroDuration()
          ? absl::StrFormat(
                ", gathering for up to %d us%s", Us(b.batch_window),
                b.min_batch_calls > 0
                    ? absl::StrFormat(" or until %d calls (at most half the "
                                      "active sessions) are queued",
                                      b.min_batch_calls)
                    : std::string(""))
          : std::string("");
  const std::string inline_rounds = absl::StrFormat(
      "inline, at most %d launches in a row, then the batcher thread",
      Batcher::kMaxInlineRounds);
  const char* const kFastFlags = "--fast_channel_spin_us";
  std::vector<SchedulingRow> rows(3);
  SchedulingRow& lone = rows[0];
  SchedulingRow& several = rows[1];
  SchedulingRow& grpc = rows[2];
  lone.situation = "one client on the fast channel";
  several.situation = "several clients on the fast channel";
  grpc.situation = "gRPC allocation call";
  if (driver() == LaunchDriver::kSubmitter) {
    lone.drives = "its poller, " + inline_rounds;
    lone.spins = pollers + "; the batcher thread sleeps";
    lone.answers = "the thread that drove";
    lone.flags =
        absl::StrCat("--batcher_spin_us=0, --batch_window_us=0, ", kFastFlags);
    several = lone;
    several.situation = "several clients on the fast channel";
    several.drives = "the poller that finds the batcher idle, " +
                     inline_rounds +
                     "; calls queued meanwhile join the next launch";
    several.flags = absl::StrCat(lone.flags, ", --fast_channel_pollers");
    grpc.drives = "gRPC's callback thread, " + inline_rounds;
    grpc.spins = "nobody: the batcher thread sleeps";
    grpc.answers = "the thread that drove";
    grpc.flags = "--batcher_spin_us=0, --batch_window_us=0";
    return rows;
  }
  const std::string woken = batcher_spins() ? "" : " (woken)";
  const std::string thread_spin =
      batcher_spins()
          ? batcher_spin
          : std::string("the batcher thread sleeps between launches");
  const std::string batcher_flags =
      batcher_spins()
          ? absl::StrFormat("--batcher_spin_us, --batch_window_us%s",
                            b.batch_window > absl::ZeroDuration()
                                ? ", --batch_min_calls"
                                : "")
          : std::string(
                "--batcher_spin_us=0, --batch_window_us, "
                "--batch_min_calls");
  if (lone_client_drives()) {
    lone.drives =
        "its poller, inline (one session called lately, nothing "
        "queued)";
    lone.spins = pollers + "; the batcher thread's spin shrinks to nothing";
    lone.answers = "its poller";
  } else {
    lone.drives = "the batcher thread" + woken + gathering;
    lone.spins = pollers + "; " + thread_spin;
    lone.answers = "the batcher thread";
  }
  lone.flags = absl::StrCat(batcher_flags, ", ", kFastFlags);
  several.drives =
      "the batcher thread" + woken + gathering + "; the pollers only queue";
  several.spins = pollers + "; " + thread_spin;
  several.answers = "the batcher thread";
  several.flags = absl::StrCat(lone.flags, ", --fast_channel_pollers");
  grpc.drives = "the batcher thread" + woken + gathering +
                "; gRPC's callback thread only queues";
  if (grpc_answer_threads() > 0) {
    grpc.spins = absl::StrFormat(
        "%s; the %d answer thread%s up to %d us after each answer",
        batcher_spin, grpc_answer_threads(),
        grpc_answer_threads() == 1 ? "" : "s", Us(grpc_answer_spin()));
    grpc.answers =
        "the batcher thread for a launch of one call; the answer threads, "
        "in turn, for a launch of several";
    grpc.flags = absl::StrCat(batcher_flags, ", --grpc_answer_threads");
  } else if (batcher_spins()) {
    grpc.spins = batcher_spin;
    grpc.answers = "the batcher thread";
    grpc.flags = absl::StrCat(batcher_flags, ", --grpc_answer_threads=0");
  } else {
    grpc.spins = "nobody: " + thread_spin;
    grpc.answers = "the batcher thread";
    grpc.flags = batcher_flags;
  }
  return rows;
}

std::string SchedulingPolicy::MarkdownRow(absl::string_view settings_label,
                                          const SchedulingRow& row) {
  return absl::StrCat("| ", settings_label, " |", Cells(row));
}

std::string SchedulingPolicy::Describe() const {
  std::vector<std::string> lines = {
      "| situation | drives the launch | spins, how long | sends the answer "
      "| flags |",
      "|---|---|---|---|---|"};
  for (const SchedulingRow& row : Rows()) {
    lines.push_back(absl::StrCat("|", Cells(row)));
  }
  return absl::StrJoin(lines, "\n");
}

std::string SchedulingPolicy::Summary() const {
  const Batcher::Options& b = settings_.batcher;
  if (!batcher_spins()) {
    return b.batch_window > absl::ZeroDuration()
               ? absl::StrFormat("thread woken, window %d us for %d calls",
                                 Us(b.batch_window), b.min_batch_calls)
               : std::string("driven by submitters");
  }
  return absl::StrFormat("thread spinning %d us, window %d us for %d calls",
                         Us(b.spin), Us(b.batch_window), b.min_batch_calls);
}

}  // namespace pagealloc
