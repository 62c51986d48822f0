// nanobind's ndarray caster takes numpy arrays by the buffer protocol and
// torch tensors by DLPack; with no constraints and no conversion it never
// copies, so every check the caller needs is made here.
#include "buffers.h"

#include <nanobind/stl/string.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace nb = nanobind;

namespace optstate::python {
namespace {

std::string Describe(nb::handle object) {
  return nb::cast<std::string>(
      nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(object.ptr())))));
}

// torch tensors: torch's Tensor.__dlpack__ (what the ndarray caster calls) is
// Python code taking about 20 us a call, and __dlpack_device__ as much again;
// torch.utils.dlpack.to_dlpack makes the same capsule in C in well under one,
// and the caster takes a capsule as it is. Both are looked up once torch is
// imported (an object cannot be a torch tensor before that). The attribute
// names every view reads are interned once: a C string would be made into a
// Python string at every lookup.
struct TorchExport {
  PyObject* tensor_type = nullptr;
  PyObject* to_dlpack = nullptr;
  PyObject* requires_grad = nullptr;
  PyObject* is_cpu = nullptr;
};

const TorchExport& Torch() {
  static TorchExport torch;
  if (torch.tensor_type == nullptr) {
    PyObject* module = PyImport_GetModule(nb::str("torch").ptr());
    if (module == nullptr) {
      PyErr_Clear();
      return torch;
    }
    Py_DECREF(module);
    nb::module_ dlpack = nb::module_::import_("torch.utils.dlpack");
    nb::object type = nb::module_::import_("torch").attr("Tensor");
    nb::object to_dlpack = dlpack.attr("to_dlpack");
    torch.to_dlpack = to_dlpack.release().ptr();  // All kept for the process.
    torch.requires_grad = PyUnicode_InternFromString("requires_grad");
    torch.is_cpu = PyUnicode_InternFromString("is_cpu");
    torch.tensor_type = type.release().ptr();
  }
  return torch;
}

// A tensor's boolean attribute `name` (interned).
bool TensorFlag(nb::handle tensor, PyObject* name) {
  nb::object value = nb::steal(PyObject_GetAttr(tensor.ptr(), name));
  if (!value.is_valid()) throw nb::python_error();
  return nb::cast<bool>(value);
}

std::string DtypeName(const nb::dlpack::dtype& d) {
  const char* kind = "?";
  switch (static_cast<nb::dlpack::dtype_code>(d.code)) {
    case nb::dlpack::dtype_code::Int:
      kind = "int";
      break;
    case nb::dlpack::dtype_code::UInt:
      kind = "uint";
      break;
    case nb::dlpack::dtype_code::Float:
      kind = "float";
      break;
    case nb::dlpack::dtype_code::Bfloat:
      kind = "bfloat";
      break;
    case nb::dlpack::dtype_code::Complex:
      kind = "complex";
      break;
    case nb::dlpack::dtype_code::Bool:
      kind = "bool";
      break;
    default:
      break;
  }
  return absl::StrCat(kind, d.bits);
}

}  // namespace

WireType ParseWireType(nb::handle dtype, const std::string& what) {
  WireType type;
  if (nb::try_cast<WireType>(dtype, type, /*convert=*/false)) return type;
  std::string name = absl::AsciiStrToLower(nb::cast<std::string>(nb::str(dtype)));
  for (const char* prefix : {"torch.", "<class 'numpy.", "numpy."}) {
    if (name.rfind(prefix, 0) == 0) name = name.substr(std::string(prefix).size());
  }
  if (!name.empty() && name.back() == '>') name.pop_back();
  if (!name.empty() && name.back() == '\'') name.pop_back();
  for (WireType t : kWireTypes) {
    if (name == WireTypeName(t)) return t;
  }
  // torch's and the common short names.
  if (name == "fp32" || name == "float") return WireType::kFloat32;
  if (name == "bf16") return WireType::kBFloat16;
  if (name == "fp16" || name == "half") return WireType::kFloat16;
  throw nb::value_error(absl::StrCat(what,
                                     ": wire dtype must be float32, bfloat16 or float16, not ",
                                     nb::cast<std::string>(nb::str(dtype)))
                            .c_str());
}

HostBuffer ViewHostBuffer(nb::handle object, const std::string& what, bool writable) {
  return ViewHostBuffer(object, [&] { return what; }, writable);
}

