// SessionRegistry and Session on the real CPU backend (rings in anonymous
// shared memory). Leases are checked at times the test chooses: TakeExpired
// takes `now`, and where the registry reads the clock itself (Open and
// Authenticate renew at absl::Now()) the test uses an infinite lease or a
// deadline in 1970, which no clock reading can make ambiguous.

#include "server/session.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/shared_region.h"
#include "server/backend.h"
#include "server/memory_budget.h"
#include "tests/host_files.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::IsOkAndHolds;
using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

std::vector<uint64_t> Ids(const std::vector<std::shared_ptr<Session>>& list) {
  std::vector<uint64_t> ids;
  for (const auto& session : list) ids.push_back(session->id());
  return ids;
}

// How many descriptors this process holds to session `id`'s ring memory.
int RingDescriptors(uint64_t id) {
  return ::pagealloc::testing::DescriptorsTo(
      absl::StrFormat("/memfd:pagealloc-ring.%d (deleted)", id));
}

class SessionRegistryTest : public ::testing::Test {
 protected:
  SessionRegistryTest() : backend_(MakeCpuBackend()) {
    options_.lease = absl::Seconds(10);
    options_.max_sessions = 4;
    options_.default_ring_capacity_slots = 32;
    options_.max_ring_capacity_slots = 256;
  }

  std::unique_ptr<Backend> backend_;
  SessionRegistry::Options options_;
};

// ---------------------------------------------------------------------------
// Open

TEST_F(SessionRegistryTest, OpenGivesFreshIdsAndSecretTokens) {
  SessionRegistry registry(options_, backend_.get());
  ASSERT_OK_AND_ASSIGN(auto a, registry.Open("alice", 0, 0));
  ASSERT_OK_AND_ASSIGN(auto b, registry.Open("bob", 64, 5));
  EXPECT_NE(a->id(), 0u);
  EXPECT_NE(a->id(), b->id());
  EXPECT_EQ(a->token().size(), 32u);
  EXPECT_EQ(b->token().size(), 32u);
  EXPECT_NE(a->token(), b->token());
  EXPECT_EQ(a->client_name(), "alice");
  EXPECT_EQ(b->client_name(), "bob");
  EXPECT_EQ(b->quota_pages(), 5);
  EXPECT_EQ(registry.size(), 2);
  EXPECT_THAT(Ids(registry.List()), UnorderedElementsAre(a->id(), b->id()));
}

TEST_F(SessionRegistryTest, RingCapacityZeroTakesTheDefault) {
  SessionRegistry registry(options_, backend_.get());
  ASSERT_OK_AND_ASSIGN(auto a, registry.Open("a", 0, 0));
  EXPECT_EQ(a->ring()->capacity_slots(), 32);
  ASSERT_OK_AND_ASSIGN(auto b, registry.Open("b", 1, 0));
  EXPECT_EQ(b->ring()->capacity_slots(), 1);
  ASSERT_OK_AND_ASSIGN(auto c, registry.Open("c", 256, 0));  // the maximum
  EXPECT_EQ(c->ring()->capacity_slots(), 256);

  // The ring is real memory a client can map from the descriptor Describe
  // gives (the memory socket hands a copy of it to the client).
  const RingDescription ring = c->ring()->Describe();
  EXPECT_EQ(ring.capacity_slots, 256);
  ASSERT_GE(ring.fd, 0);
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<SharedRegion> mapped,
      SharedRegion::FromFd(UniqueFd(fcntl(ring.fd, F_DUPFD_CLOEXEC, 0)),
                           256 * sizeof(int64_t),
                           SharedRegion::Access::kReadOnly));
  c->ring()->slots()[255] = 1234;
  EXPECT_EQ(static_cast<const int64_t*>(mapped->base())[255], 1234);
}

