#include "prepared_step.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"

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
  PyObject* version_counter;  // Tensor._version
  // Of a _Registration.
  PyObject* name;
  PyObject* dtype;
  PyObject* shape;
  PyObject* step;
  PyObject* wire;
  PyObject* hyperparameters;
  PyObject* overrides;
  PyObject* version;
  PyObject* pointer;
  PyObject* contiguous;
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
    t.version_counter = intern("_version");
    t.name = intern("name");
    t.dtype = intern("dtype");
    t.shape = intern("shape");
    t.step = intern("step");
    t.wire = intern("wire");
    t.hyperparameters = intern("hyperparameters");
    t.overrides = intern("overrides");
    t.version = intern("version");
    t.pointer = intern("pointer");
    t.contiguous = intern("contiguous");
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

// The start of a tensor's memory where `dl` (its description) says it is a
// CPU tensor of `type` and shape `shape`, C-contiguous (a dimension of length
// 1 may have any stride); anything else takes the Python loop.
uint64_t MemoryIn(const nb::dlpack::dltensor& dl, WireType type, absl::Span<const int64_t> shape) {
  if (dl.device.device_type != kDLCPU || dl.dtype != DlpackTypeOf(type) ||
      dl.ndim != static_cast<int32_t>(shape.size())) {
    throw TakeThePythonLoop{};
  }
  int64_t contiguous_stride = 1;
  for (int32_t i = dl.ndim; i-- > 0;) {
    if (dl.shape[i] != shape[i]) throw TakeThePythonLoop{};
    if (shape[i] != 1 && dl.strides != nullptr && dl.strides[i] != contiguous_stride) {
      throw TakeThePythonLoop{};
    }
    contiguous_stride *= shape[i];
  }
  return reinterpret_cast<uintptr_t>(dl.data) + dl.byte_offset;
}

// MemoryIn of `tensor`, described by torch's C exchange table where it has
// one (no allocation; a tensor it cannot describe raises there, and the
// Python loop names what is wrong), else by one torch.utils.dlpack.to_dlpack
// (one C++ call: the attributes one by one cost more). The table describes a
// negated view (torch._neg_view) by its memory, which holds the negation of
// its values; the Python loop's views read that memory as it is too.
uint64_t MemoryOf(nb::handle tensor, WireType type, absl::Span<const int64_t> shape) {
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

// The record of `p` (a parameter of the param groups) from what registration
// made: `registered`, `owner` and `shared_grads` as _prepare_param_step's.
PlannedParameter PlanParameter(nb::handle p, nb::handle registered, nb::handle owner,
                               nb::handle rank, nb::handle shared_grads) {
  const TorchObjects& t = Objects();
  PlannedParameter planned;
  planned.param = nb::borrow(p);
  if (Py_TYPE(p.ptr()) != reinterpret_cast<PyTypeObject*>(t.tensor_type) &&
      Py_TYPE(p.ptr()) != reinterpret_cast<PyTypeObject*>(t.parameter_type)) {
    return planned;  // kPythonLoop
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
      if (other == 1) planned.kind = PlannedParameter::Kind::kOtherRank;
    }
    return planned;  // Never registered (unless another rank's): the loop says so.
  }
  const nb::object reg = nb::borrow(found);
  const nb::object fields = nb::steal(PyObject_GenericGetDict(reg.ptr(), nullptr));
  if (!fields.is_valid()) throw nb::python_error();
  if (!PyDict_Check(fields.ptr())) throw TakeThePythonLoop{};
  const nb::object dtype = Field(fields, t.dtype);
  if (dtype.is(nb::handle(t.float32))) {
    planned.type = WireType::kFloat32;
  } else if (dtype.is(nb::handle(t.bfloat16))) {
    planned.type = WireType::kBFloat16;
  } else if (dtype.is(nb::handle(t.float16))) {
    planned.type = WireType::kFloat16;
  } else {
    return planned;
  }
  const nb::object shape = Field(fields, t.shape);
  if (!PyTuple_Check(shape.ptr())) return planned;
  planned.elements = 1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape.ptr()); ++i) {
    const uint64_t size = AsUnsigned(PyTuple_GET_ITEM(shape.ptr(), i));
    planned.shape.push_back(static_cast<int64_t>(size));
    planned.elements *= size;
  }
  if (planned.elements == 0) return planned;
  planned.name = nb::cast<std::string>(Field(fields, t.name));
  planned.hyperparameters = Field(fields, t.hyperparameters);
  planned.wire = Field(fields, t.wire);
  PyObject* slot = PyDict_GetItemWithError(shared_grads.ptr(), id.ptr());
  if (slot == nullptr && PyErr_Occurred()) throw nb::python_error();
  if (slot != nullptr) {
    planned.slot = nb::borrow(slot);
    planned.slot_data = DataPtr(slot);
  }
  planned.registration = reg;
  planned.kind = PlannedParameter::Kind::kStep;
  return planned;
}

