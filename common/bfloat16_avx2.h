// float32 to bfloat16 for eight lanes with AVX2, exactly as FloatToBFloat16
// rounds each one (round-to-nearest-even; NaN stays NaN, quiet). Internal:
// shared by the bulk conversion (common/dtype.cc) and the AdamW kernel, which
// narrows updated params straight into a reply.
#ifndef OPTSTATE_COMMON_BFLOAT16_AVX2_H_
#define OPTSTATE_COMMON_BFLOAT16_AVX2_H_

#if defined(__x86_64__)
#include <immintrin.h>

namespace optstate::dtype_internal {

// The eight bfloat16 results, in order, in the low 128 bits' eight 16-bit lanes.
__attribute__((target("avx2"))) inline __m128i FloatToBFloat16x8(__m256 values) {
  const __m256i bits = _mm256_castps_si256(values);
  const __m256i high = _mm256_srli_epi32(bits, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_or_si256(high, _mm256_set1_epi32(0x0040));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(values, values, _CMP_UNORD_Q));
  // Both candidates were shifted down 16 bits, so every lane holds at most
  // 0xffff and packing with unsigned saturation keeps it; the two 128-bit
  // halves packed together keep the lanes in order.
  const __m256i out = _mm256_blendv_epi8(rounded, nan, is_nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(out), _mm256_extracti128_si256(out, 1));
}

}  // namespace optstate::dtype_internal

#endif  // defined(__x86_64__)

#endif  // OPTSTATE_COMMON_BFLOAT16_AVX2_H_
