#include "pool_state/pool_state_codec.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pagealloc {
namespace {

constexpr bool kLittleEndianHost = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
static_assert(kLittleEndianHost || __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__,
              "a host of another byte order");
static_assert(sizeof(PrefixKey) == kPrefixKeyBytes, "a key is its bytes");

// The fixed sizes of the format (pool_state_codec.h).
constexpr size_t kKeyBytes = kPrefixKeyBytes;
constexpr size_t kRequestBytes = 2 + 5 * 8;
// A call: num_requests and all_or_nothing, then (record format 4 on) its
// tag.
constexpr size_t kCallBytes = 8 + 1;
constexpr size_t kTagBytes = 8 + 1;
constexpr size_t kEntryBytes = 8 + kKeyBytes + 1 + kKeyBytes + 8 + 4;
static_assert(kRequestBytes == 42 && kEntryBytes == 85 && kCallBytes == 9 &&
                  kTagBytes == 9,
              "the documented sizes");
constexpr char kStateMagic[4] = {'P', 'P', 'S', 'T'};
constexpr size_t kStateHeaderBytes = 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8;
constexpr size_t kCounters = 16;
static_assert(sizeof(PoolCounters) == kCounters * sizeof(int64_t),
              "every counter is encoded");
// The smallest encoding of one owner (all lists empty) in state format 1,
// and what later formats add to it: awaiting_release's count (2), the kept
// calls' count (3). A kept call's fixed fields and its pages' count.
constexpr size_t kMinOwnerBytes = 8 + 8 + 4 + 8 + 4 + 8 + 8 + 8;
constexpr size_t kKeptCallBytes = 8 + 4 + 8 + 8 + 8 + 8 + 8;

size_t MinOwnerBytes(uint32_t format) {
  return kMinOwnerBytes + (format >= 2 ? 8 : 0) + (format >= 3 ? 4 : 0);
}

// The bytes of a tag in record format `format` (none before 4), and of a
// call.
size_t TagBytes(uint8_t format) {
  return PoolChangeFormatHoldsTags(format) ? kTagBytes : 0;
}
size_t CallBytes(uint8_t format) { return kCallBytes + TagBytes(format); }

// The host's value of little-endian `v` (and back).
template <typename T>
T Little(T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "u32 and u64 only");
  if constexpr (kLittleEndianHost) {
    return v;
  } else if constexpr (sizeof(T) == 4) {
    return __builtin_bswap32(v);
  } else {
    return __builtin_bswap64(v);
  }
}

size_t BitmapBytes(size_t bits) { return (bits + 7) / 8; }

// Stores fields into a buffer sized in advance (the encoders compute the
// exact size first, so that a record costs at most one resize).
class Writer {
 public:
  explicit Writer(char* p) : p_(p) {}
  void U8(uint8_t v) { *p_++ = static_cast<char>(v); }
  void Bool(bool v) { U8(v ? 1 : 0); }
  void U32(uint32_t v) { Store(v); }
  void I32(int32_t v) { Store(static_cast<uint32_t>(v)); }
  void U64(uint64_t v) { Store(v); }
  void I64(int64_t v) { Store(static_cast<uint64_t>(v)); }
  void Raw(const void* data, size_t n) {
    if (n == 0) return;
    std::memcpy(p_, data, n);
    p_ += n;
  }
  void Key(const PrefixKey& key) { Raw(key.data(), key.size()); }
  // A retry flag on an untagged call means nothing to the pool (it keeps
  // nothing of id 0), and the decoder refuses it: it is written as 0.
  void Tag(const CallTag& tag) {
    U64(tag.id);
    Bool(tag.id != 0 && tag.retry);
  }
  void String(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    Raw(s.data(), s.size());
  }
  void I64s(absl::Span<const int64_t> values) {
    if constexpr (kLittleEndianHost) {
      Raw(values.data(), values.size() * sizeof(int64_t));
    } else {
      for (int64_t v : values) I64(v);
    }
  }
  void Bitmap(const std::vector<bool>& bits) {
    for (size_t i = 0; i < bits.size(); i += 8) {
      uint8_t byte = 0;
      for (size_t b = 0; b < 8 && i + b < bits.size(); ++b) {
        if (bits[i + b]) byte |= uint8_t{1} << b;
      }
      U8(byte);
    }
  }
  char* position() const { return p_; }

 private:
  template <typename T>
  void Store(T v) {
    v = Little(v);
    std::memcpy(p_, &v, sizeof v);
    p_ += sizeof v;
  }

  char* p_;
};

// Reads fields, each bounds-checked; remembers why the first read failed.
class Reader {
 public:
  Reader(absl::string_view bytes, const char* what)
      : begin_(bytes.data()),
        p_(bytes.data()),
        end_(bytes.data() + bytes.size()),
        what_(what) {}

  size_t left() const { return static_cast<size_t>(end_ - p_); }

