#include "fast_channel/codec.h"

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_format.h"
#include "fast_channel/futex.h"

namespace pagealloc {
namespace fast_channel {
namespace {

// Copies `bytes` bytes from `from` to `to` (a part of the channel, which
// starts on a cache line) and leaves alone every 64-byte line `to` already
// holds. Why: a line the other side has read sits in both cores' caches,
// and a store, even of the same bytes, takes it from the reader, which
// must then fetch it back from the writer's core. A chain matched again
// (a conversation's next turn, a system prompt every request starts with)
// differs from the last call's keys in a few lines or none, and so does
// its answer, the pages found; 64 KiB of keys crossing cores cost the
// daemon more than its walk of them did.
void StoreChangedLines(char* to, const char* from, size_t bytes) {
  constexpr size_t kLine = 64;
  size_t done = 0;
  for (; done + kLine <= bytes; done += kLine) {
#if defined(__SSE2__)
    const __m128i* a = reinterpret_cast<const __m128i*>(to + done);
    const __m128i* b = reinterpret_cast<const __m128i*>(from + done);
    const __m128i same = _mm_and_si128(
        _mm_and_si128(
            _mm_cmpeq_epi8(_mm_loadu_si128(a), _mm_loadu_si128(b)),
            _mm_cmpeq_epi8(_mm_loadu_si128(a + 1), _mm_loadu_si128(b + 1))),
        _mm_and_si128(
            _mm_cmpeq_epi8(_mm_loadu_si128(a + 2), _mm_loadu_si128(b + 2)),
            _mm_cmpeq_epi8(_mm_loadu_si128(a + 3), _mm_loadu_si128(b + 3))));
    if (_mm_movemask_epi8(same) == 0xffff) continue;
#else
    if (std::memcmp(to + done, from + done, kLine) == 0) continue;
#endif
    std::memcpy(to + done, from + done, kLine);
  }
  if (done < bytes) std::memcpy(to + done, from + done, bytes - done);
}

// Which input arrays a kind carries (`keys`: the key area, over the int64
// arrays' memory).
struct KindArrays {
  bool in0 = false, in1 = false, in2 = false, free_first = false;
  bool keys = false;
};

KindArrays ArraysOf(CallKind kind) {
  switch (kind) {
    case CallKind::kExtend:
      return {true, true, true, true};
    case CallKind::kDecode:
      return {false, true, true, true};
    case CallKind::kAlloc:
      return {false, true, false, true};
    case CallKind::kFreeSlots:
    case CallKind::kFreePages:
    case CallKind::kRollback:  // at most one checkpoint id (the core checks)
      return {false, true, false, false};
    case CallKind::kCheckpoint:
      return {};
    case CallKind::kMatchPrefix:
      return {false, false, false, false, /*keys=*/true};
  }
  return {};
}

// The option bits a kind may carry: kAdopt is a match's one bit, and means
// nothing to any other kind.
uint32_t OptionsOf(CallKind kind) {
  return kind == CallKind::kMatchPrefix ? kAdopt : kKnownOptions & ~kAdopt;
}

constexpr absl::string_view kTruncated =
    "(message truncated by the fast channel)";

}  // namespace

absl::Status ValidateCapacity(const Capacity& capacity) {
  if (capacity.max_requests < 1 || capacity.message_bytes < 64) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fast channel capacity: max_requests (%d) must be >= 1 and "
        "message_bytes (%d) >= 64",
        capacity.max_requests, capacity.message_bytes));
  }
  return absl::OkStatus();
}

ChannelCodec::ChannelCodec(void* base, const Capacity& capacity)
    : base_(static_cast<char*>(base)),
      capacity_(capacity),
      layout_(capacity.max_requests, capacity.message_bytes),
      header_(reinterpret_cast<ChannelHeader*>(base)),
      codes_(At<int32_t>(layout_.codes)),
      ring_offsets_(At<int64_t>(layout_.ring_offsets)),
      counts_(At<int64_t>(layout_.counts)),
      new_pages_(At<int64_t>(layout_.new_pages)) {}

