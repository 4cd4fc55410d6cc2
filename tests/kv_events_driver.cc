// kv_events_driver: a KvEventPublisher driven through its KvEventSink from
// stdin, for the tests whose subscribers run in another process
// (tests/kv_events_subscriber_test.py). The producer is the pool's prefix
// cache; here each line of stdin is one call on the sink:
//
//   store KEYS PARENT BLOCK_SIZE LORA   BlocksStored: KEYS a comma list of
//                                       integers, PARENT one or "-", LORA
//                                       one or "-"; key k's tokens are
//                                       k * 1000 + i, i < BLOCK_SIZE
//   remove KEYS                         BlocksRemoved
//   clear                               AllBlocksCleared
//   start                               Start()
//   flush                               Flush()
//   stats                               the counters, as "name=value ..."
//
// and each is answered with one line ("ok", or the stats). Key k is 32
// bytes: 24 bytes of 0xAB, then k as 8 bytes big-endian (so vLLM's integer
// block hash of it is k).
//
// Arguments, name=value: endpoint, replay_endpoint, queue_events,
// max_batch_events, replay_batches, encoding (map|array), start (1|0).
// Prints "ready PUB_ENDPOINT REPLAY_ENDPOINT" once the sockets are bound.

#include <cstdint>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "kv_events/publisher.h"

namespace pagealloc {
namespace {

std::string Key(int64_t k) {
  std::string key(24, '\xab');
  for (int shift = 56; shift >= 0; shift -= 8) {
    key.push_back(
        static_cast<char>((static_cast<uint64_t>(k) >> shift) & 0xff));
  }
  return key;
}

int64_t Int(absl::string_view text) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    std::cerr << "kv_events_driver: not an integer: " << text << "\n";
    std::exit(2);
  }
  return value;
}

std::vector<std::string> Keys(const std::string& list) {
  std::vector<std::string> keys;
  for (absl::string_view k : absl::StrSplit(list, ','))
    keys.push_back(Key(Int(k)));
  return keys;
}

int Main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(argv[i], '=');
    args[kv.first] = kv.second;
  }
  KvEventPublisherOptions options;
  options.endpoint = args["endpoint"];
  options.replay_endpoint = args["replay_endpoint"];
  if (args.count("queue_events"))
    options.queue_events = Int(args["queue_events"]);
  if (args.count("max_batch_events")) {
    options.max_batch_events = Int(args["max_batch_events"]);
  }
  if (args.count("replay_batches")) {
    options.replay_batches = Int(args["replay_batches"]);
  }
  if (args["encoding"] == "array") {
    options.wire.encoding = KvEventEncoding::kTaggedArray;
  }
  auto publisher = KvEventPublisher::Create(options);
  if (!publisher.ok()) {
    std::cerr << "kv_events_driver: " << publisher.status() << "\n";
    return 1;
  }
  if (args["start"] != "0") (*publisher)->Start();
  std::cout << "ready " << (*publisher)->pub_endpoint() << " "
            << (*publisher)->replay_endpoint() << std::endl;

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    if (command == "store") {
      std::string keys, parent, lora;
      int64_t block_size = 0;
      in >> keys >> parent >> block_size >> lora;
      StoredBlocks blocks;
      blocks.keys = Keys(keys);
      if (parent != "-") blocks.parent_key = Key(Int(parent));
      blocks.block_size = block_size;
      for (absl::string_view k : absl::StrSplit(keys, ',')) {
        for (int64_t i = 0; i < block_size; ++i) {
          blocks.token_ids.push_back(Int(k) * 1000 + i);
        }
      }
      if (lora != "-") blocks.lora_id = Int(lora);
      (*publisher)->BlocksStored(blocks);
      std::cout << "ok" << std::endl;
    } else if (command == "remove") {
      std::string keys;
      in >> keys;
      (*publisher)->BlocksRemoved(Keys(keys));
      std::cout << "ok" << std::endl;
    } else if (command == "clear") {
      (*publisher)->AllBlocksCleared();
      std::cout << "ok" << std::endl;
    } else if (command == "start") {
      (*publisher)->Start();
      std::cout << "ok" << std::endl;
    } else if (command == "flush") {
      (*publisher)->Flush();
      std::cout << "ok" << std::endl;
    } else if (command == "stats") {
      const KvEventPublisherStats s = (*publisher)->stats();
      std::cout << "events_published=" << s.events_published
                << " batches_published=" << s.batches_published
                << " events_dropped=" << s.events_dropped
                << " sequence_gaps=" << s.sequence_gaps
                << " replay_requests=" << s.replay_requests
                << " replay_requests_rejected=" << s.replay_requests_rejected
                << " next_sequence=" << s.next_sequence
                << " oldest_sequence=" << s.oldest_sequence << std::endl;
    } else {
      std::cerr << "kv_events_driver: unknown command: " << line << "\n";
      return 2;
    }
  }
  return 0;
}

}  // namespace
}  // namespace pagealloc

int main(int argc, char** argv) { return pagealloc::Main(argc, argv); }
