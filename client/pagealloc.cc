// The C ABI over pagealloc::Client (client/pagealloc.h).
//
// Every entry point catches C++ exceptions (std::bad_alloc from a vector,
// say): unwinding into a C caller, ctypes or cgo is undefined behaviour, so
// an exception becomes an error code like any other failure.

#include "client/pagealloc.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "client/admin.h"
#include "client/client.h"
#include "client/local_expansion.h"
#include "client/page_free.h"
#include "client/page_reserve.h"
#include "common/status_macros.h"
#include "common/version.h"

struct pagealloc_client {
  std::unique_ptr<pagealloc::Client> client;
  // The target it was connected to, for the calls that need no session
  // (pagealloc_get_free_lists).
  std::string target;
};

struct pagealloc_reserve {
  std::unique_ptr<pagealloc::PageReserve> reserve;
  // The session's client, for the expanders' pool geometry.
  const pagealloc::Client* client = nullptr;
  // The expanders of pagealloc_reserve_alloc_extend / _decode, made on
  // first use, one per memory kind; `mu` serializes their calls.
  absl::Mutex mu;
  std::unique_ptr<pagealloc::LocalExpander> expanders[2] ABSL_GUARDED_BY(mu);
};

struct pagealloc_allocation {
  pagealloc::Allocation allocation;
  // The messages as C strings (into the allocation's); `view` points at
  // the allocation's arrays and these.
  std::vector<const char*> messages;
  pagealloc_allocation_view view{};
};

namespace pagealloc {
namespace {

static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
                  PAGEALLOC_UNAUTHENTICATED,
              "pagealloc_status_code numbers are absl::StatusCode's");
static_assert(static_cast<int>(absl::StatusCode::kResourceExhausted) ==
                  PAGEALLOC_RESOURCE_EXHAUSTED,
              "pagealloc_status_code numbers are absl::StatusCode's");
static_assert(static_cast<int>(v1::FREE_ORDER_DEFAULT) ==
                      PAGEALLOC_FREE_ORDER_DEFAULT &&
                  static_cast<int>(v1::FREE_ORDER_ASCENDING) ==
                      PAGEALLOC_FREE_ORDER_ASCENDING &&
                  static_cast<int>(v1::FREE_ORDER_FIRST_APPEARANCE) ==
                      PAGEALLOC_FREE_ORDER_FIRST_APPEARANCE,
              "pagealloc_free_order numbers are v1::FreeOrder's");
static_assert(static_cast<int>(v1::BACKEND_CPU) == PAGEALLOC_BACKEND_CPU &&
                  static_cast<int>(v1::BACKEND_CUDA) == PAGEALLOC_BACKEND_CUDA,
              "pagealloc_backend numbers are v1::Backend's");

// Copies `text` into `out` (`size` bytes), NUL-terminated, cut with "..."
// when it does not fit.
void CopyString(absl::string_view text, char* out, size_t size) {
  if (size == 0) return;
  if (text.size() < size) {
    std::memcpy(out, text.data(), text.size());
    out[text.size()] = '\0';
    return;
  }
  const size_t kept = size - 1;
  std::memcpy(out, text.data(), kept);
  out[kept] = '\0';
  if (kept >= 3) std::memcpy(out + kept - 3, "...", 3);
}

// Reports `status` through `error` and returns its code.
int32_t Report(const absl::Status& status, pagealloc_error* error) {
  const int32_t code = static_cast<int32_t>(status.code());
  if (code != PAGEALLOC_OK && error != nullptr) {
    error->code = code;
    CopyString(status.message(), error->message, sizeof(error->message));
  }
  return code;
}

// Runs `body` (returning absl::Status) with exceptions turned into codes.
template <typename Body>
int32_t Guarded(pagealloc_error* error, Body body) {
  try {
    return Report(body(), error);
  } catch (const std::bad_alloc&) {
    return Report(absl::ResourceExhaustedError("out of memory in the client"),
                  error);
  } catch (const std::exception& e) {
    return Report(absl::InternalError(absl::StrFormat(
                      "the client library threw: %s", e.what())),
                  error);
  } catch (...) {
    return Report(absl::InternalError("the client library threw"), error);
  }
}

// Copies a caller's versioned structure into `*out` (already holding the
// defaults). A caller built against an older header passes a smaller
// struct_size (the fields it lacks keep their defaults); a newer one a
// larger struct, accepted only when the fields this library does not know
// are zero, so that nothing the caller set is silently ignored.
template <typename T>
absl::Status ReadVersioned(const T* in, const char* name, T* out) {
  const size_t size = in->struct_size;
  if (size < sizeof(size_t)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s.struct_size (%d) is too small: fill the structure with %s_init",
        name, size, name));
  }
  if (size > sizeof(T)) {
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(in);
    for (size_t i = sizeof(T); i < size; ++i) {
      if (bytes[i] != 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s sets fields this library (ABI %d.%d) does not know "
            "(struct_size %d > %d)",
            name, PAGEALLOC_ABI_VERSION_MAJOR, PAGEALLOC_ABI_VERSION_MINOR,
            size, sizeof(T)));
      }
    }
  }
  std::memcpy(out, in, std::min(size, sizeof(T)));
  out->struct_size = sizeof(T);
  return absl::OkStatus();
}

// Writes `value` into a caller's structure of `struct_size` bytes: the
// fields that fit, and zeros past ours (fields of a later header that this
// library does not know, left at their zero defaults).
template <typename T>
void WriteVersioned(const T& value, size_t struct_size, T* out) {
  unsigned char* bytes = reinterpret_cast<unsigned char*>(out);
  std::memcpy(bytes, &value, std::min(struct_size, sizeof(T)));
  if (struct_size > sizeof(T)) {
    std::memset(bytes + sizeof(T), 0, struct_size - sizeof(T));
  }
}

// Fills `out` (the caller's struct_size bytes) with T's defaults: zeros,
// struct_size, then what `set_defaults` sets. Nothing when `out` is null.
template <typename T, typename SetDefaults>
void InitVersioned(T* out, size_t struct_size, SetDefaults set_defaults) {
  if (out == nullptr) return;
  T defaults;
  std::memset(&defaults, 0, sizeof(defaults));
  defaults.struct_size = struct_size;
  set_defaults(defaults);
  WriteVersioned(defaults, struct_size, out);
}

absl::Status CheckArray(const int64_t* data, size_t size, const char* name) {
  if (data == nullptr && size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is NULL with %d entries", name, size));
  }
  return absl::OkStatus();
}

absl::Span<const int64_t> Span(const int64_t* data, size_t size) {
  return size == 0 ? absl::Span<const int64_t>()
                   : absl::Span<const int64_t>(data, size);
}

absl::Status CheckClient(const pagealloc_client* client) {
  if (client == nullptr || client->client == nullptr) {
    return absl::InvalidArgumentError("client is NULL");
  }
  return absl::OkStatus();
}

void FillPool(const v1::PoolInfo& pool, pagealloc_pool_info* out) {
  std::memset(out, 0, sizeof(*out));
  out->page_size = pool.page_size();
  out->num_pages = pool.num_pages();
  out->backend = static_cast<int32_t>(pool.backend());
  out->gpu = pool.gpu();
  CopyString(pool.device_uuid(), out->device_uuid, sizeof(out->device_uuid));
  CopyString(pool.free_policy(), out->free_policy, sizeof(out->free_policy));
}

