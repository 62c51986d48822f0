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
#include <vector>

#include "step_entries.h"

namespace optstate::python {

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

// optstate._optstate._PreparedStep and _prepare_param_step(param_groups,
// registered, owner, rank, shared_grads): a PreparedStep of every parameter
// with a gradient, or None where RemoteAdamW.step's Python loop must run.
// `param_groups` is a list of (params list, lr float, the param group
// dict); `registered` maps id(p) to its _Registration; `owner` id(p) to the
// rank that steps it (a parameter not registered here is skipped when its
// owner is another rank); `shared_grads` id(p) to its gradient's slot in a
// shared buffer. None unless every parameter with a gradient is a
// registered torch.Tensor or Parameter on the CPU, its gradient a plain
// contiguous CPU tensor that does not require grad (and is its slot, if it
// has one), both of the registered dtype (float32, bfloat16 or float16) and
// shape, the parameter's data contiguous, and all at one step with one wire
// type. Each _Registration keeps the p.data it made (data_view) for the next
// step, while the parameter's memory starts where it did (prepared_step.cc).
// An error of Python's in here (other than KeyboardInterrupt and the like)
// also gives None: the loop meets it again and raises it there.
void BindPreparedStep(nanobind::module_& m);

}  // namespace optstate::python

#endif  // OPTSTATE_PYTHON_PREPARED_STEP_H_
