// Parts of a GroupStep's buffers as spans of their own element type. Not API.
#ifndef OPTSTATE_CLIENT_STEP_BUFFER_PARTS_H_
#define OPTSTATE_CLIENT_STEP_BUFFER_PARTS_H_

#include <cstdint>

#include "absl/types/span.h"
#include "optstate/buffer_view.h"

namespace optstate::client_internal {

// Whether a view holds 16-bit elements (made by Of16Bit) rather than floats.
inline bool Is16Bit(const ConstBufferView& view) { return view.element_bytes() == 2; }
inline bool Is16Bit(const BufferView& view) { return view.element_bytes() == 2; }

// Elements [offset, offset + count) of a view as floats; empty when the view
// is empty or 16-bit.
inline absl::Span<const float> FloatPart(const ConstBufferView& view, uint64_t offset,
                                         uint64_t count) {
  if (view.empty() || Is16Bit(view)) return {};
  return absl::MakeConstSpan(static_cast<const float*>(view.data()) + offset, count);
}
inline absl::Span<float> FloatPart(const BufferView& view, uint64_t offset, uint64_t count) {
  if (view.empty() || Is16Bit(view)) return {};
  return absl::MakeSpan(static_cast<float*>(view.data()) + offset, count);
}

// The same as 16-bit elements; empty when the view is empty or float32.
inline absl::Span<const uint16_t> SixteenBitPart(const ConstBufferView& view, uint64_t offset,
                                                 uint64_t count) {
  if (view.empty() || !Is16Bit(view)) return {};
  return absl::MakeConstSpan(static_cast<const uint16_t*>(view.data()) + offset, count);
}
inline absl::Span<uint16_t> SixteenBitPart(const BufferView& view, uint64_t offset,
                                           uint64_t count) {
  if (view.empty() || !Is16Bit(view)) return {};
  return absl::MakeSpan(static_cast<uint16_t*>(view.data()) + offset, count);
}

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_STEP_BUFFER_PARTS_H_
