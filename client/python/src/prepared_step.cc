#include "prepared_step.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace optstate::python {
namespace {

// Thrown where RemoteAdamW.step's Python loop must run instead.
struct TakeThePythonLoop {};

// DLPack's managed tensor (dlpack.h's DLManagedTensor, whose layout is
// DLPack's ABI): what a "dltensor" capsule points to.
struct ManagedTensor {
  nb::dlpack::dltensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor*);
};

// DLPack 1.3's C exchange table (dlpack.h's DLPackExchangeAPI, DLPack's
// ABI), which a framework publishes on its tensor type as the capsule
// __dlpack_c_exchange_api__ named "dlpack_exchange_api". Only
// dltensor_from_py_object_no_sync is used: it describes a tensor in a
// DLTensor the caller owns, pointing into the tensor's own shape and
// strides, valid while the tensor lives and is not changed; it allocates
// nothing (to_dlpack makes a strided view, a new tensor, for each export).
struct DlpackExchangeApi {
  struct {
    uint32_t major;
    uint32_t minor;
  } version;
  const void* prev_api;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, nb::dlpack::dltensor* out);
  void* current_work_stream;
};

// The table torch.Tensor publishes, where it is DLPack 1.3 or a later 1.x
// (a minor version only adds at the end) and has the function; else null.
const DlpackExchangeApi* ExchangeApiOf(nb::handle tensor_type) {
  PyObject* capsule = PyObject_GetAttrString(tensor_type.ptr(), "__dlpack_c_exchange_api__");
  if (capsule == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  // The table lives as long as the process (DLPack's contract): the capsule
  // need not be kept.
  auto* api =
      static_cast<const DlpackExchangeApi*>(PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
  Py_DECREF(capsule);
  if (api == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  if (api->version.major != 1 || api->version.minor < 3 ||
      api->dltensor_from_py_object_no_sync == nullptr) {
    return nullptr;
  }
  return api;
}

// What the loop reads: torch's types and singletons, and the attribute names
// (interned), looked up once and kept for the process. Only RemoteAdamW
// calls in here, so torch is imported by then.
struct TorchObjects {
  PyObject* tensor_type;
  PyObject* parameter_type;
  PyObject* to_dlpack;  // torch.utils.dlpack.to_dlpack
  PyObject* float32;
  PyObject* bfloat16;
  PyObject* float16;
  // Of a tensor.
  PyObject* grad;
  PyObject* requires_grad;
  PyObject* data;
  PyObject* data_ptr;
  // Of a _Registration.
  PyObject* name;
  PyObject* dtype;
  PyObject* shape;
  PyObject* step;
  PyObject* wire;
  PyObject* hyperparameters;
  PyObject* overrides;
  PyObject* data_view;
  PyObject* data_view_ptr;
  // torch's DLPack C exchange table, where this torch has one; else null.
  const DlpackExchangeApi* exchange;
};

const TorchObjects& Objects() {
  static const TorchObjects objects = [] {
    nb::module_ torch = nb::module_::import_("torch");
    auto keep = [](nb::object o) { return o.release().ptr(); };
    auto intern = [](const char* s) { return PyUnicode_InternFromString(s); };
    TorchObjects t;
    t.tensor_type = keep(torch.attr("Tensor"));
    t.parameter_type = keep(torch.attr("nn").attr("Parameter"));
    t.to_dlpack = keep(nb::module_::import_("torch.utils.dlpack").attr("to_dlpack"));
    t.float32 = keep(torch.attr("float32"));
    t.bfloat16 = keep(torch.attr("bfloat16"));
    t.float16 = keep(torch.attr("float16"));
    t.grad = intern("grad");
    t.requires_grad = intern("requires_grad");
    t.data = intern("data");
    t.data_ptr = intern("data_ptr");
    t.name = intern("name");
    t.dtype = intern("dtype");
    t.shape = intern("shape");
    t.step = intern("step");
    t.wire = intern("wire");
    t.hyperparameters = intern("hyperparameters");
    t.overrides = intern("overrides");
    t.data_view = intern("data_view");
    t.data_view_ptr = intern("data_view_ptr");
    t.exchange = ExchangeApiOf(torch.attr("Tensor"));
    return t;
  }();
  return objects;
}

nb::object Attr(nb::handle object, PyObject* name) {
  PyObject* value = PyObject_GetAttr(object.ptr(), name);
  if (value == nullptr) throw nb::python_error();
  return nb::steal(value);
}

// A _Registration's field, from its instance dict (a dataclass's fields are
// plain instance attributes; reading the dict skips the attribute protocol).
nb::object Field(nb::handle fields, PyObject* name) {
  PyObject* value = PyDict_GetItemWithError(fields.ptr(), name);
  if (value == nullptr) {
    if (PyErr_Occurred()) throw nb::python_error();
    throw TakeThePythonLoop{};
  }
  return nb::borrow(value);
}

nb::object CallMethod(nb::handle object, PyObject* name) {
  PyObject* value = PyObject_CallMethodNoArgs(object.ptr(), name);
  if (value == nullptr) throw nb::python_error();
  return nb::steal(value);
}

// `value` is True (a bool; anything else is not the common case).
bool IsTrue(nb::handle value) {
  if (!PyBool_Check(value.ptr())) throw TakeThePythonLoop{};
  return value.ptr() == Py_True;
}

// (PyLong_AsUnsignedLongLong goes through a byte array for a pointer's
// value; unsigned long is as wide here and read directly.)
static_assert(sizeof(unsigned long) == sizeof(uint64_t));
uint64_t AsUnsigned(nb::handle value) {
  if (!PyLong_Check(value.ptr())) throw TakeThePythonLoop{};
  const unsigned long n = PyLong_AsUnsignedLong(value.ptr());
  if (PyErr_Occurred()) throw nb::python_error();
  return n;
}

uint64_t DataPtr(nb::handle tensor) { return AsUnsigned(CallMethod(tensor, Objects().data_ptr)); }

constexpr int32_t kDLCPU = 1;

nb::dlpack::dtype DlpackTypeOf(WireType type) {
  switch (type) {
    case WireType::kBFloat16:
      return {static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case WireType::kFloat16:
      return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    default:
      return nb::dtype<float>();
  }
}

// The start of `tensor`'s memory where `dl` (its description) says it is a
// CPU tensor of `type` with the shape `shape` (a torch.Size), C-contiguous (a
// dimension of length 1 may have any stride); anything else takes the
// Python loop.
uint64_t MemoryIn(const nb::dlpack::dltensor& dl, WireType type, nb::handle shape) {
  if (dl.device.device_type != kDLCPU || dl.dtype != DlpackTypeOf(type) ||
      !PyTuple_Check(shape.ptr()) || dl.ndim != PyTuple_GET_SIZE(shape.ptr())) {
    throw TakeThePythonLoop{};
  }
  int64_t contiguous_stride = 1;
  for (int32_t i = dl.ndim; i-- > 0;) {
    const long size = PyLong_AsLong(PyTuple_GET_ITEM(shape.ptr(), i));
    if (size == -1 && PyErr_Occurred()) throw nb::python_error();
    if (dl.shape[i] != size) throw TakeThePythonLoop{};
    if (size != 1 && dl.strides != nullptr && dl.strides[i] != contiguous_stride) {
      throw TakeThePythonLoop{};
    }
    contiguous_stride *= size;
  }
  return reinterpret_cast<uintptr_t>(dl.data) + dl.byte_offset;
}

// MemoryIn of `tensor`, described by torch's C exchange table where it has
// one (no allocation; a tensor it cannot describe raises there, and the
// Python loop names what is wrong), else by one torch.utils.dlpack.to_dlpack
// (one C++ call: the attributes one by one cost more). The table describes a
// negated view (torch._neg_view) by its memory, which holds the negation of
// its values; the Python loop's views read that memory as it is too.
uint64_t MemoryOf(nb::handle tensor, WireType type, nb::handle shape) {
  const TorchObjects& t = Objects();
  if (t.exchange != nullptr) {
    nb::dlpack::dltensor dl{};
    if (t.exchange->dltensor_from_py_object_no_sync(tensor.ptr(), &dl) != 0) {
      throw nb::python_error();
    }
    return MemoryIn(dl, type, shape);
  }
  const nb::object capsule = nb::steal(PyObject_CallOneArg(t.to_dlpack, tensor.ptr()));
  if (!capsule.is_valid()) throw nb::python_error();
  // Not consumed: the capsule's destructor gives the tensor back to torch.
  auto* managed = static_cast<ManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) throw nb::python_error();
  return MemoryIn(managed->dl_tensor, type, shape);
}

// The elements of a torch.Size (a tuple of ints).
uint64_t Elements(nb::handle shape) {
  if (!PyTuple_Check(shape.ptr())) throw TakeThePythonLoop{};
  uint64_t n = 1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape.ptr()); ++i) {
    n *= AsUnsigned(PyTuple_GET_ITEM(shape.ptr(), i));
  }
  return n;
}

// A view of a CPU tensor's memory at `data`, checked by the caller, kept alive
// by it.
HostBuffer ViewOf(nb::object tensor, uint64_t data, WireType type, uint64_t elements) {
  HostBuffer view;
  view.type = type;
  view.data = reinterpret_cast<void*>(static_cast<uintptr_t>(data));
  view.size = elements;
  view.owner = std::move(tensor);
  return view;
}

// The loop of RemoteAdamW.step for one param group, over `params` (its
// "params" list), appending to `prepared`.
void PrepareGroup(nb::handle params, double lr, nb::handle group, nb::handle registered,
                  nb::handle owner, nb::handle rank, nb::handle shared_grads,
                  PreparedStep* prepared) {
  const TorchObjects& t = Objects();
  if (!PyList_Check(params.ptr())) throw TakeThePythonLoop{};
  // The overrides of each registration's hyperparameters in this group, by
  // the tuple's identity (registration shares equal tuples).
  std::vector<std::pair<nb::object, nb::object>> overrides_by_registration;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(params.ptr()); ++i) {
    // Held: reg.overrides(group) below is Python code.
    const nb::object p = nb::borrow(PyList_GET_ITEM(params.ptr(), i));
    if (Py_TYPE(p.ptr()) != reinterpret_cast<PyTypeObject*>(t.tensor_type) &&
        Py_TYPE(p.ptr()) != reinterpret_cast<PyTypeObject*>(t.parameter_type)) {
      throw TakeThePythonLoop{};
    }
    nb::object grad = Attr(p, t.grad);
    if (grad.is_none()) continue;
    if (Py_TYPE(grad.ptr()) != reinterpret_cast<PyTypeObject*>(t.tensor_type)) {
      throw TakeThePythonLoop{};
    }
    const nb::object id = nb::steal(PyLong_FromVoidPtr(p.ptr()));  // id(p)
    if (!id.is_valid()) throw nb::python_error();
    PyObject* found = PyDict_GetItemWithError(registered.ptr(), id.ptr());
    if (found == nullptr) {
      if (PyErr_Occurred()) throw nb::python_error();
      PyObject* rank_of = PyDict_GetItemWithError(owner.ptr(), id.ptr());
      if (rank_of == nullptr && PyErr_Occurred()) throw nb::python_error();
      if (rank_of != nullptr) {
        const int other = PyObject_RichCompareBool(rank_of, rank.ptr(), Py_NE);
        if (other < 0) throw nb::python_error();
        if (other == 1) continue;  // Another rank steps it.
      }
      throw TakeThePythonLoop{};  // Never registered: the loop says so.
    }
    const nb::object reg = nb::borrow(found);
    const nb::object fields = nb::steal(PyObject_GenericGetDict(reg.ptr(), nullptr));
    if (!fields.is_valid()) throw nb::python_error();
    if (!PyDict_Check(fields.ptr())) throw TakeThePythonLoop{};
    // Both of the registered dtype and shape, on the CPU, contiguous.
    const nb::object dtype = Field(fields, t.dtype);
    WireType type;
    if (dtype.is(nb::handle(t.float32))) {
      type = WireType::kFloat32;
    } else if (dtype.is(nb::handle(t.bfloat16))) {
      type = WireType::kBFloat16;
    } else if (dtype.is(nb::handle(t.float16))) {
      type = WireType::kFloat16;
    } else {
      throw TakeThePythonLoop{};
    }
    const nb::object shape = Field(fields, t.shape);
    const uint64_t data_ptr = MemoryOf(p, type, shape);
    const uint64_t grad_data = MemoryOf(grad, type, shape);
    const nb::object hyperparameters = Field(fields, t.hyperparameters);
    nb::object overrides;
    for (const auto& [tuple, known] : overrides_by_registration) {
      if (tuple.is(hyperparameters)) {
        overrides = known;
        break;
      }
    }
    if (!overrides.is_valid()) {
      overrides = nb::steal(PyObject_CallMethodOneArg(reg.ptr(), t.overrides, group.ptr()));
      if (!overrides.is_valid()) throw nb::python_error();
      overrides_by_registration.emplace_back(hyperparameters, overrides);
    }
    // One call: one step and one wire type for all.
    const uint64_t step = AsUnsigned(Field(fields, t.step)) + 1;
    nb::object wire = Field(fields, t.wire);
    if (!prepared->wire.is_valid()) {
      prepared->step = step;
      prepared->wire = wire;
    } else if (step != prepared->step) {
      throw TakeThePythonLoop{};
    } else if (!(wire.is_none() && prepared->wire.is_none())) {
      const int same = PyObject_RichCompareBool(wire.ptr(), prepared->wire.ptr(), Py_EQ);
      if (same < 0) throw nb::python_error();
      if (same == 0) throw TakeThePythonLoop{};
    }
    if (IsTrue(Attr(grad, t.requires_grad))) throw TakeThePythonLoop{};  // The loop detaches it.
    // With shared buffers, a gradient outside its slot is copied in by the loop.
    // p.grad that is the slot itself (as zero_grad(set_to_none=False) keeps it)
    // is in it without asking: data_ptr() costs about a microsecond a call.
    PyObject* slot = PyDict_GetItemWithError(shared_grads.ptr(), id.ptr());
    if (slot == nullptr && PyErr_Occurred()) throw nb::python_error();
    if (slot != nullptr && slot != grad.ptr() && DataPtr(slot) != grad_data) {
      throw TakeThePythonLoop{};
    }
    // p.data: the parameter's memory without autograd, a tensor of its own
    // (it keeps the storage even if p.data is replaced meanwhile). The one
    // the registration kept from an earlier step while p's memory still
    // starts where it did: that memory then is p's (its dtype, shape and
    // contiguity were checked above), and no tensor is made.
    nb::object data = Field(fields, t.data_view);
    if (data.is_none() || AsUnsigned(Field(fields, t.data_view_ptr)) != data_ptr) {
      data = Attr(p, t.data);
      if (DataPtr(data) != data_ptr) throw TakeThePythonLoop{};
      const nb::object ptr = nb::steal(PyLong_FromUnsignedLong(data_ptr));
      if (!ptr.is_valid() || PyDict_SetItem(fields.ptr(), t.data_view, data.ptr()) != 0 ||
          PyDict_SetItem(fields.ptr(), t.data_view_ptr, ptr.ptr()) != 0) {
        throw nb::python_error();
      }
    }
    const uint64_t elements = Elements(shape);
    if (elements == 0) throw TakeThePythonLoop{};
    StepEntry entry{nb::cast<std::string>(Field(fields, t.name)),
                    ViewOf(std::move(grad), grad_data, type, elements),
                    ViewOf(std::move(data), data_ptr, type, elements), lr};
    if (!overrides.is_none()) ReadOverrides(overrides, "", &entry);
    prepared->entries.push_back(std::move(entry));
    prepared->registrations.append(reg);
    prepared->any_float32 = prepared->any_float32 || type == WireType::kFloat32;
  }
}