HostBuffer ViewHostBuffer(nb::handle object, absl::FunctionRef<std::string()> what,
                          bool writable) {
  HostBuffer view;
  nb::object source = nb::borrow(object);
  const TorchExport& torch = Torch();
  const bool is_tensor =
      torch.tensor_type != nullptr && PyObject_IsInstance(object.ptr(), torch.tensor_type) == 1;
  if (is_tensor) {
    if (TensorFlag(object, torch.requires_grad)) {
      throw nb::type_error(
          absl::StrCat(what(),
                       ": a tensor that requires grad cannot be viewed; pass tensor.detach() "
                       "(it shares the memory)")
              .c_str());
    }
    // Any device but the CPU (cuda, meta, ...) is refused by name before
    // DLPack is asked (it cannot export some devices, e.g. meta).
    if (!TensorFlag(object, torch.is_cpu)) {
      const nb::object device = object.attr("device");
      throw nb::value_error(absl::StrCat(what(), ": the tensor is on device '",
                                         nb::cast<std::string>(nb::str(nb::handle(device.ptr()))),
                                         "', not the CPU; move it with .cpu() first")
                                .c_str());
    }
    source = nb::steal(PyObject_CallOneArg(torch.to_dlpack, object.ptr()));
    if (!source.is_valid()) {  // A sparse or otherwise unexportable tensor.
      nb::python_error error;
      throw nb::type_error(absl::StrCat(what(), ": ", error.what()).c_str());
    }
  }
  if (!nb::try_cast<nb::ndarray<nb::ro>>(source, view.array, /*convert=*/false)) {
    PyErr_Clear();
    throw nb::type_error(absl::StrCat(what(),
                                      ": expected a numpy array or a torch CPU tensor (float32, "
                                      "bfloat16 or float16), got ",
                                      Describe(object))
                             .c_str());
  }
  const nb::ndarray<nb::ro>& a = view.array;
  const nb::dlpack::dtype d = a.dtype();
  if (d == nb::dtype<float>()) {
    view.type = WireType::kFloat32;
  } else if (d.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && d.bits == 16 &&
             d.lanes == 1) {
    view.type = WireType::kBFloat16;
  } else if (d.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && d.bits == 16 &&
             d.lanes == 1) {
    view.type = WireType::kFloat16;
  } else {
    throw nb::type_error(absl::StrCat(what(), ": dtype ", DtypeName(d),
                                      " is not supported; use float32, bfloat16 or float16")
                             .c_str());
  }
  if (a.device_type() != nb::device::cpu::value) {
    throw nb::value_error(absl::StrCat(what(),
                                       ": the array is not in CPU memory (DLPack device type ",
                                       a.device_type(), "); move it with .cpu() first")
                              .c_str());
  }
  if (a.size() == 0) {  // Its strides say nothing (numpy gives 0): no group is empty.
    throw nb::value_error(absl::StrCat(what(), ": the array has no elements").c_str());
  }
  // C-contiguous: strides (in elements) as a dense row-major array's, where
  // a dimension of length 1 may have any stride.
  int64_t expected = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected) {
      throw nb::value_error(absl::StrCat(what(), ": the array is not contiguous (dimension ", i,
                                         " has stride ", a.stride(i), ", expected ", expected,
                                         "); pass .contiguous() or a copy")
                                .c_str());
    }
    expected *= static_cast<int64_t>(a.shape(i));
  }
  if (writable && !is_tensor && nb::hasattr(object, "flags") &&
      nb::hasattr(object.attr("flags"), "writeable") &&
      !nb::cast<bool>(object.attr("flags").attr("writeable"))) {
    throw nb::value_error(absl::StrCat(what(), ": the array is read-only").c_str());
  }
  // Any other buffer (a memoryview of bytes, say) is asked for a writable
  // view: nanobind's read-only view of it would be written anyway.
  if (writable && !is_tensor && PyObject_CheckBuffer(object.ptr())) {
    Py_buffer probe;
    if (PyObject_GetBuffer(object.ptr(), &probe, PyBUF_WRITABLE) != 0) {
      PyErr_Clear();
      throw nb::value_error(absl::StrCat(what(), ": the buffer is read-only").c_str());
    }
    PyBuffer_Release(&probe);
  }
  view.data = const_cast<void*>(a.data());
  view.size = a.size();
  return view;
}

}  // namespace optstate::python
