// A KV-event replay request as vLLM's subscribers send it, for tests of the
// daemon's ROUTER socket (--kv_events_replay_endpoint).

#ifndef PAGEALLOC_TESTS_KV_EVENT_REPLAY_H_
#define PAGEALLOC_TESTS_KV_EVENT_REPLAY_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pagealloc::testing {

// Sends `request` (the request's one frame: a start sequence number as 8
// bytes big-endian, or anything else) from a DEALER socket to `endpoint`
// and returns the answers as (sequence frame, payload), up to but not
// including the end marker. DEADLINE_EXCEEDED when no answer comes within
// a minute; INTERNAL for an answer that is not [sequence, payload].
absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
RequestKvEventReplay(const std::string& endpoint, const std::string& request);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_KV_EVENT_REPLAY_H_
