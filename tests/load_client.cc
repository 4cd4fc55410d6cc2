// load_client: one scheduler-like client process for multi-process tests.
//
// It keeps a set of live sequences and, until --duration_ms runs out, does
// random prefills, decode steps, chunked extends, page allocs, frees (as free
// groups) and checkpoint/rollback cycles. Every result is checked against
// the allocation semantics, and every new page is claimed in a claim table
// shared by all clients (POSIX shared memory made by the test): a page that
// is already claimed by another client means the daemon handed one page to
// two sessions at once, and the client exits with status 3. A client clears
// its claim before it frees a page.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "tests/workload.h"

ABSL_FLAG(std::string, target, "", "Daemon address.");
ABSL_FLAG(std::string, claims_shm, "", "Shared claim table (optional).");
ABSL_FLAG(int, claims_ids, 0,
          "When > 0, the claim table is followed by this many dead-client "
          "flags (one byte per client id): a claim held by a client the test "
          "killed counts as free.");
ABSL_FLAG(int, client_index, 1, "This client's id in the claim table (>= 1).");
ABSL_FLAG(int64_t, duration_ms, 2000, "How long to run.");
ABSL_FLAG(uint64_t, seed, 0, "Random seed (0: random).");
ABSL_FLAG(int64_t, max_sequences, 24, "Most live sequences.");
ABSL_FLAG(bool, report_ready, false, "Print READY after the first allocation.");
ABSL_FLAG(bool, async_completion, false,
          "Ask for async completion and order each read after its call's "
          "launch through the pool's completion counter (CUDA backend).");

namespace pagealloc {
namespace {

using ::pagealloc::testing::CallArrays;
using ::pagealloc::testing::LiveSequence;
using ::pagealloc::testing::Prefill;
using ::pagealloc::testing::SequenceSet;

class LoadClient {
 public:
  LoadClient(Client* client, std::atomic<uint32_t>* claims,
             const std::atomic<uint8_t>* dead, uint32_t id, uint64_t seed)
      : client_(client),
        claims_(claims),
        dead_(dead),
        id_(id),
        page_size_(client->pool().page_size()),
        live_(page_size_),
        rng_(seed) {
    call_options_.async_completion = absl::GetFlag(FLAGS_async_completion);
  }

  // Returns 0, or 3 on a semantic or exclusivity violation, 1 on an
  // unexpected error.
  int Run(absl::Time deadline) {
    while (absl::Now() < deadline) {
      if (client_->session_status().ok() == false) {
        std::fprintf(stderr, "session lost: %s\n",
                     client_->session_status().ToString().c_str());
        return 1;
      }
      const int op = Uniform(0, 99);
      absl::Status status;
      if (op < 25 || live_.empty()) {
        status = PrefillSome();
      } else if (op < 55) {
        status = Decode();
      } else if (op < 65) {
        status = Extend();
      } else if (op < 70) {
        status = AllocPages();
      } else if (op < 92) {
        status = FreeSome(Uniform(1, 3));
      } else {
        status = CheckpointAndRollback();
      }
      if (!status.ok()) {
        std::fprintf(stderr, "client %u: %s\n", id_, status.ToString().c_str());
        return status.code() == absl::StatusCode::kDataLoss ? 3 : 1;
      }
      if (ready_ && !reported_ && absl::GetFlag(FLAGS_report_ready)) {
        std::printf("READY\n");
        std::fflush(stdout);
        reported_ = true;
      }
    }
    // Give everything back before the session closes, so that no page is
    // claimed once the daemon may hand it to another client.
    if (absl::Status s = FreeSome(live_.size()); !s.ok()) {
      std::fprintf(stderr, "client %u: final free: %s\n", id_,
                   s.ToString().c_str());
      return s.code() == absl::StatusCode::kDataLoss ? 3 : 1;
    }
    std::printf("client %u: %lld calls, %lld slots, %lld pages claimed\n", id_,
                static_cast<long long>(calls_), static_cast<long long>(slots_),
                static_cast<long long>(pages_claimed_));
    return 0;
  }

 private:
  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  // Claims `page` for this client; DATA_LOSS if someone holds it.
  absl::Status Claim(int64_t page) {
    ++pages_claimed_;
    if (claims_ == nullptr) return absl::OkStatus();
    uint32_t holder = claims_[page].load();
    while (true) {
      // A killed client's claims are stale: the daemon reclaims its pages.
      const bool stale =
          holder != 0 && dead_ != nullptr && dead_[holder].load() != 0;
      if (holder != 0 && !stale) {
        return absl::DataLossError(absl::StrFormat(
            "page %d was handed to client %u while client %u holds it", page,
            id_, holder));
      }
      if (claims_[page].compare_exchange_strong(holder, id_)) break;
    }
    return absl::OkStatus();
  }
  void Unclaim(absl::Span<const int64_t> pages) {
    if (claims_ == nullptr) return;
    for (int64_t page : pages) claims_[page].store(0);
  }

