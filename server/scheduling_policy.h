// SchedulingPolicy: every decision about which thread does what in the
// daemon's allocation path, made in one place. Who drives a launch (the
// submitting thread inline, or the batcher thread), how a launch gathers
// calls (limits, window, min calls), who spins and for how long (the
// batcher thread, the fast-channel pollers, the gRPC answer threads), and
// who sends the answers. The batcher (server/batcher.h), the fast channel's
// pollers (server/fast_channel_server.h) and the gRPC service's answer
// threads (server/grpc_service.h) take their settings from it and hold no
// defaults or cross-field rules of their own.
//
// Settings hold what was asked for (flags, or ServerOptions set by a
// program); Create checks them and resolves settings that cannot act
// together, keeping a note of each resolution for the log. Rows() and
// Describe() render the "which thread does what, under which flag" table
// for the settings in force; docs/design.md, section 6, holds that table
// for the documented situations and //server:scheduling_policy_doc_test
// keeps the two the same.
//
// This class is thread-compatible (a value type).

#ifndef PAGEALLOC_SERVER_SCHEDULING_POLICY_H_
#define PAGEALLOC_SERVER_SCHEDULING_POLICY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/batcher.h"

namespace pagealloc {

// Who drives launches when nothing is running.
enum class LaunchDriver {
  // The thread that submits work runs the launch on its own stack, for at
  // most Batcher::kMaxInlineRounds launches, then the batcher thread.
  kSubmitter,
  // The batcher thread runs every launch, except a lone client's call
  // submitted by a dedicated thread (lone_client_drives()).
  kBatcherThread,
};

// One row of the table: for one situation, who does what.
struct SchedulingRow {
  std::string situation;
  std::string drives;   // who drives the launch
  std::string spins;    // who spins, and how long
  std::string answers;  // who sends the answer
  std::string flags;    // the flags that decide it
};

class SchedulingPolicy {
 public:
  // What was asked for. Batcher::Options carries the batcher's own fields
  // (limits, window, min calls, spin, lone_client_drives, debug checks).
  struct Settings {
    Batcher::Options batcher;
    bool fast_channel = true;
    // The cap of each poller's adaptive spin after a call.
    absl::Duration fast_channel_spin = absl::Microseconds(200);
    int fast_channel_pollers = 1;
    // Threads that send the gRPC answers of launches that carried several
    // calls, where the batcher thread spins (0: it sends them itself).
    int grpc_answer_threads = 1;
  };

  // The flags' values; -1 where the flag means "by the machine".
  struct Flags {
    int64_t max_batch_requests = 8192;
    int64_t max_batch_tokens = 1 << 21;
    int64_t batch_window_us = -1;  // -1: kDefaultBatchWindow when spinning
    int batch_min_calls = 4;
    int64_t batcher_spin_us = -1;  // -1: by CPU count
    bool fast_channel = true;
    int64_t fast_channel_spin_us = 200;
    int fast_channel_pollers = 1;
    int grpc_answer_threads = 1;
  };

  // Machines with at least this many CPUs get a spinning batcher thread by
  // default.
  static constexpr unsigned kMinCpusForSpinning = 8;
  // The batcher thread's spin cap by default on such machines.
  static constexpr absl::Duration kDefaultBatcherSpin = absl::Microseconds(200);
  // The gathering window of a spinning batcher thread by default.
  static constexpr absl::Duration kDefaultBatchWindow = absl::Microseconds(100);

  // The defaults for a daemon on a machine with `cpus` CPUs: with
  // kMinCpusForSpinning or more, a spinning batcher thread (200 us) that
  // gathers calls for up to 100 us, waiting for at most 4 calls (or half
  // the active sessions); on smaller machines, where a spinning thread
  // would take a core the clients and the pollers need, the submitting
  // thread drives and nothing waits. The defaults do not depend on the
  // backend.
  static Settings DefaultsForMachine(unsigned cpus);
  // The settings the flags ask for on a machine with `cpus` CPUs: the
  // flags' -1 values resolved (the spin by CPU count, then the window by
  // whether the batcher thread spins). The flags' ranges are checked by
  // the caller (pagealloc-server's flag parsing), the rules between them
  // by Create.
  static Settings SettingsFromFlags(const Flags& flags, unsigned cpus);

  // Checks `settings` and resolves what cannot act together, noting each
  // resolution (notes()): --grpc_answer_threads without a spinning batcher
  // thread is 0 (only that thread hands answers over), and
  // lone_client_drives without a window and min calls is off (the active
  // sessions are tracked only then). INVALID_ARGUMENT naming the flag and
  // its value for a limit below 1, a negative duration, or no poller with
  // the fast channel on.
  static absl::StatusOr<SchedulingPolicy> Create(const Settings& settings);

  // The settings in force, resolutions applied.
  const Settings& settings() const { return settings_; }
  // What Create resolved, one sentence each, naming the flags.
  const std::vector<std::string>& notes() const { return notes_; }

  LaunchDriver driver() const;
  bool batcher_spins() const {
    return settings_.batcher.spin > absl::ZeroDuration();
  }
  // Whether a lone client's call from a dedicated submitter (a
  // fast-channel poller) is driven by that submitter (Batcher::Options).
  bool lone_client_drives() const {
    return batcher_spins() && settings_.batcher.lone_client_drives &&
           settings_.batcher.batch_window > absl::ZeroDuration() &&
           settings_.batcher.min_batch_calls > 0;
  }
  // The gRPC answer threads to start (0: none) and their spin cap.
  int grpc_answer_threads() const { return settings_.grpc_answer_threads; }
  absl::Duration grpc_answer_spin() const { return settings_.batcher.spin; }

  // The batcher's options; `debug_checks` is or-ed in.
  Batcher::Options BatcherOptions(bool debug_checks) const;

  // The table for these settings: one row per situation (a lone client on
  // the fast channel, several clients on it, a gRPC allocation call).
  std::vector<SchedulingRow> Rows() const;
  // Rows() as a markdown table with a header, for
  // --print_scheduling_policy and the start-up log.
  std::string Describe() const;
  // One line: the batcher's mode, for the start-up log line.
  std::string Summary() const;

  // `row` as one markdown table row, with `settings_label` first (the
  // table of docs/design.md, section 6).
  static std::string MarkdownRow(absl::string_view settings_label,
                                 const SchedulingRow& row);

 private:
  explicit SchedulingPolicy(const Settings& settings) : settings_(settings) {}

  Settings settings_;
  std::vector<std::string> notes_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_SCHEDULING_POLICY_H_