// `plan` read anew from the param groups and the dicts.
void BuildPlan(nb::handle param_groups, nb::handle registered, nb::handle owner, nb::handle rank,
               nb::handle shared_grads, StepPlan* plan) {
  plan->Clear();
  const uint64_t generation = plan->generation;
  StepPlan built;
  for (nb::handle item : nb::borrow<nb::list>(param_groups)) {
    const nb::handle params = PyTuple_GET_ITEM(item.ptr(), 0);
    // The list's size read at each parameter: reading one runs Python code.
    Py_ssize_t i = 0;
    for (; i < PyList_GET_SIZE(params.ptr()); ++i) {
      built.parameters.push_back(
          PlanParameter(PyList_GET_ITEM(params.ptr(), i), registered, owner, rank, shared_grads));
    }
    built.group_sizes.push_back(static_cast<size_t>(i));
  }
  built.registered = registered.ptr();
  built.owner = owner.ptr();
  built.shared_grads = shared_grads.ptr();
  built.rank = nb::borrow(rank);
  if (plan->generation != generation) throw TakeThePythonLoop{};  // Cleared meanwhile.
  built.generation = generation;
  *plan = std::move(built);
}

// Whether `plan` was read from these dicts and rank, for as many groups.
bool PlanFits(const StepPlan& plan, nb::handle param_groups, nb::handle registered,
              nb::handle owner, nb::handle rank, nb::handle shared_grads) {
  if (plan.empty() || plan.registered != registered.ptr() || plan.owner != owner.ptr() ||
      plan.shared_grads != shared_grads.ptr() ||
      plan.group_sizes.size() != static_cast<size_t>(PyList_GET_SIZE(param_groups.ptr()))) {
    return false;
  }
  const int same = PyObject_RichCompareBool(plan.rank.ptr(), rank.ptr(), Py_EQ);
  if (same < 0) throw nb::python_error();
  return same == 1;
}

// Thrown where a param group's parameters are not those the plan has.
struct PlanOutOfDate {};

// A plan's records, taken out of it for one step and given back after it
// unless the plan was cleared meanwhile: a record is never used after a
// Clear(), which would have destroyed it under the step's feet.
class CheckedOutPlan {
 public:
  explicit CheckedOutPlan(StepPlan* plan)
      : plan_(plan),
        generation_(plan->generation),
        parameters_(std::move(plan->parameters)),
        group_sizes_(std::move(plan->group_sizes)) {
    plan->parameters.clear();
    plan->group_sizes.clear();
  }
  CheckedOutPlan(const CheckedOutPlan&) = delete;
  CheckedOutPlan& operator=(const CheckedOutPlan&) = delete;
  ~CheckedOutPlan() {
    if (!cleared()) {
      plan_->parameters = std::move(parameters_);
      plan_->group_sizes = std::move(group_sizes_);
    }
  }

  bool cleared() const { return plan_->generation != generation_; }
  std::vector<PlannedParameter>& parameters() { return parameters_; }
  const std::vector<size_t>& group_sizes() const { return group_sizes_; }

 private:
  StepPlan* plan_;
  uint64_t generation_;
  std::vector<PlannedParameter> parameters_;
  std::vector<size_t> group_sizes_;
};

