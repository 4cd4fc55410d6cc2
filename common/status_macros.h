// Early-return helpers for absl::Status and absl::StatusOr.
//
// Debian 12's Abseil (20220623) predates absl's own status macros, so we keep
// these two here and use them everywhere instead of hand-written if-chains.

#ifndef PAGEALLOC_COMMON_STATUS_MACROS_H_
#define PAGEALLOC_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define RETURN_IF_ERROR(expr)                                 \
  do {                                                        \
    const ::absl::Status pagealloc_status_internal_ = (expr); \
    if (!pagealloc_status_internal_.ok()) {                   \
      return pagealloc_status_internal_;                      \
    }                                                         \
  } while (false)

#define PAGEALLOC_STATUS_CONCAT_INNER_(a, b) a##b
#define PAGEALLOC_STATUS_CONCAT_(a, b) PAGEALLOC_STATUS_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); returns its status from the
// enclosing function when it is not OK, else moves its value into `lhs`,
// which may be a declaration: ASSIGN_OR_RETURN(auto x, MakeX());
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  PAGEALLOC_ASSIGN_OR_RETURN_IMPL_(  \
      PAGEALLOC_STATUS_CONCAT_(pagealloc_statusor_, __LINE__), lhs, rexpr)

#define PAGEALLOC_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                     \
  if (!statusor.ok()) {                                        \
    return std::move(statusor).status();                       \
  }                                                            \
  lhs = std::move(statusor).value()

#endif  // PAGEALLOC_COMMON_STATUS_MACROS_H_
