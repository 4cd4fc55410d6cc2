// LatencyHistogram: an HdrHistogram-like log-linear histogram of durations
// in nanoseconds. Values below 128 ns have a bucket each; above, every power
// of two is split into 64 buckets, so a reported percentile is within 1.6%
// of the true sample (it reports the bucket's highest value, never less than
// the sample). Recording is one array increment, so workers record every
// call; histograms of several processes merge exactly by adding counts.
//
// This class is thread-compatible.

#ifndef PAGEALLOC_BENCH_LATENCY_HISTOGRAM_H_
#define PAGEALLOC_BENCH_LATENCY_HISTOGRAM_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pagealloc {

class LatencyHistogram {
 public:
  // 128 exact buckets, then 64 per power of two up to 2^63.
  static constexpr int kExactBits = 7;
  static constexpr int kSubBits = 6;
  static constexpr int kNumBuckets =
      (1 << kExactBits) + (63 - kExactBits + 1) * (1 << kSubBits);

  LatencyHistogram() : counts_(kNumBuckets, 0) {}

  void Record(int64_t nanos) {
    if (nanos < 0) nanos = 0;
    ++counts_[BucketOf(nanos)];
    ++count_;
    sum_ += nanos;
    max_ = std::max(max_, nanos);
  }

  void Merge(const LatencyHistogram& other) {
    for (int i = 0; i < kNumBuckets; ++i) counts_[i] += other.counts_[i];
    count_ += other.count_;
    sum_ += other.sum_;
    max_ = std::max(max_, other.max_);
  }

  int64_t count() const { return count_; }
  int64_t max_nanos() const { return max_; }
  double mean_nanos() const {
    return count_ == 0 ? 0 : static_cast<double>(sum_) / count_;
  }

  // The value at quantile `q` (0..1): the highest value of the bucket that
  // holds the ceil(q * count)-th sample, capped at the largest sample.
  // 0 when empty.
  int64_t Percentile(double q) const {
    if (count_ == 0) return 0;
    const int64_t rank = std::max<int64_t>(
        1, static_cast<int64_t>(std::ceil(q * static_cast<double>(count_))));
    int64_t seen = 0;
    for (int i = 0; i < kNumBuckets; ++i) {
      seen += counts_[i];
      if (seen >= rank) return std::min(BucketHighest(i), max_);
    }
    return max_;
  }

  // "count sum max index:n index:n ...": the non-empty buckets, for passing
  // a worker's histogram to the coordinator.
  std::string Serialize() const {
    std::string out = absl::StrCat(count_, " ", sum_, " ", max_);
    for (int i = 0; i < kNumBuckets; ++i) {
      if (counts_[i] != 0) absl::StrAppend(&out, " ", i, ":", counts_[i]);
    }
    return out;
  }

  static absl::StatusOr<LatencyHistogram> Parse(absl::string_view text) {
    std::vector<absl::string_view> fields =
        absl::StrSplit(text, ' ', absl::SkipEmpty());
    LatencyHistogram h;
    if (fields.size() < 3 || !absl::SimpleAtoi(fields[0], &h.count_) ||
        !absl::SimpleAtoi(fields[1], &h.sum_) ||
        !absl::SimpleAtoi(fields[2], &h.max_)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad histogram header: ", text.substr(0, 40)));
    }
    int64_t total = 0;
    for (size_t f = 3; f < fields.size(); ++f) {
      std::pair<absl::string_view, absl::string_view> kv =
          absl::StrSplit(fields[f], ':');
      int index = 0;
      int64_t n = 0;
      if (!absl::SimpleAtoi(kv.first, &index) ||
          !absl::SimpleAtoi(kv.second, &n) || index < 0 ||
          index >= kNumBuckets || n < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad histogram bucket: ", fields[f]));
      }
      h.counts_[index] += n;
      total += n;
    }
    if (total != h.count_) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram buckets hold ", total,
                       " samples, header says ", h.count_));
    }
    return h;
  }

 private:
  static int BucketOf(int64_t v) {
    if (v < (1 << kExactBits)) return static_cast<int>(v);
    const int exponent = 63 - __builtin_clzll(static_cast<uint64_t>(v));
    const int shift = exponent - kSubBits;
    const int sub = static_cast<int>(v >> shift) - (1 << kSubBits);
    return (1 << kExactBits) + (exponent - kExactBits) * (1 << kSubBits) + sub;
  }
  static int64_t BucketHighest(int index) {
    if (index < (1 << kExactBits)) return index;
    const int rel = index - (1 << kExactBits);
    const int exponent = rel / (1 << kSubBits) + kExactBits;
    const int shift = exponent - kSubBits;
    const int64_t sub = rel % (1 << kSubBits) + (1 << kSubBits);
    return ((sub + 1) << shift) - 1;
  }

  std::vector<int64_t> counts_;
  int64_t count_ = 0;
  int64_t sum_ = 0;
  int64_t max_ = 0;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_BENCH_LATENCY_HISTOGRAM_H_
