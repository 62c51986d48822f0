// Typed views of a caller's buffers for Client::Step: one view is a gradient
// or a params_out in float32, bfloat16 or float16, so a wrong pair cannot be given.
#ifndef OPTSTATE_BUFFER_VIEW_H_
#define OPTSTATE_BUFFER_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "absl/types/span.h"
#include "optstate/dtype.h"

namespace optstate {

// A caller's contiguous buffer of elements of one WireType (float32,
// bfloat16 or float16), not owned: the caller keeps it alive and unchanged
// while a call that was given it runs. Cheap to copy.
class ConstBufferView {
 public:
  ConstBufferView() = default;  // Empty, float32.
  // float32 elements. Implicit, so a span (or a vector) of floats passes as it is.
  ConstBufferView(absl::Span<const float> floats)  // NOLINT(google-explicit-constructor)
      : data_(floats.data()), size_(floats.size()) {}
  // Anything convertible to absl::Span<const float> (std::vector<float>, ...).
  template <typename T,
            typename = std::enable_if_t<std::is_convertible_v<T&&, absl::Span<const float>> &&
                                        !std::is_same_v<std::decay_t<T>, ConstBufferView> &&
                                        !std::is_same_v<std::decay_t<T>, absl::Span<const float>>>>
  ConstBufferView(T&& floats)  // NOLINT(google-explicit-constructor)
      : ConstBufferView(absl::Span<const float>(std::forward<T>(floats))) {}

  // 16-bit elements of `dtype`, which must be kBFloat16 or kFloat16 (the
  // call given the view refuses another with INVALID_ARGUMENT).
  static ConstBufferView Of16Bit(absl::Span<const uint16_t> elements, WireType dtype) {
    ConstBufferView view;
    view.data_ = elements.data();
    view.size_ = elements.size();
    view.dtype_ = dtype;
    view.element_bytes_ = 2;
    return view;
  }

  const void* data() const { return data_; }
  size_t size() const { return size_; }  // Elements, not bytes.
  WireType dtype() const { return dtype_; }
  bool empty() const { return size_ == 0; }
  // 4 for a float32 view, 2 for one made by Of16Bit (whatever its dtype).
  size_t element_bytes() const { return element_bytes_; }

 private:
  const void* data_ = nullptr;
  size_t size_ = 0;
  WireType dtype_ = WireType::kFloat32;
  size_t element_bytes_ = 4;
};

// The same for a buffer the call writes into.
class BufferView {
 public:
  BufferView() = default;  // Empty, float32.
  // float32 elements. Implicit, so a span (or a vector) of floats passes as it is.
  BufferView(absl::Span<float> floats)  // NOLINT(google-explicit-constructor)
      : data_(floats.data()), size_(floats.size()) {}
  // Anything convertible to absl::Span<float> (as for the span, a mutable
  // container passes through absl::MakeSpan).
  template <typename T,
            typename = std::enable_if_t<std::is_convertible_v<T&&, absl::Span<float>> &&
                                        !std::is_same_v<std::decay_t<T>, BufferView> &&
                                        !std::is_same_v<std::decay_t<T>, absl::Span<float>>>>
  BufferView(T&& floats)  // NOLINT(google-explicit-constructor)
      : BufferView(absl::Span<float>(std::forward<T>(floats))) {}

  // 16-bit elements of `dtype`, which must be kBFloat16 or kFloat16 (the
  // call given the view refuses another with INVALID_ARGUMENT).
  static BufferView Of16Bit(absl::Span<uint16_t> elements, WireType dtype) {
    BufferView view;
    view.data_ = elements.data();
    view.size_ = elements.size();
    view.dtype_ = dtype;
    view.element_bytes_ = 2;
    return view;
  }

  void* data() const { return data_; }
  size_t size() const { return size_; }  // Elements, not bytes.
  WireType dtype() const { return dtype_; }
  bool empty() const { return size_ == 0; }
  // 4 for a float32 view, 2 for one made by Of16Bit (whatever its dtype).
  size_t element_bytes() const { return element_bytes_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  WireType dtype_ = WireType::kFloat32;
  size_t element_bytes_ = 4;
};

}  // namespace optstate

#endif  // OPTSTATE_BUFFER_VIEW_H_
