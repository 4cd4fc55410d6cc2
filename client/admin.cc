#include "client/admin.h"

#include "common/grpc_status.h"
#include "proto/pagealloc.grpc.pb.h"

namespace pagealloc {

absl::StatusOr<v1::GetStatsResponse> GetDaemonStats(const AdminOptions& options,
                                                    bool include_sessions) {
  std::shared_ptr<grpc::Channel> channel = options.channel;
  if (channel == nullptr) {
    if (options.target.empty()) {
      return absl::InvalidArgumentError("AdminOptions.target is empty");
    }
    channel = grpc::CreateChannel(options.target,
                                  options.credentials != nullptr
                                      ? options.credentials
                                      : grpc::InsecureChannelCredentials());
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  v1::GetStatsRequest request;
  request.set_include_sessions(include_sessions);
  v1::GetStatsResponse response;
  const absl::Status status =
      FromGrpcStatus(v1::PageAllocator::NewStub(channel)->GetStats(
          &context, request, &response));
  if (!status.ok()) return status;
  return response;
}

}  // namespace pagealloc