// Builds the handle of a successful call: the allocation and its view.
std::unique_ptr<pagealloc_allocation> MakeHandle(Allocation allocation) {
  auto handle = std::make_unique<pagealloc_allocation>();
  handle->allocation = std::move(allocation);
  const Allocation& a = handle->allocation;
  handle->messages.reserve(a.size());
  for (const std::string& message : a.messages()) {
    handle->messages.push_back(message.c_str());
  }
  pagealloc_allocation_view& view = handle->view;
  view.num_requests = static_cast<int64_t>(a.size());
  view.codes = a.codes().data();
  view.slots = a.slots().data();
  view.counts = a.counts().data();
  view.new_pages = a.new_pages().data();
  view.messages = handle->messages.data();
  view.ring_end = a.ring_end();
  view.pages_freed_first = a.pages_freed_first();
  view.batch_requests = a.batch_requests();
  view.on_device = a.on_device() ? 1 : 0;
  view.completion_value = a.completion_value();
  view.link_epoch = a.link_epoch();
  view.num_refused = a.num_refused();
  view.all_slots = a.all_slots();
  view.num_slots = a.num_slots();
  return handle;
}

// The common tail of the three allocation calls.
template <typename Call>
int32_t AllocCall(pagealloc_client* client,
                  const pagealloc_call_options* options,
                  pagealloc_allocation** allocation, pagealloc_error* error,
                  Call call) {
  return Guarded(error, [&]() -> absl::Status {
    if (allocation == nullptr) {
      return absl::InvalidArgumentError("allocation is NULL");
    }
    *allocation = nullptr;
    RETURN_IF_ERROR(CheckClient(client));
    pagealloc_call_options read;
    pagealloc_call_options_init(&read, sizeof(read));
    if (options != nullptr) {
      RETURN_IF_ERROR(ReadVersioned(options, "pagealloc_call_options", &read));
    }
    RETURN_IF_ERROR(CheckArray(read.free_pages_first, read.num_free_pages_first,
                               "options.free_pages_first"));
    CallOptions call_options;
    call_options.return_inline = read.return_inline != 0;
    call_options.async_completion = read.async_completion != 0;
    call_options.free_pages_first =
        Span(read.free_pages_first, read.num_free_pages_first);
    call_options.checkpoint_first = read.checkpoint_first != 0;
    call_options.all_or_nothing = read.all_or_nothing != 0;
    absl::StatusOr<Allocation> result = call(*client->client, call_options);
    if (!result.ok()) return result.status();
    *allocation = MakeHandle(*std::move(result)).release();
    return absl::OkStatus();
  });
}

absl::StatusOr<v1::FreeOrder> ReadFreeOrder(int32_t order) {
  if (order != PAGEALLOC_FREE_ORDER_DEFAULT &&
      order != PAGEALLOC_FREE_ORDER_ASCENDING &&
      order != PAGEALLOC_FREE_ORDER_FIRST_APPEARANCE) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "order (%d) is not a pagealloc_free_order (0, 1 or 2)", order));
  }
  return static_cast<v1::FreeOrder>(order);
}

// The most entries of each list one GetFreeLists may return.
constexpr int64_t kMaxFreeListPages = int64_t{1} << 20;

// Asks the daemon at `options` for its free lists and writes them into the
// caller's `lists`.
absl::Status GetFreeLists(const AdminOptions& options,
                          pagealloc_free_lists* lists) {
  if (lists == nullptr) return absl::InvalidArgumentError("lists is NULL");
  if (lists->struct_size < sizeof(pagealloc_free_lists)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "lists->struct_size (%d) is too small: fill the structure with "
        "pagealloc_free_lists_init",
        lists->struct_size));
  }
  pagealloc_free_lists read;
  pagealloc_free_lists_init(&read, sizeof(read));
  RETURN_IF_ERROR(ReadVersioned(lists, "pagealloc_free_lists", &read));
  if (read.free_capacity < 0 || read.parked_capacity < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "free_capacity (%d) and parked_capacity (%d) must not be negative",
        read.free_capacity, read.parked_capacity));
  }
  if ((read.free_pages == nullptr && read.free_capacity > 0) ||
      (read.parked_pages == nullptr && read.parked_capacity > 0)) {
    return absl::InvalidArgumentError(
        "free_pages or parked_pages is NULL with a capacity");
  }
  // At least one entry: 0 would ask for the daemon's default.
  const int64_t wanted = std::min(
      kMaxFreeListPages,
      std::max<int64_t>({1, read.free_capacity, read.parked_capacity}));
  ASSIGN_OR_RETURN(const v1::GetFreeListsResponse response,
                   GetDaemonFreeLists(options, wanted));
  read.num_free =
      std::min<int64_t>(read.free_capacity, response.free_pages_size());
  read.num_parked =
      std::min<int64_t>(read.parked_capacity, response.parked_pages_size());
  if (read.num_free > 0) {
    std::copy_n(response.free_pages().begin(), read.num_free, read.free_pages);
  }
  if (read.num_parked > 0) {
    std::copy_n(response.parked_pages().begin(), read.num_parked,
                read.parked_pages);
  }
  read.free_count = response.free_count();
  read.parked_count = response.parked_count();
  WriteVersioned(read, lists->struct_size, lists);
  return absl::OkStatus();
}

absl::StatusOr<AdminOptions> ReadAdminOptions(
    const pagealloc_admin_options* options) {
  if (options == nullptr) return absl::InvalidArgumentError("options is NULL");
  pagealloc_admin_options read;
  pagealloc_admin_options_init(&read, sizeof(read));
  RETURN_IF_ERROR(ReadVersioned(options, "pagealloc_admin_options", &read));
  if (read.timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "options.timeout_ms (%d) must be positive", read.timeout_ms));
  }
  AdminOptions admin;
  admin.target = read.target != nullptr ? read.target : "";
  admin.timeout = absl::Milliseconds(read.timeout_ms);
  return admin;
}

// The client's KV buffers (empty without a slab).
const std::vector<KvBuffer>& KvBuffers(const pagealloc_client* client) {
  static const std::vector<KvBuffer>* const kNone = new std::vector<KvBuffer>;
  if (client == nullptr || client->client == nullptr) return *kNone;
  return client->client->kv_buffers();
}

// The checks of the slab copies: a client with a slab, a sane size.
absl::StatusOr<const KvSlabView*> SlabFor(const pagealloc_client* client,
                                          const void* dst, const void* src,
                                          int64_t bytes) {
  RETURN_IF_ERROR(CheckClient(client));
  const KvSlabView* slab = client->client->kv_slab();
  if (slab == nullptr) {
    return absl::FailedPreconditionError(
        "this session has no KV slab (the daemon runs without --kv_layout, "
        "or map_kv_slab was off)");
  }
  if (bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("bytes (%d) is negative", bytes));
  }
  if (bytes > 0 && (dst == nullptr || src == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("dst or src is NULL with %d bytes", bytes));
  }
  return slab;
}

// Checks a caller's versioned output struct (its first member is
// `size_t struct_size`): not NULL, and large enough for that member.
template <typename Struct>
absl::Status CheckOutStruct(const Struct* out, const char* name,
                            const char* type) {
  if (out == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("%s is NULL", name));
  }
  if (out->struct_size < sizeof(size_t)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s->struct_size (%d) is too small: set it to "
                        "sizeof(%s)",
                        name, out->struct_size, type));
  }
  return absl::OkStatus();
}

// The four frees: `values` are slots (`pages` false) or pages, put back in
// `order` (a pagealloc_free_order; the default for the plain calls).
// Runs `call` on the client's Client and writes the value it returns to
// `out` (when not null): the shape of every C call that returns one number.
template <typename T, typename Call>
int32_t GuardedValue(pagealloc_client* client, T* out, pagealloc_error* error,
                     Call call) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    ASSIGN_OR_RETURN(const T value, call(*client->client));
    if (out != nullptr) *out = value;
    return absl::OkStatus();
  });
}

