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
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x0040));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                            _mm256_set1_epi32(0x7f800000));
  const __m256i out = _mm256_blendv_epi8(rounded, nan, is_nan);
  // Keep the low 16 bits of each lane, in order.
  const __m256i packed = _mm256_permute4x64_epi64(
      _mm256_packus_epi32(_mm256_and_si256(out, _mm256_set1_epi32(0xffff)), _mm256_setzero_si256()),
      0xd8);
  return _mm256_castsi256_si128(packed);
}

}  // namespace optstate::dtype_internal

#endif  // defined(__x86_64__)

#endif  // OPTSTATE_COMMON_BFLOAT16_AVX2_H_
