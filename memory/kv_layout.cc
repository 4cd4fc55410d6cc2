#include "memory/kv_layout.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pagealloc {
namespace {

struct DtypeInfo {
  KvDtype dtype;
  const char* name;
  int64_t bytes;
};

constexpr DtypeInfo kDtypes[] = {
    {KvDtype::kBf16, "bf16", 2},        {KvDtype::kFp16, "fp16", 2},
    {KvDtype::kFp32, "fp32", 4},        {KvDtype::kFp8E4m3, "fp8_e4m3", 1},
    {KvDtype::kFp8E5m2, "fp8_e5m2", 1}, {KvDtype::kInt8, "int8", 1},
    {KvDtype::kUint8, "uint8", 1},      {KvDtype::kInt32, "int32", 4},
};

// Largest element we accept: keeps every product below far from overflow.
constexpr int64_t kMaxElementBytes = int64_t{1} << 32;

absl::Status Bad(absl::string_view text, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("--kv_layout=%s: %s", text, why));
}

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '_') {
      return false;
    }
  }
  return true;
}

// "key=value,key=value" into ordered pairs; keys unique.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> KeyValues(
    absl::string_view text, absl::string_view body) {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (absl::string_view item : absl::StrSplit(body, ',')) {
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return Bad(text, absl::StrFormat("\"%s\" is not key=value", item));
    }
    std::string key(item.substr(0, eq));
    for (const auto& [seen, value] : pairs) {
      if (seen == key) return Bad(text, absl::StrCat(key, " given twice"));
    }
    pairs.emplace_back(std::move(key), std::string(item.substr(eq + 1)));
  }
  return pairs;
}

absl::StatusOr<int64_t> PositiveInt(absl::string_view text,
                                    absl::string_view key,
                                    absl::string_view value, int64_t max) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < 1 || n > max) {
    return Bad(text, absl::StrFormat("%s=%s is not an integer in 1..%d", key,
                                     value, max));
  }
  return n;
}

absl::Status CheckElement(absl::string_view text, const KvBufferSpec& spec) {
  int64_t elements = 1;
  for (int64_t d : spec.element_shape) {
    if (d < 1 || elements > kMaxElementBytes / d) {
      return Bad(text, absl::StrFormat("buffer %s's element is too large "
                                       "(at most %d bytes)",
                                       spec.name, kMaxElementBytes));
    }
    elements *= d;
  }
  if (elements * KvDtypeBytes(spec.dtype) > kMaxElementBytes) {
    return Bad(text, absl::StrFormat("buffer %s's element is too large "
                                     "(at most %d bytes)",
                                     spec.name, kMaxElementBytes));
  }
  return absl::OkStatus();
}

// Rounds `value` up to a multiple of `alignment` (a power of two).
int64_t AlignUp(int64_t value, int64_t alignment) {
  return (value + alignment - 1) & ~(alignment - 1);
}

}  // namespace

absl::StatusOr<KvDtype> ParseKvDtype(absl::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (name == info.name) return info.dtype;
  }
  std::vector<std::string> names;
  for (const DtypeInfo& info : kDtypes) names.push_back(info.name);
  return absl::InvalidArgumentError(absl::StrFormat(
      "dtype \"%s\" is not one of %s", name, absl::StrJoin(names, ", ")));
}

absl::string_view KvDtypeName(KvDtype dtype) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.dtype == dtype) return info.name;
  }
  return "?";
}

int64_t KvDtypeBytes(KvDtype dtype) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.dtype == dtype) return info.bytes;
  }
  return 0;
}

int64_t KvBufferSpec::element_bytes() const {
  int64_t bytes = KvDtypeBytes(dtype);
  for (int64_t d : element_shape) bytes *= d;
  return bytes;
}

int64_t KvLayout::slot_bytes() const {
  int64_t bytes = 0;
  for (const KvBufferSpec& buffer : buffers) bytes += buffer.element_bytes();
  return bytes;
}