  bool U8(uint8_t* v) {
    if (!Need(1)) return false;
    *v = static_cast<uint8_t>(*p_++);
    return true;
  }
  bool Bool(bool* v) {
    uint8_t byte = 0;
    if (!U8(&byte)) return false;
    if (byte > 1) return OutOfRange();
    *v = byte == 1;
    return true;
  }
  bool U32(uint32_t* v) { return Load(v); }
  bool I32(int32_t* v) {
    uint32_t u = 0;
    if (!Load(&u)) return false;
    *v = static_cast<int32_t>(u);
    return true;
  }
  bool U64(uint64_t* v) { return Load(v); }
  bool I64(int64_t* v) {
    uint64_t u = 0;
    if (!Load(&u)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool Key(PrefixKey* key) {
    if (!Need(kKeyBytes)) return false;
    std::memcpy(key->data(), p_, kKeyBytes);
    p_ += kKeyBytes;
    return true;
  }
  // A call's tag: a retry must name the call it retries.
  bool Tag(CallTag* tag) {
    const char* at = p_;
    if (!U64(&tag->id) || !Bool(&tag->retry)) return false;
    if (tag->retry && tag->id == 0) {
      failed_at_ = at;
      why_ = "a retry without a call id";
      return false;
    }
    return true;
  }
  // A string of at most `max` bytes.
  bool String(size_t max, std::string* s) {
    uint32_t n = 0;
    if (!U32(&n)) return false;
    if (n > max) return OutOfRange();
    if (!Need(n)) return false;
    s->assign(p_, n);
    p_ += n;
    return true;
  }
  // A count of elements of `element_bytes` each: at most `max`, and no more
  // than the bytes left can hold (checked before anything is reserved).
  template <typename T>
  bool Count(uint64_t max, size_t element_bytes, uint64_t* n) {
    T raw = 0;
    if (!Load(&raw)) return false;
    *n = raw;
    if (*n > max) return OutOfRange();
    if (element_bytes > 0 && *n > left() / element_bytes) return Truncated();
    return true;
  }
  bool I64s(uint64_t n, std::vector<int64_t>* values) {
    if (n > left() / sizeof(int64_t)) return Truncated();
    values->resize(n);
    for (uint64_t i = 0; i < n; ++i) I64(&(*values)[i]);
    return true;
  }
  // `n` bits, with the last byte's unused bits zero.
  bool Bitmap(uint64_t n, std::vector<bool>* bits) {
    const size_t bytes = BitmapBytes(n);
    if (!Need(bytes)) return false;
    bits->assign(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      (*bits)[i] = (static_cast<uint8_t>(p_[i / 8]) >> (i % 8)) & 1;
    }
    if (n % 8 != 0 && (static_cast<uint8_t>(p_[bytes - 1]) >> (n % 8)) != 0) {
      return OutOfRange();
    }
    p_ += bytes;
    return true;
  }

  // DATA_LOSS for the failed read of `field`.
  absl::Status Error(absl::string_view field) const {
    return absl::DataLossError(
        absl::StrFormat("%s: %s at byte %d of %d: %s", what_, field,
                        failed_at_ - begin_, end_ - begin_, why_));
  }
  // DATA_LOSS for a value read whole but not allowed.
  absl::Status Invalid(absl::string_view field, absl::string_view why) const {
    return absl::DataLossError(
        absl::StrFormat("%s: %s before byte %d of %d: %s", what_, field,
                        p_ - begin_, end_ - begin_, why));
  }

 private:
  bool Need(size_t n) {
    if (left() >= n) return true;
    return Truncated();
  }
  bool Truncated() {
    failed_at_ = p_;
    why_ = "truncated";
    return false;
  }
  bool OutOfRange() {
    failed_at_ = p_;
    why_ = "out of range";
    return false;
  }
  template <typename T>
  bool Load(T* v) {
    if (!Need(sizeof(T))) return false;
    T raw;
    std::memcpy(&raw, p_, sizeof raw);
    *v = Little(raw);
    p_ += sizeof raw;
    return true;
  }

  const char* begin_;
  const char* p_;
  const char* end_;
  const char* what_;
  const char* failed_at_ = nullptr;
  const char* why_ = "";
};

#define PAGEALLOC_READ(reader, expr, field)    \
  do {                                         \
    if (!(expr)) return (reader).Error(field); \
  } while (false)

absl::string_view LaunchMessage(const absl::Status& status) {
  return status.message().substr(0, kMaxLaunchMessageBytes);
}

}  // namespace

bool PoolChangeFormatHolds(uint8_t format, PoolChangeKind kind) {
  return kind != PoolChangeKind::kAwaitRelease || format >= 3;
}

size_t EncodedPoolChangeSize(const PoolChange& change, uint8_t format) {
  constexpr size_t kHeader = 2;
  switch (change.kind) {
    case PoolChangeKind::kAddOwner:
      return kHeader + 8 + 8 + 4 + change.metadata.size();
    case PoolChangeKind::kRemoveOwner:
      return kHeader + 8;
    case PoolChangeKind::kCheckpoint:
    case PoolChangeKind::kClearOwner:
      return kHeader + 8 + TagBytes(format);
    case PoolChangeKind::kAllocate:
      return kHeader + 4 + 4 + 1 +
             (change.launch_failure != nullptr
                  ? 4 + 4 + LaunchMessage(*change.launch_failure).size()
                  : 0) +
             change.requests.size() * kRequestBytes +
             change.calls.size() * CallBytes(format);
    case PoolChangeKind::kFree:
      return kHeader + 8 + 4 + 4 +
             8 * (change.pages.size() + change.shared_pages.size()) +
             TagBytes(format);
    case PoolChangeKind::kRollback:
      return kHeader + 8 + 8 + TagBytes(format);
    case PoolChangeKind::kClearPool:
      return kHeader + 1;
    case PoolChangeKind::kPublish:
      return kHeader + 8 + 1 + 1 +
             (change.parent_key != nullptr ? kKeyBytes : 0) + 4 +
             change.pages.size() * 8 + change.keys.size() * kKeyBytes;
    case PoolChangeKind::kMatchPrefix:
      if (format == 1) {
        return kHeader + 8 + 1 + 1 + 4 + change.keys.size() * kKeyBytes;
      }
      return kHeader + 8 + 1 + 1 + 4 + 4 + 4 + change.pages.size() * 8;
    case PoolChangeKind::kUnpin:
      return kHeader + 8 + 4 + change.pages.size() * 8;
    case PoolChangeKind::kAwaitRelease:
      return kHeader + 8 + 4 + change.pages.size() * 8 + TagBytes(format);
    case PoolChangeKind::kResetPrefixCache:
      return kHeader;
  }
  return kHeader;
}

void EncodePoolChange(const PoolChange& change, std::string* out,
                      uint8_t format) {
  assert(format >= kMinPoolChangeFormatVersion &&
         format <= kPoolChangeFormatVersion &&
         PoolChangeFormatHolds(format, change.kind));
  const size_t size = EncodedPoolChangeSize(change, format);
  const size_t start = out->size();
  out->resize(start + size);
  Writer w(out->data() + start);
  // Older formats cannot hold the calls' tags: their records are the same
  // without them.
  const bool tags = PoolChangeFormatHoldsTags(format);
  w.U8(format);
  w.U8(static_cast<uint8_t>(change.kind));
  switch (change.kind) {
    case PoolChangeKind::kAddOwner:
      w.U64(change.owner);
      w.I64(change.quota_pages);
      w.String(change.metadata);
      break;
    case PoolChangeKind::kRemoveOwner:
      w.U64(change.owner);
      break;
    case PoolChangeKind::kCheckpoint:
    case PoolChangeKind::kClearOwner:
      w.U64(change.owner);
      if (tags) w.Tag(change.call);
      break;
    case PoolChangeKind::kAllocate: {
      w.U32(static_cast<uint32_t>(change.requests.size()));
      w.U32(static_cast<uint32_t>(change.calls.size()));
      w.Bool(change.launch_failure != nullptr);
      if (change.launch_failure != nullptr) {
        w.U32(static_cast<uint32_t>(change.launch_failure->code()));
        w.String(LaunchMessage(*change.launch_failure));
      }
      // The hot loop: 42 bytes a request, six stores.
      for (const AllocRequest& request : change.requests) {
        w.U8(static_cast<uint8_t>(request.kind));
        w.U8(request.destination != nullptr ? 1 : 0);
        w.U64(request.owner);
        w.I64(request.index);
        w.I64(request.prefix_len);
        w.I64(request.seq_len);
        w.I64(request.last_loc);
      }
      for (const CallSpan& call : change.calls) {
        w.I64(call.num_requests);
        w.Bool(call.all_or_nothing);
        if (tags) w.Tag(call.call);
      }
      break;
    }
    case PoolChangeKind::kFree:
      w.U64(change.owner);
      w.U32(static_cast<uint32_t>(change.pages.size()));
      w.U32(static_cast<uint32_t>(change.shared_pages.size()));
      w.I64s(change.pages);
      w.I64s(change.shared_pages);
      if (tags) w.Tag(change.call);
      break;
    case PoolChangeKind::kRollback:
      w.U64(change.owner);
      w.U64(change.checkpoint_id);
      if (tags) w.Tag(change.call);
      break;
    case PoolChangeKind::kClearPool:
      w.Bool(change.force);
      break;
    case PoolChangeKind::kPublish:
      w.U64(change.owner);
      w.Bool(change.pin);
      w.Bool(change.parent_key != nullptr);
      if (change.parent_key != nullptr) w.Key(*change.parent_key);
      w.U32(static_cast<uint32_t>(change.pages.size()));
      w.I64s(change.pages);
      for (const PrefixKey& key : change.keys) w.Key(key);
      break;
    case PoolChangeKind::kMatchPrefix:
      w.U64(change.owner);
      w.Bool(change.adopt);
      w.Bool(change.refused);
      if (format == 1) {
        // The keys as the caller gave them (a record the pool made, or one
        // decoded from format 1, has them).
        w.U32(static_cast<uint32_t>(change.keys.size()));
        for (const PrefixKey& key : change.keys) w.Key(key);
        break;
      }
      w.U32(static_cast<uint32_t>(change.keys_looked_up));
      w.U32(static_cast<uint32_t>(change.pages_found));
      w.U32(static_cast<uint32_t>(change.pages.size()));
      w.I64s(change.pages);
      break;
    case PoolChangeKind::kUnpin:
    case PoolChangeKind::kAwaitRelease:
      w.U64(change.owner);
      w.U32(static_cast<uint32_t>(change.pages.size()));
      w.I64s(change.pages);
      if (tags && change.kind == PoolChangeKind::kAwaitRelease) {
        w.Tag(change.call);
      }
      break;
    case PoolChangeKind::kResetPrefixCache:
      break;
  }
  assert(w.position() == out->data() + start + size);
}

absl::Status DecodePoolChange(absl::string_view bytes,
                              const PoolGeometry& geometry,
                              DecodedPoolChange* out) {
  Reader r(bytes, "pool change");
  const uint64_t max_pages = geometry.num_pages > 0 ? geometry.num_pages : 0;
  uint8_t version = 0;
  uint8_t kind = 0;
  PAGEALLOC_READ(r, r.U8(&version), "version");
  if (version < kMinPoolChangeFormatVersion ||
      version > kPoolChangeFormatVersion) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pool change: format version %d; this decoder reads versions %d..%d",
        version, kMinPoolChangeFormatVersion, kPoolChangeFormatVersion));
  }
  PAGEALLOC_READ(r, r.U8(&kind), "kind");
  if (kind < 1 || kind > kMaxPoolChangeKind ||
      !PoolChangeFormatHolds(version, static_cast<PoolChangeKind>(kind))) {
    return r.Invalid(
        "kind", absl::StrFormat("unknown kind %d in format %d", kind, version));
  }
  PoolChange& c = out->change_;
  c = PoolChange{};
  c.kind = static_cast<PoolChangeKind>(kind);
  // Records of older formats hold no tags: their calls decode untagged.
  const bool tags = PoolChangeFormatHoldsTags(version);
  uint64_t n = 0;
  switch (c.kind) {
    case PoolChangeKind::kAddOwner:
      PAGEALLOC_READ(r, r.U64(&c.owner), "owner");
      PAGEALLOC_READ(r, r.I64(&c.quota_pages), "quota_pages");
      PAGEALLOC_READ(r, r.String(kMaxOwnerMetadataBytes, &out->metadata_),
                     "metadata");
      c.metadata = out->metadata_;
      break;
    case PoolChangeKind::kRemoveOwner:
      PAGEALLOC_READ(r, r.U64(&c.owner), "owner");
      break;
    case PoolChangeKind::kCheckpoint:
    case PoolChangeKind::kClearOwner:
      PAGEALLOC_READ(r, r.U64(&c.owner), "owner");
      if (tags) PAGEALLOC_READ(r, r.Tag(&c.call), "call");
      break;
    case PoolChangeKind::kAllocate: {
      uint32_t num_requests = 0;
      uint32_t num_calls = 0;
      bool failed = false;
      PAGEALLOC_READ(r, r.U32(&num_requests), "requests");
      PAGEALLOC_READ(r, r.U32(&num_calls), "calls");
      PAGEALLOC_READ(r, r.Bool(&failed), "launch_failed");
      if (failed) {
        uint32_t code = 0;
        std::string message;
        PAGEALLOC_READ(r, r.U32(&code), "launch status code");
        if (code < 1 || code > 16) {
          return r.Invalid("launch status code",
                           absl::StrFormat("%d is not an error code", code));
        }
        PAGEALLOC_READ(r, r.String(kMaxLaunchMessageBytes, &message),
                       "launch status message");
        out->launch_failure_ =
            absl::Status(static_cast<absl::StatusCode>(code), message);
        c.launch_failure = &out->launch_failure_;
      }
      if (num_requests > r.left() / kRequestBytes ||
          num_calls >
              (r.left() - num_requests * kRequestBytes) / CallBytes(version)) {
        return r.Invalid("requests",
                         absl::StrFormat("%d requests and %d calls do not fit "
                                         "in the bytes left",
                                         num_requests, num_calls));
      }
      out->requests_.resize(num_requests);
      for (AllocRequest& request : out->requests_) {
        uint8_t request_kind = 0;
        uint8_t flags = 0;
        PAGEALLOC_READ(r, r.U8(&request_kind), "request kind");
        if (request_kind > static_cast<uint8_t>(RequestKind::kAlloc)) {
          return r.Invalid("request kind",
                           absl::StrFormat("unknown kind %d", request_kind));
        }
        PAGEALLOC_READ(r, r.U8(&flags), "request flags");
        if (flags > 1) {
          return r.Invalid("request flags",
                           absl::StrFormat("unknown flags %d", flags));
        }
        request.kind = static_cast<RequestKind>(request_kind);
        request.destination = flags == 1 ? RecordedDestination() : nullptr;
        PAGEALLOC_READ(r, r.U64(&request.owner), "request owner");
        PAGEALLOC_READ(r, r.I64(&request.index), "request index");
        PAGEALLOC_READ(r, r.I64(&request.prefix_len), "request prefix_len");
        PAGEALLOC_READ(r, r.I64(&request.seq_len), "request seq_len");
        PAGEALLOC_READ(r, r.I64(&request.last_loc), "request last_loc");
      }
      out->calls_.resize(num_calls);
      for (CallSpan& call : out->calls_) {
        PAGEALLOC_READ(r, r.I64(&call.num_requests), "call num_requests");
        PAGEALLOC_READ(r, r.Bool(&call.all_or_nothing), "call all_or_nothing");
        call.call = CallTag{};
        if (tags) PAGEALLOC_READ(r, r.Tag(&call.call), "call tag");
      }
      c.requests = out->requests_;
      c.calls = out->calls_;
      break;
    }
    case PoolChangeKind::kFree: {
      uint64_t num_shared = 0;
      PAGEALLOC_READ(r, r.U64(&c.owner), "owner");
      PAGEALLOC_READ(r, r.Count<uint32_t>(max_pages, 8, &n), "pages");
      PAGEALLOC_READ(r, r.Count<uint32_t>(max_pages, 8, &num_shared),
                     "shared_pages");
      PAGEALLOC_READ(r, r.I64s(n, &out->pages_), "pages");
      PAGEALLOC_READ(r, r.I64s(num_shared, &out->shared_pages_),
                     "shared_pages");
      if (tags) PAGEALLOC_READ(r, r.Tag(&c.call), "call");
      c.pages = out->pages_;
      c.shared_pages = out->shared_pages_;
      break;
    }
    case PoolChangeKind::kRollback:
      PAGEALLOC_READ(r, r.U64(&c.owner), "owner");
      PAGEALLOC_READ(r, r.U64(&c.checkpoint_id), "checkpoint_id");
      if (tags) PAGEALLOC_READ(r, r.Tag(&c.call), "call");
      break;
    case PoolChangeKind::kClearPool:
      PAGEALLOC_READ(r, r.Bool(&c.force), "force");
      break;
    case PoolChangeKind::kPublish: {
      bool has_parent = false;
      PAGEALLOC_READ(r, r.U64(&c.owner), "owner");
      PAGEALLOC_READ(r, r.Bool(&c.pin), "pin");
      PAGEALLOC_READ(r, r.Bool(&has_parent), "has_parent");
      if (has_parent) {
        PAGEALLOC_READ(r, r.Key(&out->parent_key_), "parent_key");
        c.parent_key = &out->parent_key_;
      }
      PAGEALLOC_READ(r, r.Count<uint32_t>(max_pages, 8 + kKeyBytes, &n),
                     "keys");
      PAGEALLOC_READ(r, r.I64s(n, &out->pages_), "pages");
      out->keys_.resize(n);
      for (PrefixKey& key : out->keys_) {
        PAGEALLOC_READ(r, r.Key(&key), "key");
      }
      c.pages = out->pages_;
      c.keys = out->keys_;
      break;
    }
    case PoolChangeKind::kMatchPrefix: {
      PAGEALLOC_READ(r, r.U64(&c.owner), "owner");
      PAGEALLOC_READ(r, r.Bool(&c.adopt), "adopt");
      PAGEALLOC_READ(r, r.Bool(&c.refused), "refused");
      if (version == 1) {
        PAGEALLOC_READ(r, r.Count<uint32_t>(max_pages, kKeyBytes, &n), "keys");
        out->keys_.resize(n);
        for (PrefixKey& key : out->keys_) {
          PAGEALLOC_READ(r, r.Key(&key), "key");
        }
        c.keys = out->keys_;
        break;
      }
      uint32_t looked_up = 0;
      uint32_t found = 0;
      PAGEALLOC_READ(r, r.U32(&looked_up), "keys_looked_up");
      PAGEALLOC_READ(r, r.U32(&found), "pages_found");
      if (looked_up > max_pages || found > looked_up) {
        return r.Invalid("pages_found",
                         absl::StrFormat("%d pages found for %d keys in a "
                                         "pool of %d pages",
                                         found, looked_up, max_pages));
      }
      PAGEALLOC_READ(r, r.Count<uint32_t>(found, 8, &n), "pages");
      PAGEALLOC_READ(r, r.I64s(n, &out->pages_), "pages");
      c.keys_looked_up = looked_up;
      c.pages_found = found;
      c.pages = out->pages_;
      break;
    }
    case PoolChangeKind::kUnpin:
    case PoolChangeKind::kAwaitRelease:
      PAGEALLOC_READ(r, r.U64(&c.owner), "owner");
      PAGEALLOC_READ(r, r.Count<uint32_t>(max_pages, 8, &n), "pages");
      PAGEALLOC_READ(r, r.I64s(n, &out->pages_), "pages");
      if (tags && c.kind == PoolChangeKind::kAwaitRelease) {
        PAGEALLOC_READ(r, r.Tag(&c.call), "call");
      }
      c.pages = out->pages_;
      break;
    case PoolChangeKind::kResetPrefixCache:
      break;
  }
  if (r.left() != 0) {
    return r.Invalid("the end",
                     absl::StrFormat("%d bytes past the record", r.left()));
  }
  return absl::OkStatus();
}

