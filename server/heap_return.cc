#include "server/heap_return.h"

#include <malloc.h>

namespace pagealloc {

HeapReturn ReturnFreeHeapMemory(int64_t threshold_bytes) {
  HeapReturn result;
  // fordblks: the free chunks of every arena (not the top chunks, which
  // malloc trims by itself past M_TRIM_THRESHOLD).
  const struct mallinfo2 info = mallinfo2();
  result.free_bytes = static_cast<int64_t>(info.fordblks);
  if (result.free_bytes < threshold_bytes) return result;
  malloc_trim(0);
  result.trimmed = true;
  return result;
}

}  // namespace pagealloc