absl::StatusOr<KvLayout> ParseKvLayout(absl::string_view text) {
  const size_t colon = text.find(':');
  if (colon == absl::string_view::npos) {
    return Bad(text,
               "expected mha:..., mla:... or custom:... (docs/operations.md, "
               "\"KV memory\")");
  }
  const absl::string_view kind = text.substr(0, colon);
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> pairs =
      KeyValues(text, text.substr(colon + 1));
  if (!pairs.ok()) return pairs.status();
  KvLayout layout;
  constexpr int64_t kMaxDim = int64_t{1} << 24;
  if (kind == "mha" || kind == "mla") {
    const bool mha = kind == "mha";
    const std::vector<std::string> keys =
        mha ? std::vector<std::string>{"layers", "kv_heads", "head_dim",
                                       "dtype", "v_head_dim"}
            : std::vector<std::string>{"layers", "kv_lora_rank", "rope_dim",
                                       "dtype"};
    std::vector<std::string> values(keys.size());
    for (const auto& [key, value] : *pairs) {
      size_t k = 0;
      while (k < keys.size() && keys[k] != key) ++k;
      if (k == keys.size()) {
        return Bad(text, absl::StrFormat("unknown key %s for %s (accepted: %s)",
                                         key, kind, absl::StrJoin(keys, ", ")));
      }
      values[k] = value;
    }
    for (size_t k = 0; k < keys.size(); ++k) {
      if (values[k].empty() && keys[k] != "v_head_dim") {
        return Bad(text, absl::StrCat(kind, " needs ", keys[k]));
      }
    }
    absl::StatusOr<KvDtype> dtype = ParseKvDtype(values[3]);
    if (!dtype.ok()) return Bad(text, std::string(dtype.status().message()));
    absl::StatusOr<int64_t> layers =
        PositiveInt(text, "layers", values[0], kMaxKvBuffers / 2);
    absl::StatusOr<int64_t> a = PositiveInt(text, keys[1], values[1], kMaxDim);
    absl::StatusOr<int64_t> b = PositiveInt(text, keys[2], values[2], kMaxDim);
    for (const auto* n : {&layers, &a, &b}) {
      if (!n->ok()) return n->status();
    }
    std::string canonical =
        absl::StrFormat("%s:layers=%d,%s=%d,%s=%d,dtype=%s", kind, *layers,
                        keys[1], *a, keys[2], *b, KvDtypeName(*dtype));
    int64_t v_head_dim = *b;
    if (mha && !values[4].empty()) {
      absl::StatusOr<int64_t> v =
          PositiveInt(text, "v_head_dim", values[4], kMaxDim);
      if (!v.ok()) return v.status();
      v_head_dim = *v;
      absl::StrAppend(&canonical, ",v_head_dim=", v_head_dim);
    }
    layout.text = std::move(canonical);
    for (int64_t layer = 0; layer < *layers; ++layer) {
      if (mha) {
        layout.buffers.push_back({absl::StrCat("k.", layer), *dtype, {*a, *b}});
        layout.buffers.push_back(
            {absl::StrCat("v.", layer), *dtype, {*a, v_head_dim}});
      } else {
        layout.buffers.push_back(
            {absl::StrCat("kv.", layer), *dtype, {1, *a + *b}});
      }
    }
  } else if (kind == "custom") {
    int64_t layers = 0;  // 0: names as given
    std::vector<KvBufferSpec> specs;
    std::vector<std::string> canonical;
    for (const auto& [key, value] : *pairs) {
      if (key == "layers") {
        if (!specs.empty()) return Bad(text, "layers= must come first");
        absl::StatusOr<int64_t> n =
            PositiveInt(text, "layers", value, kMaxKvBuffers);
        if (!n.ok()) return n.status();
        layers = *n;
        canonical.push_back(absl::StrCat("layers=", layers));
        continue;
      }
      if (!ValidName(key)) {
        return Bad(text, absl::StrFormat("buffer name \"%s\": use a-z, 0-9 "
                                         "and _ (at most 64)",
                                         key));
      }
      const size_t dtype_end = value.find(':');
      if (dtype_end == std::string::npos) {
        return Bad(text,
                   absl::StrFormat("%s=%s is not DTYPE:D0xD1x...", key, value));
      }
      absl::StatusOr<KvDtype> dtype = ParseKvDtype(value.substr(0, dtype_end));
      if (!dtype.ok()) {
        return Bad(text, absl::StrCat(key, ": ", dtype.status().message()));
      }
      KvBufferSpec spec{key, *dtype, {}};
      std::vector<std::string> dims;
      for (absl::string_view dim : absl::StrSplit(
               absl::string_view(value).substr(dtype_end + 1), 'x')) {
        absl::StatusOr<int64_t> d = PositiveInt(text, key, dim, kMaxDim);
        if (!d.ok()) return d.status();
        spec.element_shape.push_back(*d);
        dims.push_back(absl::StrCat(*d));
      }
      canonical.push_back(absl::StrFormat("%s=%s:%s", key, KvDtypeName(*dtype),
                                          absl::StrJoin(dims, "x")));
      specs.push_back(std::move(spec));
    }
    if (specs.empty()) return Bad(text, "custom: names no buffer");
    layout.text = absl::StrCat("custom:", absl::StrJoin(canonical, ","));
    if (layers == 0) {
      layout.buffers = std::move(specs);
    } else {
      for (int64_t layer = 0; layer < layers; ++layer) {
        for (const KvBufferSpec& spec : specs) {
          KvBufferSpec copy = spec;
          copy.name = absl::StrCat(spec.name, ".", layer);
          layout.buffers.push_back(std::move(copy));
        }
      }
    }
  } else {
    return Bad(text,
               absl::StrFormat("kind \"%s\" is not mha, mla or custom", kind));
  }
  if (layout.buffers.size() > static_cast<size_t>(kMaxKvBuffers)) {
    return Bad(text, absl::StrFormat("%d buffers; at most %d",
                                     layout.buffers.size(), kMaxKvBuffers));
  }
  for (size_t i = 0; i < layout.buffers.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (layout.buffers[i].name == layout.buffers[j].name) {
        return Bad(text, absl::StrCat("buffer ", layout.buffers[i].name,
                                      " named twice"));
      }
    }
    if (absl::Status ok = CheckElement(text, layout.buffers[i]); !ok.ok()) {
      return ok;
    }
  }
  return layout;
}