TEST(SessionRegistryOptionsTest, ADefaultRingOfZeroHoldsThePool) {
  SessionRegistry::Options options;
  options.default_ring_capacity_slots = 0;
  // SGLang's profile: 65536 pages of 16, 2^20 slots.
  EXPECT_EQ(options.ForPool(int64_t{65536} * 16).default_ring_capacity_slots,
            int64_t{1} << 20);
  // A small pool still gets 2^20; a pool past the largest ring raises it.
  EXPECT_EQ(options.ForPool(64).default_ring_capacity_slots, int64_t{1} << 20);
  const SessionRegistry::Options big = options.ForPool(int64_t{1} << 27);
  EXPECT_EQ(big.default_ring_capacity_slots, int64_t{1} << 27);
  EXPECT_EQ(big.max_ring_capacity_slots, int64_t{1} << 27);
  // A ring the operator chose is kept, whatever the pool.
  options.default_ring_capacity_slots = 4096;
  EXPECT_EQ(options.ForPool(int64_t{1} << 27).default_ring_capacity_slots,
            4096);
  EXPECT_EQ(options.ForPool(int64_t{1} << 27).max_ring_capacity_slots,
            int64_t{1} << 26);
}

TEST_F(SessionRegistryTest, OpenRefusesBadRingSizesQuotasAndNames) {
  SessionRegistry registry(options_, backend_.get());
  struct Case {
    std::string name;
    std::string client_name;
    int64_t ring_capacity_slots;
    int64_t quota_pages;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"negative ring", "x", -1, 0,
       "ring_capacity_slots (-1) must be in [0, 256]"},
      {"ring over the maximum", "x", 257, 0,
       "ring_capacity_slots (257) must be in [0, 256]"},
      {"negative quota", "x", 0, -2, "quota_pages (-2) is negative"},
      {"name too long", std::string(129, 'n'), 0, 0,
       "client_name is 129 bytes long; at most 128"},
      {"name not UTF-8", "sched\xff", 0, 0,
       "client_name is not valid UTF-8 (byte 5 of 6)"},
      {"name cut in a character", "caf\xc3", 0, 0,
       "client_name is not valid UTF-8 (byte 3 of 4)"},
      {"overlong slash", "a\xc0\xaf", 0, 0,
       "client_name is not valid UTF-8 (byte 1 of 3)"},
      {"surrogate", "\xed\xa0\x80", 0, 0,
       "client_name is not valid UTF-8 (byte 0 of 3)"},
      {"newline", "tp0\n[error] forged", 0, 0,
       "client_name has a control character (U+000A at byte 3)"},
      {"escape", "\x1b[31mred", 0, 0,
       "client_name has a control character (U+001B at byte 0)"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(
        registry.Open(c.client_name, c.ring_capacity_slots, c.quota_pages),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.name;
  }
  EXPECT_EQ(registry.size(), 0);
  // The longest name and an empty one are fine, and so is any text.
  EXPECT_OK(registry.Open(std::string(128, 'n'), 0, 0));
  EXPECT_OK(registry.Open(
      "ordonnanceur-tp0 \xc3\xa9 \xe8\xb0\x83 \xf0\x9f\x9a\x80", 0, 0));
  EXPECT_OK(registry.Open("", 0, 0));
}

TEST_F(SessionRegistryTest, QuotasAreKeptWithoutAServerCap) {
  SessionRegistry registry(options_, backend_.get());
  ASSERT_OK_AND_ASSIGN(auto none, registry.Open("none", 0, 0));
  EXPECT_EQ(none->quota_pages(), 0);  // no quota
  ASSERT_OK_AND_ASSIGN(auto big, registry.Open("big", 0, 1 << 30));
  EXPECT_EQ(big->quota_pages(), 1 << 30);
}

// --max_session_quota_pages: 0 ("no quota") and anything larger take the
// cap; smaller quotas are kept.
TEST_F(SessionRegistryTest, QuotasAreCappedByTheServer) {
  options_.max_quota_pages = 3;
  SessionRegistry registry(options_, backend_.get());
  for (const auto& [asked, given] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 3}, {1, 1}, {3, 3}, {4, 3}}) {
    ASSERT_OK_AND_ASSIGN(auto session, registry.Open("q", 0, asked));
    EXPECT_EQ(session->quota_pages(), given) << "asked " << asked;
    registry.Remove(session->id());
  }
}

TEST_F(SessionRegistryTest, OpenRefusesPastMaxSessions) {
  SessionRegistry registry(options_, backend_.get());
  std::vector<std::shared_ptr<Session>> sessions;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(auto session, registry.Open("s", 0, 0));
    sessions.push_back(session);
  }
  EXPECT_THAT(
      registry.Open("one too many", 0, 0),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("already serves 4 sessions (--max_sessions)")));
  EXPECT_EQ(registry.size(), 4);
  // A removed session makes room.
  registry.Remove(sessions[0]->id());
  EXPECT_OK(registry.Open("room again", 0, 0));
  EXPECT_EQ(registry.size(), 4);
}

