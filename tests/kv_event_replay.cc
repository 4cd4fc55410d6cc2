#include "tests/kv_event_replay.h"

#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace pagealloc::testing {

absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
RequestKvEventReplay(const std::string& endpoint, const std::string& request) {
  zmq::context_t context;
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  // A bound on the wait, never a measure of speed.
  dealer.set(zmq::sockopt::rcvtimeo, 60000);
  dealer.connect(endpoint);
  // A DEALER sends the empty delimiter a REQ socket would add.
  std::vector<zmq::const_buffer> frames = {zmq::const_buffer(),
                                           zmq::buffer(request)};
  zmq::send_multipart(dealer, frames);
  std::vector<std::pair<std::string, std::string>> answers;
  while (true) {
    std::vector<zmq::message_t> answer;
    if (!zmq::recv_multipart(dealer, std::back_inserter(answer))) {
      return absl::DeadlineExceededError(
          absl::StrCat("no replay answer from ", endpoint, " within 60 s"));
    }
    if (answer.size() != 3 || answer[0].size() != 0) {
      return absl::InternalError(
          absl::StrCat("a replay answer of ", answer.size(), " frames, not 3"));
    }
    if (answer[1].to_string() == std::string(8, '\xff')) return answers;
    answers.emplace_back(answer[1].to_string(), answer[2].to_string());
  }
}

}  // namespace pagealloc::testing