absl::StatusOr<KvSlabGeometry> PlaceKvSlab(const KvLayout& layout,
                                           int64_t page_size, int64_t num_pages,
                                           int64_t alignment) {
  if (alignment < 1 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the slab's alignment (%d) is not a power of two", alignment));
  }
  if (page_size < 1 || num_pages < 1 || layout.buffers.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a KV slab of %d pages of %d slots and %d buffers",
                        num_pages, page_size, layout.buffers.size()));
  }
  KvSlabGeometry slab;
  slab.page_size = page_size;
  slab.num_pages = num_pages;
  slab.alignment = alignment;
  // Every figure below stays under 2^62: refuse what would not.
  constexpr int64_t kMaxBytes = int64_t{1} << 62;
  if (num_pages + 1 > kMaxBytes / page_size) {
    return absl::InvalidArgumentError("a KV slab of more than 2^62 slots");
  }
  slab.num_slots = (num_pages + 1) * page_size;
  const int64_t slot_bytes = layout.slot_bytes();
  if (slot_bytes > kMaxBytes / page_size) {
    return absl::InvalidArgumentError("a KV page of more than 2^62 bytes");
  }
  slab.bytes_per_page = page_size * slot_bytes;
  int64_t offset = 0;
  for (const KvBufferSpec& buffer : layout.buffers) {
    KvBufferPlacement placement;
    placement.stride_bytes = buffer.element_bytes();
    if (placement.stride_bytes > (kMaxBytes - offset) / slab.num_slots) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a KV slab of %d slots of %d bytes is larger than 2^62 bytes",
          slab.num_slots, slot_bytes));
    }
    placement.offset = offset;
    placement.bytes = slab.num_slots * placement.stride_bytes;
    offset = AlignUp(offset + placement.bytes, alignment);
    slab.placements.push_back(placement);
  }
  slab.total_bytes = offset;
  return slab;
}

