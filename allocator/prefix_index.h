// PrefixIndex: the pool's shared prefix pages. It maps a content key to the
// page that holds that content, and keeps per page its key, its parent's
// key, its holder count, its pins and, for a page no session holds, its
// place in the least-recently-used order of cached pages.
//
// States of a page the index knows (docs/design.md, "Shared prefix pages"):
//   - published: count > 0 (the sessions' references on it);
//   - cached: count == 0, its KV still valid, evictable unless pinned.
// A page the index does not know is free or owned; the pool tracks those.
//
// Keys are opaque: kPrefixKeyBytes bytes the client computed (a chained
// block hash, vLLM-style: the parent's key, the page's tokens, extra keys).
// The index never hashes tokens and never interprets a key.
//
// Invariants (CheckInvariants verifies them):
//   - each key maps to one page and that page's entry holds the key;
//   - the index holds at most num_pages entries (one per page at most);
//   - the LRU list holds exactly the entries with count 0 and no pin,
//     least recently used first.
// Every operation is O(1) per page (a hash lookup and list splices), except
// CheckInvariants and Clear.
//
// This class is thread-compatible: the pool's lock guards it.

#ifndef PAGEALLOC_ALLOCATOR_PREFIX_INDEX_H_
#define PAGEALLOC_ALLOCATOR_PREFIX_INDEX_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pagealloc {

// 32 bytes: a SHA-256 digest, what vLLM's sha256 and sha256_cbor block
// hashes are, and far enough from collisions that two schedulers (or a
// hostile one) sharing a GPU's cache never map different content to one
// key by accident. A client with a shorter hash pads it; longer ones are
// refused rather than silently cut.
inline constexpr size_t kPrefixKeyBytes = 32;
using PrefixKey = std::array<uint8_t, kPrefixKeyBytes>;

// Parses `bytes` as a key. Returns INVALID_ARGUMENT naming `field`[`index`]
// and the size when it is not kPrefixKeyBytes long.
absl::StatusOr<PrefixKey> ParsePrefixKey(absl::string_view bytes,
                                         absl::string_view field,
                                         int64_t index);
// Parses every entry of `keys` (messages name `field`[i]) and refuses more
// keys than `max_keys` (a chain longer than the pool can hold). It does not
// look for a key given twice: what repeats matters to is the pool's, which
// checks it where it is cheap (Publish, for every key it inserts; a match,
// for the keys its walk finds: a page per key, a stamp per page), rather
// than hashing every key of a chain once more before the index does.
absl::StatusOr<std::vector<PrefixKey>> ParsePrefixKeys(
    absl::Span<const absl::string_view> keys, absl::string_view field,
    int64_t max_keys);

// Equality of keys, inline: std::array's operator== calls memcmp, which
// was the largest single cost of a 2,048-page match. Two 16-byte compares
// where SSE2 is there (every x86-64): a compare by 8-byte words made the
// compiler store the keys on the stack and load them back in parts, which
// cost a 2,048-page walk a quarter of its time.
struct PrefixKeyEq {
  bool operator()(const PrefixKey& a, const PrefixKey& b) const {
#if defined(__SSE2__)
    const __m128i* x = reinterpret_cast<const __m128i*>(a.data());
    const __m128i* y = reinterpret_cast<const __m128i*>(b.data());
    const __m128i low = _mm_cmpeq_epi8(_mm_loadu_si128(x), _mm_loadu_si128(y));
    const __m128i high =
        _mm_cmpeq_epi8(_mm_loadu_si128(x + 1), _mm_loadu_si128(y + 1));
    return _mm_movemask_epi8(_mm_and_si128(low, high)) == 0xffff;
#else
    uint64_t x[4], y[4];
    std::memcpy(x, a.data(), sizeof(x));
    std::memcpy(y, b.data(), sizeof(y));
    return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
#endif
  }
};
static_assert(sizeof(PrefixKey) == 4 * sizeof(uint64_t));

// A hash map keyed by prefix keys (Abseil's seeded hash of the whole key,
// so a chain made to collide buys no more than any other).
template <typename Value>
using PrefixKeyMap =
    absl::flat_hash_map<PrefixKey, Value, absl::Hash<PrefixKey>, PrefixKeyEq>;