// A backend that pauses the first CreateRing until the test releases it, so
// that another Open can run while one is creating its ring. The rings are
// the real CPU backend's.
class PausingBackend final : public Backend {
 public:
  explicit PausingBackend(Backend* real) : real_(real) {}

  BackendKind kind() const override { return real_->kind(); }
  PlanExecutor* executor() override { return real_->executor(); }
  absl::StatusOr<std::unique_ptr<RingMemory>> CreateRing(
      uint64_t session_id, int64_t capacity_slots) override {
    if (!paused_once_.exchange(true)) {
      entered_.Notify();
      resume_.WaitForNotification();
    }
    return real_->CreateRing(session_id, capacity_slots);
  }
  absl::Status CopyToHost(const int64_t* src, int64_t count,
                          int64_t* dst) override {
    return real_->CopyToHost(src, count, dst);
  }
  absl::StatusOr<uint64_t> CompleteLaunch(bool async) override {
    return real_->CompleteLaunch(async);
  }
  uint64_t completion_value() const override {
    return real_->completion_value();
  }
  DeviceDescription DescribeDevice() const override {
    return real_->DescribeDevice();
  }
  absl::StatusOr<int64_t> KvAlignment() override {
    return real_->KvAlignment();
  }
  absl::StatusOr<int64_t> KvAvailableBytes() override {
    return real_->KvAvailableBytes();
  }
  absl::Status CreateKvSlab(const KvLayout& layout,
                            const KvSlabGeometry& geometry,
                            bool scrub) override {
    return real_->CreateKvSlab(layout, geometry, scrub);
  }
  absl::Status AdoptKvSlab(const KvLayout& layout,
                           const KvSlabGeometry& geometry, bool scrub,
                           UniqueFd fd, uint64_t slab_id) override {
    return real_->AdoptKvSlab(layout, geometry, scrub, std::move(fd), slab_id);
  }
  const KvSlab* kv_slab() const override { return real_->kv_slab(); }
  std::string Summary() const override { return real_->Summary(); }

  absl::Notification entered_;
  absl::Notification resume_;

 private:
  Backend* const real_;
  std::atomic<bool> paused_once_{false};
};

// Two Opens racing for the last place, the second run whole while the
// first creates its ring: exactly one gets it.
TEST_F(SessionRegistryTest, MaxSessionsHoldsForConcurrentOpens) {
  options_.max_sessions = 1;
  PausingBackend backend(backend_.get());
  SessionRegistry registry(options_, &backend);
  absl::StatusOr<std::shared_ptr<Session>> first;
  std::thread opener([&] { first = registry.Open("first", 0, 0); });
  backend.entered_.WaitForNotification();  // "first" is creating its ring
  absl::StatusOr<std::shared_ptr<Session>> second =
      registry.Open("second", 0, 0);
  backend.resume_.Notify();
  opener.join();

  EXPECT_EQ(registry.size(), 1);
  EXPECT_NE(first.ok(), second.ok())
      << "first: " << first.status() << ", second: " << second.status();
  const absl::Status& refused = first.ok() ? second.status() : first.status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted,
                                HasSubstr("--max_sessions")));
}

// ---------------------------------------------------------------------------
// Authenticate

TEST_F(SessionRegistryTest, AuthenticateChecksIdAndToken) {
  SessionRegistry registry(options_, backend_.get());
  ASSERT_OK_AND_ASSIGN(auto session, registry.Open("a", 0, 0));
  const uint64_t id = session->id();
  const std::string token = session->token();

  EXPECT_THAT(registry.Authenticate(id, token), IsOkAndHolds(session));

  std::string last_byte_wrong = token;
  last_byte_wrong.back() ^= 1;
  std::string first_byte_wrong = token;
  first_byte_wrong.front() ^= 0x80;
  for (const std::string& wrong :
       {last_byte_wrong, first_byte_wrong, token.substr(0, 31), token + "x",
        std::string()}) {
    const absl::Status status = registry.Authenticate(id, wrong).status();
    EXPECT_THAT(status,
                StatusIs(absl::StatusCode::kUnauthenticated,
                         HasSubstr(absl::StrFormat(
                             "wrong session_token for session %d", id))));
    // The token is a secret: messages never carry it.
    EXPECT_THAT(std::string(status.message()), Not(HasSubstr(token)));
  }

  EXPECT_THAT(registry.Authenticate(id + 1, token),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr(absl::StrFormat(
                           "session %d is unknown or has expired", id + 1))));
  // Another session's token does not open this one.
  ASSERT_OK_AND_ASSIGN(auto other, registry.Open("b", 0, 0));
  EXPECT_THAT(registry.Authenticate(id, other->token()),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("wrong session_token")));
}

