// Fast passes over whole blocks (AllWireFinite, AllNarrowToFinite); the
// element-by-element look only to name the first bad element.
#include "client/step/finite_check.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "client/step/buffer_parts.h"

namespace optstate::client_internal {
namespace {

constexpr size_t kBlock = 4096;

// The element at `i` of the gradient as the caller gave it (a 16-bit one widened).
float GivenValue(const GroupStep& group, size_t i) {
  float value;
  if (Is16Bit(group.gradient)) {
    DecodeToFloat(group.gradient.dtype(), static_cast<const uint16_t*>(group.gradient.data()) + i,
                  &value, 1);
  } else {
    value = static_cast<const float*>(group.gradient.data())[i];
  }
  return value;
}

// Whether the element at `i` of the gradient is finite as the daemon reads it.
bool FiniteAsSent(const GroupStep& group, const StepOptions& options, size_t i) {
  float value = GivenValue(group, i);
  if (options.gradient_dtype != WireType::kFloat32) {
    unsigned char wire[2];
    EncodeFromFloat(options.gradient_dtype, &value, wire, 1);
    DecodeToFloat(options.gradient_dtype, wire, &value, 1);
  }
  return std::fabs(value * options.grad_scale.value_or(1.0f)) <= FLT_MAX;
}

// `count` widened values at `values` all finite after `scale`.
bool AllScaledFinite(const float* values, size_t count, float scale) {
  bool all_finite = true;
  for (size_t i = 0; i < count; ++i) all_finite &= std::fabs(values[i] * scale) <= FLT_MAX;
  return all_finite;
}

}  // namespace

absl::Status NotFiniteError(const GroupStep& group, const StepOptions& options, size_t from) {
  const size_t n = group.gradient.size();
  size_t bad = from;
  while (bad < n && FiniteAsSent(group, options, bad)) ++bad;
  return absl::InvalidArgumentError(absl::StrCat(
      "gradient of group '", group.group, "' at element ", bad, " is ",
      bad < n ? GivenValue(group, bad) : 0.0f, ", which is not finite as ",
      WireTypeName(options.gradient_dtype), " after grad_scale ", options.grad_scale.value_or(1.0f),
      "; the whole step was refused and nothing was sent"));
}

absl::Status CheckGivenFinite(const GroupStep& group, const StepOptions& options, uint64_t offset,
                              uint64_t count) {
  const WireType type = options.gradient_dtype;
  const float scale = options.grad_scale.value_or(1.0f);
  if (std::fabs(scale) <= 1.0f) {
    const bool finite =
        Is16Bit(group.gradient)
            ? AllWireFinite(type, SixteenBitPart(group.gradient, offset, count).data(), count)
            : AllNarrowToFinite(type, FloatPart(group.gradient, offset, count).data(), count);
    return finite ? absl::OkStatus() : NotFiniteError(group, options, offset);
  }
  // A larger scale can overflow a finite narrowed value: each block is
  // narrowed and widened as the daemon will (a 16-bit gradient only
  // widened), then scaled.
  float widened[kBlock];
  uint16_t narrowed[kBlock];
  for (uint64_t begin = offset; begin < offset + count; begin += kBlock) {
    const size_t n = std::min<uint64_t>(kBlock, offset + count - begin);
    const float* values = widened;
    if (Is16Bit(group.gradient)) {
      DecodeToFloat(type, SixteenBitPart(group.gradient, begin, n).data(), widened, n);
    } else if (type != WireType::kFloat32) {
      EncodeFromFloat(type, FloatPart(group.gradient, begin, n).data(), narrowed, n);
      DecodeToFloat(type, narrowed, widened, n);
    } else {
      values = FloatPart(group.gradient, begin, n).data();
    }
    if (!AllScaledFinite(values, n, scale)) return NotFiniteError(group, options, begin);
  }
  return absl::OkStatus();
}

absl::Status CheckWireFinite(const GroupStep& group, const StepOptions& options, const void* wire,
                             uint64_t offset, uint64_t count) {
  const WireType type = options.gradient_dtype;
  const float scale = options.grad_scale.value_or(1.0f);
  if (std::fabs(scale) <= 1.0f) {
    return AllWireFinite(type, wire, count) ? absl::OkStatus()
                                            : NotFiniteError(group, options, offset);
  }
  const char* bytes = static_cast<const char*>(wire);
  const size_t size = WireTypeSize(type);
  float widened[kBlock];
  for (uint64_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = std::min<uint64_t>(kBlock, count - begin);
    DecodeToFloat(type, bytes + begin * size, widened, n);
    if (!AllScaledFinite(widened, n, scale)) return NotFiniteError(group, options, offset + begin);
  }
  return absl::OkStatus();
}

}  // namespace optstate::client_internal
