// Specification of the wire element types (common/include/optstate/dtype.h):
// conversions are checked against independent references (nearest-even by
// distance in double, binary16 by its definition, and the F16C instructions
// where the CPU has them), exhaustively where the input space allows.
#include "optstate/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>

#include "common/bfloat16_avx2.h"
#endif

#include "tests/testing/test_seed.h"

namespace optstate {

// Readable parameter values in test listings.
static void PrintTo(WireType type, std::ostream* os) { *os << WireTypeName(type); }

namespace {

namespace seeds = ::optstate::testing;

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint32_t ToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

std::string Hex(uint32_t bits) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", bits);
  return text;
}

bool HalfIsNaN(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool BFloat16IsNaN(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// ---------------------------------------------------------------------------
// Independent references.

// Nearest bfloat16 of a non-NaN float, ties to even, found by comparing the
// distances to the two bfloat16 neighbours in double. Past the largest
// bfloat16 the upper neighbour stands for 2^128, as IEEE rounding prescribes,
// and encodes as infinity.
uint16_t ReferenceFloatToBFloat16(float x) {
  const uint32_t bits = ToBits(x);
  const uint32_t toward_zero = bits & 0xffff0000u;
  if (toward_zero == bits) return static_cast<uint16_t>(bits >> 16);
  const uint32_t away = toward_zero + 0x10000u;  // Same sign, next magnitude.
  const double a = std::fabs(static_cast<double>(x));
  const double low = std::fabs(static_cast<double>(FromBits(toward_zero)));
  const double high = (away & 0x7fffffffu) == 0x7f800000u
                          ? std::ldexp(1.0, 128)
                          : std::fabs(static_cast<double>(FromBits(away)));
  const double below = a - low, above = high - a;
  if (below < above) return static_cast<uint16_t>(toward_zero >> 16);
  if (above < below) return static_cast<uint16_t>(away >> 16);
  return static_cast<uint16_t>(((toward_zero >> 16) & 1u) == 0 ? toward_zero >> 16 : away >> 16);
}

// binary16 value of a non-NaN pattern, by its definition.
double HalfValueByDefinition(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double magnitude;
  if (exponent == 0x1f) {
    magnitude = std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);
  } else {
    magnitude = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return (h & 0x8000) ? -magnitude : magnitude;
}

// Nearest binary16 of a non-NaN float, ties to even: scale |x| so that one
// half ulp of its binade is 1, round to the nearest integer (ties to even
// under the default rounding mode) and rebuild the pattern. Values at or past
// 65520 (65504 plus half an ulp) round to infinity.
uint16_t ReferenceFloatToHalf(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65520.0) return sign | 0x7c00;
  if (a == 0.0) return sign;
  int e;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e).
  const int ulp_exponent = (e - 1 < -14 ? -14 : e - 1) - 10;
  const double units = std::nearbyint(std::ldexp(a, -ulp_exponent));  // Exact scaling.
  const double rounded = std::ldexp(units, ulp_exponent);
  if (rounded < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(units);  // Subnormal.
  std::frexp(rounded, &e);
  const int mantissa = static_cast<int>(std::ldexp(rounded, 11 - e)) - 1024;
  return sign | static_cast<uint16_t>(((e - 1 + 15) << 10) | mantissa);
}

#if defined(__x86_64__)
#define OPTSTATE_F16C __attribute__((target("f16c")))
OPTSTATE_F16C uint16_t HardwareFloatToHalf(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}
OPTSTATE_F16C float HardwareHalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
bool HasF16C() { return __builtin_cpu_supports("f16c"); }
#else
uint16_t HardwareFloatToHalf(float) { return 0; }
float HardwareHalfToFloat(uint16_t) { return 0; }
bool HasF16C() { return false; }
#endif

// Random floats: fully random patterns, and patterns whose exponent lies in
// the range where binary16 rounding happens (2^-26 .. 2^17), subnormal
// halves included.
std::vector<float> RandomFloats(size_t n, std::mt19937_64& rng) {
  std::vector<float> out(n);
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_int_distribution<uint32_t> exponent(127 - 26, 127 + 17);
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = any(rng);
    if (i % 2 == 1) bits = (bits & 0x807fffffu) | (exponent(rng) << 23);
    out[i] = FromBits(bits);
  }
  return out;
}

// The reference must itself agree with binary16's definition.
TEST(DtypeTestReferences, ReferenceFloatToHalfIsExactOnEveryFiniteHalfValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    const float value = static_cast<float>(HalfValueByDefinition(static_cast<uint16_t>(h)));
    ASSERT_EQ(ReferenceFloatToHalf(value), h) << Hex(h);
  }
}

