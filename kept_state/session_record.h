// KeptSession: what the daemon keeps of a session across its own restart,
// as the pool owner's metadata (PagePool::AddOwner), so that the session's
// record and its pages travel in one state (docs/design.md, "A restart
// keeps the pool").
//
// The token is kept as its SHA-256 digest: the state lives in a memfd that
// only the daemon and the service manager hold, but a digest is all a
// restarted daemon needs to check a resuming client's token, and a leaked
// state file then gives no session away.
//
// Wire format (little-endian), version 1:
//   u8 version, u8 flags (bit 0: resumable), u16 name bytes,
//   i64 quota_pages, 32 bytes token digest, name bytes.

#ifndef PAGEALLOC_KEPT_STATE_SESSION_RECORD_H_
#define PAGEALLOC_KEPT_STATE_SESSION_RECORD_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pagealloc {

using TokenDigest = std::array<uint8_t, 32>;

// SHA-256 of `token`.
TokenDigest DigestToken(absl::string_view token);

struct KeptSession {
  TokenDigest token_digest{};
  std::string client_name;  // at most 65535 bytes (the registry's 128)
  int64_t quota_pages = 0;
  bool resumable = false;

  bool operator==(const KeptSession& other) const {
    return token_digest == other.token_digest &&
           client_name == other.client_name &&
           quota_pages == other.quota_pages && resumable == other.resumable;
  }
};

// The record's bytes (at most 45 + 65535).
std::string EncodeKeptSession(const KeptSession& session);

// Parses a record. DATA_LOSS for a record that is truncated, too long, of
// an unknown version, with unknown flags or a negative quota: a kept
// state is never trusted further than it checks.
absl::StatusOr<KeptSession> DecodeKeptSession(absl::string_view bytes);

}  // namespace pagealloc

#endif  // PAGEALLOC_KEPT_STATE_SESSION_RECORD_H_