// With an infinite lease, renewing at any time gives an infinite deadline,
// so the tests see which calls renew without reading the clock.
TEST_F(SessionRegistryTest, OpenAndAuthenticateRenewTheLease) {
  options_.lease = absl::InfiniteDuration();
  SessionRegistry registry(options_, backend_.get());
  ASSERT_OK_AND_ASSIGN(auto session, registry.Open("a", 0, 0));
  EXPECT_EQ(session->lease_deadline(), absl::InfiniteFuture());

  const absl::Time finite = absl::Now() + absl::Hours(1);
  session->Renew(finite, absl::ZeroDuration());
  EXPECT_EQ(session->lease_deadline(), finite);
  // A refused token renews nothing.
  EXPECT_THAT(registry.Authenticate(session->id(), "wrong"),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("wrong session_token")));
  EXPECT_EQ(session->lease_deadline(), finite);
  ASSERT_OK(registry.Authenticate(session->id(), session->token()));
  EXPECT_EQ(session->lease_deadline(), absl::InfiniteFuture());
}

// A session whose lease ran out is gone for its client, even before the
// reaper's next TakeExpired: a call must not bring it back to life while the
// daemon is about to reclaim its pages.
TEST_F(SessionRegistryTest, AnExpiredSessionDoesNotAuthenticate) {
  SessionRegistry registry(options_, backend_.get());
  ASSERT_OK_AND_ASSIGN(auto session, registry.Open("a", 0, 0));
  session->Renew(absl::UnixEpoch(), absl::Seconds(1));  // ran out in 1970
  EXPECT_THAT(registry.Authenticate(session->id(), session->token()),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("is unknown or has expired")));
  // Not renewed: the reaper still takes it.
  EXPECT_EQ(session->lease_deadline(), absl::UnixEpoch() + absl::Seconds(1));
  EXPECT_THAT(Ids(registry.TakeExpired(absl::UnixEpoch() + absl::Seconds(2))),
              UnorderedElementsAre(session->id()));
}

// ---------------------------------------------------------------------------
// Leases and TakeExpired

TEST_F(SessionRegistryTest, TakeExpiredTakesLeasesThatRanOutBeforeNow) {
  SessionRegistry registry(options_, backend_.get());
  ASSERT_OK_AND_ASSIGN(auto a, registry.Open("a", 0, 0));
  ASSERT_OK_AND_ASSIGN(auto b, registry.Open("b", 0, 0));
  ASSERT_OK_AND_ASSIGN(auto c, registry.Open("c", 0, 0));
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  const absl::Duration lease = absl::Seconds(10);
  a->Renew(t0, lease);
  b->Renew(t0 + absl::Seconds(5), lease);
  c->Renew(absl::InfiniteFuture(), lease);  // never expires

  EXPECT_THAT(registry.TakeExpired(t0), UnorderedElementsAre());
  // A deadline equal to `now` has not run out yet.
  EXPECT_THAT(registry.TakeExpired(t0 + lease), UnorderedElementsAre());
  EXPECT_THAT(Ids(registry.TakeExpired(t0 + lease + absl::Nanoseconds(1))),
              UnorderedElementsAre(a->id()));
  EXPECT_THAT(Ids(registry.List()), UnorderedElementsAre(b->id(), c->id()));
  // Taken once only.
  EXPECT_THAT(registry.TakeExpired(t0 + lease + absl::Nanoseconds(1)),
              UnorderedElementsAre());
  EXPECT_THAT(registry.Authenticate(a->id(), a->token()),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("is unknown or has expired")));

  // b's lease is renewed past the time it would have run out.
  b->Renew(t0 + absl::Seconds(12), lease);
  EXPECT_THAT(registry.TakeExpired(t0 + absl::Seconds(20)),
              UnorderedElementsAre());
  EXPECT_THAT(Ids(registry.TakeExpired(t0 + absl::Seconds(23))),
              UnorderedElementsAre(b->id()));
  EXPECT_THAT(Ids(registry.List()), UnorderedElementsAre(c->id()));
  EXPECT_EQ(registry.size(), 1);
}