// ---------------------------------------------------------------------------
// WireType.

TEST(WireType, SizesAndNames) {
  EXPECT_EQ(WireTypeSize(WireType::kFloat32), 4u);
  EXPECT_EQ(WireTypeSize(WireType::kBFloat16), 2u);
  EXPECT_EQ(WireTypeSize(WireType::kFloat16), 2u);
  EXPECT_EQ(WireTypeName(WireType::kFloat32), "float32");
  EXPECT_EQ(WireTypeName(WireType::kBFloat16), "bfloat16");
  EXPECT_EQ(WireTypeName(WireType::kFloat16), "float16");
}

// ---------------------------------------------------------------------------
// bfloat16.

TEST(BFloat16, TiesRoundToEven) {
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808000u)), 0x3f80);  // 1 + half ulp -> 1.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f818000u)), 0x3f82);  // Odd below: up.
  EXPECT_EQ(FloatToBFloat16(FromBits(0xbf808000u)), 0xbf80);
  EXPECT_EQ(FloatToBFloat16(FromBits(0xbf818000u)), 0xbf82);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00008000u)), 0x0000);  // Float subnormals too.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00018000u)), 0x0002);
}

TEST(BFloat16, NonTiesRoundToNearest) {
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f80ffffu)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3fffffffu)), 0x4000);  // Carries into the exponent.
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
}

TEST(BFloat16, NaNStaysNaNWithItsSign) {
  // 0x7f800001 and 0x7f80ffff truncate to the infinity pattern; 0x7fffffff
  // would carry into the sign bit if rounded like a number.
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0x7fffffffu, 0x7fbfffffu}) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint16_t b = FloatToBFloat16(FromBits(bits | sign));
      EXPECT_TRUE(BFloat16IsNaN(b)) << Hex(bits | sign) << " -> " << Hex(b);
      EXPECT_EQ(b & 0x8000, sign >> 16) << Hex(bits | sign);
    }
  }
}

TEST(BFloat16, InfinityStaysInfinity) {
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::infinity()), 0xff80);
}

TEST(BFloat16, LargestFloatsRoundToLargestBFloat16OrInfinity) {
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f7f0000u)), 0x7f7f);  // Largest bfloat16.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f7f7fffu)), 0x7f7f);  // Below the midpoint.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f7f8000u)), 0x7f80);  // Tie: even is infinity.
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::lowest()), 0xff80);
}

// Every bfloat16 value, and for each the float patterns around the rounding
// decisions: exact, one above, just below/at/above the midpoint, the top.
TEST(BFloat16, MatchesNearestEvenReferenceAroundEveryBFloat16Value) {
  for (uint32_t high = 0; high < 0x10000; ++high) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const uint32_t bits = (high << 16) | low;
      const float x = FromBits(bits);
      if (std::isnan(x)) continue;
      ASSERT_EQ(FloatToBFloat16(x), ReferenceFloatToBFloat16(x)) << Hex(bits);
    }
  }
}

TEST(BFloat16, MatchesNearestEvenReferenceOnRandomFloats) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  for (float x : RandomFloats(1 << 20, rng)) {
    if (std::isnan(x)) continue;
    ASSERT_EQ(FloatToBFloat16(x), ReferenceFloatToBFloat16(x)) << Hex(ToBits(x));
  }
}

TEST(BFloat16, EveryNonNaNPatternRoundTripsThroughFloat) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float wide = BFloat16ToFloat(static_cast<uint16_t>(b));
    EXPECT_EQ(ToBits(wide), b << 16) << Hex(b);  // Widening appends zero bits.
    if (BFloat16IsNaN(static_cast<uint16_t>(b))) {
      EXPECT_TRUE(BFloat16IsNaN(FloatToBFloat16(wide))) << Hex(b);
    } else {
      EXPECT_EQ(FloatToBFloat16(wide), b) << Hex(b);
    }
  }
}

