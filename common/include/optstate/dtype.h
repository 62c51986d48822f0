// Element types a tensor can have on the wire, and exact conversions between
// them and float32 (round-to-nearest-even when narrowing).
#ifndef OPTSTATE_DTYPE_H_
#define OPTSTATE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"

namespace optstate {

enum class WireType { kFloat32, kBFloat16, kFloat16 };

// Bytes per element of `type`.
inline size_t WireTypeSize(WireType type) { return type == WireType::kFloat32 ? 4 : 2; }

// "float32", "bfloat16" or "float16".
absl::string_view WireTypeName(WireType type);

// bfloat16 is the top half of a float32: widening is exact.
inline float BFloat16ToFloat(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

// Round-to-nearest-even; NaN stays NaN (quiet), infinities stay infinite.
inline uint16_t FloatToBFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

// IEEE binary16 to float32; exact for every input, subnormals included.
float HalfToFloat(uint16_t bits);

// float32 to IEEE binary16 with round-to-nearest-even; overflow gives infinity.
uint16_t FloatToHalf(float value);

// Narrowing a float to `type` (EncodeFromFloat) gives a finite value exactly
// when the float's bits with the sign cleared are below this bound: the
// first value that rounds to infinity (float32: infinity itself). NaN bits
// are above every bound. Lets a caller check finiteness on the wire without
// converting.
inline uint32_t NarrowedFiniteBoundBits(WireType type) {
  switch (type) {
    case WireType::kFloat32:
      return 0x7f800000u;
    case WireType::kBFloat16:
      return 0x7f7f8000u;  // Halfway above 0x7f7f rounds to 0x7f80.
    case WireType::kFloat16:
      return 0x477ff000u;  // 65520 rounds to infinity.
  }
  return 0;
}

// Whether every one of `count` floats narrows to a finite `type` value
// (NarrowedFiniteBoundBits); AVX2 where the CPU has it.
bool AllNarrowToFinite(WireType type, const float* values, size_t count);

// Whether every one of `count` elements of `type` at `wire` (any alignment)
// is finite; AVX2 where the CPU has it.
bool AllWireFinite(WireType type, const void* wire, size_t count);

// Widens `count` elements of `type` at `src` (any alignment) into `dst`.
void DecodeToFloat(WireType type, const void* src, float* dst, size_t count);

// Narrows `count` floats into `type` at `dst` (any alignment).
void EncodeFromFloat(WireType type, const float* src, void* dst, size_t count);

}  // namespace optstate

#endif  // OPTSTATE_DTYPE_H_