namespace {

size_t KeptCallsBytes(const PoolOwnerState& owner) {
  size_t bytes = 4;
  for (const PoolKeptCall& kept : owner.kept_calls) {
    bytes += kKeptCallBytes + kept.pages.size() * 8;
  }
  return bytes;
}

size_t EncodedOwnerSize(const PoolOwnerState& owner, uint32_t format) {
  return 8 + 8 + 4 + owner.metadata.size() + 8 + 4 +
         owner.checkpoints.size() * 16 + 8 + owner.given_log.size() * 8 +
         BitmapBytes(owner.given_log.size()) + 8 + owner.refs.size() * 16 + 8 +
         owner.pins.size() * 8 +
         (format >= 2 ? 8 + owner.awaiting_release.size() * 8 : 0) +
         (format >= 3 ? KeptCallsBytes(owner) : 0);
}

size_t EncodedStateSize(const PoolState& state, uint32_t format) {
  const size_t pages = state.owner_of.size();
  size_t size = kStateHeaderBytes + 8 + state.free_pages.size() * 8 + 8 +
                state.parked_pages.size() * 8 + pages * 8 +
                BitmapBytes(state.allocated_once.size()) +
                state.last_owner.size() * 8 + 8;
  for (const PoolOwnerState& owner : state.owners) {
    size += EncodedOwnerSize(owner, format);
  }
  size += 8 + state.prefix_entries.size() * kEntryBytes + 8 +
          state.prefix_lru.size() * 8 + kCounters * 8;
  return size;
}

void EncodeCounters(const PoolCounters& c, Writer& w) {
  for (int64_t v :
       {c.slots_allocated, c.pages_allocated, c.pages_freed,
        c.out_of_pages_refusals, c.quota_refusals, c.free_list_sorts,
        c.batches_executed, c.pages_scrubbed, c.prefix_pages_published,
        c.prefix_publish_existing, c.prefix_lookup_pages, c.prefix_hit_pages,
        c.prefix_pages_adopted, c.prefix_evicted_for_allocation,
        c.prefix_evicted_by_reset, c.prefix_cleared}) {
    w.I64(v);
  }
}

}  // namespace