#if defined(__x86_64__)
// QuietFloatToBFloat16x8 (common/bfloat16_avx2.h), the AdamW kernel's
// narrowing, is FloatToBFloat16 on every float32 pattern but the signaling
// NaNs, which arithmetic never returns: all 2^32 minus those, eight lanes a
// call, each lane against its own scalar answer.
__attribute__((target("avx2"))) bool QuietNarrowingEqualsScalarFrom(uint64_t first, uint64_t end,
                                                                    uint32_t* differs) {
  alignas(32) uint32_t lanes[8];
  alignas(16) uint16_t narrowed[8];
  for (uint64_t base = first; base < end; base += 8) {
    for (uint32_t k = 0; k < 8; ++k) {
      uint32_t bits = static_cast<uint32_t>(base + k);
      const bool signaling = (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0 &&
                             (bits & 0x00400000u) == 0;
      if (signaling) bits |= 0x00400000u;  // Quieted, as arithmetic would.
      lanes[k] = bits;
    }
    _mm_store_si128(reinterpret_cast<__m128i*>(narrowed),
                    dtype_internal::QuietFloatToBFloat16x8(
                        _mm256_load_ps(reinterpret_cast<const float*>(lanes))));
    for (uint32_t k = 0; k < 8; ++k) {
      if (narrowed[k] != FloatToBFloat16(FromBits(lanes[k]))) {
        *differs = lanes[k];
        return false;
      }
    }
  }
  return true;
}

TEST(BFloat16, QuietNarrowingOfEightLanesEqualsTheScalarOneOnEveryPattern) {
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no AVX2 here";
  uint32_t differs = 0;
  EXPECT_TRUE(QuietNarrowingEqualsScalarFrom(0, uint64_t{1} << 32, &differs))
      << "first difference at " << Hex(differs) << ": " << Hex(FloatToBFloat16(FromBits(differs)))
      << " wanted";
}
#endif

// ---------------------------------------------------------------------------
// float16.

TEST(Float16, HalfToFloatMatchesTheDefinitionForEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float wide = HalfToFloat(static_cast<uint16_t>(h));
    if (HalfIsNaN(static_cast<uint16_t>(h))) {
      EXPECT_TRUE(std::isnan(wide)) << Hex(h);
      EXPECT_EQ(std::signbit(wide), (h & 0x8000) != 0) << Hex(h);
      continue;
    }
    EXPECT_EQ(static_cast<double>(wide), HalfValueByDefinition(static_cast<uint16_t>(h))) << Hex(h);
    EXPECT_EQ(std::signbit(wide), (h & 0x8000) != 0) << Hex(h);  // -0 stays -0.
  }
}

TEST(Float16, HalfToFloatMatchesF16CForEveryNonNaNPattern) {
  if (!HasF16C()) GTEST_SKIP() << "CPU without F16C";
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (HalfIsNaN(static_cast<uint16_t>(h))) continue;
    EXPECT_EQ(ToBits(HalfToFloat(static_cast<uint16_t>(h))),
              ToBits(HardwareHalfToFloat(static_cast<uint16_t>(h))))
        << Hex(h);
  }
}

TEST(Float16, EveryNonNaNPatternRoundTripsToTheSameBits) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (HalfIsNaN(static_cast<uint16_t>(h))) continue;
    EXPECT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << Hex(h);
  }
}

TEST(Float16, EveryNaNPatternStaysNaNWithItsSignThroughRoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (!HalfIsNaN(static_cast<uint16_t>(h))) continue;
    const uint16_t back = FloatToHalf(HalfToFloat(static_cast<uint16_t>(h)));
    EXPECT_TRUE(HalfIsNaN(back)) << Hex(h) << " -> " << Hex(back);
    EXPECT_EQ(back & 0x8000, h & 0x8000) << Hex(h);
  }
}