nb::object PrepareParamStep(nb::handle param_groups, nb::handle registered, nb::handle owner,
                            nb::handle rank, nb::handle shared_grads) {
  try {
    if (!PyList_Check(param_groups.ptr()) || !PyDict_Check(registered.ptr()) ||
        !PyDict_Check(owner.ptr()) || !PyDict_Check(shared_grads.ptr())) {
      throw TakeThePythonLoop{};
    }
    // Room for every parameter's entry at once: an entry is a few hundred
    // bytes, and growing the vector would move them all several times.
    size_t params = 0;
    for (nb::handle item : nb::borrow<nb::list>(param_groups)) {
      if (!PyTuple_Check(item.ptr()) || PyTuple_GET_SIZE(item.ptr()) != 3 ||
          !PyList_Check(PyTuple_GET_ITEM(item.ptr(), 0))) {
        throw TakeThePythonLoop{};
      }
      params += static_cast<size_t>(PyList_GET_SIZE(PyTuple_GET_ITEM(item.ptr(), 0)));
    }
    PreparedStep prepared;
    prepared.entries.reserve(params);
    for (nb::handle item : nb::borrow<nb::list>(param_groups)) {
      const nb::handle lr = PyTuple_GET_ITEM(item.ptr(), 1);
      if (!PyFloat_Check(lr.ptr())) throw TakeThePythonLoop{};
      PrepareGroup(PyTuple_GET_ITEM(item.ptr(), 0), PyFloat_AS_DOUBLE(lr.ptr()),
                   PyTuple_GET_ITEM(item.ptr(), 2), registered, owner, rank, shared_grads,
                   &prepared);
    }
    if (!prepared.wire.is_valid()) prepared.wire = nb::none();
    return nb::cast(std::move(prepared));
  } catch (const TakeThePythonLoop&) {
    return nb::none();
  } catch (nb::python_error& e) {
    if (!e.matches(PyExc_Exception)) throw;  // KeyboardInterrupt, SystemExit: not ours to drop.
    return nb::none();
  } catch (const nb::builtin_exception&) {  // ReadOverrides' TypeError, a failed cast.
    return nb::none();
  } catch (const nb::cast_error&) {
    return nb::none();
  }
}

