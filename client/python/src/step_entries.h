// A step's groups as the binding hands them to the C++ client: each group's
// name, buffer views and per-step hyperparameters, read from Client.step's
// arguments (or from torch's parameters: prepared_step.h), and turned into
// the client's GroupStep and StepOptions' wire types.
#ifndef OPTSTATE_PYTHON_STEP_ENTRIES_H_
#define OPTSTATE_PYTHON_STEP_ENTRIES_H_

#include <nanobind/nanobind.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "buffers.h"
#include "optstate/client.h"

namespace optstate::python {

// One group of a step as the caller gave it.
struct StepEntry {
  std::string name;
  HostBuffer gradient;
  std::optional<HostBuffer> params_out;
  std::optional<double> lr;  // This group's own lr for the step.
  // Its other hyperparameters for the step (GroupStep's overrides).
  std::optional<double> beta1 = std::nullopt, beta2 = std::nullopt, eps = std::nullopt,
                        weight_decay = std::nullopt;
  std::optional<bool> maximize = std::nullopt;
};

// The overrides of a tuple's fifth element: a dict of some of "betas" (a
// pair), "eps", "weight_decay" and "maximize"; any other key is a TypeError.
void ReadOverrides(nanobind::handle overrides, const std::string& where, StepEntry* entry);

// `where` names the entry in refusals; it is made only for one.
StepEntry MakeEntry(const std::string& name, nanobind::handle gradient,
                    nanobind::handle params_out, absl::FunctionRef<std::string()> where);

// The wire type of one direction of the call: a 16-bit buffer travels as it
// is (so all 16-bit buffers of a call must agree, and agree with an explicit
// `wire`); float32 buffers are narrowed to `wire` (float32 when unset).
WireType ResolveWire(const std::vector<const HostBuffer*>& buffers,
                     const std::optional<WireType>& wire, const char* what);

// The C++ client's view of one entry.
GroupStep ToGroupStep(const StepEntry& e);

}  // namespace optstate::python

#endif  // OPTSTATE_PYTHON_STEP_ENTRIES_H_