// The reserve's calls that write up to `max_pages` page ids and say how
// many (a peek, a take of what it holds): `fill` is the PageReserve call.
template <typename Fill>
int32_t GuardedReserveFill(pagealloc_reserve* reserve, int64_t* pages,
                           size_t max_pages, int64_t* count,
                           pagealloc_error* error, Fill fill) {
  return Guarded(error, [&]() -> absl::Status {
    if (reserve == nullptr) {
      return absl::InvalidArgumentError("reserve is NULL");
    }
    if (count == nullptr) return absl::InvalidArgumentError("count is NULL");
    RETURN_IF_ERROR(CheckArray(pages, max_pages, "pages"));
    *count = fill(*reserve->reserve, absl::MakeSpan(pages, max_pages));
    return absl::OkStatus();
  });
}

// How a free of the C ABI is fenced (the release fence).
struct FreeFence {
  bool on_stream = false;  // queue a release on `stream` first
  void* stream = nullptr;
  uint64_t release_value = 0;  // or carry this value (0: none)
};

int32_t FreeValues(pagealloc_client* client, const int64_t* values,
                   size_t count, bool pages, int32_t order,
                   int64_t* pages_freed, pagealloc_error* error,
                   FreeFence fence = {}) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    RETURN_IF_ERROR(CheckArray(values, count, pages ? "pages" : "slots"));
    ASSIGN_OR_RETURN(const pagealloc::v1::FreeOrder free_order,
                     pagealloc::ReadFreeOrder(order));
    pagealloc::Client& c = *client->client;
    if (fence.on_stream) {
      ASSIGN_OR_RETURN(fence.release_value, c.QueueRelease(fence.stream));
    }
    ASSIGN_OR_RETURN(const int64_t freed,
                     pages ? c.FreePagesAfter(Span(values, count),
                                              fence.release_value, free_order)
                           : c.FreeSlotsAfter(Span(values, count),
                                              fence.release_value, free_order));
    if (pages_freed != nullptr) *pages_freed = freed;
    return absl::OkStatus();
  });
}

// pagealloc_reserve_put, its stream-fenced form and pagealloc_reserve_put_under
// (`under`: under the pages the reserve holds).
int32_t PutPages(pagealloc_reserve* reserve, const int64_t* pages, size_t n,
                 bool on_stream, void* stream, bool under,
                 pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    if (reserve == nullptr) {
      return absl::InvalidArgumentError("reserve is NULL");
    }
    RETURN_IF_ERROR(CheckArray(pages, n, "pages"));
    const absl::Span<const int64_t> span = absl::MakeConstSpan(pages, n);
    PageReserve& to = *reserve->reserve;
    if (under) return on_stream ? to.PutUnder(span, stream) : to.PutUnder(span);
    return on_stream ? to.Put(span, stream) : to.Put(span);
  });
}

}  // namespace
}  // namespace pagealloc

using pagealloc::CheckArray;
using pagealloc::CheckClient;
using pagealloc::CheckOutStruct;
using pagealloc::FreeValues;
using pagealloc::Guarded;
using pagealloc::GuardedReserveFill;
using pagealloc::PutPages;
using pagealloc::Span;

namespace pagealloc {
namespace {

// `count` keys of PAGEALLOC_PREFIX_KEY_BYTES at `bytes`, as strings.
absl::StatusOr<std::vector<std::string>> KeysFromBytes(const uint8_t* bytes,
                                                       size_t count) {
  if (count > 0 && bytes == nullptr) {
    return absl::InvalidArgumentError("keys is NULL");
  }
  std::vector<std::string> keys;
  keys.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    keys.emplace_back(
        reinterpret_cast<const char*>(bytes) + i * PAGEALLOC_PREFIX_KEY_BYTES,
        PAGEALLOC_PREFIX_KEY_BYTES);
  }
  return keys;
}

}  // namespace
}  // namespace pagealloc

extern "C" {

uint32_t pagealloc_abi_version(void) { return PAGEALLOC_ABI_VERSION; }

const char* pagealloc_version(void) { return pagealloc::kPageallocVersion; }

const char* pagealloc_status_code_name(int32_t code) {
  if (code < 0 || code > PAGEALLOC_UNAUTHENTICATED) return "UNKNOWN_CODE";
  // absl's names are gRPC's spelling, the ones the daemon's metrics use;
  // they are copied once into strings that live as long as the process, as
  // the C ABI promises.
  static const auto* const names = [] {
    auto* names = new std::array<std::string, PAGEALLOC_UNAUTHENTICATED + 1>;
    for (size_t c = 0; c < names->size(); ++c) {
      (*names)[c] = absl::StatusCodeToString(static_cast<absl::StatusCode>(c));
    }
    return names;
  }();
  return (*names)[code].c_str();
}

void pagealloc_client_options_init(pagealloc_client_options* options,
                                   size_t struct_size) {
  pagealloc::InitVersioned(options, struct_size,
                           [](pagealloc_client_options& defaults) {
                             defaults.call_timeout_ms = 30000;
                             defaults.fast_channel = 1;
                             defaults.fast_channel_spin_us = 500;
                             defaults.map_kv_slab = 1;
                             defaults.reconnect_timeout_ms = -1;
                             defaults.reconnect_initial_backoff_ms = 50;
                             defaults.reconnect_max_backoff_ms = 1000;
                           });
}

void pagealloc_call_options_init(pagealloc_call_options* options,
                                 size_t struct_size) {
  pagealloc::InitVersioned(options, struct_size,
                           [](pagealloc_call_options&) {});
}

}  // extern "C"

namespace pagealloc {
namespace {

// The client options the C structure gives (its struct_size's fields).
absl::StatusOr<ClientOptions> ReadClientOptions(
    const pagealloc_client_options* options) {
  if (options == nullptr) {
    return absl::InvalidArgumentError("options is NULL");
  }
  pagealloc_client_options read;
  pagealloc_client_options_init(&read, sizeof(read));
  RETURN_IF_ERROR(ReadVersioned(options, "pagealloc_client_options", &read));
  if (read.call_timeout_ms <= 0 || read.keepalive_interval_ms < 0 ||
      read.fast_channel_spin_us < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "options: call_timeout_ms (%d) must be positive, "
        "keepalive_interval_ms (%d) and fast_channel_spin_us (%d) not "
        "negative",
        read.call_timeout_ms, read.keepalive_interval_ms,
        read.fast_channel_spin_us));
  }
  if (read.reconnect_timeout_ms < -1 ||
      read.reconnect_initial_backoff_ms <= 0 ||
      read.reconnect_max_backoff_ms < read.reconnect_initial_backoff_ms) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "options: reconnect_timeout_ms (%d) must be -1 (automatic), 0 (off) "
        "or positive, and 0 < reconnect_initial_backoff_ms (%d) <= "
        "reconnect_max_backoff_ms (%d)",
        read.reconnect_timeout_ms, read.reconnect_initial_backoff_ms,
        read.reconnect_max_backoff_ms));
  }
  ClientOptions client_options;
  client_options.target = read.target != nullptr ? read.target : "";
  client_options.client_name =
      read.client_name != nullptr ? read.client_name : "";
  client_options.ring_capacity_slots = read.ring_capacity_slots;
  client_options.quota_pages = read.quota_pages;
  client_options.keepalive_interval =
      absl::Milliseconds(read.keepalive_interval_ms);
  client_options.call_timeout = absl::Milliseconds(read.call_timeout_ms);
  client_options.fast_channel = read.fast_channel != 0;
  client_options.fast_channel_spin =
      absl::Microseconds(read.fast_channel_spin_us);
  if (read.register_secret == nullptr && read.register_secret_length != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("options.register_secret is NULL with a length of %d",
                        read.register_secret_length));
  }
  if (read.register_secret != nullptr) {
    client_options.register_secret.assign(read.register_secret,
                                          read.register_secret_length);
  }
  client_options.map_kv_slab = read.map_kv_slab != 0;
  client_options.resumable = read.resumable != 0;
  client_options.reconnect_timeout =
      read.reconnect_timeout_ms < 0
          ? ClientOptions::kReconnectIfStateKept
          : absl::Milliseconds(read.reconnect_timeout_ms);
  client_options.reconnect_initial_backoff =
      absl::Milliseconds(read.reconnect_initial_backoff_ms);
  client_options.reconnect_max_backoff =
      absl::Milliseconds(read.reconnect_max_backoff_ms);
  return client_options;
}

