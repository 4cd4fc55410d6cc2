// A table of bad inputs across every RPC. Each gets the code of the error
// model, a message naming the field (and request index), and leaves the pool
// exactly as it was: free list, parked pages, owner of every page, counts.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/pagealloc.grpc.pb.h"
#include "server/server.h"
#include "tests/in_process_server.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::InProcessServer;
using ::pagealloc::testing::StatusIs;
using ::testing::HasSubstr;

struct PoolSnapshot {
  std::vector<int64_t> free_list, parked;
  std::vector<OwnerId> owners;
  int64_t free_pages = 0, used_pages = 0;
  bool operator==(const PoolSnapshot& o) const {
    return free_list == o.free_list && parked == o.parked &&
           owners == o.owners && free_pages == o.free_pages &&
           used_pages == o.used_pages;
  }
};

struct Case {
  std::string name;
  std::function<absl::Status()> call;
  absl::StatusCode code;
  std::string message;
};

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.backend = "cpu";
    options.pool = {64, 4, FreePolicy::kLifo};
    options.batcher.max_batch_requests = 16;
    options.batcher.max_batch_tokens = 1024;
    options.sessions.default_ring_capacity_slots = 1024;
    options.sessions.max_ring_capacity_slots = 4096;
    options.sessions.max_sessions = 4;
    options.max_message_bytes = 64 << 10;
    options.debug_checks = true;
    ASSERT_OK_AND_ASSIGN(server_, InProcessServer::Start(options));
    stub_ = server_->NewStub();
    // The socket too: the in-process transport does not apply gRPC's
    // message size limit.
    socket_stub_ = v1::PageAllocator::NewStub(grpc::CreateChannel(
        server_->target(), grpc::InsecureChannelCredentials()));
    alice_ = Register("alice", 0);
    bob_ = Register("bob", 0);
    carol_ = Register("carol", 1);
    // Alice: a 6-token sequence on pages 1, 2 (slots 4..9, last slot 9).
    ASSERT_OK(Extend(alice_, {0}, {6}, {-1}).status());
    // Bob: page 3 (slots 12..15). Carol: page 4, her whole quota.
    ASSERT_OK(Alloc(bob_, {4}).status());
    ASSERT_OK(Alloc(carol_, {4}).status());
  }

  v1::SessionRef Register(const std::string& name, int64_t quota) {
    v1::RegisterRequest request;
    request.set_client_name(name);
    request.set_quota_pages(quota);
    v1::RegisterResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->Register(&context, request, &response).ok());
    v1::SessionRef ref;
    ref.set_session_id(response.session_id());
    ref.set_session_token(response.session_token());
    return ref;
  }

  // An allocation call's status: the RPC's, or else its first refused
  // request's.
  static absl::StatusOr<v1::AllocResponse> Outcome(
      const grpc::Status& rpc, const v1::AllocResponse& response) {
    absl::Status status = FromGrpcStatus(rpc);
    if (!status.ok()) return status;
    for (const v1::RequestResult& result : response.results()) {
      if (result.code() != 0) {
        return absl::Status(static_cast<absl::StatusCode>(result.code()),
                            result.message());
      }
    }
    return response;
  }

  absl::StatusOr<v1::AllocResponse> Extend(v1::SessionRef s,
                                           std::vector<int64_t> prefix,
                                           std::vector<int64_t> seq,
                                           std::vector<int64_t> last,
                                           int64_t release = 0) {
    v1::AllocExtendRequest request;
    *request.mutable_session() = s;
    request.mutable_prefix_lens()->Add(prefix.begin(), prefix.end());
    request.mutable_seq_lens()->Add(seq.begin(), seq.end());
    request.mutable_last_locs()->Add(last.begin(), last.end());
    request.mutable_options()->set_release_ring_up_to(release);
    v1::AllocResponse response;
    grpc::ClientContext context;
    grpc::Status rpc = stub_->AllocExtend(&context, request, &response);
    return Outcome(rpc, response);
  }
  absl::StatusOr<v1::AllocResponse> Decode(v1::SessionRef s,
                                           std::vector<int64_t> seq,
                                           std::vector<int64_t> last) {
    v1::AllocDecodeRequest request;
    *request.mutable_session() = s;
    request.mutable_seq_lens()->Add(seq.begin(), seq.end());
    request.mutable_last_locs()->Add(last.begin(), last.end());
    v1::AllocResponse response;
    grpc::ClientContext context;
    grpc::Status rpc = stub_->AllocDecode(&context, request, &response);
    return Outcome(rpc, response);
  }
  absl::StatusOr<v1::AllocResponse> Alloc(
      v1::SessionRef s, std::vector<int64_t> tokens,
      std::vector<int64_t> free_pages_first = {}) {
    v1::AllocRequest request;
    *request.mutable_session() = s;
    request.mutable_num_tokens()->Add(tokens.begin(), tokens.end());
    request.mutable_options()->mutable_free_pages_first()->Add(
        free_pages_first.begin(), free_pages_first.end());
    request.mutable_options()->set_checkpoint_first(!free_pages_first.empty());
    v1::AllocResponse response;
    grpc::ClientContext context;
    grpc::Status rpc = stub_->Alloc(&context, request, &response);
    return Outcome(rpc, response);
  }
  absl::Status Free(v1::SessionRef s, std::vector<int64_t> slots,
                    std::vector<int64_t> pages) {
    v1::FreeRequest request;
    *request.mutable_session() = s;
    request.mutable_slots()->Add(slots.begin(), slots.end());
    request.mutable_pages()->Add(pages.begin(), pages.end());
    v1::FreeResponse response;
    grpc::ClientContext context;
    return FromGrpcStatus(stub_->Free(&context, request, &response));
  }
  absl::Status Checkpoint(v1::SessionRef s) {
    v1::CheckpointRequest request;
    *request.mutable_session() = s;
    v1::CheckpointResponse response;
    grpc::ClientContext context;
    return FromGrpcStatus(stub_->Checkpoint(&context, request, &response));
  }
  absl::Status Rollback(v1::SessionRef s) {
    v1::RollbackRequest request;
    *request.mutable_session() = s;
    v1::RollbackResponse response;
    grpc::ClientContext context;
    return FromGrpcStatus(stub_->Rollback(&context, request, &response));
  }
  absl::Status Release(v1::SessionRef s, int64_t up_to) {
    v1::ReleaseRingRequest request;
    *request.mutable_session() = s;
    request.set_up_to(up_to);
    v1::ReleaseRingResponse response;
    grpc::ClientContext context;
    return FromGrpcStatus(stub_->ReleaseRing(&context, request, &response));
  }
  absl::Status RegisterWith(const std::string& name, int64_t ring,
                            int64_t quota) {
    v1::RegisterRequest request;
    request.set_client_name(name);
    request.set_ring_capacity_slots(ring);
    request.set_quota_pages(quota);
    v1::RegisterResponse response;
    grpc::ClientContext context;
    return FromGrpcStatus(stub_->Register(&context, request, &response));
  }
  absl::Status KeepAlive(v1::SessionRef s) {
    grpc::ClientContext context;
    auto stream = stub_->KeepAlive(&context);
    v1::KeepAliveRequest ping;
    *ping.mutable_session() = s;
    stream->Write(ping);
    stream->WritesDone();
    v1::KeepAliveResponse pong;
    while (stream->Read(&pong)) {
    }
    return FromGrpcStatus(stream->Finish());
  }

  PoolSnapshot Take() {
    PoolSnapshot s;
    s.free_list = server_->pool().FreeList();
    s.parked = server_->pool().ParkedPages();
    for (int64_t p = 0; p <= 64; ++p)
      s.owners.push_back(server_->pool().OwnerOf(p));
    PoolStats stats = server_->pool().Stats();
    s.free_pages = stats.free_pages;
    s.used_pages = stats.used_pages;
    return s;
  }

  v1::SessionRef Unknown() {
    v1::SessionRef ref = alice_;
    ref.set_session_id(alice_.session_id() ^ 0x5555);
    return ref;
  }
  v1::SessionRef WrongToken(v1::SessionRef ref) {
    ref.set_session_token(std::string(32, '\x7f'));
    return ref;
  }

  std::unique_ptr<InProcessServer> server_;
  std::unique_ptr<v1::PageAllocator::Stub> stub_;
  std::unique_ptr<v1::PageAllocator::Stub> socket_stub_;
  v1::SessionRef alice_, bob_, carol_;
};