absl::StatusOr<KvSlabGeometry> FitKvSlab(const KvLayout& layout,
                                         int64_t page_size,
                                         int64_t budget_bytes,
                                         int64_t alignment) {
  if (alignment < 1 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the slab's alignment (%d) is not a power of two", alignment));
  }
  if (page_size < 1 || layout.buffers.empty()) {
    return absl::InvalidArgumentError("a KV slab needs pages and buffers");
  }
  const int64_t slot_bytes = layout.slot_bytes();
  const double page_bytes = static_cast<double>(page_size) * slot_bytes;
  auto refuse = [&] {
    absl::StatusOr<KvSlabGeometry> one =
        PlaceKvSlab(layout, page_size, 1, alignment);
    return absl::InvalidArgumentError(absl::StrFormat(
        "a KV budget of %s (%d bytes) leaves no usable page: page 0 and one "
        "page of %d slots need %s (%d buffers, %d bytes a slot, each buffer "
        "aligned to %s)",
        FormatBytes(budget_bytes), budget_bytes, page_size,
        one.ok() ? FormatBytes(one->total_bytes) : std::string("more"),
        layout.buffers.size(), slot_bytes, FormatBytes(alignment)));
  };
  // Rounding each buffer up to the alignment costs less than one alignment
  // a buffer: `low` pages always fit, `high` never do; search between.
  const double slack =
      static_cast<double>(layout.buffers.size()) * (alignment - 1);
  auto pages_for = [&](double bytes) {
    return static_cast<int64_t>(std::floor(bytes / page_bytes)) - 1;
  };
  int64_t low = std::max<int64_t>(0, pages_for(budget_bytes - slack));
  int64_t high = pages_for(budget_bytes) + 1;
  high = std::min<int64_t>(high, (int64_t{1} << 40) / page_size + 1);
  low = std::min(low, high - 1);
  if (high <= 1) return refuse();
  while (high - low > 1) {
    const int64_t mid = low + (high - low) / 2;
    absl::StatusOr<KvSlabGeometry> slab =
        PlaceKvSlab(layout, page_size, mid, alignment);
    if (slab.ok() && slab->total_bytes <= budget_bytes) {
      low = mid;
    } else {
      high = mid;
    }
  }
  if (low < 1) return refuse();
  return PlaceKvSlab(layout, page_size, low, alignment);
}

int64_t KvMemoryBudget::Resolve(int64_t available_bytes) const {
  if (bytes > 0) return bytes;
  return static_cast<int64_t>(fraction * static_cast<double>(available_bytes));
}

absl::StatusOr<KvMemoryBudget> ParseKvMemory(absl::string_view text) {
  static constexpr std::pair<const char*, int64_t> kUnits[] = {
      {"TiB", int64_t{1} << 40},
      {"GiB", int64_t{1} << 30},
      {"MiB", int64_t{1} << 20},
      {"KiB", int64_t{1} << 10},
      {"TB", 1000000000000},
      {"GB", 1000000000},
      {"MB", 1000000},
      {"KB", 1000},
      {"B", 1},
  };
  const absl::string_view number_text = absl::StripAsciiWhitespace(text);
  absl::string_view number = number_text;
  int64_t unit = 0;
  for (const auto& [suffix, scale] : kUnits) {
    if (absl::ConsumeSuffix(&number, suffix)) {
      unit = scale;
      break;
    }
  }
  number = absl::StripAsciiWhitespace(number);
  double value = 0;
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--kv_memory=%s is neither a size (80GiB, 512MiB, 1000000000) nor a "
        "fraction of the available memory in (0, 1] (0.9)",
        text));
  };
  if (number.empty() || !absl::SimpleAtod(number, &value) ||
      !std::isfinite(value) || value <= 0) {
    return bad();
  }
  KvMemoryBudget budget;
  const bool has_point = absl::StrContains(number, '.') ||
                         absl::StrContains(number, 'e') ||
                         absl::StrContains(number, 'E');
  if (unit == 0 && has_point) {
    if (value > 1) return bad();
    budget.fraction = value;
    return budget;
  }
  if (unit == 0) unit = 1;
  const double bytes = value * static_cast<double>(unit);
  if (bytes < 1 || bytes > static_cast<double>(int64_t{1} << 60)) return bad();
  budget.bytes = static_cast<int64_t>(bytes);
  return budget;
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 40)) {
    return absl::StrFormat("%.1f TiB", b / (int64_t{1} << 40));
  }
  if (bytes >= (int64_t{1} << 30)) {
    return absl::StrFormat("%.1f GiB", b / (int64_t{1} << 30));
  }
  if (bytes >= (int64_t{1} << 20)) {
    return absl::StrFormat("%.1f MiB", b / (int64_t{1} << 20));
  }
  if (bytes >= (int64_t{1} << 10)) {
    return absl::StrFormat("%.1f KiB", b / (int64_t{1} << 10));
  }
  return absl::StrFormat("%d B", bytes);
}

}  // namespace pagealloc