// The handle of a client that connected or resumed.
absl::Status MakeClientHandle(absl::StatusOr<std::unique_ptr<Client>> connected,
                              std::string target, pagealloc_client** client) {
  if (!connected.ok()) return connected.status();
  auto handle = std::make_unique<pagealloc_client>();
  handle->client = *std::move(connected);
  handle->target = std::move(target);
  *client = handle.release();
  return absl::OkStatus();
}

}  // namespace
}  // namespace pagealloc

extern "C" {

int32_t pagealloc_connect(const pagealloc_client_options* options,
                          pagealloc_client** client, pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    if (client == nullptr) return absl::InvalidArgumentError("client is NULL");
    *client = nullptr;
    ASSIGN_OR_RETURN(pagealloc::ClientOptions client_options,
                     pagealloc::ReadClientOptions(options));
    return pagealloc::MakeClientHandle(
        pagealloc::Client::Connect(client_options), client_options.target,
        client);
  });
}

int32_t pagealloc_resume(const pagealloc_client_options* options,
                         uint64_t session_id, const char* token,
                         size_t token_length, int32_t take_over,
                         pagealloc_client** client, pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    if (client == nullptr) return absl::InvalidArgumentError("client is NULL");
    *client = nullptr;
    if (token == nullptr && token_length != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("token is NULL with a length of %d", token_length));
    }
    ASSIGN_OR_RETURN(pagealloc::ClientOptions client_options,
                     pagealloc::ReadClientOptions(options));
    return pagealloc::MakeClientHandle(
        pagealloc::Client::Resume(
            client_options, session_id,
            token != nullptr ? std::string(token, token_length) : "",
            take_over != 0),
        client_options.target, client);
  });
}

int32_t pagealloc_detach(pagealloc_client* client, pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    return client->client->Detach();
  });
}

int32_t pagealloc_session_resumable(const pagealloc_client* client) {
  return client != nullptr && client->client->resumable() ? 1 : 0;
}

uint64_t pagealloc_link_epoch(const pagealloc_client* client) {
  return client != nullptr ? client->client->link_epoch() : 0;
}

uint64_t pagealloc_calls_sent_again(const pagealloc_client* client) {
  return client != nullptr
             ? static_cast<uint64_t>(client->client->calls_sent_again())
             : 0;
}

int32_t pagealloc_reconnecting(const pagealloc_client* client) {
  return client != nullptr && client->client->reconnecting() ? 1 : 0;
}

int32_t pagealloc_close(pagealloc_client* client, pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    return client->client->Close();
  });
}

void pagealloc_client_destroy(pagealloc_client* client) {
  try {
    delete client;
  } catch (...) {
    // A destructor that throws has nowhere to report to; the handle is gone.
  }
}

int32_t pagealloc_session_status(const pagealloc_client* client,
                                 pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    return client->client->session_status();
  });
}

uint64_t pagealloc_session_id(const pagealloc_client* client) {
  return client != nullptr ? client->client->session_id() : 0;
}

const char* pagealloc_session_token(const pagealloc_client* client,
                                    size_t* length) {
  if (client == nullptr) {
    if (length != nullptr) *length = 0;
    return "";
  }
  const std::string& token = client->client->session_token();
  if (length != nullptr) *length = token.size();
  return token.data();
}

int64_t pagealloc_lease_ms(const pagealloc_client* client) {
  return client != nullptr ? client->client->lease_ms() : 0;
}

int32_t pagealloc_uses_fast_channel(const pagealloc_client* client) {
  return client != nullptr && client->client->uses_fast_channel() ? 1 : 0;
}

void pagealloc_pool(const pagealloc_client* client, pagealloc_pool_info* pool) {
  if (pool == nullptr) return;
  if (client == nullptr) {
    std::memset(pool, 0, sizeof(*pool));
    return;
  }
  pagealloc::FillPool(client->client->pool(), pool);
}

const char* pagealloc_pool_semantics(const pagealloc_client* client) {
  if (client == nullptr) return "";
  return client->client->pool().semantics().c_str();
}

const int64_t* pagealloc_ring(const pagealloc_client* client,
                              int64_t* capacity_slots, int32_t* on_device) {
  if (capacity_slots != nullptr) *capacity_slots = 0;
  if (on_device != nullptr) *on_device = 0;
  if (client == nullptr) return nullptr;
  if (capacity_slots != nullptr) {
    *capacity_slots = client->client->ring_capacity_slots();
  }
  if (on_device != nullptr) {
    *on_device = client->client->ring_on_device() ? 1 : 0;
  }
  return client->client->ring_slots();
}

int32_t pagealloc_alloc_extend(pagealloc_client* client,
                               const int64_t* prefix_lens,
                               size_t num_prefix_lens, const int64_t* seq_lens,
                               size_t num_seq_lens, const int64_t* last_locs,
                               size_t num_last_locs,
                               const pagealloc_call_options* options,
                               pagealloc_allocation** allocation,
                               pagealloc_error* error) {
  return pagealloc::AllocCall(
      client, options, allocation, error,
      [&](pagealloc::Client& c, const pagealloc::CallOptions& call_options)
          -> absl::StatusOr<pagealloc::Allocation> {
        RETURN_IF_ERROR(
            CheckArray(prefix_lens, num_prefix_lens, "prefix_lens"));
        RETURN_IF_ERROR(CheckArray(seq_lens, num_seq_lens, "seq_lens"));
        RETURN_IF_ERROR(CheckArray(last_locs, num_last_locs, "last_locs"));
        return c.AllocExtend(Span(prefix_lens, num_prefix_lens),
                             Span(seq_lens, num_seq_lens),
                             Span(last_locs, num_last_locs), call_options);
      });
}

int32_t pagealloc_alloc_decode(pagealloc_client* client,
                               const int64_t* seq_lens, size_t num_seq_lens,
                               const int64_t* last_locs, size_t num_last_locs,
                               const pagealloc_call_options* options,
                               pagealloc_allocation** allocation,
                               pagealloc_error* error) {
  return pagealloc::AllocCall(
      client, options, allocation, error,
      [&](pagealloc::Client& c, const pagealloc::CallOptions& call_options)
          -> absl::StatusOr<pagealloc::Allocation> {
        RETURN_IF_ERROR(CheckArray(seq_lens, num_seq_lens, "seq_lens"));
        RETURN_IF_ERROR(CheckArray(last_locs, num_last_locs, "last_locs"));
        return c.AllocDecode(Span(seq_lens, num_seq_lens),
                             Span(last_locs, num_last_locs), call_options);
      });
}

int32_t pagealloc_alloc(pagealloc_client* client, const int64_t* num_tokens,
                        size_t num_requests,
                        const pagealloc_call_options* options,
                        pagealloc_allocation** allocation,
                        pagealloc_error* error) {
  return pagealloc::AllocCall(
      client, options, allocation, error,
      [&](pagealloc::Client& c, const pagealloc::CallOptions& call_options)
          -> absl::StatusOr<pagealloc::Allocation> {
        RETURN_IF_ERROR(CheckArray(num_tokens, num_requests, "num_tokens"));
        return c.Alloc(Span(num_tokens, num_requests), call_options);
      });
}

