// kv_writer: one scheduler-like process for the KV slab's multi-process
// tests. It registers, allocates --pages pages, writes KvPattern(its
// session, slot, buffer) into every slot of them in every KV buffer through
// its own mapping of the slab, then prints
//   SESSION <id>
//   PAGES <p> <p> ...
//   READY
// and holds its session (and pages) until it is killed or --hold_ms runs
// out. Exits 1 on any error, naming it on stderr.

#include <cstdio>
#include <set>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "tests/kv_pattern.h"

ABSL_FLAG(std::string, target, "", "Daemon address.");
ABSL_FLAG(std::string, register_secret, "", "The pool's Register secret.");
ABSL_FLAG(int64_t, pages, 8, "Pages to allocate and fill.");
ABSL_FLAG(int64_t, hold_ms, 60000, "How long to hold the pages.");

namespace pagealloc {
namespace {

int Fail(const absl::Status& status, const char* what) {
  std::fprintf(stderr, "kv_writer: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

int Main() {
  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.client_name = "kv-writer";
  options.register_secret = absl::GetFlag(FLAGS_register_secret);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return Fail(client.status(), "connect");
  const KvSlabView* slab = (*client)->kv_slab();
  if (slab == nullptr) {
    return Fail(absl::FailedPreconditionError("no KV slab"), "kv_slab");
  }
  const int64_t page_size = (*client)->pool().page_size();
  const int64_t pages = absl::GetFlag(FLAGS_pages);
  CallOptions inline_slots;
  inline_slots.return_inline = true;
  absl::StatusOr<Allocation> allocation =
      (*client)->Alloc({pages * page_size}, inline_slots);
  if (!allocation.ok()) return Fail(allocation.status(), "alloc");
  if (!allocation->status().ok()) return Fail(allocation->status(), "alloc");
  const RequestSlots& slots = (*allocation)[0];
  std::set<int64_t> owned;
  const uint64_t session = (*client)->session_id();
  for (int64_t i = 0; i < slots.count; ++i) {
    const int64_t slot = slots.slots[i];
    owned.insert(slot / page_size);
    for (size_t b = 0; b < slab->buffers().size(); ++b) {
      const KvBuffer& buffer = slab->buffers()[b];
      const std::vector<uint8_t> pattern = testing::KvPattern(
          session, slot, static_cast<int>(b), buffer.stride_bytes);
      if (absl::Status copied = slab->CopyToSlab(
              buffer.slot(slot), pattern.data(), buffer.stride_bytes);
          !copied.ok()) {
        return Fail(copied, "write");
      }
    }
  }
  std::printf("SESSION %llu\nPAGES %s\nREADY\n",
              static_cast<unsigned long long>(session),
              absl::StrJoin(owned, " ").c_str());
  std::fflush(stdout);
  const absl::Time until =
      absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_hold_ms));
  while (absl::Now() < until && (*client)->session_status().ok()) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  return 0;
}

}  // namespace
}  // namespace pagealloc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pagealloc::Main();
}