// The loop of RemoteAdamW.step for one param group, over `params` (its
// "params" list), appending to `prepared`; `next` is the plan's record of the
// group's first parameter, and is advanced past its last.
void StepGroup(nb::handle params, double lr, nb::handle group, CheckedOutPlan* plan,
               size_t group_index, size_t* next, PreparedStep* prepared) {
  const TorchObjects& t = Objects();
  const Py_ssize_t n = PyList_GET_SIZE(params.ptr());
  if (static_cast<size_t>(n) != plan->group_sizes()[group_index]) throw PlanOutOfDate{};
  // Python code runs for each parameter (torch's getters): a list changed
  // meanwhile is found by its size at each parameter, and its parameters by
  // identity.
  // The overrides of each registration's hyperparameters in this group, by
  // the tuple's identity (registration shares equal tuples).
  std::vector<std::pair<nb::handle, nb::object>> overrides_by_registration;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (PyList_GET_SIZE(params.ptr()) != n) throw TakeThePythonLoop{};
    PlannedParameter& planned = plan->parameters()[(*next)++];
    if (PyList_GET_ITEM(params.ptr(), i) != planned.param.ptr()) throw PlanOutOfDate{};
    const nb::handle p = planned.param;
    nb::object grad = Attr(p, t.grad);
    if (grad.is_none()) continue;
    if (Py_TYPE(grad.ptr()) != reinterpret_cast<PyTypeObject*>(t.tensor_type)) {
      throw TakeThePythonLoop{};
    }
    if (planned.kind == PlannedParameter::Kind::kOtherRank) continue;  // Another rank steps it.
    if (planned.kind != PlannedParameter::Kind::kStep) throw TakeThePythonLoop{};
    // Both of the registered dtype and shape, on the CPU, contiguous.
    const uint64_t data_ptr = MemoryOf(p, planned.type, planned.shape);
    const uint64_t grad_data = MemoryOf(grad, planned.type, planned.shape);
    // With shared buffers, a gradient outside its slot is copied in by the
    // loop; p.grad that is the slot itself (as zero_grad(set_to_none=False)
    // keeps it) is ours, and where it requires grad its memory is read all
    // the same. Another gradient that requires grad (backward's create_graph)
    // the loop detaches.
    if (!grad.is(planned.slot)) {
      if (planned.slot.is_valid() && grad_data != planned.slot_data) throw TakeThePythonLoop{};
      if (IsTrue(Attr(grad, t.requires_grad))) throw TakeThePythonLoop{};
    }
    nb::object overrides;
    for (const auto& [tuple, known] : overrides_by_registration) {
      if (tuple.is(planned.hyperparameters)) {
        overrides = known;
        break;
      }
    }
    if (!overrides.is_valid()) {
      overrides = nb::steal(
          PyObject_CallMethodOneArg(planned.registration.ptr(), t.overrides, group.ptr()));
      if (!overrides.is_valid()) throw nb::python_error();
      overrides_by_registration.emplace_back(planned.hyperparameters, overrides);
    }
    // One call: one step and one wire type for all. The step is the
    // registration's, which step() moves on.
    const nb::object fields =
        nb::steal(PyObject_GenericGetDict(planned.registration.ptr(), nullptr));
    if (!fields.is_valid()) throw nb::python_error();
    if (!PyDict_Check(fields.ptr())) throw TakeThePythonLoop{};
    const uint64_t step = AsUnsigned(Field(fields, t.step)) + 1;
    // Values given to p since the daemon last wrote them (its version counter
    // moved, or p.data is other memory, or was strided then and is contiguous
    // now in the same memory): the Python loop imports them first
    // (RemoteAdamW._adopt_values).
    if (AsUnsigned(Field(fields, t.pointer)) != data_ptr ||
        AsUnsigned(Attr(p, t.version_counter)) != AsUnsigned(Field(fields, t.version)) ||
        !IsTrue(Field(fields, t.contiguous))) {
      throw TakeThePythonLoop{};
    }
    if (!prepared->wire.is_valid()) {
      prepared->step = step;
      prepared->wire = planned.wire;
    } else if (step != prepared->step) {
      throw TakeThePythonLoop{};
    } else if (!(planned.wire.is_none() && prepared->wire.is_none())) {
      const int same = PyObject_RichCompareBool(planned.wire.ptr(), prepared->wire.ptr(), Py_EQ);
      if (same < 0) throw nb::python_error();
      if (same == 0) throw TakeThePythonLoop{};
    }
    // p.data: the parameter's memory without autograd, a tensor of its own
    // (it keeps the storage even if p.data is replaced meanwhile). The one
    // an earlier step made while p's memory still starts where it did: that
    // memory then is p's (its dtype, shape and contiguity were checked
    // above), and no tensor is made.
    if (!planned.data.is_valid() || planned.data_ptr != data_ptr) {
      nb::object data = Attr(p, t.data);
      if (DataPtr(data) != data_ptr) throw TakeThePythonLoop{};
      planned.data = std::move(data);
      planned.data_ptr = data_ptr;
    }
    StepEntry entry{planned.name,
                    ViewOf(std::move(grad), grad_data, planned.type, planned.elements),
                    ViewOf(planned.data, data_ptr, planned.type, planned.elements), lr};
    if (!overrides.is_none()) ReadOverrides(overrides, "", &entry);
    prepared->entries.push_back(std::move(entry));
    prepared->registrations.append(planned.registration);
    prepared->any_float32 = prepared->any_float32 || planned.type == WireType::kFloat32;
  }
}

