#include "allocator/pool_state.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace pagealloc {
namespace {

// Formats one value of a state for FirstDifference.
std::string Show(int64_t v) { return absl::StrFormat("%d", v); }
std::string Show(uint64_t v) { return absl::StrFormat("%d", v); }
std::string Show(uint32_t v) { return absl::StrFormat("%d", v); }
std::string Show(int32_t v) { return absl::StrFormat("%d", v); }
std::string Show(bool v) { return v ? "true" : "false"; }
std::string Show(FreePolicy v) { return std::string(FreePolicyName(v)); }
std::string Show(Semantics v) { return std::string(SemanticsName(v)); }
std::string Show(const std::string& v) {
  return absl::StrFormat("\"%s\"", absl::CHexEscape(v));
}
std::string Show(const PrefixKey& v) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(v.data()), v.size()));
}
std::string Show(const std::pair<int64_t, int64_t>& v) {
  return absl::StrFormat("(%d, %d)", v.first, v.second);
}
std::string Show(const PoolCheckpointState& v) {
  return absl::StrFormat("{id %d, log_position %d}", v.id, v.log_position);
}

// Compares field by field, remembering the first difference.
class Differ {
 public:
  template <typename T>
  void Field(absl::string_view name, const T& a, const T& b) {
    if (!first_.empty() || a == b) return;
    first_ = absl::StrFormat("%s: %s vs %s", name, Show(a), Show(b));
  }
  template <typename T>
  void List(absl::string_view name, const std::vector<T>& a,
            const std::vector<T>& b) {
    if (!first_.empty()) return;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      Field(absl::StrFormat("%s[%d]", name, i), T(a[i]), T(b[i]));
    }
    if (first_.empty() && a.size() != b.size()) {
      first_ =
          absl::StrFormat("%s: %d entries vs %d", name, a.size(), b.size());
    }
  }
  bool done() const { return !first_.empty(); }
  std::string first() const { return first_; }

 private:
  std::string first_;
};

void DiffCounters(const PoolCounters& a, const PoolCounters& b, Differ& d) {
#define PAGEALLOC_DIFF_COUNTER(name) d.Field("counters." #name, a.name, b.name)
  PAGEALLOC_DIFF_COUNTER(slots_allocated);
  PAGEALLOC_DIFF_COUNTER(pages_allocated);
  PAGEALLOC_DIFF_COUNTER(pages_freed);
  PAGEALLOC_DIFF_COUNTER(out_of_pages_refusals);
  PAGEALLOC_DIFF_COUNTER(quota_refusals);
  PAGEALLOC_DIFF_COUNTER(free_list_sorts);
  PAGEALLOC_DIFF_COUNTER(batches_executed);
  PAGEALLOC_DIFF_COUNTER(pages_scrubbed);
  PAGEALLOC_DIFF_COUNTER(prefix_pages_published);
  PAGEALLOC_DIFF_COUNTER(prefix_publish_existing);
  PAGEALLOC_DIFF_COUNTER(prefix_lookup_pages);
  PAGEALLOC_DIFF_COUNTER(prefix_hit_pages);
  PAGEALLOC_DIFF_COUNTER(prefix_pages_adopted);
  PAGEALLOC_DIFF_COUNTER(prefix_evicted_for_allocation);
  PAGEALLOC_DIFF_COUNTER(prefix_evicted_by_reset);
  PAGEALLOC_DIFF_COUNTER(prefix_cleared);
#undef PAGEALLOC_DIFF_COUNTER
}