// For every pair of neighbouring halves: both values, the midpoint between
// them (a tie), and the floats just below and just above the midpoint.
TEST(Float16, FloatToHalfMatchesReferenceAtEveryRoundingBoundary) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float low = static_cast<float>(HalfValueByDefinition(static_cast<uint16_t>(h)));
    const double high_value = h + 1 == 0x7c00 ? 65536.0  // The step past the largest half.
                                              : HalfValueByDefinition(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((low + high_value) / 2);  // Exact in float.
    const float inf = std::numeric_limits<float>::infinity();
    for (float x : {low, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, inf),
                    std::nextafter(low, inf)}) {
      for (float signed_x : {x, -x}) {
        ASSERT_EQ(FloatToHalf(signed_x), ReferenceFloatToHalf(signed_x))
            << Hex(ToBits(signed_x)) << " (" << signed_x << ")";
      }
    }
  }
}

TEST(Float16, FloatToHalfMatchesReferenceOnRandomFloats) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  for (float x : RandomFloats(1 << 21, rng)) {
    if (std::isnan(x)) {
      ASSERT_TRUE(HalfIsNaN(FloatToHalf(x))) << Hex(ToBits(x));
      continue;
    }
    ASSERT_EQ(FloatToHalf(x), ReferenceFloatToHalf(x)) << Hex(ToBits(x)) << " (" << x << ")";
  }
}

TEST(Float16, FloatToHalfMatchesF16COnRandomFloats) {
  if (!HasF16C()) GTEST_SKIP() << "CPU without F16C";
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  for (float x : RandomFloats(1 << 21, rng)) {
    const uint16_t got = FloatToHalf(x), want = HardwareFloatToHalf(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(HalfIsNaN(got) && HalfIsNaN(want)) << Hex(ToBits(x));
      continue;
    }
    ASSERT_EQ(got, want) << Hex(ToBits(x)) << " (" << x << ")";
  }
}

