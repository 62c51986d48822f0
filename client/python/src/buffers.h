// Arrays from Python (numpy arrays, torch CPU tensors) checked and viewed in
// place: contiguous float32, bfloat16 or float16 on the CPU, never copied.
#ifndef OPTSTATE_PYTHON_BUFFERS_H_
#define OPTSTATE_PYTHON_BUFFERS_H_

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "optstate/dtype.h"

namespace optstate::python {

// Every WireType: the members of optstate.WireType, named by WireTypeName.
inline constexpr WireType kWireTypes[] = {WireType::kFloat32, WireType::kBFloat16,
                                          WireType::kFloat16};

// A WireType (optstate.WireType), or its name (WireTypeName: "float32",
// "bfloat16", "float16"; also "fp32", "bf16", "fp16", and torch or numpy
// dtypes, by their str()); ValueError naming `what` otherwise.
WireType ParseWireType(nanobind::handle dtype, const std::string& what);

// A view of a caller's array. `array` keeps the caller's object alive (and
// with it the memory) while the view is used, without the GIL; or, for a
// torch tensor read by its attributes (prepared_step.h), `owner` does.
struct HostBuffer {
  nanobind::ndarray<nanobind::ro> array;
  nanobind::object owner;
  WireType type = WireType::kFloat32;  // The element type, as it would travel.
  void* data = nullptr;
  size_t size = 0;  // Elements.

  absl::Span<const float> floats() const { return {static_cast<const float*>(data), size}; }
  absl::Span<float> mutable_floats() const { return {static_cast<float*>(data), size}; }
  absl::Span<const uint16_t> halves() const { return {static_cast<const uint16_t*>(data), size}; }
  absl::Span<uint16_t> mutable_halves() const { return {static_cast<uint16_t*>(data), size}; }
};

// Views `object` as a C-contiguous CPU array of float32, bfloat16 or float16
// without copying it. `what` names the parameter in errors: TypeError when
// it is not an array (or a tensor that requires grad) or has another dtype,
// ValueError when it is not contiguous or not in CPU memory, or, with
// `writable`, is read-only.
HostBuffer ViewHostBuffer(nanobind::handle object, const std::string& what, bool writable);
// The same, with `what` made only when an error is thrown (a step views two
// buffers a group, and its groups may be hundreds).
HostBuffer ViewHostBuffer(nanobind::handle object, absl::FunctionRef<std::string()> what,
                          bool writable);

}  // namespace optstate::python

#endif  // OPTSTATE_PYTHON_BUFFERS_H_