const pagealloc_allocation_view* pagealloc_allocation_get_view(
    const pagealloc_allocation* allocation) {
  return allocation != nullptr ? &allocation->view : nullptr;
}

int32_t pagealloc_allocation_status(const pagealloc_allocation* allocation,
                                    pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    if (allocation == nullptr) {
      return absl::InvalidArgumentError("allocation is NULL");
    }
    return allocation->allocation.status();
  });
}

void pagealloc_allocation_destroy(pagealloc_allocation* allocation) {
  delete allocation;
}

void pagealloc_release(pagealloc_client* client,
                       const pagealloc_allocation* allocation) {
  if (client == nullptr || allocation == nullptr) return;
  client->client->Release(allocation->allocation);
}

int32_t pagealloc_flush_release(pagealloc_client* client,
                                pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    return client->client->FlushRelease();
  });
}

int32_t pagealloc_order_after_completion(const pagealloc_client* client,
                                         void* cuda_stream,
                                         pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    return client->client->OrderAfterCompletion(cuda_stream);
  });
}

int32_t pagealloc_order_after(const pagealloc_client* client,
                              const pagealloc_allocation* allocation,
                              void* cuda_stream, pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    if (allocation == nullptr) {
      return absl::InvalidArgumentError("allocation is NULL");
    }
    return client->client->OrderAfter(allocation->allocation, cuda_stream);
  });
}

int32_t pagealloc_copy_to_host(const pagealloc_client* client,
                               const int64_t* slots, int64_t count,
                               int64_t* out, pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    if (count < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("count (%d) is negative", count));
    }
    if (count == 0) return absl::OkStatus();
    if (slots == nullptr || out == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("slots or out is NULL with a count of %d", count));
    }
    return client->client->CopyToHost(slots, count, out);
  });
}

int32_t pagealloc_free_slots(pagealloc_client* client, const int64_t* slots,
                             size_t num_slots, int64_t* pages_freed,
                             pagealloc_error* error) {
  return FreeValues(client, slots, num_slots, /*pages=*/false,
                    PAGEALLOC_FREE_ORDER_DEFAULT, pages_freed, error);
}

int32_t pagealloc_free_pages(pagealloc_client* client, const int64_t* pages,
                             size_t num_pages, int64_t* pages_freed,
                             pagealloc_error* error) {
  return FreeValues(client, pages, num_pages, /*pages=*/true,
                    PAGEALLOC_FREE_ORDER_DEFAULT, pages_freed, error);
}

int32_t pagealloc_free_slots_in_order(pagealloc_client* client,
                                      const int64_t* slots, size_t num_slots,
                                      int32_t order, int64_t* pages_freed,
                                      pagealloc_error* error) {
  return FreeValues(client, slots, num_slots, /*pages=*/false, order,
                    pages_freed, error);
}

int32_t pagealloc_free_pages_in_order(pagealloc_client* client,
                                      const int64_t* pages, size_t num_pages,
                                      int32_t order, int64_t* pages_freed,
                                      pagealloc_error* error) {
  return FreeValues(client, pages, num_pages, /*pages=*/true, order,
                    pages_freed, error);
}

int32_t pagealloc_queue_release(pagealloc_client* client, void* cuda_stream,
                                uint64_t* release_value,
                                pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    ASSIGN_OR_RETURN(const uint64_t value,
                     client->client->QueueRelease(cuda_stream));
    if (release_value != nullptr) *release_value = value;
    return absl::OkStatus();
  });
}

int32_t pagealloc_free_slots_on_stream(pagealloc_client* client,
                                       const int64_t* slots, size_t num_slots,
                                       int32_t order, void* cuda_stream,
                                       int64_t* pages_freed,
                                       pagealloc_error* error) {
  return FreeValues(client, slots, num_slots, /*pages=*/false, order,
                    pages_freed, error, {true, cuda_stream, 0});
}

int32_t pagealloc_free_pages_on_stream(pagealloc_client* client,
                                       const int64_t* pages, size_t num_pages,
                                       int32_t order, void* cuda_stream,
                                       int64_t* pages_freed,
                                       pagealloc_error* error) {
  return FreeValues(client, pages, num_pages, /*pages=*/true, order,
                    pages_freed, error, {true, cuda_stream, 0});
}

int32_t pagealloc_free_pages_after(pagealloc_client* client,
                                   const int64_t* pages, size_t num_pages,
                                   int32_t order, uint64_t release_value,
                                   int64_t* pages_freed,
                                   pagealloc_error* error) {
  return FreeValues(client, pages, num_pages, /*pages=*/true, order,
                    pages_freed, error, {false, nullptr, release_value});
}

int32_t pagealloc_checkpoint_id(pagealloc_client* client,
                                uint64_t* checkpoint_id,
                                pagealloc_error* error) {
  return pagealloc::GuardedValue(
      client, checkpoint_id, error,
      [](pagealloc::Client& c) { return c.CheckpointId(); });
}

int32_t pagealloc_rollback_to(pagealloc_client* client, uint64_t checkpoint_id,
                              int64_t* pages_returned, pagealloc_error* error) {
  return pagealloc::GuardedValue(client, pages_returned, error,
                                 [checkpoint_id](pagealloc::Client& c) {
                                   return c.Rollback(checkpoint_id);
                                 });
}

int32_t pagealloc_clear_session(pagealloc_client* client, int64_t* pages_freed,
                                pagealloc_error* error) {
  return pagealloc::GuardedValue(
      client, pages_freed, error,
      [](pagealloc::Client& c) { return c.ClearSession(); });
}

int32_t pagealloc_list_pages(pagealloc_client* client, int64_t* pages,
                             size_t capacity, size_t* count,
                             pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    if (count == nullptr || (pages == nullptr && capacity > 0)) {
      return absl::InvalidArgumentError(
          "pagealloc_list_pages: count is NULL, or pages is NULL with a "
          "capacity");
    }
    ASSIGN_OR_RETURN(const std::vector<int64_t> owned,
                     client->client->ListPages());
    *count = owned.size();
    if (owned.size() > capacity) {
      return absl::OutOfRangeError(absl::StrFormat(
          "pagealloc_list_pages: the session owns %d pages, room for %d",
          owned.size(), capacity));
    }
    std::copy(owned.begin(), owned.end(), pages);
    return absl::OkStatus();
  });
}

int32_t pagealloc_checkpoint(pagealloc_client* client, pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    return client->client->Checkpoint();
  });
}

int32_t pagealloc_rollback(pagealloc_client* client, int64_t* pages_returned,
                           pagealloc_error* error) {
  return pagealloc::GuardedValue(
      client, pages_returned, error,
      [](pagealloc::Client& c) { return c.Rollback(); });
}

