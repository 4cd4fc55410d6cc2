// Fuzz target: the daemon's take-decode-answer path over a fast channel
// whose every byte, header included, a hostile client chose.
//
// Input: the channel's bytes (shorter inputs are repeated to fill it). The
// channel is a heap buffer of exactly the layout's size, so AddressSanitizer
// reports any read or write outside it. Whatever the bytes:
//   - TakeCall either refuses with INVALID_ARGUMENT and a message, or hands
//     back arrays whose sizes match the kind and stay within the daemon's
//     capacity (never the header's);
//   - an allocation call's arrays either decode into valid requests or are
//     refused with INVALID_ARGUMENT (DecodeCall); a prefix match's keys
//     number num_requests (the pool walks them as they are taken);
//   - the daemon's answer (per-request results with long messages, a whole
//     refusal, an operation's value, a match's pages) stays inside the
//     channel, and the client's codec reads it back consistently.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "allocator/requests.h"
#include "fast_channel/codec.h"
#include "server/request_decoding.h"

namespace pagealloc {
namespace {

constexpr fast_channel::Capacity kCapacity{/*max_requests=*/16,
                                           /*message_bytes=*/128};
constexpr CallLimits kLimits{/*max_requests=*/16, /*max_slots=*/4096};
constexpr PoolGeometry kGeometry{/*page_size=*/4, /*num_pages=*/64};

[[noreturn]] void Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "fast_channel_fuzzer: %s: %s\n", what,
               status.ToString().c_str());
  std::abort();
}

void CheckRefusal(const char* what, const absl::Status& status) {
  if (status.code() != absl::StatusCode::kInvalidArgument ||
      status.message().empty()) {
    Fail(what, status);
  }
}

bool IsAllocation(fast_channel::CallKind kind) {
  return !fast_channel::IsOperation(kind);
}

void Answer(const fast_channel::TakenCall& call,
            fast_channel::ChannelCodec& daemon,
            const fast_channel::ChannelCodec& client) {
  if (call.kind == fast_channel::CallKind::kMatchPrefix) {
    // The first half of the chain found, as page ids 1, 2, ...
    std::vector<int64_t> pages(call.num_requests / 2);
    for (size_t i = 0; i < pages.size(); ++i) pages[i] = i + 1;
    const absl::Status written = daemon.WriteMatchedPages(pages);
    if (!written.ok()) Fail("writing a match's pages", written);
    daemon.Publish(1);
    const absl::StatusOr<absl::Span<const int64_t>> read =
        client.ReadMatchedPages(call.num_requests);
    if (!read.ok()) Fail("reading a match's pages back", read.status());
    if (std::vector<int64_t>(read->begin(), read->end()) != pages) {
      Fail("a match's pages read back", absl::InternalError("differ"));
    }
    return;
  }
  if (!IsAllocation(call.kind)) {
    daemon.WriteOpValue(call.num_requests);
    daemon.Publish(1);
    if (!client.CallStatus().ok() || client.OpValue() != call.num_requests) {
      Fail("operation answer", client.CallStatus());
    }
    return;
  }
  // Every other request refused with a message longer than the area.
  const std::string long_message(3 * kCapacity.message_bytes, 'm');
  daemon.BeginResults();
  int32_t refused = 0;
  for (int32_t i = 0; i < call.num_requests; ++i) {
    if (i % 2 == 0) {
      daemon.Accepted(i, i, 1, 0);
    } else {
      daemon.Refused(i, absl::ResourceExhaustedError(long_message));
      ++refused;
    }
  }
  daemon.FinishResults(call.num_requests, 0, 0, call.num_requests, 1, 1);
  daemon.Publish(1);
  fast_channel::AllocAnswerView answer;
  const absl::Status read = client.ReadAllocAnswer(call.num_requests, &answer);
  if (!read.ok()) Fail("reading the answer back", read);
  if (static_cast<int32_t>(answer.messages.size()) != refused) {
    Fail("one message per refused request", absl::InternalError("count"));
  }
}

}  // namespace
}  // namespace pagealloc

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pagealloc;  // NOLINT: a fuzz entry point
  if (size == 0) return 0;
  const fast_channel::ChannelLayout layout(kCapacity.max_requests,
                                           kCapacity.message_bytes);
  // Exactly the channel's size (ASan sees any access past it), aligned as
  // a mapping is (the header is alignas(64)).
  const size_t bytes = layout.total_bytes;
  std::unique_ptr<char, decltype(&std::free)> channel(
      static_cast<char*>(std::aligned_alloc(64, bytes)), &std::free);
  for (size_t at = 0; at < bytes; at += size) {
    std::memcpy(channel.get() + at, data, std::min(size, bytes - at));
  }
  fast_channel::ChannelCodec daemon(channel.get(), kCapacity);
  const fast_channel::ChannelCodec client(channel.get(), kCapacity);

  fast_channel::TakenCall call;
  const absl::Status taken = daemon.TakeCall(&call);
  if (!taken.ok()) {
    CheckRefusal("TakeCall refused", taken);
    daemon.WriteRefusal(taken);
    daemon.Publish(1);
    if (client.CallStatus().code() != absl::StatusCode::kInvalidArgument) {
      Fail("the refusal read back", client.CallStatus());
    }
    return 0;
  }
  if (call.num_requests < 0 || call.num_requests > kCapacity.max_requests ||
      call.free_first.size() > static_cast<size_t>(kCapacity.max_requests)) {
    Fail("TakeCall's counts", absl::InternalError("out of capacity"));
  }
  if (call.kind == fast_channel::CallKind::kMatchPrefix) {
    if (call.keys.size() != static_cast<size_t>(call.num_requests) ||
        !call.in0.empty() || !call.in1.empty() || !call.free_first.empty()) {
      Fail("a match's keys", absl::InternalError("wrong shape"));
    }
  } else if (call.keys.size() != 0) {
    Fail("keys in a call that is not a match", absl::InternalError("keys"));
  }
  if (IsAllocation(call.kind)) {
    const RequestKind kind =
        call.kind == fast_channel::CallKind::kExtend   ? RequestKind::kExtend
        : call.kind == fast_channel::CallKind::kDecode ? RequestKind::kDecode
                                                       : RequestKind::kAlloc;
    const CallArrays arrays{kind, call.num_requests, call.in0.data(),
                            call.in1.data(), call.in2.data()};
    DecodedCall decoded;
    const absl::Status valid =
        DecodeCall(arrays, /*owner=*/1, kGeometry, kLimits, &decoded);
    if (!valid.ok()) {
      CheckRefusal("DecodeCall refused", valid);
    } else {
      for (const AllocRequest& request : decoded.requests) {
        const absl::Status shape = ValidateShape(request, kGeometry);
        if (!shape.ok()) Fail("a decoded request is invalid", shape);
      }
    }
  }
  Answer(call, daemon, client);
  return 0;
}
