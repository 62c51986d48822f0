// What this CPU can run, asked once: AVX2 with F16C (the vector paths of the
// kernels and conversions) and FMA. F16C is read from CPUID, since GCC's and clang's
// __builtin_cpu_supports do not know the same names (clang 14 lacks "f16c").
#ifndef OPTSTATE_COMMON_CPU_FEATURES_H_
#define OPTSTATE_COMMON_CPU_FEATURES_H_

#if defined(__x86_64__)
#include <cpuid.h>

namespace optstate {

inline bool CpuHasAvx2F16c() {
  static const bool supported = [] {
    unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
    return (ecx & bit_F16C) != 0 && __builtin_cpu_supports("avx2");
  }();
  return supported;
}

// FMA3 (the AdamW kernel's vector path: torch's lerp and addcmul are fused).
inline bool CpuHasFma() {
  static const bool supported = [] {
    unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
    return (ecx & bit_FMA) != 0;
  }();
  return supported;
}

}  // namespace optstate

#endif  // defined(__x86_64__)
#endif  // OPTSTATE_COMMON_CPU_FEATURES_H_
