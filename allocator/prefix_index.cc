#include "allocator/prefix_index.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"

namespace pagealloc {

absl::StatusOr<PrefixKey> ParsePrefixKey(absl::string_view bytes,
                                         absl::string_view field,
                                         int64_t index) {
  if (bytes.size() != kPrefixKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s[%d] is %d bytes; a prefix key is %d bytes", field,
                        index, bytes.size(), kPrefixKeyBytes));
  }
  PrefixKey key;
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(key.data()));
  return key;
}

absl::StatusOr<std::vector<PrefixKey>> ParsePrefixKeys(
    absl::Span<const absl::string_view> keys, absl::string_view field,
    int64_t max_keys) {
  if (static_cast<int64_t>(keys.size()) > max_keys) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s has %d keys, more than the pool's %d pages", field,
                        keys.size(), max_keys));
  }
  std::vector<PrefixKey> parsed(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].size() != kPrefixKeyBytes) {
      return ParsePrefixKey(keys[i], field, i).status();
    }
    std::memcpy(parsed[i].data(), keys[i].data(), kPrefixKeyBytes);
  }
  return parsed;
}

PrefixIndex::PrefixIndex(int64_t num_pages) : num_pages_(num_pages) {}

void PrefixIndex::Uncount(const Entry& entry) {
  (entry.count > 0 ? counts_.published_pages : counts_.cached_pages) -= 1;
  if (entry.pins > 0) --counts_.pinned_pages;
  if (Evictable(entry)) --counts_.evictable_pages;
}

void PrefixIndex::Count(const Entry& entry) {
  (entry.count > 0 ? counts_.published_pages : counts_.cached_pages) += 1;
  if (entry.pins > 0) ++counts_.pinned_pages;
  if (Evictable(entry)) ++counts_.evictable_pages;
}

void PrefixIndex::LruAppend(int64_t page) {
  Entry& entry = entries_[page];
  Entry& head = entries_[0];
  entry.prev = head.prev;
  entry.next = 0;
  entries_[head.prev].next = page;
  head.prev = page;
}

void PrefixIndex::LruUnlink(int64_t page) {
  Entry& entry = entries_[page];
  entries_[entry.prev].next = entry.next;
  entries_[entry.next].prev = entry.prev;
  entry.prev = entry.next = 0;
}

void PrefixIndex::Insert(int64_t page, const PrefixKey& key,
                         const PrefixKey* parent) {
  if (entries_.empty()) {
    entries_.resize(num_pages_ + 1);
    next_hints_.resize(num_pages_ + 1);
    parents_.resize(num_pages_ + 1);
  }
  pages_.emplace(key, page);
  Entry& entry = entries_[page];
  entry.key = key;
  entry.has_parent = parent != nullptr;
  parents_[page] = parent != nullptr ? *parent : PrefixKey{};
  entry.count = 1;
  entry.pins = 0;
  entry.in_index = true;
  Count(entry);
}

void PrefixIndex::AddFirstRef(int64_t page) {
  Entry& entry = entries_[page];
  Uncount(entry);
  if (Evictable(entry)) LruUnlink(page);
  ++entry.count;
  Count(entry);
}

void PrefixIndex::ReleaseLast(int64_t page) {
  Entry& entry = entries_[page];
  Uncount(entry);
  --entry.count;
  if (Evictable(entry)) LruAppend(page);
  Count(entry);
}

void PrefixIndex::Pin(int64_t page) {
  Entry& entry = entries_[page];
  Uncount(entry);
  if (Evictable(entry)) LruUnlink(page);
  ++entry.pins;
  Count(entry);
}

void PrefixIndex::Unpin(int64_t page) {
  Entry& entry = entries_[page];
  Uncount(entry);
  --entry.pins;
  // An unpinned cached page was used when it was pinned last: it goes to
  // the most recently used end.
  if (Evictable(entry)) LruAppend(page);
  Count(entry);
}

