// Exact float32 <-> bfloat16/float16 conversions used on both ends of the wire.
// The bulk conversions have AVX2/F16C paths that give the scalar functions'
// results bit for bit (the tests compare every element).
#include "optstate/dtype.h"

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bfloat16_avx2.h"
#include "cpu_features.h"

namespace optstate {
namespace {

#if defined(__x86_64__)
bool HasAvx2F16c() { return CpuHasAvx2F16c(); }

#define OPTSTATE_AVX2 __attribute__((target("avx2,f16c")))

// Returns how many leading elements were converted (a multiple of 8).
OPTSTATE_AVX2 size_t DecodeAvx2(WireType type, const unsigned char* src, float* dst, size_t count) {
  const size_t end = count - count % 8;
  for (size_t i = 0; i < end; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    const __m256 f = type == WireType::kBFloat16
                         ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                         : _mm256_cvtph_ps(h);
    _mm256_storeu_ps(dst + i, f);
  }
  return end;
}

// bfloat16 only: round-to-nearest-even with the scalar function's NaN rule.
OPTSTATE_AVX2 size_t EncodeBFloat16Avx2(const float* src, unsigned char* dst, size_t count) {
  const size_t end = count - count % 8;
  for (size_t i = 0; i < end; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i),
                     dtype_internal::FloatToBFloat16x8(_mm256_loadu_ps(src + i)));
  }
  return end;
}
// Whether |bits| of the first `end` (a multiple of 32) float32 values at
// `bytes` (any alignment) stay below `bound`.
OPTSTATE_AVX2 bool AllAbsBitsBelowAvx2(const unsigned char* bytes, size_t end, uint32_t bound) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i last_ok = _mm256_set1_epi32(static_cast<int>(bound - 1));
  __m256i over = _mm256_setzero_si256();
  for (size_t i = 0; i < end; i += 32) {
    for (size_t k = 0; k < 32; k += 8) {
      const __m256i bits = _mm256_and_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes + 4 * (i + k))), abs_mask);
      over = _mm256_or_si256(over, _mm256_cmpgt_epi32(bits, last_ok));  // Both >= 0.
    }
  }
  return _mm256_testz_si256(over, over);
}

// Whether no 16-bit element of the first `end` (a multiple of 16) has all of
// `exponent` set (infinity or NaN).
OPTSTATE_AVX2 bool AllHalvesFiniteAvx2(const unsigned char* wire, size_t end, uint16_t exponent) {
  const __m256i mask = _mm256_set1_epi16(static_cast<short>(exponent));
  __m256i bad = _mm256_setzero_si256();
  for (size_t i = 0; i < end; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wire + 2 * i));
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(h, mask), mask));
  }
  return _mm256_testz_si256(bad, bad);
}
#endif  // defined(__x86_64__)

// Whether |bits| of `count` float32 values at `bytes` (any alignment) stay
// below `bound`.
bool AllAbsBitsBelow(const unsigned char* bytes, size_t count, uint32_t bound) {
  size_t done = 0;
#if defined(__x86_64__)
  if (HasAvx2F16c()) {
    done = count - count % 32;
    if (!AllAbsBitsBelowAvx2(bytes, done, bound)) return false;
  }
#endif
  bool all_finite = true;
  for (size_t i = done; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, bytes + 4 * i, sizeof(bits));
    all_finite &= (bits & 0x7fffffffu) < bound;
  }
  return all_finite;
}

}  // namespace

bool AllWireFinite(WireType type, const void* wire, size_t count) {
  const auto* bytes = static_cast<const unsigned char*>(wire);
  if (type == WireType::kFloat32) {  // The float's own bits.
    return AllAbsBitsBelow(bytes, count, NarrowedFiniteBoundBits(WireType::kFloat32));
  }
  const uint16_t exponent = type == WireType::kBFloat16 ? 0x7f80 : 0x7c00;
  size_t done = 0;
#if defined(__x86_64__)
  if (HasAvx2F16c()) {
    done = count - count % 16;
    if (!AllHalvesFiniteAvx2(bytes, done, exponent)) return false;
  }
#endif
  bool all_finite = true;
  for (size_t i = done; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, sizeof(h));
    all_finite &= (h & exponent) != exponent;
  }
  return all_finite;
}

bool AllNarrowToFinite(WireType type, const float* values, size_t count) {
  return AllAbsBitsBelow(reinterpret_cast<const unsigned char*>(values), count,
                         NarrowedFiniteBoundBits(type));
}

absl::string_view WireTypeName(WireType type) {
  switch (type) {
    case WireType::kFloat32:
      return "float32";
    case WireType::kBFloat16:
      return "bfloat16";
    case WireType::kFloat16:
      return "float16";
  }
  return "unknown";
}

float HalfToFloat(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0x1f) {
    out = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    out = sign;
  } else {
    // Subnormal: normalise the mantissa.
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ffu;
    out = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mantissa << 13);
  }
  float result;
  std::memcpy(&result, &out, sizeof(result));
  return result;
}

uint16_t FloatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // Rounds to >= 65520: infinity.
  if (abs >= 0x38800000u) {
    // Normal half: rebias the exponent and round the 13 dropped bits to even.
    uint32_t rebased = abs - (112u << 23);
    uint32_t rounded = rebased + 0x0fffu + ((rebased >> 13) & 1u);
    return sign | static_cast<uint16_t>(rounded >> 13);
  }
  if (abs < 0x33000000u) return sign;  // Below half the smallest subnormal: zero.
  // Subnormal half: value = mantissa * 2^-24, round to even.
  uint32_t exponent = abs >> 23;
  uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126 - exponent;  // 14..24
  uint32_t truncated = mantissa >> shift;
  uint32_t remainder = mantissa & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (remainder > half || (remainder == half && (truncated & 1u))) ++truncated;
  return sign | static_cast<uint16_t>(truncated);
}

void DecodeToFloat(WireType type, const void* src, float* dst, size_t count) {
  const auto* bytes = static_cast<const unsigned char*>(src);
#if defined(__x86_64__)
  if (type != WireType::kFloat32 && HasAvx2F16c()) {
    const size_t done = DecodeAvx2(type, bytes, dst, count);
    bytes += 2 * done;
    dst += done;
    count -= done;
  }
#endif
  switch (type) {
    case WireType::kFloat32:
      if (count != 0) std::memcpy(dst, bytes, count * sizeof(float));  // May be null when empty.
      return;
    case WireType::kBFloat16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        dst[i] = BFloat16ToFloat(h);
      }
      return;
    case WireType::kFloat16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        dst[i] = HalfToFloat(h);
      }
      return;
  }
}

void EncodeFromFloat(WireType type, const float* src, void* dst, size_t count) {
  auto* bytes = static_cast<unsigned char*>(dst);
#if defined(__x86_64__)
  // float16 stays scalar: F16C's NaN payloads differ from FloatToHalf's.
  if (type == WireType::kBFloat16 && HasAvx2F16c()) {
    const size_t done = EncodeBFloat16Avx2(src, bytes, count);
    bytes += 2 * done;
    src += done;
    count -= done;
  }
#endif
  switch (type) {
    case WireType::kFloat32:
      if (count != 0) std::memcpy(bytes, src, count * sizeof(float));  // May be null when empty.
      return;
    case WireType::kBFloat16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t h = FloatToBFloat16(src[i]);
        std::memcpy(bytes + 2 * i, &h, 2);
      }
      return;
    case WireType::kFloat16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t h = FloatToHalf(src[i]);
        std::memcpy(bytes + 2 * i, &h, 2);
      }
      return;
  }
}

}  // namespace optstate
