// FastChannelClient: the client's end of a session's fast channel
// (fast_channel/layout.h): maps the channel the memory socket handed over,
// posts one call at a time through the codec, rings the channel's doorbell
// when its poller sleeps, and waits for the answer.
//
// This class is not thread-safe (Client serializes its calls), except
// WakeWaiter and SessionLive, which any thread may call.

#ifndef PAGEALLOC_CLIENT_FAST_CHANNEL_CLIENT_H_
#define PAGEALLOC_CLIENT_FAST_CHANNEL_CLIENT_H_

#include <cstdint>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fast_channel/codec.h"
#include "fast_channel/layout.h"
#include "memory/shared_region.h"
#include "memory/unique_fd.h"
#include "proto/pagealloc.pb.h"

namespace pagealloc {

class FastChannelClient {
 public:
  // Maps the channel whose capacity `description` gives, from `channel`
  // (its memory) and `doorbell` (its eventfd), as the memory socket handed
  // them over, and checks its header. Fails when the description is
  // malformed (INTERNAL), the memory is not what it describes
  // (FAILED_PRECONDITION: too short, not sealed, no descriptor), or the
  // daemon speaks another version of the layout (FAILED_PRECONDITION).
  static absl::StatusOr<std::unique_ptr<FastChannelClient>> Map(
      const v1::FastChannel& description, UniqueFd channel, UniqueFd doorbell);

  // The most requests (and free_first pages) one call can carry.
  int32_t max_requests() const { return codec_.capacity().max_requests; }

  // Posts `call`, rings the doorbell if the poller sleeps, and waits for
  // its answer: spins for `spin`, then sleeps on the answer in short slices
  // (WakeWaiter ends one early), calling `alive` between them. On OK the answer
  // is readable through codec(). Returns DEADLINE_EXCEEDED at `deadline`, or
  // `alive`'s error; after either the channel must not be used again (the
  // daemon may still answer into it).
  absl::Status Call(const fast_channel::CallView& call, absl::Duration spin,
                    absl::Time deadline,
                    absl::FunctionRef<absl::Status()> alive);

  // Wakes a Call sleeping on its answer, so that it looks at `alive` again
  // at once (the daemon went away). Thread-safe.
  void WakeWaiter();

  // The stale-answer fence (fast_channel/layout.h): OK while the daemon
  // has not ended session `session_id`; once it has, NOT_FOUND naming the
  // session and why ("session 7 ended (lost its lease): ..."). Call it
  // after reading an answer, on either transport: an answer read before it
  // returned OK was read while the session still owned its pages.
  // Thread-safe.
  absl::Status SessionLive(uint64_t session_id) const;

  const fast_channel::ChannelCodec& codec() const { return codec_; }

 private:
  FastChannelClient(std::unique_ptr<SharedRegion> channel, UniqueFd doorbell,
                    const fast_channel::Capacity& capacity);

  const std::unique_ptr<SharedRegion> channel_region_;
  const UniqueFd doorbell_;
  fast_channel::ChannelCodec codec_;
  uint32_t seq_ = 0;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_CLIENT_FAST_CHANNEL_CLIENT_H_
