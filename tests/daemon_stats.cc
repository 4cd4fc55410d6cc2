#include "tests/daemon_stats.h"

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "proto/pagealloc.grpc.pb.h"
#include "tests/wait_for.h"

namespace pagealloc::testing {

absl::StatusOr<v1::GetStatsResponse> DaemonStats(const std::string& target,
                                                 absl::Duration deadline) {
  auto stub = v1::PageAllocator::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  v1::GetStatsRequest request;
  request.set_include_sessions(true);
  v1::GetStatsResponse response;
  absl::Status status =
      FromGrpcStatus(stub->GetStats(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::GetStatsResponse> WaitForStats(
    const std::string& target,
    absl::FunctionRef<bool(const v1::GetStatsResponse&)> done,
    absl::Duration timeout) {
  absl::StatusOr<v1::GetStatsResponse> stats;
  WaitFor(
      [&] {
        stats = DaemonStats(target);
        return !stats.ok() || done(*stats);
      },
      timeout);
  return stats;
}

absl::StatusOr<v1::GetStatsResponse> WaitUntilEmpty(const std::string& target,
                                                    absl::Duration timeout) {
  return WaitForStats(
      target,
      [](const v1::GetStatsResponse& stats) {
        return stats.used_pages() == 0 && stats.sessions_active() == 0;
      },
      timeout);
}

}  // namespace pagealloc::testing