void EncodePoolState(const PoolState& state, std::string* out,
                     uint32_t format) {
  assert(format >= kMinPoolStateFormatVersion &&
         format <= kPoolStateFormatVersion);
  // The per-page tables are written as num_pages + 1 entries whatever
  // their sizes (a state that CreateFromState would refuse still
  // encodes): missing entries are kNoOwner / false.
  const size_t pages =
      static_cast<size_t>(std::max<int64_t>(state.num_pages, 0)) + 1;
  PoolState padded;
  const PoolState* s = &state;
  if (state.owner_of.size() != pages || state.allocated_once.size() != pages ||
      state.last_owner.size() != (state.scrub ? pages : 0)) {
    padded = state;
    padded.owner_of.resize(pages, kNoOwner);
    padded.allocated_once.resize(pages, false);
    padded.last_owner.resize(state.scrub ? pages : 0, kNoOwner);
    s = &padded;
  }
  const size_t size = EncodedStateSize(*s, format);
  const size_t start = out->size();
  out->resize(start + size);
  Writer w(out->data() + start);
  w.Raw(kStateMagic, sizeof kStateMagic);
  w.U32(format);
  w.U32(s->semantics_version);
  w.I64(s->num_pages);
  w.I64(s->page_size);
  w.U8(static_cast<uint8_t>(s->free_policy));
  w.U8(static_cast<uint8_t>(s->semantics));
  w.Bool(s->scrub);
  w.U8(0);
  w.I64(s->max_pinned_pages_per_owner);
  w.I64(s->ring_head);
  w.U64(s->free_pages.size());
  w.I64s(s->free_pages);
  w.U64(s->parked_pages.size());
  w.I64s(s->parked_pages);
  for (OwnerId owner : s->owner_of) w.U64(owner);
  w.Bitmap(s->allocated_once);
  for (OwnerId owner : s->last_owner) w.U64(owner);
  w.U64(s->owners.size());
  for (const PoolOwnerState& owner : s->owners) {
    w.U64(owner.id);
    w.I64(owner.quota_pages);
    w.String(owner.metadata);
    w.U64(owner.next_checkpoint_id);
    w.U32(static_cast<uint32_t>(owner.checkpoints.size()));
    for (const PoolCheckpointState& mark : owner.checkpoints) {
      w.U64(mark.id);
      w.U64(mark.log_position);
    }
    w.U64(owner.given_log.size());
    w.I64s(owner.given_log);
    // One liveness bit per log entry (a state with fewer bits than entries
    // is padded with dead ones; CreateFromState refuses it either way).
    std::vector<bool> live = owner.given_live;
    live.resize(owner.given_log.size(), false);
    w.Bitmap(live);
    w.U64(owner.refs.size());
    for (const auto& [page, count] : owner.refs) {
      w.I64(page);
      w.I64(count);
    }
    w.U64(owner.pins.size());
    w.I64s(owner.pins);
    if (format >= 2) {
      w.U64(owner.awaiting_release.size());
      w.I64s(owner.awaiting_release);
    }
    if (format >= 3) {
      w.U32(static_cast<uint32_t>(owner.kept_calls.size()));
      for (const PoolKeptCall& kept : owner.kept_calls) {
        w.U64(kept.id);
        w.U32(kept.parts);
        w.U64(kept.order);
        w.I64(kept.freed);
        w.U64(kept.checkpoint_id);
        w.I64(kept.returned);
        w.U64(kept.pages.size());
        w.I64s(kept.pages);
      }
    }
  }
  w.U64(s->prefix_entries.size());
  for (const PrefixEntryState& entry : s->prefix_entries) {
    w.I64(entry.page);
    w.Key(entry.key);
    w.Bool(entry.has_parent);
    w.Key(entry.parent);
    w.I64(entry.count);
    w.I32(entry.pins);
  }
  w.U64(s->prefix_lru.size());
  w.I64s(s->prefix_lru);
  EncodeCounters(s->counters, w);
  assert(w.position() == out->data() + start + size);
}

