// The one place where absl::Status becomes grpc::Status (and back, for the
// client library). The canonical codes share their numbers.

#ifndef PAGEALLOC_COMMON_GRPC_STATUS_H_
#define PAGEALLOC_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace pagealloc {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace pagealloc

#endif  // PAGEALLOC_COMMON_GRPC_STATUS_H_