TEST_F(SessionRegistryTest, TakeExpiredAtTheEndOfTimeTakesEveryFiniteLease) {
  SessionRegistry registry(options_, backend_.get());
  ASSERT_OK_AND_ASSIGN(auto a, registry.Open("a", 0, 0));
  ASSERT_OK_AND_ASSIGN(auto b, registry.Open("b", 0, 0));
  EXPECT_THAT(registry.TakeExpired(absl::InfinitePast()),
              UnorderedElementsAre());
  EXPECT_THAT(Ids(registry.TakeExpired(absl::InfiniteFuture())),
              UnorderedElementsAre(a->id(), b->id()));
  EXPECT_EQ(registry.size(), 0);
}

// ---------------------------------------------------------------------------
// Remove and List

TEST_F(SessionRegistryTest, RemoveReturnsTheSessionOnce) {
  SessionRegistry registry(options_, backend_.get());
  ASSERT_OK_AND_ASSIGN(auto a, registry.Open("a", 0, 0));
  ASSERT_OK_AND_ASSIGN(auto b, registry.Open("b", 0, 0));
  EXPECT_EQ(registry.Remove(a->id()), a);
  EXPECT_EQ(registry.Remove(a->id()), nullptr);
  EXPECT_EQ(registry.Remove(b->id() + 1000), nullptr);  // never opened
  EXPECT_THAT(Ids(registry.List()), UnorderedElementsAre(b->id()));
  EXPECT_EQ(registry.size(), 1);
  EXPECT_THAT(registry.Authenticate(a->id(), a->token()),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("is unknown or has expired")));
  EXPECT_THAT(registry.TakeExpired(absl::InfiniteFuture()),
              ::testing::ElementsAre(b));
}

// The ring lives as long as anyone holds its session: a call in flight keeps
// it mapped after the session is removed; the last holder releases it.
TEST_F(SessionRegistryTest, TheLastHolderOfARemovedSessionFreesItsRing) {
  SessionRegistry registry(options_, backend_.get());
  ASSERT_OK_AND_ASSIGN(auto session, registry.Open("a", 0, 0));
  const uint64_t id = session->id();
  ASSERT_EQ(RingDescriptors(id), 1);
  std::shared_ptr<Session> removed = registry.Remove(id);
  EXPECT_EQ(RingDescriptors(id), 1);
  removed.reset();
  session.reset();
  EXPECT_EQ(RingDescriptors(id), 0);
}

// ---------------------------------------------------------------------------
// Ring accounting

TEST_F(SessionRegistryTest, RingReservationsAreBoundedUntilReleased) {
  SessionRegistry registry(options_, backend_.get());
  ASSERT_OK_AND_ASSIGN(auto session, registry.Open("a", 16, 0));
  EXPECT_EQ(session->ring_reserved(), 0);
  EXPECT_THAT(session->ReserveRing(10), IsOkAndHolds(0));
  EXPECT_EQ(session->ring_reserved(), 10);
  EXPECT_THAT(session->ReserveRing(7),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("output ring full: the call needs 7 slots, "
                                 "10 of 16 are still reserved")));
  EXPECT_THAT(session->ReserveRing(17),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("more than the ring's capacity of 16")));
  EXPECT_EQ(session->ring_reserved(), 10);  // refusals reserve nothing

  EXPECT_OK(session->ReleaseRing(10));
  EXPECT_EQ(session->ring_reserved(), 0);
  // 6 slots are left before the lap's end: a 10-slot region skips them.
  EXPECT_THAT(session->ReserveRing(10), IsOkAndHolds(16));
  EXPECT_EQ(session->ring_reserved(), 16);
  EXPECT_THAT(session->ReleaseRing(27),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("up_to (27) is past the ring's last reserved "
                                 "position (26)")));
  EXPECT_OK(session->ReleaseRing(5));  // before the last release: no-op
  EXPECT_EQ(session->ring_reserved(), 16);
}

