#include "client/admin.h"

#include "common/grpc_status.h"
#include "common/socket_location.h"
#include "common/status_macros.h"
#include "proto/pagealloc.grpc.pb.h"

namespace pagealloc {
namespace {

// The channel `options` names: its own, or one dialed to its target.
absl::StatusOr<std::shared_ptr<grpc::Channel>> AdminChannel(
    const AdminOptions& options) {
  if (options.channel != nullptr) return options.channel;
  std::string target = options.target;
  if (target.empty()) {
    ASSIGN_OR_RETURN(target, FindDaemonTarget(0));
  }
  return grpc::CreateChannel(target, options.credentials != nullptr
                                         ? options.credentials
                                         : grpc::InsecureChannelCredentials());
}

}  // namespace

absl::StatusOr<v1::GetStatsResponse> GetDaemonStats(const AdminOptions& options,
                                                    bool include_sessions) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      AdminChannel(options);
  if (!channel.ok()) return channel.status();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  v1::GetStatsRequest request;
  request.set_include_sessions(include_sessions);
  v1::GetStatsResponse response;
  const absl::Status status =
      FromGrpcStatus(v1::PageAllocator::NewStub(*channel)->GetStats(
          &context, request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<int64_t> ClearDaemonPool(const AdminOptions& options,
                                        bool force) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      AdminChannel(options);
  if (!channel.ok()) return channel.status();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  v1::ClearPoolRequest request;
  request.set_force(force);
  v1::ClearPoolResponse response;
  const absl::Status status =
      FromGrpcStatus(v1::PageAllocator::NewStub(*channel)->ClearPool(
          &context, request, &response));
  if (!status.ok()) return status;
  return response.pages_freed();
}

absl::StatusOr<int64_t> ResetDaemonPrefixCache(const AdminOptions& options) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      AdminChannel(options);
  if (!channel.ok()) return channel.status();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  v1::ResetPrefixCacheRequest request;
  v1::ResetPrefixCacheResponse response;
  const absl::Status status =
      FromGrpcStatus(v1::PageAllocator::NewStub(*channel)->ResetPrefixCache(
          &context, request, &response));
  if (!status.ok()) return status;
  return response.pages_evicted();
}

absl::StatusOr<v1::GetFreeListsResponse> GetDaemonFreeLists(
    const AdminOptions& options, int64_t max_pages) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      AdminChannel(options);
  if (!channel.ok()) return channel.status();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  v1::GetFreeListsRequest request;
  request.set_max_pages(max_pages);
  v1::GetFreeListsResponse response;
  const absl::Status status =
      FromGrpcStatus(v1::PageAllocator::NewStub(*channel)->GetFreeLists(
          &context, request, &response));
  if (!status.ok()) return status;
  return response;
}

}  // namespace pagealloc