int64_t PrefixIndex::EvictLru(int64_t max_pages, std::vector<int64_t>* pages,
                              std::vector<std::string>* keys) {
  int64_t evicted = 0;
  while (evicted < max_pages && !entries_.empty() && entries_[0].next != 0) {
    const int64_t page = entries_[0].next;
    Entry& entry = entries_[page];
    Uncount(entry);
    LruUnlink(page);
    pages_.erase(entry.key);
    pages->push_back(page);
    if (keys != nullptr) keys->push_back(PrefixKeyBytes(entry.key));
    entry = Entry{};
    ++evicted;
  }
  return evicted;
}

std::vector<int64_t> PrefixIndex::LruOrder() const {
  std::vector<int64_t> order;
  if (entries_.empty()) return order;
  for (int64_t page = entries_[0].next; page != 0; page = entries_[page].next) {
    order.push_back(page);
  }
  return order;
}

void PrefixIndex::Clear() {
  pages_.clear();
  if (!entries_.empty()) {
    entries_.assign(num_pages_ + 1, Entry{});
    next_hints_.assign(num_pages_ + 1, 0);
    parents_.assign(num_pages_ + 1, PrefixKey{});
  }
  counts_ = PrefixIndexCounts{};
}

void PrefixIndex::Export(std::vector<PrefixEntryState>* entries,
                         std::vector<int64_t>* lru) const {
  entries->clear();
  entries->reserve(pages_.size());
  // By page, from the table: the key map's order is its hash's, which
  // Abseil seeds per process.
  for (int64_t p = 1; p < static_cast<int64_t>(entries_.size()); ++p) {
    const Entry& entry = entries_[p];
    if (!entry.in_index) continue;
    entries->push_back(PrefixEntryState{p, entry.key, entry.has_parent,
                                        parents_[p], entry.count, entry.pins});
  }
  *lru = LruOrder();
}

absl::Status PrefixIndex::Import(absl::Span<const PrefixEntryState> entries,
                                 absl::Span<const int64_t> lru) {
  Clear();
  if (entries.empty() && lru.empty()) return absl::OkStatus();
  auto refuse = [this](absl::Status status) {
    pages_.clear();
    entries_.clear();
    next_hints_.clear();
    parents_.clear();
    counts_ = PrefixIndexCounts{};
    return status;
  };
  if (static_cast<int64_t>(entries.size()) > num_pages_) {
    return refuse(absl::DataLossError(
        absl::StrFormat("the prefix index lists %d entries for %d pages",
                        entries.size(), num_pages_)));
  }
  entries_.assign(num_pages_ + 1, Entry{});
  next_hints_.assign(num_pages_ + 1, 0);
  parents_.assign(num_pages_ + 1, PrefixKey{});
  pages_.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const PrefixEntryState& in = entries[i];
    if (in.page < 1 || in.page > num_pages_) {
      return refuse(absl::DataLossError(
          absl::StrFormat("prefix entry %d: page %d is outside [1, %d]", i,
                          in.page, num_pages_)));
    }
    Entry& entry = entries_[in.page];
    if (entry.in_index) {
      return refuse(absl::DataLossError(absl::StrFormat(
          "prefix entry %d: page %d is listed twice", i, in.page)));
    }
    if (in.count < 0 || in.pins < 0) {
      return refuse(absl::DataLossError(
          absl::StrFormat("prefix entry %d: page %d has count %d, pins %d", i,
                          in.page, in.count, in.pins)));
    }
    if (!in.has_parent && in.parent != PrefixKey{}) {
      return refuse(absl::DataLossError(absl::StrFormat(
          "prefix entry %d: page %d has a parent key but no parent", i,
          in.page)));
    }
    if (!pages_.emplace(in.key, in.page).second) {
      return refuse(absl::DataLossError(
          absl::StrFormat("prefix entry %d: page %d's key is also page %d's", i,
                          in.page, pages_.find(in.key)->second)));
    }
    entry.key = in.key;
    parents_[in.page] = in.parent;
    entry.has_parent = in.has_parent;
    entry.count = in.count;
    entry.pins = in.pins;
    entry.in_index = true;
    Count(entry);
  }
  // The LRU: exactly the evictable entries, each once, in the order given.
  if (static_cast<int64_t>(lru.size()) != counts_.evictable_pages) {
    return refuse(absl::DataLossError(absl::StrFormat(
        "the LRU lists %d pages; %d entries are cached and unpinned",
        lru.size(), counts_.evictable_pages)));
  }
  for (size_t i = 0; i < lru.size(); ++i) {
    const int64_t page = lru[i];
    if (page < 1 || page > num_pages_ || !entries_[page].in_index ||
        !Evictable(entries_[page])) {
      return refuse(absl::DataLossError(absl::StrFormat(
          "lru[%d] (%d) is not a cached, unpinned page of the index", i,
          page)));
    }
    // Linked pages have a non-zero neighbour, or are the list's only page
    // (then the sentinel points at them).
    if (entries_[page].prev != 0 || entries_[page].next != 0 ||
        entries_[0].next == page) {
      return refuse(absl::DataLossError(
          absl::StrFormat("lru[%d] (%d) is listed twice", i, page)));
    }
    LruAppend(page);
  }
  return absl::OkStatus();
}

