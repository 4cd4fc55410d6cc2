// The bytes a test writes into a KV slot: a function of the writing
// session, the slot, the buffer and the byte's place in the element, so
// that a reader can tell exactly whose write a slot holds (or that it holds
// none: zeros). Shared by kv_writer (the writing processes) and
// kv_slab_test (the checking one), and by tests/gpu/kv_pattern_kernel.cu
// (kv_writer's kernel on the CUDA backend), which is why KvPatternByte is
// also a device function.

#ifndef PAGEALLOC_TESTS_KV_PATTERN_H_
#define PAGEALLOC_TESTS_KV_PATTERN_H_

#include <cstdint>
#include <vector>

#ifdef __CUDACC__
#define PAGEALLOC_KV_PATTERN_HOST_DEVICE __host__ __device__
#else
#define PAGEALLOC_KV_PATTERN_HOST_DEVICE
#endif

namespace pagealloc::testing {

// Never all zero over an element of 8 bytes or more (a byte is 0 with
// probability 1/256; eight in a row practically never).
PAGEALLOC_KV_PATTERN_HOST_DEVICE inline uint8_t KvPatternByte(uint64_t session,
                                                              int64_t slot,
                                                              int buffer,
                                                              int64_t byte) {
  uint64_t x = session * 0x9e3779b97f4a7c15ull ^
               static_cast<uint64_t>(slot) * 0xbf58476d1ce4e5b9ull ^
               static_cast<uint64_t>(buffer) * 0x94d049bb133111ebull ^
               static_cast<uint64_t>(byte / 8);
  x ^= x >> 31;
  x *= 0xd6e8feb86659fd39ull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x >> (8 * (byte % 8)));
}

// One slot's element of `bytes` bytes.
inline std::vector<uint8_t> KvPattern(uint64_t session, int64_t slot,
                                      int buffer, int64_t bytes) {
  std::vector<uint8_t> out(bytes);
  for (int64_t i = 0; i < bytes; ++i) {
    out[i] = KvPatternByte(session, slot, buffer, i);
  }
  return out;
}

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_KV_PATTERN_H_
