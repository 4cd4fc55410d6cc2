// prefix_match_benchmark: match and adopt of one long published chain
// against a daemon, per transport (docs/design.md, "Shared prefix pages").
//
// A writer session publishes --chain_pages pages (2,048: a 32k-token prompt
// at page size 16) under a chain of fresh keys. Then, for each transport in
// --transports, a reader session of that transport, one call at a time:
//   - "match+adopt": MatchPrefixPacked(chain, adopt) (timed: the keys back
//     to back, as the C ABI and Python pass them), checked to find the
//     whole chain, then FreePages of the pages found (timed apart, "free"),
//     which drops the references, so every iteration adopts again;
//   - "match+adopt, two chains in turn": the same with a second published
//     chain of as many pages every other call, so that no cache line of
//     the keys or of the answer is the last call's (the fast channel
//     stores only the lines that changed: a chain matched again crosses
//     cores only where it differs);
//   - "match": MatchPrefixPacked(chain) without adopt (a peek);
//   - "match, first key missing": the chain with its first key changed, so
//     that the walk stops at once: the keys' transport and parse alone.
// It prints p50, p99, mean and max of each in microseconds. The keys are
// parsed, looked up and adopted in the daemon on every call: what the
// issue's target ("match+adopt of 2,048 pages <= 30 us through the fast
// channel") measures, on the daemon's host.
//
// It reports; it fails only when something breaks (the daemon does not
// start, a call is refused, a match finds less than the chain, a fast
// channel was asked for and not had), never on a number.
//
//   ./bazelw build -c opt //bench:prefix_match_benchmark
//   //server:pagealloc-server bazel-bin/bench/prefix_match_benchmark
//   --backend=cpu
// (or --target=unix:///run/pagealloc/daemon.sock for a running daemon: its
// pool needs twice --chain_pages free pages).

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "bench/clock.h"
#include "bench/daemon.h"
#include "client/client.h"
#include "common/command_line.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, target, "",
          "A running daemon to measure (unix:///path or host:port); empty "
          "starts pagealloc-server on a private socket.");
ABSL_FLAG(std::string, server_binary, "",
          "The daemon to start (default: beside this binary).");
ABSL_FLAG(std::string, backend, "cpu", "Backend of the started daemon.");
ABSL_FLAG(int64_t, num_pages, 8192, "Pool size of the started daemon.");
ABSL_FLAG(int64_t, page_size, 16, "Page size of the started daemon.");
ABSL_FLAG(std::vector<std::string>, server_flags, {},
          "More flags for the started daemon (comma-separated).");
ABSL_FLAG(int64_t, chain_pages, 2048, "Pages (keys) in the chain.");
ABSL_FLAG(int64_t, iterations, 2000, "Timed calls of each kind.");
ABSL_FLAG(int64_t, warmup, 200, "Untimed calls of each kind first.");
ABSL_FLAG(std::vector<std::string>, transports,
          std::vector<std::string>({"fast_channel", "grpc"}),
          "The readers' transports, in order: fast_channel, grpc.");

namespace pagealloc::bench {
namespace {

// A chain of `n` distinct 32-byte keys, unique to this run (`salt`), so
// that a daemon measured before holds none of them.
std::vector<std::string> ChainKeys(int64_t n, uint64_t salt) {
  std::vector<std::string> keys(n, std::string(32, '\0'));
  for (int64_t i = 0; i < n; ++i) {
    for (int b = 0; b < 8; ++b) {
      keys[i][b] = static_cast<char>(static_cast<uint64_t>(i) >> (8 * b));
      keys[i][8 + b] = static_cast<char>(salt >> (8 * b));
    }
    keys[i][31] = 'p';
  }
  return keys;
}

struct Summary {
  std::string transport;
  std::string call;
  int64_t p50 = 0, p99 = 0, max = 0;
  double mean = 0;
};

// The percentiles of `nanos` (sorted here), exact: every sample is kept.
Summary Summarize(std::string transport, std::string call,
                  std::vector<int64_t>& nanos) {
  Summary s{std::move(transport), std::move(call)};
  if (nanos.empty()) return s;
  std::sort(nanos.begin(), nanos.end());
  auto at = [&](double q) {
    const size_t rank = static_cast<size_t>(q * (nanos.size() - 1) + 0.5);
    return nanos[rank];
  };
  s.p50 = at(0.50);
  s.p99 = at(0.99);
  s.max = nanos.back();
  double sum = 0;
  for (int64_t n : nanos) sum += static_cast<double>(n);
  s.mean = sum / static_cast<double>(nanos.size());
  return s;
}

ClientOptions ClientFor(const std::string& target, const std::string& name,
                        bool fast_channel) {
  ClientOptions options;
  options.target = target;
  options.client_name = name;
  options.fast_channel = fast_channel;
  return options;
}

// The writer's pages: `n` whole pages, allocated inline (over gRPC: setup,
// not measured) and published under `keys`. The writer keeps its
// references, so the pages stay published while readers come and go.
absl::StatusOr<std::vector<int64_t>> PublishChain(
    Client& writer, const std::vector<std::string>& keys) {
  const int64_t n = static_cast<int64_t>(keys.size());
  const int64_t page_size = writer.pool().page_size();
  CallOptions inline_slots;
  inline_slots.return_inline = true;
  ASSIGN_OR_RETURN(Allocation allocation,
                   writer.Alloc({n * page_size}, inline_slots));
  RETURN_IF_ERROR(allocation.status());
  std::vector<int64_t> pages(n);
  for (int64_t i = 0; i < n; ++i) {
    pages[i] = allocation[0].slots[i * page_size] / page_size;
  }
  ASSIGN_OR_RETURN(Client::PublishResult published,
                   writer.Publish(pages, keys));
  if (published.newly_published != n) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "published %d of %d new keys", published.newly_published, n));
  }
  return pages;
}

