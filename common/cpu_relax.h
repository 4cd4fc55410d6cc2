// CpuRelax: one step of a spin-wait loop.

#ifndef PAGEALLOC_COMMON_CPU_RELAX_H_
#define PAGEALLOC_COMMON_CPU_RELAX_H_

namespace pagealloc {

// Tells the core that the caller is spinning (the x86 PAUSE hint), so a
// sibling hyper-thread gets the pipeline and the loop's exit does not pay
// for a memory-order mis-speculation. For the loops that poll the fast
// channel, the doorbell or the batcher's queue. A no-op elsewhere.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace pagealloc

#endif  // PAGEALLOC_COMMON_CPU_RELAX_H_