absl::Status PrefixIndex::CheckInvariants() const {
  if (size() > num_pages_) {
    return absl::InternalError(absl::StrFormat(
        "the prefix index holds %d keys for %d pages", size(), num_pages_));
  }
  PrefixIndexCounts counted;
  for (const auto& [key, page] : pages_) {
    if (page < 1 || page > num_pages_ || !entries_[page].in_index ||
        entries_[page].key != key) {
      return absl::InternalError(absl::StrFormat(
          "a prefix key maps to page %d, whose entry does not hold it", page));
    }
  }
  int64_t in_index = 0;
  for (int64_t p = 1; p < static_cast<int64_t>(entries_.size()); ++p) {
    const Entry& entry = entries_[p];
    if (!entry.in_index) continue;
    ++in_index;
    if (entry.count < 0 || entry.pins < 0) {
      return absl::InternalError(absl::StrFormat(
          "page %d has count %d, pins %d", p, entry.count, entry.pins));
    }
    (entry.count > 0 ? counted.published_pages : counted.cached_pages) += 1;
    if (entry.pins > 0) ++counted.pinned_pages;
    if (Evictable(entry)) ++counted.evictable_pages;
  }
  if (in_index != size()) {
    return absl::InternalError(absl::StrFormat(
        "%d pages are in the prefix index, %d keys", in_index, size()));
  }
  int64_t lru = 0;
  int64_t prev = 0;
  for (int64_t page = entries_.empty() ? 0 : entries_[0].next; page != 0;
       page = entries_[page].next) {
    const Entry& entry = entries_[page];
    if (!entry.in_index || !Evictable(entry) || entry.prev != prev) {
      return absl::InternalError(
          absl::StrFormat("page %d is on the LRU with count %d, pins %d", page,
                          entry.count, entry.pins));
    }
    prev = page;
    if (++lru > num_pages_) {
      return absl::InternalError("the LRU list has a cycle");
    }
  }
  if (lru != counted.evictable_pages ||
      counted.published_pages != counts_.published_pages ||
      counted.cached_pages != counts_.cached_pages ||
      counted.pinned_pages != counts_.pinned_pages ||
      counted.evictable_pages != counts_.evictable_pages) {
    return absl::InternalError(absl::StrFormat(
        "prefix counts: published %d/%d cached %d/%d pinned %d/%d evictable "
        "%d/%d (kept/counted), LRU length %d",
        counts_.published_pages, counted.published_pages, counts_.cached_pages,
        counted.cached_pages, counts_.pinned_pages, counted.pinned_pages,
        counts_.evictable_pages, counted.evictable_pages, lru));
  }
  return absl::OkStatus();
}

}  // namespace pagealloc