absl::StatusOr<PoolState> DecodePoolState(absl::string_view bytes,
                                          const PoolGeometry& geometry) {
  Reader r(bytes, "pool state");
  PoolState s;
  char magic[sizeof kStateMagic];
  for (char& c : magic) {
    uint8_t byte = 0;
    PAGEALLOC_READ(r, r.U8(&byte), "magic");
    c = static_cast<char>(byte);
  }
  if (std::memcmp(magic, kStateMagic, sizeof magic) != 0) {
    return r.Invalid("magic", "not a pool state");
  }
  uint32_t version = 0;
  PAGEALLOC_READ(r, r.U32(&version), "version");
  if (version < kMinPoolStateFormatVersion ||
      version > kPoolStateFormatVersion) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pool state: format version %d; this decoder reads versions %d..%d",
        version, kMinPoolStateFormatVersion, kPoolStateFormatVersion));
  }
  PAGEALLOC_READ(r, r.U32(&s.semantics_version), "semantics_version");
  PAGEALLOC_READ(r, r.I64(&s.num_pages), "num_pages");
  PAGEALLOC_READ(r, r.I64(&s.page_size), "page_size");
  if (s.num_pages != geometry.num_pages || s.page_size != geometry.page_size ||
      geometry.num_pages < 1) {
    return r.Invalid(
        "geometry",
        absl::StrFormat("a pool of %d pages of %d; this pool has %d of %d",
                        s.num_pages, s.page_size, geometry.num_pages,
                        geometry.page_size));
  }
  uint8_t policy = 0;
  uint8_t semantics = 0;
  uint8_t reserved = 0;
  PAGEALLOC_READ(r, r.U8(&policy), "free_policy");
  PAGEALLOC_READ(r, r.U8(&semantics), "semantics");
  PAGEALLOC_READ(r, r.Bool(&s.scrub), "scrub");
  PAGEALLOC_READ(r, r.U8(&reserved), "reserved byte");
  if (policy > static_cast<uint8_t>(FreePolicy::kSorted) ||
      semantics > static_cast<uint8_t>(Semantics::kSglang) || reserved != 0) {
    return r.Invalid("policy", absl::StrFormat("free policy %d, semantics %d, "
                                               "reserved byte %d",
                                               policy, semantics, reserved));
  }
  s.free_policy = static_cast<FreePolicy>(policy);
  s.semantics = static_cast<Semantics>(semantics);
  PAGEALLOC_READ(r, r.I64(&s.max_pinned_pages_per_owner),
                 "max_pinned_pages_per_owner");
  PAGEALLOC_READ(r, r.I64(&s.ring_head), "ring_head");
  const uint64_t n = static_cast<uint64_t>(s.num_pages);
  uint64_t count = 0;
  PAGEALLOC_READ(r, r.Count<uint64_t>(n, 8, &count), "free_pages");
  PAGEALLOC_READ(r, r.I64s(count, &s.free_pages), "free_pages");
  PAGEALLOC_READ(r, r.Count<uint64_t>(n, 8, &count), "parked_pages");
  PAGEALLOC_READ(r, r.I64s(count, &s.parked_pages), "parked_pages");
  // The per-page tables: their size is the caller's geometry, so check the
  // bytes are there before reserving.
  if (n + 1 > r.left() / 8) return r.Invalid("owner_of", "truncated");
  s.owner_of.resize(n + 1);
  for (OwnerId& owner : s.owner_of) r.U64(&owner);
  PAGEALLOC_READ(r, r.Bitmap(n + 1, &s.allocated_once), "allocated_once");
  if (s.scrub) {
    if (n + 1 > r.left() / 8) return r.Invalid("last_owner", "truncated");
    s.last_owner.resize(n + 1);
    for (OwnerId& owner : s.last_owner) r.U64(&owner);
  }
  uint64_t num_owners = 0;
  PAGEALLOC_READ(
      r, r.Count<uint64_t>(~uint64_t{0}, MinOwnerBytes(version), &num_owners),
      "owners");
  s.owners.resize(num_owners);
  for (PoolOwnerState& owner : s.owners) {
    PAGEALLOC_READ(r, r.U64(&owner.id), "owner id");
    PAGEALLOC_READ(r, r.I64(&owner.quota_pages), "owner quota_pages");
    PAGEALLOC_READ(r, r.String(kMaxOwnerMetadataBytes, &owner.metadata),
                   "owner metadata");
    PAGEALLOC_READ(r, r.U64(&owner.next_checkpoint_id),
                   "owner next_checkpoint_id");
    PAGEALLOC_READ(r, r.Count<uint32_t>(~uint64_t{0}, 16, &count),
                   "owner checkpoints");
    owner.checkpoints.resize(count);
    for (PoolCheckpointState& mark : owner.checkpoints) {
      r.U64(&mark.id);
      r.U64(&mark.log_position);
    }
    PAGEALLOC_READ(r, r.Count<uint64_t>(~uint64_t{0}, 8, &count),
                   "owner given_log");
    PAGEALLOC_READ(r, r.I64s(count, &owner.given_log), "owner given_log");
    PAGEALLOC_READ(r, r.Bitmap(count, &owner.given_live), "owner given_live");
    PAGEALLOC_READ(r, r.Count<uint64_t>(n, 16, &count), "owner refs");
    owner.refs.resize(count);
    for (auto& [page, refs] : owner.refs) {
      r.I64(&page);
      r.I64(&refs);
    }
    PAGEALLOC_READ(r, r.Count<uint64_t>(n, 8, &count), "owner pins");
    PAGEALLOC_READ(r, r.I64s(count, &owner.pins), "owner pins");
    if (version >= 2) {
      PAGEALLOC_READ(r, r.Count<uint64_t>(n, 8, &count),
                     "owner awaiting_release");
      PAGEALLOC_READ(r, r.I64s(count, &owner.awaiting_release),
                     "owner awaiting_release");
    }
    if (version >= 3) {
      // Whether the calls' fields agree (ids ascending, known parts, pages
      // only for an allocation) is CreateFromState's to check; their count
      // is bounded by what a pool keeps, their pages like every other list
      // of pages.
      PAGEALLOC_READ(
          r, r.Count<uint32_t>(kKeptCallsPerOwner, kKeptCallBytes, &count),
          "owner kept_calls");
      owner.kept_calls.resize(count);
      for (PoolKeptCall& kept : owner.kept_calls) {
        PAGEALLOC_READ(r, r.U64(&kept.id), "owner kept call id");
        PAGEALLOC_READ(r, r.U32(&kept.parts), "owner kept call parts");
        PAGEALLOC_READ(r, r.U64(&kept.order), "owner kept call order");
        PAGEALLOC_READ(r, r.I64(&kept.freed), "owner kept call freed");
        PAGEALLOC_READ(r, r.U64(&kept.checkpoint_id),
                       "owner kept call checkpoint_id");
        PAGEALLOC_READ(r, r.I64(&kept.returned), "owner kept call returned");
        PAGEALLOC_READ(r, r.Count<uint64_t>(n, 8, &count),
                       "owner kept call pages");
        PAGEALLOC_READ(r, r.I64s(count, &kept.pages), "owner kept call pages");
      }
    }
  }
  PAGEALLOC_READ(r, r.Count<uint64_t>(n, kEntryBytes, &count),
                 "prefix_entries");
  s.prefix_entries.resize(count);
  for (PrefixEntryState& entry : s.prefix_entries) {
    r.I64(&entry.page);
    r.Key(&entry.key);
    PAGEALLOC_READ(r, r.Bool(&entry.has_parent), "prefix entry has_parent");
    r.Key(&entry.parent);
    r.I64(&entry.count);
    r.I32(&entry.pins);
  }
  PAGEALLOC_READ(r, r.Count<uint64_t>(n, 8, &count), "prefix_lru");
  PAGEALLOC_READ(r, r.I64s(count, &s.prefix_lru), "prefix_lru");
  PoolCounters& c = s.counters;
  for (int64_t* v :
       {&c.slots_allocated, &c.pages_allocated, &c.pages_freed,
        &c.out_of_pages_refusals, &c.quota_refusals, &c.free_list_sorts,
        &c.batches_executed, &c.pages_scrubbed, &c.prefix_pages_published,
        &c.prefix_publish_existing, &c.prefix_lookup_pages, &c.prefix_hit_pages,
        &c.prefix_pages_adopted, &c.prefix_evicted_for_allocation,
        &c.prefix_evicted_by_reset, &c.prefix_cleared}) {
    PAGEALLOC_READ(r, r.I64(v), "counters");
  }
  if (r.left() != 0) {
    return r.Invalid("the end",
                     absl::StrFormat("%d bytes past the state", r.left()));
  }
  return s;
}

#undef PAGEALLOC_READ

}  // namespace pagealloc
