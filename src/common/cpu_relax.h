// A pause between two polls of memory another core writes: the spinning
// thread yields the core's pipeline (and its sibling hyperthread) without a
// system call.
#pragma once

namespace ferry::internal {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace ferry::internal
