#include "server/memory_budget.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/host_memory.h"
#include "memory/kv_layout.h"

namespace pagealloc {

MemoryBudget::Charge& MemoryBudget::Charge::operator=(Charge&& other) noexcept {
  if (this != &other) {
    Reset();
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void MemoryBudget::Charge::Reset() {
  if (budget_ != nullptr) budget_->Give(bytes_);
  budget_ = nullptr;
  bytes_ = 0;
}

MemoryBudget::MemoryBudget(std::string name, std::string flag,
                           int64_t limit_bytes)
    : name_(std::move(name)), flag_(std::move(flag)), limit_(limit_bytes) {}

absl::StatusOr<MemoryBudget::Charge> MemoryBudget::Take(
    int64_t bytes, absl::string_view what) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d bytes is negative", what, bytes));
  }
  absl::MutexLock lock(&mu_);
  if (bytes > limit_ - used_) {
    refusals_.fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "session memory budget exhausted: %s needs %s (%d bytes) of %s "
        "memory; %d "
        "bytes are in use of a budget of %d (%s, %s)",
        what, FormatBytes(bytes), bytes, name_, used_, limit_,
        FormatBytes(limit_), flag_));
  }
  used_ += bytes;
  return Charge(this, bytes);
}

int64_t MemoryBudget::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

void MemoryBudget::Give(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  used_ -= bytes;
}

namespace {

// v1 reports "no limit" as the largest page-aligned int64.
constexpr int64_t kNoLimitAbove = int64_t{1} << 62;

std::optional<int64_t> ReadLimit(const std::string& path) {
  std::ifstream file(path);
  std::string text;
  if (!(file >> text) || text == "max") return std::nullopt;
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value <= 0 || value >= kNoLimitAbove) {
    return std::nullopt;
  }
  return value;
}

// The tightest limit of `dir` and its ancestors up to `root`, reading
// `file` in each.
std::optional<int64_t> TightestLimit(const std::string& root,
                                     std::string relative,
                                     const std::string& file) {
  std::optional<int64_t> tightest;
  while (true) {
    std::optional<int64_t> limit = ReadLimit(root + relative + "/" + file);
    if (limit.has_value() && (!tightest.has_value() || *limit < *tightest)) {
      tightest = limit;
    }
    if (relative.empty() || relative == "/") break;
    const size_t slash = relative.rfind('/');
    relative = slash == std::string::npos ? "" : relative.substr(0, slash);
  }
  return tightest;
}

}  // namespace

std::optional<int64_t> CgroupMemoryLimit(const std::string& proc_self_cgroup,
                                         const std::string& cgroup_root) {
  std::ifstream file(proc_self_cgroup);
  std::string line;
  std::optional<int64_t> tightest;
  auto consider = [&](std::optional<int64_t> limit) {
    if (limit.has_value() && (!tightest.has_value() || *limit < *tightest)) {
      tightest = limit;
    }
  };
  // Lines are "id:controllers:path": "0::/path" for v2, "4:memory:/path"
  // for v1's memory controller.
  while (std::getline(file, line)) {
    std::vector<std::string> fields =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    std::string path = fields[2];
    if (path == "/") path = "";
    if (fields[0] == "0" && fields[1].empty()) {
      consider(TightestLimit(cgroup_root, path, "memory.max"));
      // The unified hierarchy mounted beside v1 controllers.
      consider(TightestLimit(cgroup_root + "/unified", path, "memory.max"));
    } else {
      for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
        if (controller == "memory") {
          consider(TightestLimit(cgroup_root + "/memory", path,
                                 "memory.limit_in_bytes"));
        }
      }
    }
  }
  return tightest;
}

HostMemory AvailableHostMemory() {
  HostMemory memory;
  if (absl::StatusOr<int64_t> available = AvailableHostBytes();
      available.ok()) {
    memory.bytes = *available;
  }
  const std::optional<int64_t> limit = CgroupMemoryLimit();
  if (limit.has_value() && (memory.bytes < 0 || *limit < memory.bytes)) {
    memory.bytes = *limit;
    memory.cgroup_limit = true;
  }
  return memory;
}

int64_t DefaultSessionBudget(BudgetMemory memory, int64_t room, int64_t taken) {
  const int64_t left = std::max<int64_t>(0, room - taken);
  if (memory == BudgetMemory::kGpu) return left / 8;
  const int64_t keep = std::max<int64_t>(int64_t{64} << 20, left / 4);
  return std::max<int64_t>(0, left - keep);
}

}  // namespace pagealloc