// Entry i as the Python loop makes it: (name, gradient, p.data, lr,
// overrides or None), for a caller that reads a step's groups.
nb::tuple EntryTuple(const PreparedStep& prepared, Py_ssize_t i) {
  const Py_ssize_t n = static_cast<Py_ssize_t>(prepared.entries.size());
  if (i < 0) i += n;
  if (i < 0 || i >= n) throw nb::index_error("_PreparedStep index out of range");
  const StepEntry& e = prepared.entries[static_cast<size_t>(i)];
  nb::object overrides = nb::none();
  if (e.beta1 || e.eps || e.weight_decay || e.maximize) {
    nb::dict d;
    if (e.beta1) d["betas"] = nb::make_tuple(*e.beta1, *e.beta2);
    if (e.eps) d["eps"] = *e.eps;
    if (e.weight_decay) d["weight_decay"] = *e.weight_decay;
    if (e.maximize) d["maximize"] = *e.maximize;
    overrides = d;
  }
  return nb::make_tuple(e.name, e.gradient.owner, e.params_out->owner, *e.lr, overrides);
}

}  // namespace

void BindPreparedStep(nb::module_& m) {
  nb::class_<PreparedStep>(m, "_PreparedStep",
                           "One Client.step call's groups read from torch's parameters by "
                           "_prepare_param_step (RemoteAdamW's step); pass it as step()'s groups.")
      .def_ro("step", &PreparedStep::step)
      .def_ro("wire", &PreparedStep::wire)
      .def_ro("registrations", &PreparedStep::registrations)
      .def_ro("any_float32", &PreparedStep::any_float32)
      .def("__len__", [](const PreparedStep& s) { return s.entries.size(); })
      .def("__getitem__", &EntryTuple, "i"_a,
           "Group i as RemoteAdamW's Python loop makes it: (name, gradient, p.data, lr, "
           "overrides or None).");
  m.def("_prepare_param_step", &PrepareParamStep, "param_groups"_a, "registered"_a, "owner"_a,
        "rank"_a, "shared_grads"_a,
        "RemoteAdamW.step's loop over its parameters in C++, for the common case: a "
        "_PreparedStep, or None where the Python loop must run (prepared_step.h).");
}

}  // namespace optstate::python
