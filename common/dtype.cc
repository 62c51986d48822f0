// Exact float32 <-> bfloat16/float16 conversions used on both ends of the wire.
#include "optstate/dtype.h"

namespace optstate {

absl::string_view WireTypeName(WireType type) {
  switch (type) {
    case WireType::kFloat32: return "float32";
    case WireType::kBFloat16: return "bfloat16";
    case WireType::kFloat16: return "float16";
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
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
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
  switch (type) {
    case WireType::kFloat32:
      std::memcpy(dst, bytes, count * sizeof(float));
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
  switch (type) {
    case WireType::kFloat32:
      std::memcpy(bytes, src, count * sizeof(float));
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
