// AtomicHistogram: a fixed-bucket histogram whose Observe takes no lock
// (relaxed atomic adds), so the batcher and the handlers can record on the
// hot path while a scrape reads a snapshot.
//
// This class is thread-safe. A snapshot taken during concurrent Observe calls
// may count an observation in `count` but not yet in its bucket (or the sum);
// Prometheus tolerates such skew between scrapes.

#ifndef PAGEALLOC_SERVER_HISTOGRAM_H_
#define PAGEALLOC_SERVER_HISTOGRAM_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace pagealloc {

class AtomicHistogram {
 public:
  struct Snapshot {
    std::vector<double> upper_bounds;         // ascending, +Inf excluded
    std::vector<uint64_t> cumulative_counts;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };

  // REQUIRES: `upper_bounds` ascending.
  explicit AtomicHistogram(std::vector<double> upper_bounds)
      : bounds_(std::move(upper_bounds)),
        buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
    for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i] = 0;
  }

  void Observe(double value) {
    const size_t bucket =
        std::lower_bound(bounds_.begin(), bounds_.end(), value) -
        bounds_.begin();
    buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
    // A CAS loop on the sum: no lock, and one thread almost always wins.
    double sum = sum_.load(std::memory_order_relaxed);
    while (!sum_.compare_exchange_weak(sum, sum + value,
                                       std::memory_order_relaxed)) {
    }
  }

  Snapshot Take() const {
    Snapshot snapshot;
    snapshot.upper_bounds = bounds_;
    uint64_t running = 0;
    for (size_t i = 0; i <= bounds_.size(); ++i) {
      running += buckets_[i].load(std::memory_order_relaxed);
      snapshot.cumulative_counts.push_back(running);
    }
    snapshot.count = running;
    snapshot.sum = sum_.load(std::memory_order_relaxed);
    return snapshot;
  }

  // Bounds start, start * factor, ... (count of them).
  static std::vector<double> Exponential(double start, double factor,
                                         int count) {
    std::vector<double> bounds;
    for (int i = 0; i < count; ++i, start *= factor) bounds.push_back(start);
    return bounds;
  }

 private:
  const std::vector<double> bounds_;
  const std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0};
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_HISTOGRAM_H_
