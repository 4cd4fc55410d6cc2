// pagealloc-cli: an operator's view of a pagealloc daemon.
//
//   pagealloc-cli [--target=unix:///run/pagealloc/gpu0.sock] stats [--sessions]
//   pagealloc-cli watch [--interval_ms=1000] [--count=N]
//   pagealloc-cli alloc --tokens=64 [--hold_s=0] [--token_file=PATH]
//   pagealloc-cli free --session_id=ID --token_file=PATH --pages=3,4
//
// `alloc` opens its own session, allocates whole pages and prints them; the
// pages return to the pool when the CLI exits (after --hold_s), or earlier
// through `free` from another shell using the token file `alloc` wrote.

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/admin.h"
#include "client/client.h"
#include "common/grpc_status.h"
#include "proto/pagealloc.grpc.pb.h"

ABSL_FLAG(std::string, target, "unix:///run/pagealloc/gpu0.sock",
          "The daemon's gRPC address.");
ABSL_FLAG(bool, sessions, false, "stats: list sessions too.");
ABSL_FLAG(int64_t, interval_ms, 1000, "watch: refresh period.");
ABSL_FLAG(int64_t, count, 0,
          "watch: stop after this many refreshes (0: never).");
ABSL_FLAG(int64_t, tokens, 0, "alloc: tokens to allocate (whole pages).");
ABSL_FLAG(int64_t, hold_s, 0, "alloc: keep the pages this long before exit.");
ABSL_FLAG(std::string, token_file, "",
          "alloc: write the session token here (mode 0600); free: read it.");
ABSL_FLAG(uint64_t, session_id, 0, "free: the session whose pages to free.");
ABSL_FLAG(std::vector<std::string>, pages, {}, "free: page ids to free.");

namespace pagealloc {
namespace {

std::unique_ptr<v1::PageAllocator::Stub> Stub() {
  return v1::PageAllocator::NewStub(grpc::CreateChannel(
      absl::GetFlag(FLAGS_target), grpc::InsecureChannelCredentials()));
}

absl::StatusOr<v1::GetStatsResponse> FetchStats(bool sessions) {
  AdminOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  return GetDaemonStats(options, sessions);
}

std::string Bar(double fraction, int width) {
  const int filled = static_cast<int>(fraction * width + 0.5);
  return "[" + std::string(filled, '#') + std::string(width - filled, '.') +
         "]";
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
    std::printf("\n%-20s %-24s %10s %10s %12s %s\n", "SESSION", "CLIENT",
                "PAGES", "QUOTA", "RING USED", "CHECKPOINT");
    for (const v1::SessionStats& session : s.sessions()) {
      std::printf("%-20llu %-24s %10lld %10lld %5lld/%-6lld %s\n",
                  static_cast<unsigned long long>(session.session_id()),
                  session.client_name().c_str(),
                  static_cast<long long>(session.pages_owned()),
                  static_cast<long long>(session.quota_pages()),
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
    return 1;
  }
  PrintStats(*stats);
  return 0;
}

int Watch() {
  const int64_t count = absl::GetFlag(FLAGS_count);
  for (int64_t i = 0; count == 0 || i < count; ++i) {
    if (i > 0)
      absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_interval_ms)));
    absl::StatusOr<v1::GetStatsResponse> stats = FetchStats(true);
    if (isatty(STDOUT_FILENO)) std::printf("\033[H\033[2J");
    std::printf("pagealloc %s   %s\n\n", absl::GetFlag(FLAGS_target).c_str(),
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

int Alloc() {
  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.client_name = "pagealloc-cli";
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) {
    std::cerr << "alloc: " << client.status() << "\n";
    return 1;
  }
  const int64_t tokens = absl::GetFlag(FLAGS_tokens);
  const absl::Time start = absl::Now();
  CallOptions call;
  call.return_inline = true;
  absl::StatusOr<Allocation> allocation = (*client)->Alloc({tokens}, call);
  const absl::Duration took = absl::Now() - start;
  if (!allocation.ok()) {
    std::cerr << "alloc: " << allocation.status() << "\n";
    return 1;
  }
  if (!allocation->status().ok()) {
    std::cerr << "alloc: " << allocation->status() << "\n";
    return 1;
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
  const std::string token_file = absl::GetFlag(FLAGS_token_file);
  const int64_t hold = absl::GetFlag(FLAGS_hold_s);
  if (!token_file.empty()) {
    const int fd = open(token_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const std::string& secret = (*client)->session_token();
    if (fd < 0 || write(fd, secret.data(), secret.size()) !=
                      static_cast<ssize_t>(secret.size())) {
      std::cerr << "alloc: cannot write " << token_file << "\n";
      return 1;
    }
    close(fd);
    std::printf("session token written to %s (mode 0600)\n",
                token_file.c_str());
  }
  if (hold > 0) {
    std::printf("holding the pages for %llds (Ctrl-C returns them)\n",
                static_cast<long long>(hold));
    std::fflush(stdout);
    absl::SleepFor(absl::Seconds(hold));
  }
  return 0;
}

int Free() {
  std::ifstream in(absl::GetFlag(FLAGS_token_file), std::ios::binary);
  std::stringstream token;
  token << in.rdbuf();
  std::vector<int64_t> pages;
  for (const std::string& text : absl::GetFlag(FLAGS_pages)) {
    int64_t page;
    if (!absl::SimpleAtoi(text, &page)) {
      std::cerr << "free: --pages: \"" << text << "\" is not a page id\n";
      return 2;
    }
    pages.push_back(page);
  }
  v1::FreeRequest request;
  request.mutable_session()->set_session_id(absl::GetFlag(FLAGS_session_id));
  request.mutable_session()->set_session_token(token.str());
  request.mutable_pages()->Add(pages.begin(), pages.end());
  v1::FreeResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  absl::Status status =
      FromGrpcStatus(Stub()->Free(&context, request, &response));
  if (!status.ok()) {
    std::cerr << "free: " << status << "\n";
    return 1;
  }
  std::printf("%lld pages freed\n",
              static_cast<long long>(response.pages_freed()));
  return 0;
}

}  // namespace
}  // namespace pagealloc

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "pagealloc-cli [--target=ADDRESS] stats|watch|alloc|free [flags]\n"
      "  stats [--sessions]          pool and session figures\n"
      "  watch [--interval_ms=1000]  the same, refreshing\n"
      "  alloc --tokens=N [--hold_s=S] [--token_file=F]\n"
      "  free --session_id=ID --token_file=F --pages=P1,P2");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const std::string command = args.size() > 1 ? args[1] : "";
  if (command == "stats") return pagealloc::Stats();
  if (command == "watch") return pagealloc::Watch();
  if (command == "alloc") return pagealloc::Alloc();
  if (command == "free") return pagealloc::Free();
  std::cerr << "usage: pagealloc-cli stats|watch|alloc|free (see --help)\n";
  return 2;
}