// The key as bytes (what the KV-event sink and the wire carry).
inline std::string PrefixKeyBytes(const PrefixKey& key) {
  return std::string(reinterpret_cast<const char*>(key.data()), key.size());
}

// Figures of the index, for PoolStats.
struct PrefixIndexCounts {
  int64_t published_pages = 0;  // count > 0
  int64_t cached_pages = 0;     // count == 0
  int64_t pinned_pages = 0;     // pin count > 0, either state
  int64_t evictable_pages = 0;  // cached and not pinned: the LRU's length
};

// One entry of the index as PrefixIndex::Export lists it and Import takes
// it back: a page's key, its parent's key (zero at a chain's start), its
// holder count and its pins. A value type.
struct PrefixEntryState {
  int64_t page = 0;
  PrefixKey key{};
  bool has_parent = false;
  PrefixKey parent{};  // all zero when !has_parent
  int64_t count = 0;   // references; 0: cached
  int32_t pins = 0;

  bool operator==(const PrefixEntryState& other) const {
    return page == other.page && key == other.key &&
           has_parent == other.has_parent && parent == other.parent &&
           count == other.count && pins == other.pins;
  }
  bool operator!=(const PrefixEntryState& other) const {
    return !(*this == other);
  }
};

class PrefixIndex {
 public:
  // An index for pages 1..num_pages. It allocates its per-page table on the
  // first Insert, so that a pool that never shares a page pays nothing.
  explicit PrefixIndex(int64_t num_pages);

  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // Returns the page published or cached under `key`, 0 when none.
  int64_t Find(const PrefixKey& key) const {
    auto it = pages_.find(key);
    return it == pages_.end() ? 0 : it->second;
  }
  // Find(key) for the key that follows `previous`'s in a chain (0 at the
  // chain's start): the page that followed `previous` the last time a walk
  // passed through it, when that page is in the index under `key`, else a
  // lookup, remembered for the next walk. A chain walked again (a system
  // prompt matched by every request) costs a key compare a page instead
  // of a hash lookup. The remembered page is a hint checked against the
  // key before use, not state: Export leaves it out and it never changes
  // an answer.
  int64_t FindAfter(int64_t previous, const PrefixKey& key) {
    if (previous != 0) {
      const int64_t next = next_hints_[previous];
      if (next != 0 && entries_[next].in_index &&
          PrefixKeyEq()(entries_[next].key, key)) {
        return next;
      }
    }
    const int64_t page = Find(key);
    if (previous != 0 && page != 0) next_hints_[previous] = page;
    return page;
  }
  // Returns whether `page` is in the index. REQUIRES: 1 <= page <= num_pages.
  bool Contains(int64_t page) const {
    return !entries_.empty() && entries_[page].in_index;
  }
  int64_t count(int64_t page) const { return entries_[page].count; }
  int32_t pins(int64_t page) const { return entries_[page].pins; }
  const PrefixKey& key(int64_t page) const { return entries_[page].key; }
  // The parent's key; has_parent(page) false at the start of a chain.
  const PrefixKey& parent_key(int64_t page) const { return parents_[page]; }
  bool has_parent(int64_t page) const { return entries_[page].has_parent; }
  int64_t size() const { return static_cast<int64_t>(pages_.size()); }
  int64_t num_pages() const { return num_pages_; }

  // Publishes `page` under `key` with one reference (its publisher's).
  // REQUIRES: the key is not in the index and the page is not.
  void Insert(int64_t page, const PrefixKey& key, const PrefixKey* parent);
  // Takes a reference on `page`; a cached page becomes published (and
  // leaves the LRU). REQUIRES: Contains(page).
  void AddRef(int64_t page) {
    // Inline for the common case, a page already published: an adopt of a
    // long chain takes one a page.
    Entry& entry = entries_[page];
    if (entry.count > 0) {
      ++entry.count;
    } else {
      AddFirstRef(page);
    }
  }
  // AddRef of a published page (count > 0), which is only a count: takes
  // the reference and returns true. Returns false and changes nothing for
  // a cached page (AddRef's other case, which leaves the LRU). An adopt
  // takes a chain's references this way as its walk finds the pages.
  // REQUIRES: Contains(page).
  bool AddRefIfPublished(int64_t page) {
    Entry& entry = entries_[page];
    if (entry.count == 0) return false;
    ++entry.count;
    return true;
  }
  // Gives back a reference AddRefIfPublished took (a refused adopt).
  void UndoAddRefIfPublished(int64_t page) { --entries_[page].count; }
  // Drops a reference on `page`; at count 0 it becomes cached and, unless
  // pinned, the most recently used entry of the LRU. REQUIRES: count > 0.
  void Release(int64_t page) {
    Entry& entry = entries_[page];
    if (entry.count > 1) {
      --entry.count;
    } else {
      ReleaseLast(page);
    }
  }
  // Adds or removes a pin. A page with a pin is never evicted.
  // REQUIRES: Contains(page); Unpin only with pins(page) > 0.
  void Pin(int64_t page);
  void Unpin(int64_t page);