// A published chain: its keys back to back and its pages.
struct Chain {
  std::string packed;
  std::vector<int64_t> pages;
};

// Times match+adopt of chains[i % chains.size()] at call i, and the free
// that drops the references after each, into `adopt_nanos` and
// `free_nanos`.
absl::Status MeasureAdopts(Client& reader, absl::Span<const Chain> chains,
                           std::vector<int64_t>* adopt_nanos,
                           std::vector<int64_t>* free_nanos) {
  const int64_t warmup = absl::GetFlag(FLAGS_warmup);
  const int64_t iterations = absl::GetFlag(FLAGS_iterations);
  adopt_nanos->reserve(iterations);
  free_nanos->reserve(iterations);
  for (int64_t i = 0; i < warmup + iterations; ++i) {
    const Chain& chain = chains[i % chains.size()];
    const int64_t t0 = NowNanos();
    ASSIGN_OR_RETURN(std::vector<int64_t> found,
                     reader.MatchPrefixPacked(chain.packed, /*adopt=*/true));
    const int64_t t1 = NowNanos();
    if (found != chain.pages) {
      return absl::InternalError(absl::StrFormat(
          "iteration %d: the match found %d of the chain's %d pages, or "
          "others",
          i, found.size(), chain.pages.size()));
    }
    ASSIGN_OR_RETURN(const int64_t freed, reader.FreePages(found));
    const int64_t t2 = NowNanos();
    if (freed != static_cast<int64_t>(chain.pages.size())) {
      return absl::InternalError(
          absl::StrFormat("iteration %d: dropped %d references of %d", i, freed,
                          chain.pages.size()));
    }
    if (i >= warmup) {
      adopt_nanos->push_back(t1 - t0);
      free_nanos->push_back(t2 - t1);
    }
  }
  return absl::OkStatus();
}

// Times the calls of one reader session; appends its rows to `rows`.
absl::Status MeasureReader(const std::string& target,
                           const std::string& transport,
                           absl::Span<const Chain> chains,
                           std::vector<Summary>* rows) {
  if (transport != "fast_channel" && transport != "grpc") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--transports: %s is neither fast_channel nor grpc", transport));
  }
  const bool fast = transport == "fast_channel";
  ASSIGN_OR_RETURN(
      std::unique_ptr<Client> reader,
      Client::Connect(ClientFor(target, "prefix-bench-" + transport, fast)));
  if (reader->uses_fast_channel() != fast) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the %s reader %s a fast channel", transport,
                        fast ? "did not get" : "got"));
  }
  const std::string& packed = chains[0].packed;
  const std::vector<int64_t>& pages = chains[0].pages;
  const int64_t warmup = absl::GetFlag(FLAGS_warmup);
  const int64_t iterations = absl::GetFlag(FLAGS_iterations);
  std::vector<int64_t> adopt_nanos, free_nanos, peek_nanos;
  RETURN_IF_ERROR(
      MeasureAdopts(*reader, chains.subspan(0, 1), &adopt_nanos, &free_nanos));
  std::vector<int64_t> turn_nanos, turn_free_nanos;
  RETURN_IF_ERROR(
      MeasureAdopts(*reader, chains, &turn_nanos, &turn_free_nanos));
  peek_nanos.reserve(iterations);
  for (int64_t i = 0; i < warmup + iterations; ++i) {
    const int64_t t0 = NowNanos();
    ASSIGN_OR_RETURN(std::vector<int64_t> found,
                     reader->MatchPrefixPacked(packed, /*adopt=*/false));
    const int64_t t1 = NowNanos();
    if (found.size() != pages.size()) {
      return absl::InternalError(
          absl::StrFormat("iteration %d: the peek found %d of %d pages", i,
                          found.size(), pages.size()));
    }
    if (i >= warmup) peek_nanos.push_back(t1 - t0);
  }
  // The same chain with its first key changed: the walk stops at once, so
  // what is left is the keys' way in and their parse (the transport's part
  // of a match).
  std::string missing = packed;
  missing[31] = static_cast<char>(~missing[31]);  // no key of the run ends so
  std::vector<int64_t> miss_nanos;
  miss_nanos.reserve(iterations);
  for (int64_t i = 0; i < warmup + iterations; ++i) {
    const int64_t t0 = NowNanos();
    ASSIGN_OR_RETURN(std::vector<int64_t> found,
                     reader->MatchPrefixPacked(missing, /*adopt=*/false));
    const int64_t t1 = NowNanos();
    if (!found.empty()) {
      return absl::InternalError(absl::StrFormat(
          "iteration %d: a chain missing its first key found %d pages", i,
          found.size()));
    }
    if (i >= warmup) miss_nanos.push_back(t1 - t0);
  }
  rows->push_back(Summarize(transport, "match+adopt", adopt_nanos));
  rows->push_back(
      Summarize(transport, "free (drop the references)", free_nanos));
  rows->push_back(
      Summarize(transport, "match+adopt, two chains in turn", turn_nanos));
  rows->push_back(Summarize(transport, "match (no adopt)", peek_nanos));
  rows->push_back(Summarize(
      transport, "match, first key missing (keys in, no walk)", miss_nanos));
  return reader->Close();
}