void ChannelCodec::Initialize() {
  header_->magic = kMagic;
  header_->version = kVersion;
  header_->max_requests = capacity_.max_requests;
  header_->message_bytes = capacity_.message_bytes;
  header_->poller_sleeping.store(1, std::memory_order_seq_cst);
}

absl::Status ChannelCodec::TakeCall(TakenCall* call) const {
  // Each field read once: the client may be rewriting them as we go.
  const volatile ChannelHeader* h = header_;
  const uint32_t kind = h->kind;
  const int32_t n = h->num_requests;
  const uint32_t options = h->options;
  const int64_t release_up_to = h->release_ring_up_to;
  const int32_t num_free_first = h->num_free_first;
  const uint64_t release_value = h->release_value;
  const uint64_t call_id = h->call_id;
  if (!IsKnownKind(kind)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("fast channel: unknown call kind %d", kind));
  }
  if ((options & ~kKnownOptions) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fast channel: unknown option bits 0x%x", options & ~kKnownOptions));
  }
  const uint32_t foreign = options & ~OptionsOf(static_cast<CallKind>(kind));
  if (foreign != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fast channel: option bits 0x%x do not apply to call kind %d", foreign,
        kind));
  }
  const KindArrays arrays = ArraysOf(static_cast<CallKind>(kind));
  const bool has_requests =
      arrays.in0 || arrays.in1 || arrays.in2 || arrays.keys;
  if (arrays.keys && (n < 0 || n > capacity_.max_requests)) {
    // A key's size is fixed, so the count alone says where the keys end:
    // bounding it bounds the bytes read (computed in 64 bits).
    return absl::InvalidArgumentError(absl::StrFormat(
        "fast channel: num_requests (%d) is outside [0, %d]: the key area "
        "holds %d keys of %d bytes (%d bytes)",
        n, capacity_.max_requests, capacity_.max_requests, kKeyBytes,
        int64_t{capacity_.max_requests} * kKeyBytes));
  }
  if (has_requests && (n < 0 || n > capacity_.max_requests)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("fast channel: num_requests (%d) is outside [0, %d]", n,
                        capacity_.max_requests));
  }
  if (arrays.free_first &&
      (num_free_first < 0 || num_free_first > capacity_.max_requests)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("fast channel: num_free_first (%d) is outside [0, %d]",
                        num_free_first, capacity_.max_requests));
  }
  const bool tagged = static_cast<CallKind>(kind) != CallKind::kMatchPrefix;
  if ((options & kRetry) != 0 && call_id == 0) {
    return absl::InvalidArgumentError(
        "fast channel: a retry (option bit kRetry) without a call_id");
  }
  call->kind = static_cast<CallKind>(kind);
  call->options = options;
  call->call_id = tagged ? call_id : 0;
  call->release_ring_up_to = release_up_to;
  const bool is_free =
      call->kind == CallKind::kFreeSlots || call->kind == CallKind::kFreePages;
  call->release_value = is_free ? release_value : 0;
  call->num_requests = has_requests ? n : 0;
  auto copy = [this](bool used, size_t offset, int32_t count,
                     std::vector<int64_t>* storage) {
    if (!used || count == 0) return absl::Span<const int64_t>();
    if (storage->size() < static_cast<size_t>(count)) storage->resize(count);
    std::memcpy(storage->data(), At<int64_t>(offset), count * sizeof(int64_t));
    return absl::MakeConstSpan(storage->data(), count);
  };
  call->in0 =
      copy(arrays.in0, layout_.in0, call->num_requests, &call->in0_storage);
  call->in1 =
      copy(arrays.in1, layout_.in1, call->num_requests, &call->in1_storage);
  call->in2 =
      copy(arrays.in2, layout_.in2, call->num_requests, &call->in2_storage);
  call->free_first =
      copy(arrays.free_first, layout_.free_first,
           arrays.free_first ? num_free_first : 0, &call->free_storage);
  call->keys = absl::Span<const Key>();
  if (arrays.keys && call->num_requests > 0) {
    const size_t n = static_cast<size_t>(call->num_requests);
    // Grown only: a resize to more keys than the storage holds zeroes the
    // new ones first, a cost a chain of one size then another would pay on
    // every call.
    if (call->key_storage.size() < n) call->key_storage.resize(n);
    static_assert(sizeof(Key) == kKeyBytes);
    std::memcpy(call->key_storage.data(), At<char>(layout_.keys()),
                n * kKeyBytes);
    call->keys = absl::MakeConstSpan(call->key_storage.data(), n);
  }
  return absl::OkStatus();
}

