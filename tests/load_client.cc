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
#include <set>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/client.h"

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
          "Ask for async completion and order reads after the daemon's "
          "completion event (CUDA backend).");

namespace pagealloc {
namespace {

struct Sequence {
  int64_t len = 0;
  int64_t last_loc = -1;
  std::vector<int64_t> pages;
};

class LoadClient {
 public:
  LoadClient(Client* client, std::atomic<uint32_t>* claims,
             const std::atomic<uint8_t>* dead, uint32_t id, uint64_t seed)
      : client_(client),
        claims_(claims),
        dead_(dead),
        id_(id),
        page_size_(client->pool().page_size()),
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
      if (op < 25 || sequences_.empty()) {
        status = Prefill();
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
    if (absl::Status s = FreeSome(sequences_.size()); !s.ok()) {
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
  void Unclaim(int64_t page) {
    if (claims_ != nullptr) claims_[page].store(0);
  }

  // Checks one request's slots against the semantics and claims its pages.
  absl::Status Check(int64_t prefix, int64_t seq, int64_t last_loc,
                     const RequestSlots& result, Sequence* sequence) {
    std::vector<int64_t> slots(result.count);
    if (call_options_.async_completion) {
      // The answer came right after the launch: order our read (on the
      // default stream) after the daemon's completion event.
      absl::Status ordered = client_->OrderAfterCompletion(nullptr);
      if (!ordered.ok()) return ordered;
    }
    if (result.count != seq - prefix) {
      return absl::DataLossError(absl::StrFormat("%d slots for %d tokens",
                                                 result.count, seq - prefix));
    }
    absl::Status copied =
        client_->CopyToHost(result.slots, result.count, slots.data());
    if (!copied.ok()) return copied;
    int64_t previous = last_loc;
    int64_t new_pages = 0;
    for (int64_t t = 0; t < result.count; ++t) {
      const int64_t position = prefix + t;
      const int64_t slot = slots[t];
      if (position % page_size_ == 0) {
        if (slot % page_size_ != 0 || slot < page_size_) {
          return absl::DataLossError(absl::StrFormat(
              "token %d opens a page but got slot %d", position, slot));
        }
        const int64_t page = slot / page_size_;
        if (absl::Status claimed = Claim(page); !claimed.ok()) return claimed;
        sequence->pages.push_back(page);
        ++new_pages;
      } else if (slot != previous + 1) {
        return absl::DataLossError(absl::StrFormat(
            "token %d got slot %d, expected %d", position, slot, previous + 1));
      }
      previous = slot;
    }
    if (new_pages != result.new_pages) {
      return absl::DataLossError(absl::StrFormat(
          "%d new pages reported, %d seen", result.new_pages, new_pages));
    }
    sequence->len = seq;
    if (result.count > 0) sequence->last_loc = previous;
    slots_ += result.count;
    return absl::OkStatus();
  }

  // Out of pages is normal under load: make room and carry on.
  absl::Status Tolerate(const absl::Status& status) {
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      return FreeSome(std::max<int64_t>(1, sequences_.size() / 2));
    }
    return status;
  }

  absl::Status Prefill() {
    if (static_cast<int64_t>(sequences_.size()) >=
        absl::GetFlag(FLAGS_max_sequences)) {
      return FreeSome(2);
    }
    const int n = Uniform(1, 4);
    std::vector<int64_t> prefix(n, 0), seq(n), last(n, -1);
    for (int i = 0; i < n; ++i) seq[i] = Uniform(1, 3 * page_size_ + 3);
    absl::StatusOr<Allocation> a =
        client_->AllocExtend(prefix, seq, last, call_options_);
    ++calls_;
    if (!a.ok()) return a.status();
    for (int i = 0; i < n; ++i) {
      if (!(*a)[i].status.ok()) {
        if (absl::Status s = Tolerate((*a)[i].status); !s.ok()) return s;
        continue;
      }
      Sequence sequence;
      if (absl::Status s = Check(0, seq[i], -1, (*a)[i], &sequence); !s.ok()) {
        return s;
      }
      sequences_.push_back(std::move(sequence));
      ready_ = true;
    }
    client_->Release(*a);
    return absl::OkStatus();
  }

  // Decodes one token for every sequence; `make_room` frees sequences when
  // the pool runs short.
  absl::Status Decode(bool make_room = true) {
    std::vector<int64_t> seq, last;
    for (const Sequence& s : sequences_) {
      seq.push_back(s.len + 1);
      last.push_back(s.last_loc);
    }
    absl::StatusOr<Allocation> a =
        client_->AllocDecode(seq, last, call_options_);
    ++calls_;
    if (!a.ok()) return a.status();
    bool exhausted = false;
    for (size_t i = 0; i < seq.size(); ++i) {
      if (!(*a)[i].status.ok()) {
        if ((*a)[i].status.code() != absl::StatusCode::kResourceExhausted) {
          return (*a)[i].status;
        }
        exhausted = true;
        continue;
      }
      if (absl::Status s =
              Check(seq[i] - 1, seq[i], last[i], (*a)[i], &sequences_[i]);
          !s.ok()) {
        return s;
      }
    }
    client_->Release(*a);
    return exhausted && make_room ? FreeSome(2) : absl::OkStatus();
  }

  absl::Status Extend() {
    const size_t k = Uniform(0, sequences_.size() - 1);
    Sequence& s = sequences_[k];
    const int64_t seq = s.len + Uniform(1, 2 * page_size_ + 1);
    absl::StatusOr<Allocation> a =
        client_->AllocExtend({s.len}, {seq}, {s.last_loc}, call_options_);
    ++calls_;
    if (!a.ok()) return a.status();
    if (!(*a)[0].status.ok()) return Tolerate((*a)[0].status);
    absl::Status checked = Check(s.len, seq, s.last_loc, (*a)[0], &s);
    client_->Release(*a);
    return checked;
  }

  absl::Status AllocPages() {
    const int64_t tokens = page_size_ * Uniform(1, 3);
    absl::StatusOr<Allocation> a = client_->Alloc({tokens}, call_options_);
    ++calls_;
    if (!a.ok()) return a.status();
    if (!(*a)[0].status.ok()) return Tolerate((*a)[0].status);
    Sequence sequence;
    if (absl::Status s = Check(0, tokens, -1, (*a)[0], &sequence); !s.ok()) {
      return s;
    }
    sequences_.push_back(std::move(sequence));
    client_->Release(*a);
    return absl::OkStatus();
  }

  absl::Status FreeSome(int64_t count) {
    Client::FreeGroup group = client_->BeginFreeGroup();
    int64_t pages = 0;
    for (int64_t i = 0; i < count && !sequences_.empty(); ++i) {
      const size_t k = Uniform(0, sequences_.size() - 1);
      std::vector<int64_t> slots;
      for (int64_t page : sequences_[k].pages) {
        Unclaim(page);
        slots.push_back(page * page_size_);
      }
      pages += sequences_[k].pages.size();
      group.Add(slots);
      sequences_.erase(sequences_.begin() + k);
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
    std::vector<size_t> page_counts;
    for (const Sequence& s : sequences_) page_counts.push_back(s.pages.size());
    if (absl::Status s = Decode(/*make_room=*/false); !s.ok()) return s;
    // Pages given since the checkpoint go back: unclaim them first, and drop
    // the sequences that lost their last page.
    std::vector<Sequence> kept;
    int64_t returned = 0;
    for (size_t i = 0; i < sequences_.size(); ++i) {
      Sequence& s = sequences_[i];
      const size_t before = i < page_counts.size() ? page_counts[i] : 0;
      if (s.pages.size() == before) {
        kept.push_back(std::move(s));
        continue;
      }
      for (size_t p = before; p < s.pages.size(); ++p) {
        Unclaim(s.pages[p]);
        ++returned;
      }
      s.pages.resize(before);
      dropped_.push_back(std::move(s));
    }
    sequences_ = std::move(kept);
    absl::StatusOr<int64_t> rolled = client_->Rollback();
    ++calls_;
    if (!rolled.ok()) return rolled.status();
    if (*rolled != returned) {
      return absl::DataLossError(absl::StrFormat(
          "rollback returned %d pages, expected %d", *rolled, returned));
    }
    // The dropped sequences' older pages are still ours: free them.
    std::vector<int64_t> pages;
    for (Sequence& s : dropped_) {
      for (int64_t page : s.pages) {
        Unclaim(page);
        pages.push_back(page);
      }
    }
    dropped_.clear();
    if (pages.empty()) return absl::OkStatus();
    absl::StatusOr<int64_t> freed = client_->FreePages(pages);
    ++calls_;
    return freed.status();
  }

  Client* const client_;
  std::atomic<uint32_t>* const claims_;
  const std::atomic<uint8_t>* const dead_;
  const uint32_t id_;
  const int64_t page_size_;
  std::mt19937_64 rng_;
  CallOptions call_options_;
  std::vector<Sequence> sequences_;
  std::vector<Sequence> dropped_;
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