int32_t pagealloc_get_stats(pagealloc_client* client, pagealloc_stats* stats,
                            pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    RETURN_IF_ERROR(CheckOutStruct(stats, "stats", "pagealloc_stats"));
    const size_t size = stats->struct_size;
    ASSIGN_OR_RETURN(const pagealloc::v1::GetStatsResponse response,
                     client->client->GetStats(/*include_sessions=*/false));
    pagealloc_stats out;
    std::memset(&out, 0, sizeof(out));
    pagealloc::FillPool(response.pool(), &out.pool);
    out.free_pages = response.free_pages();
    out.parked_pages = response.parked_pages();
    out.used_pages = response.used_pages();
    out.slots_allocated_total = response.slots_allocated_total();
    out.pages_allocated_total = response.pages_allocated_total();
    out.pages_freed_total = response.pages_freed_total();
    out.out_of_pages_total = response.out_of_pages_total();
    out.free_list_sorts_total = response.free_list_sorts_total();
    out.launches_total = response.launches_total();
    out.sessions_active = response.sessions_active();
    pagealloc::CopyString(response.pool().semantics(), out.semantics,
                          sizeof(out.semantics));
    const pagealloc::v1::PrefixStats& prefix = response.prefix();
    out.prefix_published_pages = prefix.published_pages();
    out.prefix_cached_pages = prefix.cached_pages();
    out.prefix_pinned_pages = prefix.pinned_pages();
    out.prefix_evictable_pages = prefix.evictable_pages();
    out.prefix_lookup_pages_total = prefix.lookup_pages_total();
    out.prefix_hit_pages_total = prefix.hit_pages_total();
    // An older caller's smaller structure gets the fields it knows.
    out.struct_size = std::min(size, sizeof(out));
    std::memcpy(stats, &out, out.struct_size);
    return absl::OkStatus();
  });
}

void pagealloc_free_lists_init(pagealloc_free_lists* lists,
                               size_t struct_size) {
  pagealloc::InitVersioned(lists, struct_size, [](pagealloc_free_lists&) {});
}

void pagealloc_admin_options_init(pagealloc_admin_options* options,
                                  size_t struct_size) {
  pagealloc::InitVersioned(
      options, struct_size,
      [](pagealloc_admin_options& defaults) { defaults.timeout_ms = 5000; });
}

int32_t pagealloc_get_free_lists(const pagealloc_client* client,
                                 pagealloc_free_lists* lists,
                                 pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    pagealloc::AdminOptions options;
    options.target = client->target;
    return pagealloc::GetFreeLists(options, lists);
  });
}

int32_t pagealloc_admin_get_free_lists(const pagealloc_admin_options* options,
                                       pagealloc_free_lists* lists,
                                       pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const pagealloc::AdminOptions admin,
                     pagealloc::ReadAdminOptions(options));
    return pagealloc::GetFreeLists(admin, lists);
  });
}

int32_t pagealloc_admin_clear_pool(const pagealloc_admin_options* options,
                                   int32_t force, int64_t* pages_freed,
                                   pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const pagealloc::AdminOptions admin,
                     pagealloc::ReadAdminOptions(options));
    ASSIGN_OR_RETURN(const int64_t freed,
                     pagealloc::ClearDaemonPool(admin, force != 0));
    if (pages_freed != nullptr) *pages_freed = freed;
    return absl::OkStatus();
  });
}

int64_t pagealloc_kv_buffer_count(const pagealloc_client* client) {
  return static_cast<int64_t>(pagealloc::KvBuffers(client).size());
}

int32_t pagealloc_kv_buffer_get(const pagealloc_client* client, int64_t index,
                                pagealloc_kv_buffer* buffer,
                                pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    RETURN_IF_ERROR(CheckOutStruct(buffer, "buffer", "pagealloc_kv_buffer"));
    const size_t size = buffer->struct_size;
    const std::vector<pagealloc::KvBuffer>& buffers =
        pagealloc::KvBuffers(client);
    if (index < 0 || index >= static_cast<int64_t>(buffers.size())) {
      return absl::OutOfRangeError(absl::StrFormat(
          "KV buffer index %d is outside [0, %d)", index, buffers.size()));
    }
    const pagealloc::KvBuffer& b = buffers[index];
    pagealloc_kv_buffer out;
    std::memset(&out, 0, sizeof(out));
    out.name = b.name.c_str();
    // KvDtypeName returns a view of a string literal: NUL-terminated.
    out.dtype = pagealloc::KvDtypeName(b.dtype).data();
    out.dtype_bytes = pagealloc::KvDtypeBytes(b.dtype);
    out.num_slots = b.num_slots;
    out.stride_bytes = b.stride_bytes;
    out.data = b.data;
    out.on_device = b.on_device ? 1 : 0;
    out.device = b.device;
    out.element_shape = b.element_shape.data();
    out.rank = static_cast<int64_t>(b.element_shape.size());
    out.struct_size = std::min(size, sizeof(out));
    pagealloc::WriteVersioned(out, size, buffer);
    return absl::OkStatus();
  });
}

int64_t pagealloc_kv_buffer_find(const pagealloc_client* client,
                                 const char* name) {
  if (name == nullptr) return -1;
  const std::vector<pagealloc::KvBuffer>& buffers =
      pagealloc::KvBuffers(client);
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].name == name) return static_cast<int64_t>(i);
  }
  return -1;
}

void* pagealloc_kv_slab(const pagealloc_client* client, int64_t* bytes,
                        int32_t* on_device) {
  if (bytes != nullptr) *bytes = 0;
  if (on_device != nullptr) *on_device = 0;
  if (client == nullptr || client->client == nullptr) return nullptr;
  const pagealloc::KvSlabView* slab = client->client->kv_slab();
  if (slab == nullptr) return nullptr;
  if (bytes != nullptr) *bytes = slab->bytes();
  if (on_device != nullptr) *on_device = slab->on_device() ? 1 : 0;
  return slab->data();
}

int32_t pagealloc_kv_copy_to_slab(const pagealloc_client* client, void* dst,
                                  const void* src, int64_t bytes,
                                  pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const pagealloc::KvSlabView* slab,
                     pagealloc::SlabFor(client, dst, src, bytes));
    if (bytes == 0) return absl::OkStatus();
    return slab->CopyToSlab(dst, src, bytes);
  });
}

int32_t pagealloc_kv_copy_from_slab(const pagealloc_client* client, void* dst,
                                    const void* src, int64_t bytes,
                                    pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const pagealloc::KvSlabView* slab,
                     pagealloc::SlabFor(client, dst, src, bytes));
    if (bytes == 0) return absl::OkStatus();
    return slab->CopyFromSlab(dst, src, bytes);
  });
}

}  // extern "C"

void pagealloc_reserve_options_init(pagealloc_reserve_options* options,
                                    size_t struct_size) {
  if (options == nullptr) return;
  const pagealloc::PageReserveOptions cpp;
  pagealloc_reserve_options defaults;
  std::memset(&defaults, 0, sizeof(defaults));
  defaults.struct_size = struct_size;
  defaults.initial_batch = cpp.initial_batch;
  defaults.max_pages = cpp.max_pages;
  defaults.tick_us = absl::ToInt64Microseconds(cpp.tick);
  defaults.idle_ticks = cpp.idle_ticks;
  defaults.starved_wait_us = absl::ToInt64Microseconds(cpp.starved_wait);
  pagealloc::WriteVersioned(defaults, struct_size, options);
}

int32_t pagealloc_reserve_create(pagealloc_client* client,
                                 const pagealloc_reserve_options* options,
                                 pagealloc_reserve** reserve,
                                 pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    if (reserve == nullptr) {
      return absl::InvalidArgumentError("reserve is NULL");
    }
    pagealloc_reserve_options in;
    pagealloc_reserve_options_init(&in, sizeof(in));
    if (options != nullptr) {
      RETURN_IF_ERROR(
          pagealloc::ReadVersioned(options, "pagealloc_reserve_options", &in));
    }
    pagealloc::PageReserveOptions cpp;
    cpp.initial_batch = in.initial_batch;
    cpp.max_pages = in.max_pages;
    cpp.tick = absl::Microseconds(in.tick_us);
    cpp.idle_ticks = in.idle_ticks;
    cpp.starved_wait = absl::Microseconds(in.starved_wait_us);
    ASSIGN_OR_RETURN(std::unique_ptr<pagealloc::PageReserve> made,
                     pagealloc::PageReserve::Create(client->client.get(), cpp));
    *reserve = new pagealloc_reserve;
    (*reserve)->reserve = std::move(made);
    (*reserve)->client = client->client.get();
    return absl::OkStatus();
  });
}

