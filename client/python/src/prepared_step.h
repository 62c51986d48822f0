// RemoteAdamW's step read from torch's parameters in C++: what the loop of
// optstate/torch.py's RemoteAdamW.step does for each parameter (its checks,
// the grouping by step and wire type, each gradient's and parameter's
// memory), for the common case only, so that a model of hundreds of tensors
// does not pay the interpreter per tensor. Whatever that case does not
// cover, or does not look right, gives None instead, and the caller runs its
// Python loop, which steps it or names what is wrong: this code never
// refuses anything itself.
#ifndef OPTSTATE_PYTHON_PREPARED_STEP_H_
#define OPTSTATE_PYTHON_PREPARED_STEP_H_

#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "step_entries.h"

namespace optstate::python {

// What a StepPlan knows of one parameter of the param groups.
struct PlannedParameter {
  enum class Kind {
    kStep,        // Registered here and of the common case: stepped from this record.
    kOtherRank,   // Not registered here, stepped by another rank: skipped.
    kPythonLoop,  // Anything else: the Python loop, if it has a gradient.
  };
  nanobind::object param;  // Held, so that its address stays its own.
  Kind kind = Kind::kPythonLoop;
  // kStep only: its _Registration, and what registration fixed.
  nanobind::object registration;
  std::string name;
  WireType type = WireType::kFloat32;
  absl::InlinedVector<int64_t, 4> shape;
  uint64_t elements = 0;
  nanobind::object hyperparameters;  // The registration's tuple (shared by equal ones).
  nanobind::object wire;             // None, "bfloat16" or "float16".
  nanobind::object slot;             // Its gradient's slot in a shared buffer, if any,
  uint64_t slot_data = 0;            // and where the slot's memory starts.
  // p.data as a step last found it, reused while the parameter's memory
  // starts at data_ptr (it holds that memory until the next step when p.data
  // is replaced meanwhile).
  nanobind::object data;
  uint64_t data_ptr = 0;
};

// RemoteAdamW's records of its parameters in the order of its param groups,
// read once from its _Registration objects and kept in one array, so that a
// step reads one compact record a parameter instead of the registration's
// dict and its objects (which the step before has pushed out of the caches).
// Valid while the param groups hold the same parameters in the same order
// and the dicts it was read from are unchanged: RemoteAdamW clears it on
// every change of its registrations, owners and gradient slots (optstate/
// torch.py's _PlanSource), and a step rebuilds it when a param group's
// parameters differ. Holds the parameters, registrations, slots and data
// views until cleared (the garbage collector sees these references).
struct StepPlan {
  void Clear() {
    parameters.clear();
    group_sizes.clear();
    registered = owner = shared_grads = nullptr;
    rank = nanobind::object();
    ++generation;
  }
  bool empty() const { return group_sizes.empty(); }

  std::vector<PlannedParameter> parameters;  // In param group order.
  std::vector<size_t> group_sizes;           // Each param group's number of parameters.
  // What it was read from (compared by identity; the dicts are RemoteAdamW's
  // own, made with the plan).
  PyObject* registered = nullptr;
  PyObject* owner = nullptr;
  PyObject* shared_grads = nullptr;
  nanobind::object rank;
  // Counts Clear()s: Python code a step or a rebuild runs (torch's getters,
  // a torch function mode) could clear the plan meanwhile, and what was read
  // before then is not used.
  uint64_t generation = 0;
};

// One Client.step call's groups, read from torch's parameters: its entries
// (each gradient and parameter viewed in place and kept alive), and what the
// caller's bookkeeping needs. Not changed after it is made. In Python also a
// sequence of the tuples the Python loop makes (name, gradient, p.data, lr,
// overrides or None), for code that reads a step's groups.
struct PreparedStep {
  std::vector<StepEntry> entries;
  nanobind::list registrations;  // Each entry's _Registration, in entry order.
  uint64_t step = 0;             // The call's step: every registration's step + 1.
  nanobind::object wire;         // Every registration's wire: None, "bfloat16" or "float16".
  bool any_float32 = false;      // Whether a gradient is float32.
};

// optstate._optstate._PreparedStep, _StepPlan and
// _prepare_param_step(param_groups, registered, owner, rank, shared_grads,
// plan): a PreparedStep of every parameter with a gradient, or None where
// RemoteAdamW.step's Python loop must run. `param_groups` is a list of
// (params list, lr float, the param group dict); `registered` maps id(p) to
// its _Registration; `owner` id(p) to the rank that steps it (a parameter not
// registered here is skipped when its owner is another rank); `shared_grads`
// id(p) to its gradient's slot in a shared buffer; `plan` is what an earlier
// call read from them (rebuilt here when empty or out of date). None unless
// every parameter with a gradient is a registered torch.Tensor or Parameter
// on the CPU, its gradient a plain contiguous CPU tensor that is its slot
// (if it has one) or does not require grad, both of the registered dtype
// (float32, bfloat16 or float16) and shape, the parameter's data contiguous,
// and all at one step with one wire type. An error of Python's in here
// (other than KeyboardInterrupt and the like) also gives None: the loop
// meets it again and raises it there.
void BindPreparedStep(nanobind::module_& m);

}  // namespace optstate::python

#endif  // OPTSTATE_PYTHON_PREPARED_STEP_H_
