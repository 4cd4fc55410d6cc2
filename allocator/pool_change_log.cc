#include "allocator/pool_change_log.h"

namespace pagealloc {

absl::string_view PoolChangeKindName(PoolChangeKind kind) {
  switch (kind) {
    case PoolChangeKind::kAddOwner:
      return "add_owner";
    case PoolChangeKind::kRemoveOwner:
      return "remove_owner";
    case PoolChangeKind::kAllocate:
      return "allocate";
    case PoolChangeKind::kFree:
      return "free";
    case PoolChangeKind::kCheckpoint:
      return "checkpoint";
    case PoolChangeKind::kRollback:
      return "rollback";
    case PoolChangeKind::kClearOwner:
      return "clear_owner";
    case PoolChangeKind::kClearPool:
      return "clear_pool";
    case PoolChangeKind::kPublish:
      return "publish";
    case PoolChangeKind::kMatchPrefix:
      return "match_prefix";
    case PoolChangeKind::kUnpin:
      return "unpin";
    case PoolChangeKind::kResetPrefixCache:
      return "reset_prefix_cache";
    case PoolChangeKind::kAwaitRelease:
      return "await_release";
  }
  return "unknown";
}

}  // namespace pagealloc
