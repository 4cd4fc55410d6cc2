// kv_example: a scheduler's KV cache in memory the daemon owns
// (docs/integration.md, "KV memory owned by the daemon").
//
//   pagealloc-server --backend=cpu --listen=unix:///tmp/pa.sock
//       --kv_layout=mha:layers=4,kv_heads=2,head_dim=64,dtype=bf16
//       --kv_memory=64MiB --page_size=16 --metrics_port=-1 &
//   kv_example --target=unix:///tmp/pa.sock
//
// It connects (which maps the pool's KV slab), prefills one request of
// --tokens tokens, writes each token's K and V for every layer at the slot
// the daemon gave it (as an attention kernel's KV store would), decodes a
// few tokens the same way, reads every token's K and V back through the
// slab and checks them, and frees the request. On a GPU daemon the buffers
// are device memory and the example copies with cudaMemcpy
// (KvSlabView::CopyToSlab); an engine writes them from its kernels, using
// KvBuffer::data + slot * stride_bytes as the address of slot's element.
// Exits 0 when every value read back is the one written.

#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/client.h"

ABSL_FLAG(std::string, target, "unix:///run/pagealloc/gpu0.sock",
          "The daemon's address.");
ABSL_FLAG(std::string, register_secret, "",
          "The pool's Register secret (--register_secret_file), if any.");
ABSL_FLAG(int64_t, tokens, 40, "Prompt tokens of the request.");
ABSL_FLAG(int64_t, decode_steps, 5, "Decode steps after the prefill.");

namespace {

// The value a token's element holds: a function of the token and the
// buffer, one byte pattern per element, so that a mix-up shows.
std::vector<unsigned char> ElementFor(int64_t token, size_t buffer,
                                      int64_t bytes) {
  std::vector<unsigned char> element(bytes);
  for (int64_t i = 0; i < bytes; ++i) {
    element[i] = static_cast<unsigned char>(token * 31 + buffer * 7 + i);
  }
  return element;
}

int Fail(const absl::Status& status, const char* what) {
  std::fprintf(stderr, "kv_example: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using pagealloc::Allocation;
  using pagealloc::CallOptions;
  using pagealloc::Client;
  using pagealloc::KvBuffer;
  using pagealloc::KvSlabView;

  // 1. Connect: Register, then the slab's fd over the memory socket,
  // mapped once.
  pagealloc::ClientOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.client_name = "kv-example";
  options.register_secret = absl::GetFlag(FLAGS_register_secret);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(options);
  if (!connected.ok()) return Fail(connected.status(), "connect");
  Client& client = **connected;
  const KvSlabView* slab = client.kv_slab();
  if (slab == nullptr) {
    std::fprintf(stderr,
                 "kv_example: the daemon owns no KV memory (start it with "
                 "--kv_layout and --kv_memory)\n");
    return 1;
  }
  const std::vector<KvBuffer>& buffers = client.kv_buffers();
  std::printf(
      "connected and mapped in %s: layout %s, %zu buffers of %lld slots, "
      "%s\n",
      absl::FormatDuration(absl::Now() - start).c_str(),
      slab->layout().text.c_str(), buffers.size(),
      static_cast<long long>(buffers.front().num_slots),
      slab->on_device() ? "device memory" : "host memory");
  std::printf(
      "buffer %s: %s [%lld, %s], %lld bytes a slot\n",
      buffers.front().name.c_str(),
      std::string(pagealloc::KvDtypeName(buffers.front().dtype)).c_str(),
      static_cast<long long>(buffers.front().num_slots),
      absl::StrJoin(buffers.front().element_shape, ", ").c_str(),
      static_cast<long long>(buffers.front().stride_bytes));

  // 2. Prefill, then decode: each step's slots come back from the daemon;
  // slots are host values (return_inline) so the host can address them.
  CallOptions inline_slots;
  inline_slots.return_inline = true;
  std::vector<int64_t> slots;  // the request's slot of each token
  const int64_t tokens = absl::GetFlag(FLAGS_tokens);
  absl::StatusOr<Allocation> prefill =
      client.AllocExtend({0}, {tokens}, {-1}, inline_slots);
  if (!prefill.ok()) return Fail(prefill.status(), "prefill");
  if (!prefill->status().ok()) return Fail(prefill->status(), "prefill");
  slots.assign((*prefill)[0].slots, (*prefill)[0].slots + (*prefill)[0].count);
  for (int64_t step = 0; step < absl::GetFlag(FLAGS_decode_steps); ++step) {
    const int64_t seq_len = static_cast<int64_t>(slots.size()) + 1;
    absl::StatusOr<Allocation> decode =
        client.AllocDecode({seq_len}, {slots.back()}, inline_slots);
    if (!decode.ok()) return Fail(decode.status(), "decode");
    if (!decode->status().ok()) return Fail(decode->status(), "decode");
    slots.push_back((*decode)[0].slots[0]);
  }

  // 3. Write every token's element in every buffer (each layer's K and V)
  // at its slot.
  for (size_t token = 0; token < slots.size(); ++token) {
    for (size_t b = 0; b < buffers.size(); ++b) {
      const std::vector<unsigned char> element =
          ElementFor(token, b, buffers[b].stride_bytes);
      if (absl::Status written = slab->CopyToSlab(
              buffers[b].slot(slots[token]), element.data(), element.size());
          !written.ok()) {
        return Fail(written, "write");
      }
    }
  }
  std::printf("wrote %zu tokens x %zu buffers at slots %lld..%lld\n",
              slots.size(), buffers.size(),
              static_cast<long long>(slots.front()),
              static_cast<long long>(slots.back()));

  // 4. Read them back through the slab.
  int64_t mismatches = 0;
  for (size_t token = 0; token < slots.size(); ++token) {
    for (size_t b = 0; b < buffers.size(); ++b) {
      std::vector<unsigned char> read(buffers[b].stride_bytes);
      if (absl::Status copied = slab->CopyFromSlab(
              read.data(), buffers[b].slot(slots[token]), read.size());
          !copied.ok()) {
        return Fail(copied, "read");
      }
      if (read != ElementFor(token, b, buffers[b].stride_bytes)) ++mismatches;
    }
  }
  std::printf("read back %zu tokens x %zu buffers: %lld mismatches\n",
              slots.size(), buffers.size(), static_cast<long long>(mismatches));

  // 5. The request is done: its pages go back to the pool.
  absl::StatusOr<int64_t> freed = client.FreeSlots(slots);
  if (!freed.ok()) return Fail(freed.status(), "free");
  std::printf("freed %lld pages\n", static_cast<long long>(*freed));
  return mismatches == 0 ? 0 : 1;
}