uint64_t ChannelCodec::ReadReleaseWord() const {
  return header_->release_word.load(std::memory_order_acquire);
}

void ChannelCodec::AddMessage(absl::string_view text, bool length_prefixed) {
  char* messages = At<char>(layout_.messages);
  const int32_t room =
      capacity_.message_bytes - messages_used_ - (length_prefixed ? 4 : 0);
  if (room <= 0) return;
  const int32_t n = std::min<int64_t>(text.size(), room);
  if (length_prefixed) {
    std::memcpy(messages + messages_used_, &n, 4);
    messages_used_ += 4;
  }
  if (n > 0) std::memcpy(messages + messages_used_, text.data(), n);
  messages_used_ += n;
}

void ChannelCodec::WriteRefusal(const absl::Status& status) {
  messages_used_ = 0;
  AddMessage(status.message(), /*length_prefixed=*/false);
  header_->call_code = static_cast<int32_t>(status.code());
  header_->num_results = 0;
  header_->op_value = 0;
  header_->pages_freed_first = 0;
  header_->messages_used = messages_used_;
}

void ChannelCodec::BeginResults() { messages_used_ = 0; }

void ChannelCodec::Refused(int32_t index, const absl::Status& status) {
  codes_[index] = static_cast<int32_t>(status.code());
  ring_offsets_[index] = 0;
  counts_[index] = 0;
  new_pages_[index] = 0;
  AddMessage(status.message(), /*length_prefixed=*/true);
}

void ChannelCodec::FinishResults(int32_t num_results, int64_t ring_end,
                                 int64_t pages_freed_first,
                                 int32_t batch_requests, uint64_t launch_id,
                                 uint64_t completion_value) {
  header_->call_code = 0;
  header_->num_results = num_results;
  header_->messages_used = messages_used_;
  header_->ring_end = ring_end;
  header_->pages_freed_first = pages_freed_first;
  header_->batch_requests = batch_requests;
  header_->launch_id = launch_id;
  header_->completion_value = completion_value;
  header_->op_value = 0;
}

void ChannelCodec::WriteOpValue(int64_t op_value) {
  header_->call_code = 0;
  header_->num_results = 0;
  header_->messages_used = 0;
  header_->pages_freed_first = 0;
  header_->op_value = op_value;
}

absl::Status ChannelCodec::WriteMatchedPages(absl::Span<const int64_t> pages) {
  if (pages.size() > static_cast<size_t>(capacity_.max_requests)) {
    return absl::InternalError(absl::StrFormat(
        "a match found %d pages, more than the fast channel's %d keys",
        pages.size(), capacity_.max_requests));
  }
  StoreChangedLines(reinterpret_cast<char*>(new_pages_),
                    reinterpret_cast<const char*>(pages.data()),
                    pages.size() * sizeof(int64_t));
  WriteOpValue(static_cast<int64_t>(pages.size()));
  return absl::OkStatus();
}

void ChannelCodec::Publish(uint32_t seq) {
  header_->response_seq.store(seq, std::memory_order_seq_cst);
  if (header_->client_waiting.load(std::memory_order_seq_cst) != 0) {
    FutexWakeAll(&header_->response_seq);
  }
}

