// What this CPU can run, asked once: AVX2 with F16C (the vector paths of the
// kernels and conversions), FMA, and AVX-512F with the OS saving its state.
// F16C is read from CPUID, since GCC's and clang's __builtin_cpu_supports do
// not know the same names (clang 14 lacks "f16c").
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

// AVX-512 Foundation, and an OS that saves the opmask and ZMM registers
// (XCR0 bits 5-7 beside SSE and AVX): without the latter the instructions
// fault even where CPUID lists them.
inline bool CpuHasAvx512f() {
  static const bool supported = [] {
    unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & bit_OSXSAVE) == 0) return false;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0 || (ebx & bit_AVX512F) == 0) {
      return false;
    }
    unsigned int xcr0_low = 0, xcr0_high = 0;
    __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
    constexpr unsigned int kSseAvxOpmaskZmm = 0xe6;
    return (xcr0_low & kSseAvxOpmaskZmm) == kSseAvxOpmaskZmm;
  }();
  return supported;
}

}  // namespace optstate

#endif  // defined(__x86_64__)
#endif  // OPTSTATE_COMMON_CPU_FEATURES_H_