  // Checks request `k`'s answer in `allocation` to `call` against the
  // semantics, records it in sequence `i` and claims the pages it opened.
  // DATA_LOSS on a violation.
  absl::Status Check(size_t i, const CallArrays& call, size_t k,
                     const Allocation& allocation) {
    const RequestSlots& result = allocation[k];
    std::vector<int64_t> slots(result.count);
    if (call_options_.async_completion) {
      // The answer came right after the launch was queued: order our read
      // (on the default stream) after it, through the pool's completion
      // counter.
      absl::Status ordered = client_->OrderAfter(allocation, nullptr);
      if (!ordered.ok()) return ordered;
    }
    absl::Status copied =
        client_->CopyToHost(result.slots, result.count, slots.data());
    if (!copied.ok()) return copied;
    std::vector<int64_t> opened;
    if (absl::Status s = live_.Record(i, call[k], slots, &opened); !s.ok()) {
      // A call we built wrongly is our bug; a bad answer is the daemon's.
      return s;
    }
    for (int64_t page : opened) {
      if (absl::Status claimed = Claim(page); !claimed.ok()) return claimed;
    }
    if (static_cast<int64_t>(opened.size()) != result.new_pages) {
      return absl::DataLossError(absl::StrFormat(
          "%d new pages reported, %d seen", result.new_pages, opened.size()));
    }
    slots_ += result.count;
    return absl::OkStatus();
  }

  // Out of pages is normal under load: make room and carry on.
  absl::Status Tolerate(const absl::Status& status) {
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      return FreeSome(std::max<int64_t>(1, live_.size() / 2));
    }
    return status;
  }

  absl::Status PrefillSome() {
    if (static_cast<int64_t>(live_.size()) >=
        absl::GetFlag(FLAGS_max_sequences)) {
      return FreeSome(2);
    }
    CallArrays call;
    for (int n = Uniform(1, 4); n > 0; --n) {
      call.Add(Prefill(Uniform(1, 3 * page_size_ + 3)));
    }
    absl::StatusOr<Allocation> a = client_->AllocExtend(
        call.prefix_lens, call.seq_lens, call.last_locs, call_options_);
    ++calls_;
    if (!a.ok()) return a.status();
    for (size_t k = 0; k < call.size(); ++k) {
      if (!(*a)[k].status.ok()) {
        if (absl::Status s = Tolerate((*a)[k].status); !s.ok()) return s;
        continue;
      }
      if (absl::Status s = Check(live_.Add(), call, k, *a); !s.ok()) {
        return s;
      }
      ready_ = true;
    }
    client_->Release(*a);
    return absl::OkStatus();
  }

  // Decodes one token for every sequence; `make_room` frees sequences when
  // the pool runs short.
  absl::Status Decode(bool make_room = true) {
    CallArrays call;
    for (const LiveSequence& s : live_) call.Add(s.Decode());
    absl::StatusOr<Allocation> a =
        client_->AllocDecode(call.seq_lens, call.last_locs, call_options_);
    ++calls_;
    if (!a.ok()) return a.status();
    bool exhausted = false;
    for (size_t i = 0; i < call.size(); ++i) {
      if (!(*a)[i].status.ok()) {
        if ((*a)[i].status.code() != absl::StatusCode::kResourceExhausted) {
          return (*a)[i].status;
        }
        exhausted = true;
        continue;
      }
      if (absl::Status s = Check(i, call, i, *a); !s.ok()) return s;
    }
    client_->Release(*a);
    return exhausted && make_room ? FreeSome(2) : absl::OkStatus();
  }

  absl::Status Extend() {
    const size_t i = Uniform(0, live_.size() - 1);
    CallArrays call;
    call.Add(live_[i].Extend(Uniform(1, 2 * page_size_ + 1)));
    absl::StatusOr<Allocation> a = client_->AllocExtend(
        call.prefix_lens, call.seq_lens, call.last_locs, call_options_);
    ++calls_;
    if (!a.ok()) return a.status();
    if (!(*a)[0].status.ok()) return Tolerate((*a)[0].status);
    absl::Status checked = Check(i, call, 0, *a);
    client_->Release(*a);
    return checked;
  }