// A call refused after it reserved gives its region back.
TEST_F(SessionRegistryTest, UnreserveGivesBackARefusedCallsRegion) {
  SessionRegistry registry(options_, backend_.get());
  ASSERT_OK_AND_ASSIGN(auto session, registry.Open("a", 16, 0));
  ASSERT_THAT(session->ReserveRing(4), IsOkAndHolds(0));
  ASSERT_THAT(session->ReserveRing(8), IsOkAndHolds(4));
  session->UnreserveRing(4, 8);
  EXPECT_EQ(session->ring_reserved(), 4);
  EXPECT_THAT(session->ReserveRing(12), IsOkAndHolds(4));
  EXPECT_EQ(session->ring_reserved(), 16);
}

// Each session has a ring of its own.
TEST_F(SessionRegistryTest, RingsAreAccountedPerSession) {
  SessionRegistry registry(options_, backend_.get());
  ASSERT_OK_AND_ASSIGN(auto a, registry.Open("a", 8, 0));
  ASSERT_OK_AND_ASSIGN(auto b, registry.Open("b", 8, 0));
  ASSERT_THAT(a->ReserveRing(8), IsOkAndHolds(0));
  EXPECT_THAT(b->ReserveRing(8), IsOkAndHolds(0));
  EXPECT_THAT(a->ReserveRing(1), StatusIs(absl::StatusCode::kResourceExhausted,
                                          HasSubstr("output ring full")));
  EXPECT_EQ(a->ring_reserved(), 8);
  EXPECT_EQ(b->ring_reserved(), 8);
}

// ---------------------------------------------------------------------------
// Links and Resume's fresh ring

// A session's link: one connection a link, a resumable session kept when it
// closes, a Resume (ReplaceRing) starting a new link that the old
// connection's close cannot end.
TEST_F(SessionRegistryTest, LinksFollowConnectionsAndResumes) {
  SessionRegistry registry(options_, backend_.get());
  ASSERT_OK_AND_ASSIGN(auto kept, registry.Open("kept", 0, 0, true));
  ASSERT_OK_AND_ASSIGN(auto plain, registry.Open("plain", 0, 0));
  EXPECT_TRUE(kept->resumable());
  EXPECT_FALSE(plain->resumable());
  EXPECT_EQ(kept->link(), SessionLink::kAwaitingHello);

  ASSERT_OK_AND_ASSIGN(const uint64_t first, kept->Connect());
  EXPECT_EQ(kept->link(), SessionLink::kConnected);
  EXPECT_THAT(kept->Connect(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("already has its memory socket connection")));
  EXPECT_EQ(kept->Disconnected(first), Session::Disconnect::kDetached);
  EXPECT_EQ(kept->link(), SessionLink::kDetached);
  // Its memory went to the connection that closed: only a Resume hands it
  // over again.
  EXPECT_THAT(kept->Connect(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        HasSubstr("Resume the session")));

  ASSERT_OK_AND_ASSIGN(const uint64_t plain_link, plain->Connect());
  EXPECT_EQ(plain->Disconnected(plain_link), Session::Disconnect::kEnded);

  // Connected: a Resume needs take_over, and without it changes nothing.
  ASSERT_OK_AND_ASSIGN(SessionRegistry::NewRing fresh,
                       registry.MakeRing(kept->id(), 16));
  ASSERT_OK_AND_ASSIGN(
      Session::Relinked relinked,
      kept->ReplaceRing(std::move(fresh.memory), std::move(fresh.charge),
                        /*take_over=*/false));
  EXPECT_EQ(relinked.was, SessionLink::kDetached);
  EXPECT_EQ(relinked.old_generation, first);
  ASSERT_OK_AND_ASSIGN(const uint64_t second, kept->Connect());
  EXPECT_GT(second, first);
  ASSERT_OK_AND_ASSIGN(fresh, registry.MakeRing(kept->id(), 8));
  const int64_t capacity_before = kept->ring_capacity_slots();
  EXPECT_THAT(
      kept->ReplaceRing(std::move(fresh.memory), std::move(fresh.charge),
                        /*take_over=*/false),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr(absl::StrFormat("session %d is still connected",
                                         kept->id()))));
  EXPECT_EQ(kept->link(), SessionLink::kConnected);
  EXPECT_EQ(kept->ring_capacity_slots(), capacity_before);

  ASSERT_OK_AND_ASSIGN(fresh, registry.MakeRing(kept->id(), 8));
  ASSERT_OK_AND_ASSIGN(
      relinked, kept->ReplaceRing(std::move(fresh.memory),
                                  std::move(fresh.charge), /*take_over=*/true));
  EXPECT_EQ(relinked.was, SessionLink::kConnected);
  EXPECT_EQ(relinked.old_generation, second);
  EXPECT_EQ(kept->ring_capacity_slots(), 8);
  // The taken-over connection's close is stale: the session waits for the
  // new link's Hello.
  EXPECT_EQ(kept->Disconnected(second), Session::Disconnect::kStale);
  EXPECT_FALSE(kept->Detach(second));
  EXPECT_EQ(kept->link(), SessionLink::kAwaitingHello);
  ASSERT_OK_AND_ASSIGN(const uint64_t third, kept->Connect());
  kept->AbortConnect(third);
  EXPECT_EQ(kept->link(), SessionLink::kAwaitingHello);
  ASSERT_OK_AND_ASSIGN(const uint64_t fourth, kept->Connect());
  EXPECT_EQ(fourth, third);
  // Severed (SeverConnections: a daemon's restart, for tests): detached.
  EXPECT_TRUE(kept->Detach(fourth));
  EXPECT_EQ(kept->link(), SessionLink::kDetached);
}

