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

namespace {

// The ring's memory shared with its charge: the charge is given back when
// the last holder lets go, after the memory is released.
std::shared_ptr<RingMemory> ShareRing(std::unique_ptr<RingMemory> memory,
                                      MemoryBudget::Charge charge) {
  struct Held {
    MemoryBudget::Charge charge;  // first: given back last
    std::unique_ptr<RingMemory> memory;
  };
  auto held = std::make_shared<Held>();
  held->charge = std::move(charge);
  held->memory = std::move(memory);
  RingMemory* const ring = held->memory.get();
  return std::shared_ptr<RingMemory>(std::move(held), ring);
}

}  // namespace

Session::Session(uint64_t id, std::string token, std::string client_name,
                 int64_t quota_pages, std::unique_ptr<RingMemory> ring,
                 MemoryBudget::Charge ring_charge, bool resumable)
    : id_(id),
      token_digest_(DigestToken(token)),
      client_name_(std::move(client_name)),
      quota_pages_(quota_pages),
      resumable_(resumable),
      token_(std::move(token)),
      ring_space_(ring->capacity_slots()) {
  ring_ = ShareRing(std::move(ring), std::move(ring_charge));
}

Session::Session(uint64_t id, Restored restored, std::string client_name,
                 int64_t quota_pages, std::unique_ptr<RingMemory> ring,
                 MemoryBudget::Charge ring_charge, bool resumable)
    : id_(id),
      token_digest_(restored.token_digest),
      client_name_(std::move(client_name)),
      quota_pages_(quota_pages),
      resumable_(resumable),
      ring_space_(ring->capacity_slots()),
      // Its client's process outlived the daemon: its memory waits for a
      // Resume, as a detached session's does.
      link_(SessionLink::kDetached) {
  ring_ = ShareRing(std::move(ring), std::move(ring_charge));
}

std::string Session::token() const {
  absl::MutexLock lock(&mu_);
  return token_;
}

bool Session::MatchesToken(absl::string_view token) {
  const TokenDigest digest = DigestToken(token);
  if (!ConstantTimeEquals(
          absl::string_view(reinterpret_cast<const char*>(digest.data()),
                            digest.size()),
          absl::string_view(reinterpret_cast<const char*>(token_digest_.data()),
                            token_digest_.size()))) {
    return false;
  }
  absl::MutexLock lock(&mu_);
  if (token_.empty()) token_ = std::string(token);
  return true;
}

std::shared_ptr<RingMemory> Session::ring() const {
  absl::MutexLock lock(&mu_);
  return ring_;
}

int64_t Session::ring_capacity_slots() const {
  absl::MutexLock lock(&mu_);
  return ring_space_.capacity();
}

absl::StatusOr<int64_t> Session::ReserveRing(
    int64_t n, std::shared_ptr<RingMemory>* ring) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const int64_t position, ring_space_.Reserve(n));
  if (ring != nullptr) *ring = ring_;
  return position;
}

void Session::UnreserveRing(int64_t position, int64_t n,
                            const RingMemory* ring) {
  absl::MutexLock lock(&mu_);
  // Space in a ring a Resume replaced went with that ring.
  if (ring != nullptr && ring != ring_.get()) return;
  ring_space_.Unreserve(position, n);
}

absl::Status Session::ReleaseRing(int64_t up_to) {
  absl::MutexLock lock(&mu_);
  return ring_space_.Release(up_to);
}

int64_t Session::ring_reserved() const {
  absl::MutexLock lock(&mu_);
  return ring_space_.reserved();
}

void Session::Renew(absl::Time now, absl::Duration lease) {
  absl::MutexLock lock(&mu_);
  lease_deadline_ = now + lease;
}

absl::Time Session::lease_deadline() const {
  absl::MutexLock lock(&mu_);
  return lease_deadline_;
}

SessionLink Session::link() const {
  absl::MutexLock lock(&mu_);
  return link_;
}

uint64_t Session::link_generation() const {
  absl::MutexLock lock(&mu_);
  return link_generation_;
}

absl::StatusOr<uint64_t> Session::Connect() {
  absl::MutexLock lock(&mu_);
  switch (link_) {
    case SessionLink::kAwaitingHello:
      link_ = SessionLink::kConnected;
      return link_generation_;
    case SessionLink::kConnected:
      return absl::FailedPreconditionError(absl::StrFormat(
          "session %d already has its memory socket connection", id_));
    case SessionLink::kDetached:
      break;
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "session %d's memory went to an earlier connection, which closed; "
      "Resume the session to be handed its memory again",
      id_));
}