absl::Status Run() {
  const int64_t chain_pages = absl::GetFlag(FLAGS_chain_pages);
  if (chain_pages < 1 || absl::GetFlag(FLAGS_iterations) < 1 ||
      absl::GetFlag(FLAGS_warmup) < 0) {
    return absl::InvalidArgumentError(
        "--chain_pages and --iterations must be >= 1, --warmup >= 0");
  }
  DaemonOptions daemon_options;
  daemon_options.target = absl::GetFlag(FLAGS_target);
  daemon_options.server_binary = absl::GetFlag(FLAGS_server_binary);
  daemon_options.backend = absl::GetFlag(FLAGS_backend);
  daemon_options.num_pages = absl::GetFlag(FLAGS_num_pages);
  daemon_options.page_size = absl::GetFlag(FLAGS_page_size);
  daemon_options.server_flags = absl::GetFlag(FLAGS_server_flags);
  // Unix socket paths are limited to 107 bytes: a short private directory.
  char pattern[] = "/tmp/pagealloc-prefix-bench-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    return absl::InternalError("mkdtemp for the benchmark's socket");
  }
  ASSIGN_OR_RETURN(DaemonHandle daemon, StartOrAttach(daemon_options, pattern));

  ASSIGN_OR_RETURN(
      std::unique_ptr<Client> writer,
      Client::Connect(ClientFor(daemon.target, "prefix-bench-writer", false)));
  std::vector<Chain> chains(2);
  for (Chain& chain : chains) {
    const std::vector<std::string> keys =
        ChainKeys(chain_pages, static_cast<uint64_t>(NowNanos()));
    chain.packed = absl::StrJoin(keys, "");
    ASSIGN_OR_RETURN(chain.pages, PublishChain(*writer, keys));
  }
  std::vector<Summary> rows;
  for (const std::string& transport : absl::GetFlag(FLAGS_transports)) {
    RETURN_IF_ERROR(MeasureReader(daemon.target, transport, chains, &rows));
  }
  RETURN_IF_ERROR(writer->Close());

  absl::PrintF(
      "prefix_match_benchmark: a chain of %d pages (%d tokens at page size "
      "%d), %d calls of each kind after %d untimed, one at a time; daemon: "
      "%s\n\n",
      chain_pages, chain_pages * writer->pool().page_size(),
      writer->pool().page_size(), absl::GetFlag(FLAGS_iterations),
      absl::GetFlag(FLAGS_warmup),
      daemon_options.target.empty()
          ? absl::StrFormat("started here, --backend=%s",
                            daemon_options.backend)
          : daemon_options.target);
  absl::PrintF("| transport | call | p50 us | p99 us | mean us | max us |\n");
  absl::PrintF("| --- | --- | ---: | ---: | ---: | ---: |\n");
  for (const Summary& row : rows) {
    absl::PrintF("| %s | %s | %.1f | %.1f | %.1f | %.1f |\n", row.transport,
                 row.call, row.p50 * 1e-3, row.p99 * 1e-3, row.mean * 1e-3,
                 row.max * 1e-3);
  }
  std::fflush(stdout);
  writer.reset();
  return StopDaemon(daemon);
}

}  // namespace
}  // namespace pagealloc::bench

int main(int argc, char** argv) {
  pagealloc::ParseCommandLine(
      argc, argv,
      {"prefix_match_benchmark",
       "prefix_match_benchmark: match and adopt of a published 2,048-page "
       "chain, through the fast channel and over gRPC.\n"
       "  prefix_match_benchmark --backend=cpu\n"
       "  prefix_match_benchmark --target=unix:///run/pagealloc/daemon.sock",
       "bench/prefix_match_benchmark.cc",
       {},
       {}});
  // As the daemon does (server/main.cc): Debian's Abseil leaves Mutex
  // deadlock detection on, a global lock in every Lock.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const absl::Status status = pagealloc::bench::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "prefix_match_benchmark: %s\n",
                 status.ToString().c_str());
    return pagealloc::kExitFailure;
  }
  return 0;
}