void pagealloc_reserve_destroy(pagealloc_reserve* reserve) { delete reserve; }

int32_t pagealloc_reserve_take(pagealloc_reserve* reserve, int64_t n,
                               int64_t* pages, pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    if (reserve == nullptr) {
      return absl::InvalidArgumentError("reserve is NULL");
    }
    if (pages == nullptr && n != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("pages is NULL with %d entries", n));
    }
    return reserve->reserve->Take(n, pages);
  });
}

int32_t pagealloc_reserve_peek(pagealloc_reserve* reserve, int64_t* pages,
                               size_t max_pages, int64_t* count,
                               pagealloc_error* error) {
  return GuardedReserveFill(
      reserve, pages, max_pages, count, error,
      [](const pagealloc::PageReserve& r, absl::Span<int64_t> out) {
        return r.Peek(out);
      });
}

int32_t pagealloc_reserve_take_held(pagealloc_reserve* reserve, int64_t* pages,
                                    size_t max_pages, int64_t* count,
                                    pagealloc_error* error) {
  return GuardedReserveFill(
      reserve, pages, max_pages, count, error,
      [](pagealloc::PageReserve& r, absl::Span<int64_t> out) {
        return r.TakeHeld(out);
      });
}

int32_t pagealloc_reserve_put(pagealloc_reserve* reserve, const int64_t* pages,
                              size_t n, pagealloc_error* error) {
  return PutPages(reserve, pages, n, /*on_stream=*/false, nullptr,
                  /*under=*/false, error);
}

int32_t pagealloc_reserve_put_on_stream(pagealloc_reserve* reserve,
                                        const int64_t* pages, size_t n,
                                        void* cuda_stream,
                                        pagealloc_error* error) {
  return PutPages(reserve, pages, n, /*on_stream=*/true, cuda_stream,
                  /*under=*/false, error);
}

int32_t pagealloc_reserve_put_under(pagealloc_reserve* reserve,
                                    const int64_t* pages, size_t n,
                                    void* cuda_stream, int32_t fence,
                                    pagealloc_error* error) {
  return PutPages(reserve, pages, n, /*on_stream=*/fence != 0, cuda_stream,
                  /*under=*/true, error);
}

int32_t pagealloc_reserve_get_stats(const pagealloc_reserve* reserve,
                                    pagealloc_reserve_stats* stats,
                                    pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    if (reserve == nullptr) {
      return absl::InvalidArgumentError("reserve is NULL");
    }
    RETURN_IF_ERROR(
        pagealloc::CheckOutStruct(stats, "stats", "pagealloc_reserve_stats"));
    const pagealloc::PageReserveStats cpp = reserve->reserve->stats();
    pagealloc_reserve_stats out;
    std::memset(&out, 0, sizeof(out));
    out.pages = cpp.pages;
    out.handed_out = cpp.handed_out;
    out.batch = cpp.batch;
    out.refills = cpp.refills;
    out.pages_refilled = cpp.pages_refilled;
    out.returns = cpp.returns;
    out.pages_returned = cpp.pages_returned;
    out.reclaims = cpp.reclaims;
    out.sync_refills = cpp.sync_refills;
    out.takes = cpp.takes;
    out.refills_refused = cpp.refills_refused;
    out.refills_backed_off = cpp.refills_backed_off;
    const size_t size = stats->struct_size;
    out.struct_size = std::min(size, sizeof(out));
    pagealloc::WriteVersioned(out, size, stats);
    return absl::OkStatus();
  });
}

namespace pagealloc {
namespace {

// The expander of `reserve` for `memory`, made on first use.
absl::StatusOr<LocalExpander*> ExpanderFor(pagealloc_reserve* reserve,
                                           int32_t memory)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(reserve->mu) {
  if (memory != PAGEALLOC_MEMORY_HOST && memory != PAGEALLOC_MEMORY_DEVICE) {
    return absl::InvalidArgumentError(
        absl::StrFormat("memory (%d) is neither PAGEALLOC_MEMORY_HOST (0) nor "
                        "PAGEALLOC_MEMORY_DEVICE (1)",
                        memory));
  }
  std::unique_ptr<LocalExpander>& expander = reserve->expanders[memory];
  if (expander == nullptr) {
    LocalExpanderOptions options;
    options.memory = memory == PAGEALLOC_MEMORY_DEVICE
                         ? ExpansionMemory::kDevice
                         : ExpansionMemory::kHost;
    ASSIGN_OR_RETURN(expander,
                     LocalExpander::Create(*reserve->client,
                                           reserve->reserve.get(), options));
  }
  return expander.get();
}

// Runs `call` on the reserve's expander for `memory` and stores the slots
// it wrote in `*num_slots` (when not NULL).
template <typename Call>
int32_t Expand(pagealloc_reserve* reserve, int32_t memory, int64_t* num_slots,
               pagealloc_error* error, Call call) {
  return Guarded(error, [&]() -> absl::Status {
    if (reserve == nullptr) {
      return absl::InvalidArgumentError("reserve is NULL");
    }
    absl::MutexLock lock(&reserve->mu);
    ASSIGN_OR_RETURN(LocalExpander * expander, ExpanderFor(reserve, memory));
    ASSIGN_OR_RETURN(const int64_t slots, call(*expander));
    if (num_slots != nullptr) *num_slots = slots;
    return absl::OkStatus();
  });
}

}  // namespace
}  // namespace pagealloc

extern "C" {

int32_t pagealloc_reserve_alloc_extend(pagealloc_reserve* reserve,
                                       int32_t memory, size_t n,
                                       const int64_t* prefix_lens,
                                       const int64_t* seq_lens,
                                       const int64_t* last_loc, int64_t* out,
                                       void* stream, int64_t* num_slots,
                                       pagealloc_error* error) {
  return pagealloc::Expand(
      reserve, memory, num_slots, error,
      [&](pagealloc::LocalExpander& expander) -> absl::StatusOr<int64_t> {
        RETURN_IF_ERROR(pagealloc::CheckArray(prefix_lens, n, "prefix_lens"));
        RETURN_IF_ERROR(pagealloc::CheckArray(seq_lens, n, "seq_lens"));
        return expander.AllocExtend(absl::MakeConstSpan(prefix_lens, n),
                                    absl::MakeConstSpan(seq_lens, n), last_loc,
                                    out, stream);
      });
}

int32_t pagealloc_reserve_alloc_decode(pagealloc_reserve* reserve,
                                       int32_t memory, size_t n,
                                       const int64_t* seq_lens,
                                       const int64_t* last_loc, int64_t* out,
                                       void* stream, int64_t* num_slots,
                                       pagealloc_error* error) {
  return pagealloc::Expand(
      reserve, memory, num_slots, error,
      [&](pagealloc::LocalExpander& expander) -> absl::StatusOr<int64_t> {
        RETURN_IF_ERROR(pagealloc::CheckArray(seq_lens, n, "seq_lens"));
        return expander.AllocDecode(absl::MakeConstSpan(seq_lens, n), last_loc,
                                    out, stream);
      });
}

int32_t pagealloc_reserve_last_expansion_pages(pagealloc_reserve* reserve,
                                               int32_t memory, int64_t* pages,
                                               size_t capacity, int64_t* count,
                                               pagealloc_error* error) {
  return pagealloc::Guarded(error, [&]() -> absl::Status {
    if (reserve == nullptr) {
      return absl::InvalidArgumentError("reserve is NULL");
    }
    if (count == nullptr) return absl::InvalidArgumentError("count is NULL");
    RETURN_IF_ERROR(pagealloc::CheckArray(pages, capacity, "pages"));
    if (memory != PAGEALLOC_MEMORY_HOST && memory != PAGEALLOC_MEMORY_DEVICE) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "memory (%d) is neither PAGEALLOC_MEMORY_HOST (0) nor "
          "PAGEALLOC_MEMORY_DEVICE (1)",
          memory));
    }
    absl::MutexLock lock(&reserve->mu);
    const std::unique_ptr<pagealloc::LocalExpander>& expander =
        reserve->expanders[memory];
    // No expander of that memory yet: no call has taken pages.
    const absl::Span<const int64_t> last = expander == nullptr
                                               ? absl::Span<const int64_t>()
                                               : expander->last_pages();
    std::copy_n(last.begin(), std::min(last.size(), capacity), pages);
    *count = static_cast<int64_t>(last.size());
    return absl::OkStatus();
  });
}