// The step's entries from `plan`, which fits the param groups' number.
PreparedStep StepFromPlan(nb::handle param_groups, size_t params, StepPlan* plan) {
  if (plan->parameters.size() != params) throw PlanOutOfDate{};
  CheckedOutPlan checked_out(plan);
  PreparedStep prepared;
  // Room for every parameter's entry at once: an entry is a few hundred
  // bytes, and growing the vector would move them all several times.
  prepared.entries.reserve(params);
  size_t next = 0;
  size_t group_index = 0;
  for (nb::handle item : nb::borrow<nb::list>(param_groups)) {
    const nb::handle lr = PyTuple_GET_ITEM(item.ptr(), 1);
    if (!PyFloat_Check(lr.ptr())) throw TakeThePythonLoop{};
    StepGroup(PyTuple_GET_ITEM(item.ptr(), 0), PyFloat_AS_DOUBLE(lr.ptr()),
              PyTuple_GET_ITEM(item.ptr(), 2), &checked_out, group_index++, &next, &prepared);
  }
  // What changed the registrations meanwhile may have changed this step: the
  // Python loop reads it all again.
  if (checked_out.cleared()) throw TakeThePythonLoop{};
  if (!prepared.wire.is_valid()) prepared.wire = nb::none();
  return prepared;
}

nb::object PrepareParamStep(nb::handle param_groups, nb::handle registered, nb::handle owner,
                            nb::handle rank, nb::handle shared_grads, StepPlan& plan) {
  try {
    if (!PyList_Check(param_groups.ptr()) || !PyDict_Check(registered.ptr()) ||
        !PyDict_Check(owner.ptr()) || !PyDict_Check(shared_grads.ptr())) {
      throw TakeThePythonLoop{};
    }
    size_t params = 0;
    for (nb::handle item : nb::borrow<nb::list>(param_groups)) {
      if (!PyTuple_Check(item.ptr()) || PyTuple_GET_SIZE(item.ptr()) != 3 ||
          !PyList_Check(PyTuple_GET_ITEM(item.ptr(), 0))) {
        throw TakeThePythonLoop{};
      }
      params += static_cast<size_t>(PyList_GET_SIZE(PyTuple_GET_ITEM(item.ptr(), 0)));
    }
    if (!PlanFits(plan, param_groups, registered, owner, rank, shared_grads)) {
      BuildPlan(param_groups, registered, owner, rank, shared_grads, &plan);
    }
    try {
      return nb::cast(StepFromPlan(param_groups, params, &plan));
    } catch (const PlanOutOfDate&) {
      // A param group's parameters changed (added, removed or reordered):
      // read them again, once.
      BuildPlan(param_groups, registered, owner, rank, shared_grads, &plan);
      return nb::cast(StepFromPlan(param_groups, params, &plan));
    }
  } catch (const PlanOutOfDate&) {
    plan.Clear();
    return nb::none();
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

// The garbage collector's view of a _StepPlan: the references it holds.
int StepPlanTraverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));  // A heap type's instance refers to its type.
  if (!nb::inst_ready(self)) return 0;
  const StepPlan* plan = nb::inst_ptr<StepPlan>(self);
  for (const PlannedParameter& planned : plan->parameters) {
    for (const nb::object* o : {&planned.param, &planned.registration, &planned.hyperparameters,
                                &planned.wire, &planned.slot, &planned.data}) {
      Py_VISIT(o->ptr());
    }
  }
  Py_VISIT(plan->rank.ptr());
  return 0;
}

int StepPlanClear(PyObject* self) {
  if (nb::inst_ready(self)) nb::inst_ptr<StepPlan>(self)->Clear();
  return 0;
}

PyType_Slot step_plan_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(StepPlanTraverse)},
                                 {Py_tp_clear, reinterpret_cast<void*>(StepPlanClear)},
                                 {0, nullptr}};

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
  nb::class_<StepPlan>(m, "_StepPlan", nb::type_slots(step_plan_slots),
                       "What RemoteAdamW's steps read of its parameters' registrations, in "
                       "param group order (prepared_step.h); clear() it on every change of them.")
      .def(nb::init<>())
      .def("clear", &StepPlan::Clear)
      .def("__len__", [](const StepPlan& plan) { return plan.parameters.size(); });
  m.def("_prepare_param_step", &PrepareParamStep, "param_groups"_a, "registered"_a, "owner"_a,
        "rank"_a, "shared_grads"_a, "plan"_a,
        "RemoteAdamW.step's loop over its parameters in C++, for the common case: a "
        "_PreparedStep, or None where the Python loop must run (prepared_step.h).");
}

}  // namespace optstate::python