  // Evicts up to `max_pages` cached, unpinned pages, least recently used
  // first: removes them from the index and appends their ids to `pages`
  // and their keys to `keys`. Returns the number evicted.
  int64_t EvictLru(int64_t max_pages, std::vector<int64_t>* pages,
                   std::vector<std::string>* keys);
  // The LRU's pages, least recently used first (for tests and debugging).
  std::vector<int64_t> LruOrder() const;

  // Forgets every entry (the pool is cleared whole).
  void Clear();

  PrefixIndexCounts Counts() const { return counts_; }

  // Lists every entry, ascending by page, into `entries`, and the LRU's
  // pages, least recently used first, into `lru` (both replaced).
  void Export(std::vector<PrefixEntryState>* entries,
              std::vector<int64_t>* lru) const;
  // Replaces the index's contents with `entries` (any order) and the LRU
  // order `lru`, least recently used first. Returns DATA_LOSS naming the
  // first violation of the invariants (a page outside 1..num_pages or
  // listed twice, a key listed twice, a parent key without has_parent, a
  // negative count or pin count, an LRU that does not list exactly the
  // entries with count 0 and no pin, once each), and leaves the index empty
  // then. O(entries).
  absl::Status Import(absl::Span<const PrefixEntryState> entries,
                      absl::Span<const int64_t> lru);

  // Verifies the invariants; INTERNAL describing the first violation.
  absl::Status CheckInvariants() const;

 private:
  // One cache line a page: what a walk reads of a page (its key, whether
  // it is in the index) and what an adopt then changes (its count) come in
  // one fetch. The parent's key, which only Export reads, is apart
  // (parents_).
  struct alignas(64) Entry {
    PrefixKey key{};
    int64_t count = 0;
    int32_t pins = 0;
    bool in_index = false;
    bool has_parent = false;
    // The LRU links (page ids; 0 is the list's head sentinel).
    int64_t prev = 0;
    int64_t next = 0;
  };
  static_assert(sizeof(Entry) == 64);

  // AddRef of a cached page, Release of the last reference.
  void AddFirstRef(int64_t page);
  void ReleaseLast(int64_t page);
  bool Evictable(const Entry& entry) const {
    return entry.count == 0 && entry.pins == 0;
  }
  void LruAppend(int64_t page);
  void LruUnlink(int64_t page);
  // Removes the entry's contribution to counts_ (before a change) or adds
  // it (after one).
  void Uncount(const Entry& entry);
  void Count(const Entry& entry);

  const int64_t num_pages_;
  PrefixKeyMap<int64_t> pages_;
  // entries_[p] for p in 0..num_pages once allocated; entries_[0] is the
  // LRU's sentinel: its next is the least recently used page, its prev the
  // most recently used.
  std::vector<Entry> entries_;
  // FindAfter's hints: next_hints_[p] is the page a walk last found after
  // page p (0: none), sized with entries_. Apart from the entries because
  // a walk follows them page to page: each step waits for the last one's
  // hint, and a dense array of them stays in a near cache where the
  // entries (a cache line a page) do not.
  std::vector<int64_t> next_hints_;
  // parents_[p]: page p's parent key (all zero without one), sized with
  // entries_.
  std::vector<PrefixKey> parents_;
  PrefixIndexCounts counts_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_ALLOCATOR_PREFIX_INDEX_H_