int32_t pagealloc_reserve_take_device_error(pagealloc_reserve* reserve,
                                            pagealloc_error* error) {
  return pagealloc::Guarded(error, [&]() -> absl::Status {
    if (reserve == nullptr) {
      return absl::InvalidArgumentError("reserve is NULL");
    }
    absl::MutexLock lock(&reserve->mu);
    std::unique_ptr<pagealloc::LocalExpander>& device =
        reserve->expanders[PAGEALLOC_MEMORY_DEVICE];
    return device == nullptr ? absl::OkStatus() : device->TakeDeviceError();
  });
}

int32_t pagealloc_reserve_disown(pagealloc_reserve* reserve,
                                 const int64_t* pages, size_t n,
                                 int64_t* disowned, pagealloc_error* error) {
  return pagealloc::Guarded(error, [&]() -> absl::Status {
    if (reserve == nullptr) {
      return absl::InvalidArgumentError("reserve is NULL");
    }
    RETURN_IF_ERROR(pagealloc::CheckArray(pages, n, "pages"));
    const int64_t count =
        reserve->reserve->Disown(absl::MakeConstSpan(pages, n));
    if (disowned != nullptr) *disowned = count;
    return absl::OkStatus();
  });
}

int32_t pagealloc_reserve_free_slots(pagealloc_reserve* reserve, int32_t memory,
                                     const int64_t* slots, size_t n,
                                     void* stream, int32_t fence,
                                     int64_t* host_copy, int64_t* pages,
                                     int64_t* num_pages,
                                     pagealloc_error* error) {
  return pagealloc::Guarded(error, [&]() -> absl::Status {
    if (reserve == nullptr) {
      return absl::InvalidArgumentError("reserve is NULL");
    }
    if (memory != PAGEALLOC_MEMORY_HOST && memory != PAGEALLOC_MEMORY_DEVICE) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "memory (%d) is neither PAGEALLOC_MEMORY_HOST (0) nor "
          "PAGEALLOC_MEMORY_DEVICE (1)",
          memory));
    }
    RETURN_IF_ERROR(pagealloc::CheckArray(slots, n, "slots"));
    const size_t page_size = static_cast<size_t>(reserve->reserve->page_size());
    RETURN_IF_ERROR(pagealloc::CheckArray(pages, n / page_size, "pages"));
    const pagealloc::FreeSource source{memory == PAGEALLOC_MEMORY_DEVICE
                                           ? pagealloc::ExpansionMemory::kDevice
                                           : pagealloc::ExpansionMemory::kHost,
                                       stream, fence != 0};
    ASSIGN_OR_RETURN(
        const int64_t freed,
        pagealloc::FreeWholePages(*reserve->reserve, source, slots,
                                  static_cast<int64_t>(n), host_copy,
                                  absl::MakeSpan(pages, n / page_size)));
    if (num_pages != nullptr) *num_pages = freed;
    return absl::OkStatus();
  });
}

int32_t pagealloc_copy_to_host_async(const void* device, size_t bytes,
                                     void* host, void* cuda_stream,
                                     pagealloc_error* error) {
  return pagealloc::Guarded(error, [&] {
    return pagealloc::QueueCopyToHost(device, bytes, host, cuda_stream);
  });
}

}  // extern "C"

// Shared prefix pages (ABI 1.4).
extern "C" {

int32_t pagealloc_publish(pagealloc_client* client, const int64_t* pages,
                          const uint8_t* keys, size_t n,
                          const uint8_t* parent_key, int32_t pin,
                          int64_t* published_pages, uint8_t* existing,
                          int64_t* newly_published, pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    if (n > 0 && pages == nullptr) {
      return absl::InvalidArgumentError("pages is NULL");
    }
    ASSIGN_OR_RETURN(const std::vector<std::string> chain,
                     pagealloc::KeysFromBytes(keys, n));
    const std::string parent =
        parent_key == nullptr
            ? std::string()
            : std::string(reinterpret_cast<const char*>(parent_key),
                          PAGEALLOC_PREFIX_KEY_BYTES);
    ASSIGN_OR_RETURN(const pagealloc::Client::PublishResult result,
                     client->client->Publish(absl::MakeConstSpan(pages, n),
                                             chain, parent, pin != 0));
    for (size_t i = 0; i < n && i < result.pages.size(); ++i) {
      if (published_pages != nullptr) published_pages[i] = result.pages[i];
      if (existing != nullptr) existing[i] = result.existing[i] ? 1 : 0;
    }
    if (newly_published != nullptr) *newly_published = result.newly_published;
    return absl::OkStatus();
  });
}

int32_t pagealloc_match_prefix(pagealloc_client* client, const uint8_t* keys,
                               size_t num_keys, int32_t adopt, int64_t* pages,
                               int64_t* num_matched, pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckClient(client));
    if (num_keys > 0 && pages == nullptr) {
      return absl::InvalidArgumentError("pages is NULL");
    }
    if (num_keys > 0 && keys == nullptr) {
      return absl::InvalidArgumentError("keys is NULL");
    }
    if (num_keys >
        std::numeric_limits<size_t>::max() / PAGEALLOC_PREFIX_KEY_BYTES) {
      return absl::InvalidArgumentError(
          absl::StrFormat("num_keys (%d) is past any chain", num_keys));
    }
    ASSIGN_OR_RETURN(
        const std::vector<int64_t> matched,
        client->client->MatchPrefixPacked(
            absl::string_view(reinterpret_cast<const char*>(keys),
                              num_keys * PAGEALLOC_PREFIX_KEY_BYTES),
            adopt != 0));
    std::copy(matched.begin(), matched.end(), pages);
    if (num_matched != nullptr) *num_matched = matched.size();
    return absl::OkStatus();
  });
}

int32_t pagealloc_unpin_prefix(pagealloc_client* client, const int64_t* pages,
                               size_t n, int64_t* unpinned,
                               pagealloc_error* error) {
  if (n > 0 && pages == nullptr) {
    return Guarded(error,
                   [] { return absl::InvalidArgumentError("pages is NULL"); });
  }
  return pagealloc::GuardedValue(
      client, unpinned, error, [pages, n](pagealloc::Client& c) {
        return c.UnpinPrefix(absl::MakeConstSpan(pages, n));
      });
}

int32_t pagealloc_admin_reset_prefix_cache(
    const pagealloc_admin_options* options, int64_t* pages_evicted,
    pagealloc_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const pagealloc::AdminOptions admin,
                     pagealloc::ReadAdminOptions(options));
    ASSIGN_OR_RETURN(const int64_t evicted,
                     pagealloc::ResetDaemonPrefixCache(admin));
    if (pages_evicted != nullptr) *pages_evicted = evicted;
    return absl::OkStatus();
  });
}

}  // extern "C"