void DiffOwner(absl::string_view at, const PoolOwnerState& a,
               const PoolOwnerState& b, Differ& d) {
  d.Field(absl::StrFormat("%s.id", at), a.id, b.id);
  d.Field(absl::StrFormat("%s.quota_pages", at), a.quota_pages, b.quota_pages);
  d.Field(absl::StrFormat("%s.metadata", at), a.metadata, b.metadata);
  d.Field(absl::StrFormat("%s.next_checkpoint_id", at), a.next_checkpoint_id,
          b.next_checkpoint_id);
  d.List(absl::StrFormat("%s.checkpoints", at), a.checkpoints, b.checkpoints);
  d.List(absl::StrFormat("%s.given_log", at), a.given_log, b.given_log);
  d.List(absl::StrFormat("%s.given_live", at), a.given_live, b.given_live);
  d.List(absl::StrFormat("%s.refs", at), a.refs, b.refs);
  d.List(absl::StrFormat("%s.pins", at), a.pins, b.pins);
  d.List(absl::StrFormat("%s.awaiting_release", at), a.awaiting_release,
         b.awaiting_release);
  for (size_t k = 0; k < a.kept_calls.size() && k < b.kept_calls.size(); ++k) {
    const PoolKeptCall& ka = a.kept_calls[k];
    const PoolKeptCall& kb = b.kept_calls[k];
    const std::string call = absl::StrFormat("%s.kept_calls[%d]", at, k);
    d.Field(call + ".id", ka.id, kb.id);
    d.Field(call + ".parts", ka.parts, kb.parts);
    d.Field(call + ".order", ka.order, kb.order);
    d.Field(call + ".freed", ka.freed, kb.freed);
    d.Field(call + ".checkpoint_id", ka.checkpoint_id, kb.checkpoint_id);
    d.Field(call + ".returned", ka.returned, kb.returned);
    d.List(call + ".pages", ka.pages, kb.pages);
  }
  if (!d.done() && a.kept_calls.size() != b.kept_calls.size()) {
    d.Field(absl::StrFormat("%s.kept_calls.size()", at), a.kept_calls.size(),
            b.kept_calls.size());
  }
}

void DiffEntry(absl::string_view at, const PrefixEntryState& a,
               const PrefixEntryState& b, Differ& d) {
  d.Field(absl::StrFormat("%s.page", at), a.page, b.page);
  d.Field(absl::StrFormat("%s.key", at), a.key, b.key);
  d.Field(absl::StrFormat("%s.has_parent", at), a.has_parent, b.has_parent);
  d.Field(absl::StrFormat("%s.parent", at), a.parent, b.parent);
  d.Field(absl::StrFormat("%s.count", at), a.count, b.count);
  d.Field(absl::StrFormat("%s.pins", at), a.pins, b.pins);
}

}  // namespace

bool PoolCounters::operator==(const PoolCounters& other) const {
  Differ d;
  DiffCounters(*this, other, d);
  return !d.done();
}

bool PoolOwnerState::operator==(const PoolOwnerState& other) const {
  Differ d;
  DiffOwner("owner", *this, other, d);
  return !d.done();
}

bool PoolState::operator==(const PoolState& other) const {
  return FirstDifference(*this, other).empty();
}

std::string FirstDifference(const PoolState& a, const PoolState& b) {
  Differ d;
  d.Field("semantics_version", a.semantics_version, b.semantics_version);
  d.Field("num_pages", a.num_pages, b.num_pages);
  d.Field("page_size", a.page_size, b.page_size);
  d.Field("free_policy", a.free_policy, b.free_policy);
  d.Field("semantics", a.semantics, b.semantics);
  d.Field("scrub", a.scrub, b.scrub);
  d.Field("max_pinned_pages_per_owner", a.max_pinned_pages_per_owner,
          b.max_pinned_pages_per_owner);
  d.Field("ring_head", a.ring_head, b.ring_head);
  d.List("free_pages", a.free_pages, b.free_pages);
  d.List("parked_pages", a.parked_pages, b.parked_pages);
  d.List("owner_of", a.owner_of, b.owner_of);
  d.List("allocated_once", a.allocated_once, b.allocated_once);
  d.List("last_owner", a.last_owner, b.last_owner);
  for (size_t i = 0; i < a.owners.size() && i < b.owners.size(); ++i) {
    DiffOwner(absl::StrFormat("owners[%d]", i), a.owners[i], b.owners[i], d);
  }
  if (!d.done() && a.owners.size() != b.owners.size()) {
    return absl::StrFormat("owners: %d vs %d", a.owners.size(),
                           b.owners.size());
  }
  for (size_t i = 0; i < a.prefix_entries.size() && i < b.prefix_entries.size();
       ++i) {
    DiffEntry(absl::StrFormat("prefix_entries[%d]", i), a.prefix_entries[i],
              b.prefix_entries[i], d);
  }
  if (!d.done() && a.prefix_entries.size() != b.prefix_entries.size()) {
    return absl::StrFormat("prefix_entries: %d vs %d", a.prefix_entries.size(),
                           b.prefix_entries.size());
  }
  d.List("prefix_lru", a.prefix_lru, b.prefix_lru);
  DiffCounters(a.counters, b.counters, d);
  return d.first();
}

}  // namespace pagealloc
