#include "kept_state/session_record.h"

#include <openssl/sha.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"

namespace pagealloc {
namespace {

constexpr uint8_t kVersion = 1;
constexpr uint8_t kResumable = 1;
constexpr size_t kFixedBytes = 1 + 1 + 2 + 8 + 32;

// The record is little-endian, as every host the daemon runs on.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);
template <typename T>
void Store(char* p, T value) {
  std::memcpy(p, &value, sizeof(value));
}
template <typename T>
T Load(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof(value));
  return value;
}

}  // namespace

TokenDigest DigestToken(absl::string_view token) {
  TokenDigest digest;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(),
         digest.data());
  return digest;
}

std::string EncodeKeptSession(const KeptSession& session) {
  const size_t name_bytes = std::min<size_t>(session.client_name.size(), 65535);
  std::string out(kFixedBytes + name_bytes, '\0');
  char* p = out.data();
  p[0] = static_cast<char>(kVersion);
  p[1] = static_cast<char>(session.resumable ? kResumable : 0);
  Store<uint16_t>(p + 2, static_cast<uint16_t>(name_bytes));
  Store<int64_t>(p + 4, session.quota_pages);
  std::memcpy(p + 12, session.token_digest.data(), 32);
  std::memcpy(p + kFixedBytes, session.client_name.data(), name_bytes);
  return out;
}

absl::StatusOr<KeptSession> DecodeKeptSession(absl::string_view bytes) {
  if (bytes.size() < kFixedBytes) {
    return absl::DataLossError(absl::StrFormat(
        "kept session record of %d bytes: shorter than its %d-byte header",
        bytes.size(), kFixedBytes));
  }
  const char* p = bytes.data();
  if (static_cast<uint8_t>(p[0]) != kVersion) {
    return absl::DataLossError(
        absl::StrFormat("kept session record version %d; this build reads %d",
                        static_cast<uint8_t>(p[0]), kVersion));
  }
  const uint8_t flags = static_cast<uint8_t>(p[1]);
  if ((flags & ~kResumable) != 0) {
    return absl::DataLossError(
        absl::StrFormat("kept session record: unknown flags 0x%02x", flags));
  }
  const size_t name_bytes = Load<uint16_t>(p + 2);
  if (bytes.size() != kFixedBytes + name_bytes) {
    return absl::DataLossError(
        absl::StrFormat("kept session record of %d bytes; its header says %d",
                        bytes.size(), kFixedBytes + name_bytes));
  }
  KeptSession session;
  session.resumable = (flags & kResumable) != 0;
  session.quota_pages = Load<int64_t>(p + 4);
  if (session.quota_pages < 0) {
    return absl::DataLossError(absl::StrFormat(
        "kept session record: quota %d pages", session.quota_pages));
  }
  std::memcpy(session.token_digest.data(), p + 12, 32);
  session.client_name.assign(p + kFixedBytes, name_bytes);
  return session;
}

}  // namespace pagealloc
