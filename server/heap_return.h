// Giving freed heap memory back to the kernel.
//
// Why. glibc's malloc keeps what the daemon frees for reuse: in the main
// heap below its top chunk, and in the arenas of the threads gRPC runs
// calls on, it returns nothing to the kernel by itself, however much is
// free. A burst of gRPC calls or streams (5,000 KeepAlive streams take
// about 80 MiB of per-call state) so left the daemon's resident memory at
// its peak for good. malloc_trim(0) walks every arena and returns the
// free pages in the middle of each too (madvise), so we call it when
// enough is free to matter.

#ifndef PAGEALLOC_SERVER_HEAP_RETURN_H_
#define PAGEALLOC_SERVER_HEAP_RETURN_H_

#include <cstdint>

namespace pagealloc {

// Whether malloc is glibc's, whose free memory ReturnFreeHeapMemory sees
// and gives back. The sanitizers' runtimes bring allocators of their own:
// mallinfo2 then reports nothing free and malloc_trim has nothing to trim.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kGlibcMalloc = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
inline constexpr bool kGlibcMalloc = false;
#else
inline constexpr bool kGlibcMalloc = true;
#endif
#else
inline constexpr bool kGlibcMalloc = true;
#endif

struct HeapReturn {
  int64_t free_bytes = 0;  // free in malloc's arenas before (mallinfo2)
  bool trimmed = false;    // malloc_trim ran
};

// Calls malloc_trim(0) when malloc holds at least `threshold_bytes` free.
// Costs a walk of every arena's free lists (mallinfo2), and the trim's
// madvise calls when it trims; each arena is locked while it is walked.
// Thread-safe.
HeapReturn ReturnFreeHeapMemory(int64_t threshold_bytes);

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_HEAP_RETURN_H_
