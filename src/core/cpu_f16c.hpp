// Whether an x86 CPU has F16C (fp16 <-> fp32 conversions), read from CPUID leaf 1: clang 14's
// __builtin_cpu_supports does not know "f16c", and kvq builds with clang too (the fuzz preset).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

namespace kvq::detail {

// Read once: CPUID traps to the hypervisor in a virtual machine (microseconds), and the attention dispatch asks on
// every call.
inline bool cpu_has_f16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return has;
}

}  // namespace kvq::detail
#endif