  absl::Status AllocPages() {
    const int64_t tokens = page_size_ * Uniform(1, 3);
    absl::StatusOr<Allocation> a = client_->Alloc({tokens}, call_options_);
    ++calls_;
    if (!a.ok()) return a.status();
    if (!(*a)[0].status.ok()) return Tolerate((*a)[0].status);
    // A page alloc has the shape of a prefill of whole pages.
    CallArrays call;
    call.Add(Prefill(tokens));
    if (absl::Status s = Check(live_.Add(), call, 0, *a); !s.ok()) {
      return s;
    }
    client_->Release(*a);
    return absl::OkStatus();
  }

  absl::Status FreeSome(int64_t count) {
    Client::FreeGroup group = client_->BeginFreeGroup();
    int64_t pages = 0;
    for (int64_t i = 0; i < count && !live_.empty(); ++i) {
      std::vector<int64_t> freed;
      live_.Remove(Uniform(0, live_.size() - 1), &freed);
      Unclaim(freed);
      std::vector<int64_t> slots;
      for (int64_t page : freed) slots.push_back(page * page_size_);
      pages += freed.size();
      group.Add(slots);
    }
    absl::StatusOr<int64_t> freed = group.End();
    ++calls_;
    if (!freed.ok()) return freed.status();
    if (*freed != pages) {
      return absl::DataLossError(
          absl::StrFormat("freed %d pages, expected %d", *freed, pages));
    }
    return absl::OkStatus();
  }

  // Speculative decoding: checkpoint, decode a draft step, roll it back.
  absl::Status CheckpointAndRollback() {
    if (absl::Status s = client_->Checkpoint(); !s.ok()) return s;
    ++calls_;
    const SequenceSet::Mark mark = live_.MarkCheckpoint();
    if (absl::Status s = Decode(/*make_room=*/false); !s.ok()) return s;
    // Pages given since the checkpoint go back: unclaim them first. The
    // sequences that lost their last page leave; their older pages are
    // still ours, to free below.
    std::vector<int64_t> returned, orphaned;
    live_.Rollback(mark, &returned, &orphaned);
    Unclaim(returned);
    absl::StatusOr<int64_t> rolled = client_->Rollback();
    ++calls_;
    if (!rolled.ok()) return rolled.status();
    if (*rolled != static_cast<int64_t>(returned.size())) {
      return absl::DataLossError(absl::StrFormat(
          "rollback returned %d pages, expected %d", *rolled, returned.size()));
    }
    Unclaim(orphaned);
    if (orphaned.empty()) return absl::OkStatus();
    absl::StatusOr<int64_t> freed = client_->FreePages(orphaned);
    ++calls_;
    return freed.status();
  }

  Client* const client_;
  std::atomic<uint32_t>* const claims_;
  const std::atomic<uint8_t>* const dead_;
  const uint32_t id_;
  const int64_t page_size_;
  SequenceSet live_;
  std::mt19937_64 rng_;
  CallOptions call_options_;
  int64_t calls_ = 0, slots_ = 0, pages_claimed_ = 0;
  bool ready_ = false, reported_ = false;
};

int Main() {
  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.client_name =
      absl::StrFormat("load-client-%d", absl::GetFlag(FLAGS_client_index));
  options.ring_capacity_slots = 1 << 16;
  // A call the daemon never answers should end the client well within the
  // tests' waits.
  options.call_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  std::atomic<uint32_t>* claims = nullptr;
  const std::atomic<uint8_t>* dead = nullptr;
  const std::string shm = absl::GetFlag(FLAGS_claims_shm);
  if (!shm.empty()) {
    const int fd = shm_open(shm.c_str(), O_RDWR, 0);
    const size_t claim_bytes =
        ((*client)->pool().num_pages() + 1) * sizeof(std::atomic<uint32_t>);
    const size_t bytes = claim_bytes + absl::GetFlag(FLAGS_claims_ids);
    void* base = fd < 0 ? MAP_FAILED
                        : mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                               MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (base == MAP_FAILED) {
      std::fprintf(stderr, "cannot map claim table %s\n", shm.c_str());
      return 1;
    }
    claims = static_cast<std::atomic<uint32_t>*>(base);
    if (absl::GetFlag(FLAGS_claims_ids) > 0) {
      dead = reinterpret_cast<const std::atomic<uint8_t>*>(
          static_cast<const char*>(base) + claim_bytes);
    }
  }
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed == 0) seed = std::random_device{}();
  LoadClient load(client->get(), claims, dead,
                  absl::GetFlag(FLAGS_client_index), seed);
  const int code = load.Run(
      absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_duration_ms)));
  if (code != 0) std::fprintf(stderr, "seed %llu\n", (unsigned long long)seed);
  return code;
}

}  // namespace
}  // namespace pagealloc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pagealloc::Main();
}