void ChannelCodec::EndSession(absl::string_view reason) {
  const int32_t n = std::min<size_t>(reason.size(), kEndReasonBytes);
  std::memcpy(header_->end_reason, reason.data(), n);
  header_->end_reason_bytes = n;
  header_->session_ended.store(1, std::memory_order_seq_cst);
  // A client asleep on its answer looks again (and at the flag) at once.
  FutexWakeAll(&header_->response_seq);
}

void ChannelCodec::AskForReserve(int64_t pages) {
  header_->reclaim_pages.store(pages, std::memory_order_relaxed);
  header_->reclaim_seq.fetch_add(1, std::memory_order_seq_cst);
  RingReserveBell();
}

ChannelCodec::ReserveHints ChannelCodec::ReadReserveHints() const {
  ReserveHints hints;
  hints.pages = std::max<int64_t>(
      0, header_->reserve_pages.load(std::memory_order_relaxed));
  hints.refills = std::max<int64_t>(
      0, header_->reserve_refills.load(std::memory_order_relaxed));
  hints.returns = std::max<int64_t>(
      0, header_->reserve_returns.load(std::memory_order_relaxed));
  hints.answered = header_->reclaim_answered.load(std::memory_order_relaxed) ==
                   header_->reclaim_seq.load(std::memory_order_relaxed);
  return hints;
}

void ChannelCodec::RingReserveBell() const {
  header_->reserve_bell.fetch_add(1, std::memory_order_seq_cst);
  FutexWakeAll(&header_->reserve_bell);
}

void ChannelCodec::ReportReserve(int64_t pages, int64_t refills,
                                 int64_t returns) const {
  header_->reserve_pages.store(pages, std::memory_order_relaxed);
  header_->reserve_refills.store(refills, std::memory_order_relaxed);
  header_->reserve_returns.store(returns, std::memory_order_relaxed);
}

absl::Status ChannelCodec::CheckHeader() const {
  if (header_->magic != kMagic || header_->version != kVersion ||
      header_->max_requests != capacity_.max_requests ||
      header_->message_bytes != capacity_.message_bytes) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the fast channel's header (magic 0x%x, version %d, %d requests, %d "
        "message bytes) does not match version %d with %d requests and %d "
        "message bytes",
        header_->magic, header_->version, header_->max_requests,
        header_->message_bytes, kVersion, capacity_.max_requests,
        capacity_.message_bytes));
  }
  return absl::OkStatus();
}

absl::Status ChannelCodec::PostCall(const CallView& call, uint32_t seq) {
  const size_t capacity = capacity_.max_requests;
  const bool match = call.kind == CallKind::kMatchPrefix;
  const size_t arrays = std::max({call.in0.size(), call.in1.size(),
                                  call.in2.size(), call.free_first.size()});
  if (match && arrays > 0) {
    return absl::InvalidArgumentError(
        "a fast-channel match carries keys only: its keys take the memory of "
        "the int64 arrays");
  }
  if (!match && !call.keys.empty()) {
    return absl::InvalidArgumentError("only a fast-channel match carries keys");
  }
  if (call.keys.size() % kKeyBytes != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a match's keys are %d bytes, not a whole number of %d-byte keys",
        call.keys.size(), kKeyBytes));
  }
  const size_t n =
      match ? call.keys.size() / kKeyBytes
            : std::max({call.in0.size(), call.in1.size(), call.in2.size()});
  if (n > capacity || call.free_first.size() > capacity) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a fast-channel call holds at most %d requests and %d free_first "
        "pages; this one has %d and %d",
        capacity, capacity, n, call.free_first.size()));
  }
  StoreChangedLines(At<char>(layout_.keys()), call.keys.data(),
                    call.keys.size());
  auto put = [this](size_t offset, absl::Span<const int64_t> values) {
    if (!values.empty()) {
      std::memcpy(At<char>(offset), values.data(),
                  values.size() * sizeof(int64_t));
    }
  };
  put(layout_.in0, call.in0);
  put(layout_.in1, call.in1);
  put(layout_.in2, call.in2);
  put(layout_.free_first, call.free_first);
  header_->num_free_first = static_cast<int32_t>(call.free_first.size());
  header_->kind = static_cast<uint32_t>(call.kind);
  header_->num_requests = static_cast<int32_t>(n);
  header_->options = call.options;
  header_->release_ring_up_to = call.release_ring_up_to;
  header_->release_value = call.release_value;
  header_->call_id = call.call_id;
  header_->request_seq.store(seq, std::memory_order_seq_cst);
  return absl::OkStatus();
}

