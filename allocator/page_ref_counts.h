// PageRefCounts: one owner's reference counts on shared pages, page id ->
// count, as a two-level table indexed by page id (tcmalloc's pagemap shape)
// instead of a hash map.
//
// Why: a match that adopts a 2,048-page chain takes one reference a page,
// and a free drops them again. In a hash map each of those is a hash, a
// probe and, after erases, tombstones that a later insert pays to clean;
// here each is an index into a leaf and an add. Leaves of kLeafPages
// counts are allocated when a page of their range is first counted and
// kept until Clear (an owner's table never holds more than one count per
// page of the pool, 8 bytes a page at most).
//
// Pages are ids in [0, 2^62); callers pass pool pages (1..num_pages).
// Thread-compatible: the pool's lock guards it.
#ifndef PAGEALLOC_ALLOCATOR_PAGE_REF_COUNTS_H_
#define PAGEALLOC_ALLOCATOR_PAGE_REF_COUNTS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace pagealloc {

class PageRefCounts {
 public:
  static constexpr int64_t kLeafPages = 512;  // a leaf: 4 KiB of counts

  PageRefCounts() = default;
  PageRefCounts(PageRefCounts&&) = default;
  PageRefCounts& operator=(PageRefCounts&&) = default;
  PageRefCounts(const PageRefCounts&) = delete;
  PageRefCounts& operator=(const PageRefCounts&) = delete;

  // The count on `page` (0: none).
  int64_t count(int64_t page) const {
    const size_t leaf = static_cast<size_t>(page / kLeafPages);
    if (leaf >= leaves_.size() || leaves_[leaf] == nullptr) return 0;
    return leaves_[leaf][page % kLeafPages];
  }
  bool contains(int64_t page) const { return count(page) != 0; }

  // Pages with a count above 0.
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Adds one to `page`'s count. Returns whether the page is new (its count
  // was 0).
  bool Add(int64_t page) {
    int64_t& c = Slot(page);
    size_ += c == 0;
    return ++c == 1;
  }

  // Takes one from `page`'s count and returns what is left.
  // REQUIRES: count(page) > 0.
  int64_t Drop(int64_t page) {
    int64_t& c = leaves_[page / kLeafPages][page % kLeafPages];
    size_ -= c == 1;
    return --c;
  }

  // Sets `page`'s count (a restored state). REQUIRES: count >= 0.
  void Set(int64_t page, int64_t count) {
    int64_t& c = Slot(page);
    size_ += (c == 0) - (count == 0);
    c = count;
  }

  // Calls fn(page, count) for each page with a count, ascending by page.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (size_t leaf = 0; leaf < leaves_.size(); ++leaf) {
      if (leaves_[leaf] == nullptr) continue;
      const int64_t* counts = leaves_[leaf].get();
      for (int64_t k = 0; k < kLeafPages; ++k) {
        if (counts[k] != 0) {
          fn(static_cast<int64_t>(leaf) * kLeafPages + k, counts[k]);
        }
      }
    }
  }

  // Forgets every count and frees the leaves.
  void Clear() {
    leaves_.clear();
    size_ = 0;
  }

 private:
  int64_t& Slot(int64_t page) {
    const size_t leaf = static_cast<size_t>(page / kLeafPages);
    if (leaf >= leaves_.size()) leaves_.resize(leaf + 1);
    if (leaves_[leaf] == nullptr) {
      leaves_[leaf] = std::make_unique<int64_t[]>(kLeafPages);  // zeroed
    }
    return leaves_[leaf][page % kLeafPages];
  }

  std::vector<std::unique_ptr<int64_t[]>> leaves_;
  size_t size_ = 0;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_ALLOCATOR_PAGE_REF_COUNTS_H_
