#include "server/session.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "server/descriptors.h"

namespace pagealloc {

Session::Session(uint64_t id, std::string token, std::string client_name,
                 int64_t quota_pages, std::unique_ptr<RingMemory> ring,
                 MemoryBudget::Charge ring_charge)
    : id_(id),
      token_(std::move(token)),
      client_name_(std::move(client_name)),
      quota_pages_(quota_pages),
      ring_charge_(std::move(ring_charge)),
      ring_memory_(std::move(ring)),
      ring_(ring_memory_->capacity_slots()) {}

absl::StatusOr<int64_t> Session::ReserveRing(int64_t n) {
  absl::MutexLock lock(&mu_);
  return ring_.Reserve(n);
}

void Session::UnreserveRing(int64_t position, int64_t n) {
  absl::MutexLock lock(&mu_);
  ring_.Unreserve(position, n);
}

absl::Status Session::ReleaseRing(int64_t up_to) {
  absl::MutexLock lock(&mu_);
  return ring_.Release(up_to);
}

int64_t Session::ring_reserved() const {
  absl::MutexLock lock(&mu_);
  return ring_.reserved();
}

void Session::Renew(absl::Time now, absl::Duration lease) {
  absl::MutexLock lock(&mu_);
  lease_deadline_ = now + lease;
}

absl::Time Session::lease_deadline() const {
  absl::MutexLock lock(&mu_);
  return lease_deadline_;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

namespace {

// 32 bytes from the kernel's CSPRNG. getrandom takes no descriptor, so a
// daemon short of them still makes tokens.
absl::StatusOr<std::string> RandomToken() {
  std::string token(32, '\0');
  size_t got = 0;
  while (got < token.size()) {
    const ssize_t n = getrandom(token.data() + got, token.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(
          absl::StrFormat("getrandom failed: %s", std::strerror(errno)));
    }
    got += n;
  }
  return token;
}

}  // namespace

SessionRegistry::Options SessionRegistry::Options::ForPool(
    int64_t pool_slots) const {
  Options sized = *this;
  if (sized.default_ring_capacity_slots == 0) {
    sized.default_ring_capacity_slots =
        std::max(kMinDefaultRingCapacitySlots, pool_slots);
    sized.max_ring_capacity_slots = std::max(sized.max_ring_capacity_slots,
                                             sized.default_ring_capacity_slots);
  }
  return sized;
}

SessionRegistry::SessionRegistry(const Options& options, Backend* backend,
                                 MemoryBudget* ring_budget)
    : options_(options), backend_(backend), ring_budget_(ring_budget) {
  // Session ids start at a random point so that a restarted daemon does not
  // hand a returning client its old id.
  std::random_device random;
  next_id_ = (static_cast<uint64_t>(random()) << 20) + 1;
}

absl::Status CheckClientName(absl::string_view name) {
  // The name goes into log lines and metric labels: it must be text, and
  // one line of it.
  size_t i = 0;
  while (i < name.size()) {
    const unsigned char lead = name[i];
    int length = 0;
    uint32_t code = 0;
    if (lead < 0x80) {
      length = 1;
      code = lead;
    } else if ((lead & 0xE0) == 0xC0) {
      length = 2;
      code = lead & 0x1F;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3;
      code = lead & 0x0F;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4;
      code = lead & 0x07;
    }
    bool valid = length > 0 && i + length <= name.size();
    for (int k = 1; valid && k < length; ++k) {
      const unsigned char next = name[i + k];
      valid = (next & 0xC0) == 0x80;
      code = (code << 6) | (next & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not
    // UTF-8 either.
    static constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    valid = valid && code >= kSmallest[length] && code <= 0x10FFFF &&
            !(code >= 0xD800 && code <= 0xDFFF);
    if (!valid) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "client_name is not valid UTF-8 (byte %d of %d)", i, name.size()));
    }
    if (code < 0x20 || code == 0x7F) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "client_name has a control character (U+%04X at byte %d)", code, i));
    }
    i += length;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Open(
    std::string client_name, int64_t ring_capacity_slots, int64_t quota_pages) {
  if (ring_capacity_slots < 0 ||
      ring_capacity_slots > options_.max_ring_capacity_slots) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ring_capacity_slots (%d) must be in [0, %d]",
                        ring_capacity_slots, options_.max_ring_capacity_slots));
  }
  if (quota_pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("quota_pages (%d) is negative", quota_pages));
  }
  if (client_name.size() > 128) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "client_name is %d bytes long; at most 128", client_name.size()));
  }
  RETURN_IF_ERROR(CheckClientName(client_name));
  if (ring_capacity_slots == 0) {
    ring_capacity_slots = options_.default_ring_capacity_slots;
  }
  if (options_.max_quota_pages > 0 &&
      (quota_pages == 0 || quota_pages > options_.max_quota_pages)) {
    quota_pages = options_.max_quota_pages;
  }
  ASSIGN_OR_RETURN(std::string token, RandomToken());
  auto check_room = [this]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    if (static_cast<int64_t>(sessions_.size()) < options_.max_sessions) {
      return absl::OkStatus();
    }
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the daemon already serves %d sessions (--max_sessions)",
        sessions_.size()));
  };
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(check_room());
    id = next_id_++;
  }
  // Descriptors and memory are checked before the ring is made: running
  // out of either must be a refusal that says so, never a failure deep in
  // the kernel (EMFILE from memfd_create, the OOM killer at fallocate).
  RETURN_IF_ERROR(CheckDescriptorsFree(kDescriptorsPerSession));
  MemoryBudget::Charge charge;
  if (ring_budget_ != nullptr) {
    ASSIGN_OR_RETURN(const int64_t granularity, backend_->KvAlignment());
    const int64_t bytes =
        (ring_capacity_slots * static_cast<int64_t>(sizeof(int64_t)) +
         granularity - 1) /
        granularity * granularity;
    ASSIGN_OR_RETURN(charge, ring_budget_->Take(
                                 bytes, absl::StrFormat("a ring of %d slots",
                                                        ring_capacity_slots)));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<RingMemory> ring,
                   backend_->CreateRing(id, ring_capacity_slots));
  auto session = std::make_shared<Session>(id, std::move(token),
                                           std::move(client_name), quota_pages,
                                           std::move(ring), std::move(charge));
  session->Renew(absl::Now(), options_.lease);
  absl::MutexLock lock(&mu_);
  // The ring was made outside the lock, so other Opens may have filled the
  // last places meanwhile; the first check only spares a ring when full.
  RETURN_IF_ERROR(check_room());
  sessions_[id] = session;
  return session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Authenticate(
    uint64_t session_id, absl::string_view token) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) {
      return absl::NotFoundError(absl::StrFormat(
          "session %d is unknown or has expired; register again", session_id));
    }
    session = it->second;
  }
  // A lease that ran out ends the session even before the reaper's next
  // TakeExpired removes it: renewing it here would revive a session whose
  // pages are about to be reclaimed.
  const absl::Time now = absl::Now();
  if (session->lease_deadline() < now) {
    return absl::NotFoundError(absl::StrFormat(
        "session %d is unknown or has expired; register again", session_id));
  }
  if (!ConstantTimeEquals(session->token(), token)) {
    return absl::UnauthenticatedError(
        absl::StrFormat("wrong session_token for session %d", session_id));
  }
  session->Renew(now, options_.lease);
  return session;
}

std::shared_ptr<Session> SessionRegistry::Remove(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return nullptr;
  std::shared_ptr<Session> session = std::move(it->second);
  sessions_.erase(it);
  return session;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::TakeExpired(
    absl::Time now) {
  std::vector<std::shared_ptr<Session>> expired;
  absl::MutexLock lock(&mu_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second->lease_deadline() < now) {
      expired.push_back(std::move(it->second));
      sessions_.erase(it++);
    } else {
      ++it;
    }
  }
  return expired;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> list;
  list.reserve(sessions_.size());
  for (const auto& [id, session] : sessions_) list.push_back(session);
  return list;
}

int64_t SessionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace pagealloc