absl::Status ChannelCodec::CallStatus() const {
  const int32_t code = header_->call_code;
  if (code == 0) return absl::OkStatus();
  const int32_t used =
      std::clamp<int32_t>(header_->messages_used, 0, capacity_.message_bytes);
  return absl::Status(static_cast<absl::StatusCode>(code),
                      absl::string_view(At<char>(layout_.messages), used));
}

absl::StatusOr<absl::Span<const int64_t>> ChannelCodec::ReadMatchedPages(
    int32_t num_keys) const {
  const int64_t n = header_->op_value;
  if (n < 0 || n > num_keys || n > capacity_.max_requests) {
    return absl::InternalError(absl::StrFormat(
        "the daemon's answer is malformed: %d pages matched for %d keys", n,
        num_keys));
  }
  return absl::MakeConstSpan(new_pages_, static_cast<size_t>(n));
}

std::string ChannelCodec::EndReason() const {
  if (!SessionEnded()) return "";
  if (header_->session_ended.load(std::memory_order_seq_cst) == 0) {
    return "the daemon has freed the channel of the ended session";
  }
  const int32_t n =
      std::clamp<int32_t>(header_->end_reason_bytes, 0, kEndReasonBytes);
  return std::string(header_->end_reason, n);
}

absl::Status ChannelCodec::ReadAllocAnswer(int32_t num_requests,
                                           AllocAnswerView* answer) const {
  const int32_t results = header_->num_results;
  if (results != num_requests) {
    return absl::InternalError(absl::StrFormat(
        "the daemon's answer is malformed: %d results for %d requests", results,
        num_requests));
  }
  const size_t n = num_requests;
  answer->codes = absl::MakeConstSpan(codes_, n);
  answer->ring_offsets = absl::MakeConstSpan(ring_offsets_, n);
  answer->counts = absl::MakeConstSpan(counts_, n);
  answer->new_pages = absl::MakeConstSpan(new_pages_, n);
  // Refusal messages: each a 4-byte length and its bytes.
  answer->messages.clear();
  const char* messages = At<char>(layout_.messages);
  const int32_t used =
      std::clamp<int32_t>(header_->messages_used, 0, capacity_.message_bytes);
  for (int32_t at = 0; at + 4 <= used;) {
    int32_t length = 0;
    std::memcpy(&length, messages + at, 4);
    at += 4;
    length = std::clamp<int32_t>(length, 0, used - at);
    answer->messages.emplace_back(messages + at, length);
    at += length;
  }
  // Messages truncated away (a huge batch of refusals) still get a status.
  const size_t refused =
      std::count_if(answer->codes.begin(), answer->codes.end(),
                    [](int32_t code) { return code != 0; });
  while (answer->messages.size() < refused) {
    answer->messages.emplace_back(kTruncated);
  }
  answer->ring_end = header_->ring_end;
  answer->pages_freed_first = header_->pages_freed_first;
  answer->batch_requests = header_->batch_requests;
  answer->launch_id = header_->launch_id;
  answer->completion_value = header_->completion_value;
  return absl::OkStatus();
}

}  // namespace fast_channel
}  // namespace pagealloc