void Session::AbortConnect(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  if (generation == link_generation_ && link_ == SessionLink::kConnected) {
    link_ = SessionLink::kAwaitingHello;
  }
}

Session::Disconnect Session::Disconnected(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  if (generation != link_generation_ || link_ != SessionLink::kConnected) {
    return Disconnect::kStale;
  }
  link_ = SessionLink::kDetached;
  return resumable_ ? Disconnect::kDetached : Disconnect::kEnded;
}

bool Session::Detach(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  if (generation != link_generation_ || link_ != SessionLink::kConnected) {
    return false;
  }
  link_ = SessionLink::kDetached;
  return true;
}

absl::StatusOr<Session::Relinked> Session::ReplaceRing(
    std::unique_ptr<RingMemory> ring, MemoryBudget::Charge ring_charge,
    bool take_over) {
  const int64_t capacity = ring->capacity_slots();
  std::shared_ptr<RingMemory> shared =
      ShareRing(std::move(ring), std::move(ring_charge));
  // The old ring goes after the lock is let go (its release may wait for
  // the device's stream).
  std::shared_ptr<RingMemory> old;
  absl::MutexLock lock(&mu_);
  if (link_ == SessionLink::kConnected && !take_over) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "session %d is still connected (a process holds its memory socket "
        "connection); pass take_over to take it from that process",
        id_));
  }
  Relinked relinked{link_, link_generation_};
  old = std::move(ring_);
  ring_ = std::move(shared);
  ring_space_ = RingSpace(capacity);
  link_ = SessionLink::kAwaitingHello;
  ++link_generation_;
  return relinked;
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

absl::StatusOr<SessionRegistry::NewRing> SessionRegistry::MakeRing(
    uint64_t session_id, int64_t ring_capacity_slots) {
  if (ring_capacity_slots < 0 ||
      ring_capacity_slots > options_.max_ring_capacity_slots) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ring_capacity_slots (%d) must be in [0, %d]",
                        ring_capacity_slots, options_.max_ring_capacity_slots));
  }
  if (ring_capacity_slots == 0) {
    ring_capacity_slots = options_.default_ring_capacity_slots;
  }
  // Descriptors and memory are checked before the ring is made: running
  // out of either must be a refusal that says so, never a failure deep in
  // the kernel (EMFILE from memfd_create, the OOM killer at fallocate).
  RETURN_IF_ERROR(CheckDescriptorsFree(kDescriptorsPerSession));
  NewRing ring;
  if (ring_budget_ != nullptr) {
    ASSIGN_OR_RETURN(const int64_t granularity, backend_->KvAlignment());
    const int64_t bytes =
        (ring_capacity_slots * static_cast<int64_t>(sizeof(int64_t)) +
         granularity - 1) /
        granularity * granularity;
    ASSIGN_OR_RETURN(
        ring.charge,
        ring_budget_->Take(
            bytes, absl::StrFormat("a ring of %d slots", ring_capacity_slots)));
  }
  ASSIGN_OR_RETURN(ring.memory,
                   backend_->CreateRing(session_id, ring_capacity_slots));
  return ring;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Open(
    std::string client_name, int64_t ring_capacity_slots, int64_t quota_pages,
    bool resumable) {
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
  ASSIGN_OR_RETURN(NewRing ring, MakeRing(id, ring_capacity_slots));
  auto session = std::make_shared<Session>(
      id, std::move(token), std::move(client_name), quota_pages,
      std::move(ring.memory), std::move(ring.charge), resumable);
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
  if (!session->MatchesToken(token)) {
    return absl::UnauthenticatedError(
        absl::StrFormat("wrong session_token for session %d", session_id));
  }
  session->Renew(now, options_.lease);
  return session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Restore(
    uint64_t session_id, const KeptSession& kept) {
  {
    absl::MutexLock lock(&mu_);
    if (sessions_.contains(session_id)) {
      return absl::AlreadyExistsError(
          absl::StrFormat("session %d is registered already", session_id));
    }
  }
  ASSIGN_OR_RETURN(NewRing ring, MakeRing(session_id, 0));
  Session::Restored restored;
  restored.token_digest = kept.token_digest;
  auto session = std::make_shared<Session>(
      session_id, restored, kept.client_name, kept.quota_pages,
      std::move(ring.memory), std::move(ring.charge), kept.resumable);
  session->Renew(absl::Now(), options_.lease);
  absl::MutexLock lock(&mu_);
  sessions_[session_id] = session;
  next_id_ = std::max(next_id_, session_id + 1);
  return session;
}

std::shared_ptr<Session> SessionRegistry::Find(uint64_t session_id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? nullptr : it->second;
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