TEST(Float16, SubnormalRangeRoundsToNearestEven) {
  const double tiny = std::ldexp(1.0, -24);  // Smallest subnormal half.
  EXPECT_EQ(FloatToHalf(static_cast<float>(tiny)), 0x0001);
  EXPECT_EQ(FloatToHalf(static_cast<float>(tiny / 2)), 0x0000);  // Tie: even is zero.
  EXPECT_EQ(FloatToHalf(std::nextafter(static_cast<float>(tiny / 2), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToHalf(static_cast<float>(1.5 * tiny)), 0x0002);     // Tie: up to even.
  EXPECT_EQ(FloatToHalf(static_cast<float>(2.5 * tiny)), 0x0002);     // Tie: down to even.
  EXPECT_EQ(FloatToHalf(static_cast<float>(1023 * tiny)), 0x03ff);    // Largest subnormal.
  EXPECT_EQ(FloatToHalf(static_cast<float>(1023.5 * tiny)), 0x0400);  // Up to smallest normal.
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(FloatToHalf(-static_cast<float>(tiny)), 0x8001);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
}

TEST(Float16, OverflowsToInfinityFrom65520) {
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);  // Largest half.
  EXPECT_EQ(FloatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
}

// ---------------------------------------------------------------------------
// NarrowedFiniteBoundBits: the bound agrees with narrowing then widening.

// Whether `bits` as a float is finite after a round trip through `type`.
bool FiniteOnTheWire(WireType type, uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  unsigned char wire[4];
  float widened;
  EncodeFromFloat(type, &value, wire, 1);
  DecodeToFloat(type, wire, &widened, 1);
  return std::isfinite(widened);
}

TEST(NarrowedFiniteBound, AgreesWithTheRoundTripNearTheBoundAndAcrossAllPatterns) {
  for (WireType type : {WireType::kFloat32, WireType::kBFloat16, WireType::kFloat16}) {
    SCOPED_TRACE(std::string(WireTypeName(type)));
    const uint32_t bound = NarrowedFiniteBoundBits(type);
    std::vector<uint32_t> patterns;
    for (uint32_t d = 0; d < (1u << 18); ++d) {  // Every pattern within 2^18 of the bound.
      patterns.push_back(bound - d - 1);
      patterns.push_back(bound + d);
    }
    for (uint64_t bits = 0; bits <= 0x7fffffffu; bits += 32749) {  // A sweep of the rest.
      patterns.push_back(static_cast<uint32_t>(bits));
    }
    patterns.push_back(0x7f800000u);  // Infinity.
    patterns.push_back(0x7fc00000u);  // NaN.
    for (uint32_t abs : patterns) {
      for (uint32_t sign : {0u, 0x80000000u}) {
        const uint32_t bits = (abs & 0x7fffffffu) | sign;
        ASSERT_EQ((bits & 0x7fffffffu) < bound, FiniteOnTheWire(type, bits))
            << "float bits 0x" << std::hex << bits;
      }
    }
  }
}

TEST(NarrowedFiniteBound, AllNarrowToFiniteFindsOneBadValueAtEveryPosition) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  for (WireType type : {WireType::kFloat32, WireType::kBFloat16, WireType::kFloat16}) {
    SCOPED_TRACE(std::string(WireTypeName(type)));
    const uint32_t bound = NarrowedFiniteBoundBits(type);
    std::uniform_int_distribution<uint32_t> finite_bits(0, bound - 1);
    std::uniform_int_distribution<uint32_t> bad_bits(bound, 0x7fffffffu);
    for (size_t n : {0, 1, 7, 31, 32, 33, 95, 1031}) {
      std::vector<float> values(n);
      for (float& v : values) {
        uint32_t bits = finite_bits(rng) | (rng() & 1 ? 0x80000000u : 0);
        std::memcpy(&v, &bits, sizeof(v));
      }
      ASSERT_TRUE(AllNarrowToFinite(type, values.data(), n)) << n;
      for (size_t at = 0; at < n; ++at) {
        const float kept = values[at];
        uint32_t bits = at == 0 ? bound : bad_bits(rng);  // The bound itself, once.
        if (rng() & 1) bits |= 0x80000000u;               // Either sign.
        std::memcpy(&values[at], &bits, sizeof(float));
        ASSERT_FALSE(AllNarrowToFinite(type, values.data(), n)) << n << " at " << at;
        values[at] = kept;
      }
    }
  }
}

TEST(NarrowedFiniteBound, AllWireFiniteFindsOneBadElementAtEveryPositionAndAlignment) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  const float bad_values[] = {
      std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()};
  for (WireType type : {WireType::kFloat32, WireType::kBFloat16, WireType::kFloat16}) {
    SCOPED_TRACE(std::string(WireTypeName(type)));
    const size_t width = WireTypeSize(type);
    for (size_t n : {0, 1, 15, 16, 17, 1031}) {
      for (size_t misalign : {0, 1, 2}) {
        std::vector<float> values(n);
        for (float& v : values) v = normal(rng);
        std::vector<unsigned char> storage(n * width + misalign);
        unsigned char* wire = storage.data() + misalign;
        EncodeFromFloat(type, values.data(), wire, n);
        ASSERT_TRUE(AllWireFinite(type, wire, n)) << n;
        for (size_t at = 0; at < n; ++at) {
          unsigned char kept[4];
          std::memcpy(kept, wire + at * width, width);
          const float bad = bad_values[rng() % 4];
          EncodeFromFloat(type, &bad, wire + at * width, 1);
          ASSERT_FALSE(AllWireFinite(type, wire, n)) << n << " at " << at;
          std::memcpy(wire + at * width, kept, width);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// DecodeToFloat / EncodeFromFloat at every alignment.

// A byte buffer whose payload starts `misalign` bytes past a 16-byte boundary
// and is surrounded by 0xAB guard bytes.
class GuardedBytes {
 public:
  GuardedBytes(size_t payload, size_t misalign)
      : storage_(kGuard + misalign + payload + kGuard, 0xAB),
        begin_(kGuard + misalign),
        payload_(payload) {}
  unsigned char* data() { return storage_.data() + begin_; }
  bool GuardsIntact() const {
    for (size_t i = 0; i < storage_.size(); ++i) {
      const bool inside = i >= begin_ && i < begin_ + payload_;
      if (!inside && storage_[i] != 0xAB) return false;
    }
    return true;
  }

 private:
  static constexpr size_t kGuard = 32;
  std::vector<unsigned char> storage_;
  size_t begin_, payload_;
};

class DecodeEncode : public ::testing::TestWithParam<std::tuple<WireType, size_t>> {};

constexpr size_t kElements = 1031;

TEST_P(DecodeEncode, EncodeFromFloatWritesEachElementsConversionAtAnyAlignment) {
  const auto [type, misalign] = GetParam();
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const std::vector<float> values = RandomFloats(kElements, rng);
  const size_t width = WireTypeSize(type);
  GuardedBytes out(kElements * width, misalign);

  EncodeFromFloat(type, values.data(), out.data(), kElements);

  for (size_t i = 0; i < kElements; ++i) {
    unsigned char want[4];
    if (type == WireType::kFloat32) {
      std::memcpy(want, &values[i], 4);
    } else {
      const uint16_t h =
          type == WireType::kBFloat16 ? FloatToBFloat16(values[i]) : FloatToHalf(values[i]);
      std::memcpy(want, &h, 2);
    }
    ASSERT_EQ(std::memcmp(out.data() + width * i, want, width), 0) << "element " << i;
  }
  EXPECT_TRUE(out.GuardsIntact()) << "EncodeFromFloat wrote outside its buffer";
}

TEST_P(DecodeEncode, DecodeToFloatWidensEachElementAtAnyAlignment) {
  const auto [type, misalign] = GetParam();
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const size_t width = WireTypeSize(type);
  GuardedBytes in(kElements * width, misalign);
  std::uniform_int_distribution<int> byte(0, 255);
  for (size_t i = 0; i < kElements * width; ++i) {
    in.data()[i] = static_cast<unsigned char>(byte(rng));
  }
  // Output poisoned with NaN bits, one guard element on each side.
  std::vector<float> out(kElements + 2, FromBits(0xffffffffu));

  DecodeToFloat(type, in.data(), out.data() + 1, kElements);

  EXPECT_EQ(ToBits(out.front()), 0xffffffffu) << "wrote before dst";
  EXPECT_EQ(ToBits(out.back()), 0xffffffffu) << "wrote past dst + count";
  for (size_t i = 0; i < kElements; ++i) {
    const float got = out[i + 1];
    uint32_t raw = 0;
    std::memcpy(&raw, in.data() + width * i, width);
    if (type == WireType::kFloat32) {
      ASSERT_EQ(ToBits(got), raw) << "element " << i;
    } else if (type == WireType::kBFloat16) {
      ASSERT_EQ(ToBits(got), raw << 16) << "element " << i;
    } else if (HalfIsNaN(static_cast<uint16_t>(raw))) {
      ASSERT_TRUE(std::isnan(got)) << "element " << i << " " << Hex(raw);
    } else {
      ASSERT_EQ(static_cast<double>(got), HalfValueByDefinition(static_cast<uint16_t>(raw)))
          << "element " << i << " " << Hex(raw);
    }
  }
  EXPECT_TRUE(in.GuardsIntact());
}

// Floats exactly representable in the narrow type survive Encode then Decode.
TEST_P(DecodeEncode, RepresentableValuesRoundTripAtAnyAlignment) {
  const auto [type, misalign] = GetParam();
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint32_t> pattern;
  std::vector<float> values(kElements);
  for (float& v : values) {
    do {
      const uint32_t p = pattern(rng);
      v = type == WireType::kBFloat16 ? FromBits(p & 0xffff0000u)
          : type == WireType::kFloat16
              ? static_cast<float>(HalfValueByDefinition(static_cast<uint16_t>(p)))
              : FromBits(p);
    } while (std::isnan(v));
  }
  GuardedBytes wire(kElements * WireTypeSize(type), misalign);
  std::vector<float> back(kElements);

  EncodeFromFloat(type, values.data(), wire.data(), kElements);
  DecodeToFloat(type, wire.data(), back.data(), kElements);

  EXPECT_EQ(std::memcmp(back.data(), values.data(), kElements * sizeof(float)), 0);
  EXPECT_TRUE(wire.GuardsIntact());
}

INSTANTIATE_TEST_SUITE_P(
    TypesAndMisalignments, DecodeEncode,
    ::testing::Combine(::testing::Values(WireType::kFloat32, WireType::kBFloat16,
                                         WireType::kFloat16),
                       ::testing::Values(size_t{0}, size_t{1}, size_t{2}, size_t{3})),
    [](const auto& info) {
      return std::string(WireTypeName(std::get<0>(info.param))) + "_Misalign" +
             std::to_string(std::get<1>(info.param));
    });

}  // namespace
}  // namespace optstate
