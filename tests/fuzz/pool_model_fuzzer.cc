// Fuzz target: operation sequences on the pool against the reference model.
// The fuzzer's bytes make every choice PoolModelChecker makes (which
// operation, which owner, which lengths); the first byte picks the page size,
// the policy and the semantics. Any disagreement with the model, or a broken
// invariant, aborts.

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "tests/pool_model_checker.h"

namespace pagealloc::testing {
namespace {

// Reads choices from the input; once it runs out, every choice is `lo`.
class ByteChoices : public ChoiceSource {
 public:
  ByteChoices(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  int64_t Uniform(int64_t lo, int64_t hi) override {
    const uint64_t range = static_cast<uint64_t>(hi - lo) + 1;
    uint64_t value = 0;
    for (uint64_t span = 1; span < range && at_ < size_; span <<= 8) {
      value = (value << 8) | data_[at_++];
    }
    return lo + static_cast<int64_t>(value % range);
  }
  bool exhausted() const { return at_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

}  // namespace
}  // namespace pagealloc::testing

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using pagealloc::FreePolicy;
  using pagealloc::testing::ByteChoices;
  using pagealloc::testing::PoolModelChecker;
  if (size < 2) return 0;
  static constexpr int64_t kPageSizes[] = {1, 2, 16, 64};
  const int64_t page_size = kPageSizes[data[0] % 4];
  const FreePolicy policy =
      (data[0] / 4) % 2 == 0 ? FreePolicy::kLifo : FreePolicy::kSorted;
  const pagealloc::Semantics semantics = (data[0] / 8) % 2 == 0
                                             ? pagealloc::Semantics::kPagealloc
                                             : pagealloc::Semantics::kSglang;
  const int64_t num_pages = 8 + data[1] % 40;
  ByteChoices choices(data + 2, size - 2);
  auto checker = PoolModelChecker::Create(num_pages, page_size, policy,
                                          &choices, semantics);
  if (!checker.ok()) std::abort();
  // Each step compares slots and codes with the model; the whole state (free
  // list, owners, invariants) is compared every few steps and at the end,
  // which keeps executions cheap enough for millions of them.
  constexpr int kMaxSteps = 48;
  constexpr int kFullCheckEvery = 8;
  for (int step = 0; step < kMaxSteps && !choices.exhausted(); ++step) {
    absl::Status status = (*checker)->Step();
    if (status.ok() && (step % kFullCheckEvery == kFullCheckEvery - 1 ||
                        choices.exhausted())) {
      status = (*checker)->CheckSameState();
    }
    if (!status.ok()) {
      std::fprintf(stderr, "pool_model_fuzzer: step %d: %s\n", step,
                   status.ToString().c_str());
      std::abort();
    }
  }
  const absl::Status final_state = (*checker)->CheckSameState();
  if (!final_state.ok()) {
    std::fprintf(stderr, "pool_model_fuzzer: end: %s\n",
                 final_state.ToString().c_str());
    std::abort();
  }
  return 0;
}