// A Resume's fresh ring replaces the session's; a call that reserved space
// in the old one keeps that ring (and its charge) until it lets go, and
// its Unreserve no longer touches the session's ring.
TEST_F(SessionRegistryTest, AReplacedRingLivesWhileACallHoldsIt) {
  MemoryBudget budget("host", "--session_memory", int64_t{1} << 30);
  SessionRegistry registry(options_, backend_.get(), &budget);
  ASSERT_OK_AND_ASSIGN(auto session, registry.Open("a", 256, 0, true));
  const int64_t one_ring = budget.used();
  EXPECT_GT(one_ring, 0);
  std::shared_ptr<RingMemory> held;
  ASSERT_THAT(session->ReserveRing(10, &held), IsOkAndHolds(0));
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held.get(), session->ring().get());
  held->slots()[9] = 77;

  ASSERT_OK_AND_ASSIGN(SessionRegistry::NewRing fresh,
                       registry.MakeRing(session->id(), 64));
  ASSERT_OK(session
                ->ReplaceRing(std::move(fresh.memory), std::move(fresh.charge),
                              /*take_over=*/false)
                .status());
  EXPECT_NE(session->ring().get(), held.get());
  EXPECT_EQ(session->ring_capacity_slots(), 64);
  EXPECT_EQ(session->ring_reserved(), 0);  // a fresh ring, nothing reserved
  EXPECT_EQ(budget.used(), 2 * one_ring);  // both rings (a page each)
  // The old ring is still memory a launch may write.
  EXPECT_EQ(held->slots()[9], 77);
  ASSERT_THAT(session->ReserveRing(4), IsOkAndHolds(0));
  session->UnreserveRing(0, 10, held.get());  // the old ring's: ignored
  EXPECT_EQ(session->ring_reserved(), 4);
  // The last holder lets go: the old ring and its charge go.
  held.reset();
  EXPECT_EQ(budget.used(), one_ring);
}

// ---------------------------------------------------------------------------
// ConstantTimeEquals (its timing is not testable here; its answers are)

TEST(ConstantTimeEqualsTest, ComparesEveryByte) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("token", "token"));
  EXPECT_FALSE(ConstantTimeEquals("token", "tokeN"));
  EXPECT_FALSE(ConstantTimeEquals("token", "Token"));
  EXPECT_FALSE(ConstantTimeEquals("token", "toke"));
  EXPECT_FALSE(ConstantTimeEquals("toke", "token"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  // Tokens are random bytes: NULs and high bits count like any other.
  const std::string with_nul("a\0b", 3);
  EXPECT_TRUE(ConstantTimeEquals(with_nul, std::string("a\0b", 3)));
  EXPECT_FALSE(ConstantTimeEquals(with_nul, std::string("a\0c", 3)));
  EXPECT_FALSE(ConstantTimeEquals(with_nul, std::string("a\1b", 3)));
  EXPECT_FALSE(
      ConstantTimeEquals(std::string("\x80", 1), std::string("\0", 1)));
  EXPECT_TRUE(ConstantTimeEquals(std::string("\xff\xfe", 2),
                                 std::string("\xff\xfe", 2)));
}

}  // namespace
}  // namespace pagealloc