TEST_F(BadInputTest, EveryBadInputIsRefusedClearlyAndChangesNothing) {
  using C = absl::StatusCode;
  const C kInvalid = C::kInvalidArgument;
  std::vector<int64_t> many(17, 0), many_seq(17, 1), many_last(17, -1);
  const std::vector<Case> cases = {
      // AllocExtend.
      {"extend: array lengths",
       [&] {
         return Extend(alice_, {0, 0}, {4}, {-1, -1}).status();
       },
       kInvalid, "prefix_lens has 2, seq_lens has 1, last_locs has 2"},
      {"extend: last_locs length",
       [&] { return Extend(alice_, {0}, {4}, {}).status(); }, kInvalid,
       "last_locs has 0"},
      {"extend: negative prefix",
       [&] {
         return Extend(alice_, {0, -3}, {4, 2}, {-1, -1}).status();
       },
       kInvalid, "prefix_lens[1] (-3) is negative"},
      {"extend: seq < prefix",
       [&] {
         return Extend(alice_, {0, 5}, {4, 2}, {-1, 8}).status();
       },
       kInvalid, "seq_lens[1] (2) < prefix_lens[1] (5)"},
      {"extend: huge seq",
       [&] { return Extend(alice_, {0}, {int64_t{1} << 40}, {-1}).status(); },
       kInvalid, "the call asks for 1099511627776 slots; at most 1024"},
      // Longer than the pool: refused alone, as one that never fits.
      {"extend: longer than the pool",
       [&] { return Extend(alice_, {0}, {257}, {-1}).status(); },
       C::kResourceExhausted,
       "seq_lens[0] (257) exceeds the pool's 256 usable slots"},
      {"extend: empty prefix, last_loc set",
       [&] { return Extend(alice_, {0}, {4}, {9}).status(); }, kInvalid,
       "last_locs[0] (9) must be -1"},
      {"extend: misaligned last_loc",
       [&] { return Extend(alice_, {6}, {8}, {10}).status(); }, kInvalid,
       "last_locs[0] (10) is misaligned"},
      {"extend: last_loc in page 0",
       [&] { return Extend(alice_, {2}, {4}, {1}).status(); }, kInvalid,
       "last_locs[0] (1) is outside the usable slots"},
      {"extend: last_loc past the pool",
       [&] { return Extend(alice_, {2}, {4}, {261}).status(); }, kInvalid,
       "last_locs[0] (261) is outside"},
      {"extend: another session's last_loc",
       [&] { return Extend(alice_, {2}, {4}, {13}).status(); },
       C::kPermissionDenied,
       "last_locs[0] (13): page 3 belongs to another session"},
      {"extend: last_loc on a free page",
       [&] { return Extend(alice_, {2}, {4}, {21}).status(); },
       C::kFailedPrecondition, "last_locs[0] (21): page 5 was never allocated"},
      {"extend: too many requests",
       [&] { return Extend(alice_, many, many_seq, many_last).status(); },
       kInvalid, "17 requests; at most 16"},
      {"extend: too many slots",
       [&] {
         return Extend(alice_, std::vector<int64_t>(5, 0),
                       std::vector<int64_t>(5, 250),
                       std::vector<int64_t>(5, -1))
             .status();
       },
       kInvalid, "1250 slots; at most 1024"},
      {"extend: unknown session",
       [&] { return Extend(Unknown(), {0}, {4}, {-1}).status(); }, C::kNotFound,
       "is unknown or has expired"},
      {"extend: wrong token",
       [&] { return Extend(WrongToken(alice_), {0}, {4}, {-1}).status(); },
       C::kUnauthenticated, "wrong session_token"},
      {"extend: empty token",
       [&] {
         v1::SessionRef ref = alice_;
         ref.clear_session_token();
         return Extend(ref, {0}, {4}, {-1}).status();
       },
       C::kUnauthenticated, "wrong session_token"},
      {"extend: release past the ring's end",
       [&] { return Extend(alice_, {0}, {4}, {-1}, 1 << 20).status(); },
       kInvalid, "options.release_ring_up_to: up_to (1048576) is past"},
      {"extend: negative release",
       [&] { return Extend(alice_, {0}, {4}, {-1}, -3).status(); }, kInvalid,
       "options.release_ring_up_to: up_to (-3) is negative"},
      {"extend: out of pages",
       [&] { return Extend(bob_, {0}, {4 * 61}, {-1}).status(); },
       C::kResourceExhausted, "needs 61 pages, 60 free"},
      // AllocDecode.
      {"decode: array lengths",
       [&] {
         return Decode(alice_, {7, 8}, {9}).status();
       },
       kInvalid, "seq_lens has 2, last_locs has 1"},
      {"decode: seq_len 0",
       [&] {
         return Decode(alice_, {7, 0}, {9, -1}).status();
       },
       kInvalid, "decode request 1: seq_lens[1] (0) must be >= 1"},
      {"decode: negative seq_len",
       [&] { return Decode(alice_, {-2}, {-1}).status(); }, kInvalid,
       "seq_lens[0] (-2) must be >= 1"},
      {"decode: misaligned last_loc",
       [&] { return Decode(alice_, {7}, {10}).status(); }, kInvalid,
       "last_locs[0] (10) is misaligned"},
      {"decode: missing last_loc",
       [&] { return Decode(alice_, {7}, {-1}).status(); }, kInvalid,
       "last_locs[0] (-1) is outside"},
      {"decode: another session's page",
       [&] { return Decode(bob_, {7}, {9}).status(); }, C::kPermissionDenied,
       "page 2 belongs to another session"},
      {"decode: unknown session",
       [&] { return Decode(Unknown(), {1}, {-1}).status(); }, C::kNotFound,
       "unknown or has expired"},
      // Alloc.
      {"alloc: unaligned",
       [&] {
         return Alloc(alice_, {4, 6}).status();
       },
       kInvalid, "num_tokens[1] (6) is not a multiple of page_size (4)"},
      {"alloc: negative", [&] { return Alloc(alice_, {-4}).status(); },
       kInvalid, "num_tokens[0] (-4) is negative"},
      {"alloc: huge",
       [&] { return Alloc(alice_, {int64_t{4} << 40}).status(); }, kInvalid,
       "the call asks for 4398046511104 slots"},
      {"alloc: longer than the pool",
       [&] { return Alloc(alice_, {260}).status(); }, C::kResourceExhausted,
       "num_tokens[0] (260) exceeds the pool's 256 usable slots"},
      {"alloc: too many requests",
       [&] { return Alloc(alice_, std::vector<int64_t>(17, 4)).status(); },
       kInvalid, "17 requests; at most 16"},
      {"alloc: over quota", [&] { return Alloc(carol_, {4}).status(); },
       C::kResourceExhausted, "over quota"},
      // Operations first (AllocOptions.free_pages_first, checkpoint_first):
      // a refused free fails the whole call; nothing is allocated, freed or
      // checkpointed.
      {"alloc: free_pages_first has page 0",
       [&] {
         return Alloc(alice_, {4}, {2, 0}).status();
       },
       kInvalid,
       "options.free_pages_first: pages[1] (0) is outside the usable pages"},
      {"alloc: free_pages_first frees a free page",
       [&] {
         return Alloc(alice_, {4}, {2, 5}).status();
       },
       C::kFailedPrecondition,
       "options.free_pages_first: pages[1] (5): page 5 was never "
       "allocated"},
      {"alloc: free_pages_first has another session's page",
       [&] { return Alloc(alice_, {4}, {3}).status(); }, C::kPermissionDenied,
       "options.free_pages_first: pages[0] (3): page 3 belongs to another "
       "session"},
      // Free.
      {"free: slots and pages", [&] { return Free(alice_, {4}, {1}); },
       kInvalid, "either slots (1 given) or pages (1 given)"},
      {"free: page 0",
       [&] {
         return Free(alice_, {}, {1, 0});
       },
       kInvalid,
       "pages[1] (0) is outside the usable pages [1, 64] (page 0 is reserved)"},
      {"free: slot of page 0",
       [&] {
         return Free(alice_, {4, 3}, {});
       },
       kInvalid,
       "slots[1] (3) is outside the usable slots [4, 260) (page 0 is "
       "reserved)"},
      {"free: slot past the pool", [&] { return Free(alice_, {260}, {}); },
       kInvalid, "slots[0] (260) is outside"},
      {"free: negative slot", [&] { return Free(alice_, {-8}, {}); }, kInvalid,
       "slots[0] (-8) is outside"},
      {"free: page past the pool", [&] { return Free(alice_, {}, {65}); },
       kInvalid, "pages[0] (65) is outside"},
      {"free: a page never allocated",
       [&] {
         return Free(alice_, {}, {2, 5});
       },
       C::kFailedPrecondition, "pages[1] (5): page 5 was never allocated"},
      // Bob takes page 5 from the front of the (LIFO) free list and gives it
      // back to the front: the pool is as before, and page 5 has been freed.
      {"free: double free",
       [&] {
         EXPECT_OK(Alloc(bob_, {4}).status());
         EXPECT_OK(Free(bob_, {}, {5}));
         return Free(alice_, {}, {2, 5});
       },
       C::kFailedPrecondition,
       "pages[1] (5): page 5 was already freed (double free)"},
      {"free: another session's page", [&] { return Free(alice_, {}, {3}); },
       C::kPermissionDenied, "pages[0] (3): page 3 belongs to another session"},
      {"free: own and another's, all or nothing",
       [&] {
         return Free(alice_, {4, 5, 12}, {});
       },
       C::kPermissionDenied,
       "slots[2] (12): page 3 belongs to another session"},
      {"free: unknown session", [&] { return Free(Unknown(), {}, {1}); },
       C::kNotFound, "unknown or has expired"},
      {"free: wrong token", [&] { return Free(WrongToken(bob_), {}, {3}); },
       C::kUnauthenticated, "wrong session_token"},
      // Checkpoint, Rollback, ReleaseRing.
      {"checkpoint: unknown session", [&] { return Checkpoint(Unknown()); },
       C::kNotFound, "unknown or has expired"},
      {"rollback: no checkpoint", [&] { return Rollback(bob_); },
       C::kFailedPrecondition, "has no checkpoint to roll back to"},
      {"rollback: wrong token", [&] { return Rollback(WrongToken(bob_)); },
       C::kUnauthenticated, "wrong session_token"},
      {"release: negative", [&] { return Release(alice_, -1); }, kInvalid,
       "up_to: up_to (-1) is negative"},
      {"release: past the end", [&] { return Release(alice_, 1000); }, kInvalid,
       "up_to: up_to (1000) is past the ring's last reserved position"},
      {"release: unknown session", [&] { return Release(Unknown(), 0); },
       C::kNotFound, "unknown or has expired"},
      // Register and KeepAlive.
      {"register: negative ring", [&] { return RegisterWith("x", -1, 0); },
       kInvalid, "ring_capacity_slots (-1) must be in [0, 4096]"},
      {"register: ring too large",
       [&] { return RegisterWith("x", 1 << 20, 0); }, kInvalid,
       "ring_capacity_slots (1048576) must be in [0, 4096]"},
      {"register: negative quota", [&] { return RegisterWith("x", 0, -5); },
       kInvalid, "quota_pages (-5) is negative"},
      {"register: name too long",
       [&] { return RegisterWith(std::string(300, 'n'), 0, 0); }, kInvalid,
       "client_name is 300 bytes long; at most 128"},
      {"keepalive: unknown session", [&] { return KeepAlive(Unknown()); },
       C::kNotFound, "unknown or has expired"},
      {"keepalive: wrong token", [&] { return KeepAlive(WrongToken(alice_)); },
       C::kUnauthenticated, "wrong session_token"},
      // Limits of the transport and the daemon.
      {"message larger than --max_message_bytes",
       [&] {
         v1::FreeRequest request;
         *request.mutable_session() = alice_;
         // 100k one-byte varints: past the 64 KiB limit.
         for (int i = 0; i < 100000; ++i) request.add_slots(4);
         v1::FreeResponse response;
         grpc::ClientContext context;
         return FromGrpcStatus(
             socket_stub_->Free(&context, request, &response));
       },
       C::kResourceExhausted, "larger than max"},
  };
  ASSERT_GE(cases.size(), 40u);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const PoolSnapshot before = Take();
    EXPECT_THAT(c.call(), StatusIs(c.code, HasSubstr(c.message)));
    EXPECT_TRUE(before == Take()) << "the pool changed";
    EXPECT_OK(server_->pool().CheckInvariants());
  }
}

TEST_F(BadInputTest, SessionsAreCapped) {
  ASSERT_OK(RegisterWith("fourth", 0, 0));
  EXPECT_THAT(
      RegisterWith("fifth", 0, 0),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("already serves 4 sessions (--max_sessions)")));
}

}  // namespace
}  // namespace pagealloc
