// FastChannelClient: the client's end of a session's fast channel
// (fast_channel/layout.h): maps the channel and the daemon's doorbell that
// Register described, posts one call at a time through the codec, rings the
// doorbell and waits for the answer.
//
// This class is not thread-safe: Client serializes its calls.

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
#include "proto/pagealloc.pb.h"

namespace pagealloc {

class FastChannelClient {
 public:
  // Maps the channel `description` names and checks its header. Fails when
  // the description is malformed (INTERNAL), the memory cannot be mapped
  // (another host, no permission: UNAVAILABLE / FAILED_PRECONDITION), or the
  // daemon speaks another version of the layout (FAILED_PRECONDITION).
  static absl::StatusOr<std::unique_ptr<FastChannelClient>> Map(
      const v1::FastChannel& description);

  // The most requests (and free_first pages) one call can carry.
  int32_t max_requests() const { return codec_.capacity().max_requests; }

  // Posts `call`, rings the doorbell and waits for its answer: spins for
  // `spin`, then sleeps on the answer in short slices, calling `alive`
  // between them. On OK the answer is readable through codec(). Returns
  // DEADLINE_EXCEEDED at `deadline`, or `alive`'s error; after either the
  // channel must not be used again (the daemon may still answer into it).
  absl::Status Call(const fast_channel::CallView& call, absl::Duration spin,
                    absl::Time deadline,
                    absl::FunctionRef<absl::Status()> alive);

  const fast_channel::ChannelCodec& codec() const { return codec_; }

 private:
  FastChannelClient(std::unique_ptr<SharedRegion> channel,
                    std::unique_ptr<SharedRegion> doorbell,
                    const fast_channel::Capacity& capacity);

  const std::unique_ptr<SharedRegion> channel_region_;
  const std::unique_ptr<SharedRegion> doorbell_region_;
  fast_channel::ChannelCodec codec_;
  fast_channel::Doorbell* const doorbell_;
  uint32_t seq_ = 0;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_CLIENT_FAST_CHANNEL_CLIENT_H_
