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

// FloatToBFloat16x8's bits, with fewer operations, for lanes whose NaNs
// are quiet, as every result of arithmetic is (x86 quiets a signaling NaN);
// a signaling NaN would keep its quiet bit clear. For the AdamW kernel,
// which narrows each param it has just computed: on a Zen 1 EPYC the
// narrowing's operations, above all its 32-bit shifts, held a bf16 step's
// single thread back (BENCHMARKS.md). The lanes' low and high 16-bit
// halves are separated by one shuffle and rounded as 16-bit lanes, half
// the width of FloatToBFloat16x8's and with no shift: the high half goes up
// by one (round to nearest, ties to even) where the low half exceeds
// 0x8000 less the high half's last bit, except in a NaN, which keeps its
// high half (FloatToBFloat16's truncation; its quiet bit is set already).
__attribute__((target("avx2"))) inline __m128i QuietFloatToBFloat16x8(__m256 values) {
  // In each 128-bit half, the four low 16-bit halves to bytes 0-7 and the
  // four high ones to bytes 8-15.
  const __m256i split =
      _mm256_shuffle_epi8(_mm256_castps_si256(values),
                          _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0,
                                           1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
  const __m128i first = _mm256_castsi256_si128(split);
  const __m128i second = _mm256_extracti128_si256(split, 1);
  const __m128i low = _mm_unpacklo_epi64(first, second);
  const __m128i high = _mm_unpackhi_epi64(first, second);
  // low > 0x8000 - lsb, compared as signed numbers with both sides less
  // 0x8000 (a saturating add, so a low half of 0xffff stays greatest).
  const __m128i lsb = _mm_and_si128(high, _mm_set1_epi16(1));
  const __m128i up = _mm_cmpgt_epi16(
      _mm_adds_epi16(_mm_xor_si128(low, _mm_set1_epi16(static_cast<short>(0x8000))), lsb),
      _mm_setzero_si128());
  // A quiet NaN's high half, sign cleared, is at least 0x7fc0; infinity's
  // is 0x7f80.
  const __m128i nan =
      _mm_cmpgt_epi16(_mm_and_si128(high, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x7f80));
  return _mm_sub_epi16(high, _mm_andnot_si128(nan, up));
}

}  // namespace optstate::dtype_internal

#endif  // defined(__x86_64__)

#endif  // OPTSTATE_COMMON_BFLOAT16_AVX2_H_
