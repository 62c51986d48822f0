#include "step_entries.h"

#include <nanobind/stl/string.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace nb = nanobind;

namespace optstate::python {

void ReadOverrides(nb::handle overrides, const std::string& where, StepEntry* entry) {
  nb::dict d;
  if (!nb::try_cast<nb::dict>(overrides, d)) {
    throw nb::type_error(
        (where + "hyperparameters: expected a dict of betas, eps, weight_decay, maximize").c_str());
  }
  for (auto [key, value] : d) {
    std::string name;
    if (!nb::try_cast<std::string>(key, name)) name = "?";
    auto as_double = [&](nb::handle v, const char* what) {
      double x = 0;
      if (!nb::try_cast<double>(v, x)) {
        throw nb::type_error((where + what + ": expected a float").c_str());
      }
      return x;
    };
    if (name == "betas") {
      nb::tuple t;
      if (!nb::try_cast<nb::tuple>(value, t) || t.size() != 2) {
        throw nb::type_error((where + "betas: expected a pair of floats").c_str());
      }
      entry->beta1 = as_double(t[0], "betas[0]");
      entry->beta2 = as_double(t[1], "betas[1]");
    } else if (name == "eps") {
      entry->eps = as_double(value, "eps");
    } else if (name == "weight_decay") {
      entry->weight_decay = as_double(value, "weight_decay");
    } else if (name == "maximize") {
      bool b = false;
      if (!nb::try_cast<bool>(value, b)) {
        throw nb::type_error((where + "maximize: expected a bool").c_str());
      }
      entry->maximize = b;
    } else {
      throw nb::type_error((where + "hyperparameters: unknown key '" + name +
                            "' (betas, eps, weight_decay, maximize)")
                               .c_str());
    }
  }
}

StepEntry MakeEntry(const std::string& name, nb::handle gradient, nb::handle params_out,
                    absl::FunctionRef<std::string()> where) {
  StepEntry entry{name, ViewHostBuffer(gradient, [&] { return where() + "gradient"; }, false),
                  std::nullopt, std::nullopt};
  if (!params_out.is_none()) {
    entry.params_out =
        ViewHostBuffer(params_out, [&] { return where() + "params_out"; }, true);
  }
  return entry;
}

WireType ResolveWire(const std::vector<const HostBuffer*>& buffers,
                     const std::optional<WireType>& wire, const char* what) {
  std::optional<WireType> sixteen;
  for (const HostBuffer* b : buffers) {
    if (b->type == WireType::kFloat32) continue;
    if (sixteen && *sixteen != b->type) {
      throw nb::value_error(absl::StrCat("step: the ", what, " buffers mix ",
                                         WireTypeName(*sixteen), " and ", WireTypeName(b->type),
                                         "; one call carries one 16-bit type")
                                .c_str());
    }
    sixteen = b->type;
  }
  if (!sixteen) return wire.value_or(WireType::kFloat32);
  const bool has_float32 = std::any_of(buffers.begin(), buffers.end(), [](const HostBuffer* b) {
    return b->type == WireType::kFloat32;
  });
  if (has_float32 && !wire) {
    // Float32 buffers travel as float32 unless wire_dtype says otherwise: in
    // this call they would be narrowed to the 16-bit type without a word.
    throw nb::value_error(absl::StrCat("step: the ", what, " buffers mix float32 and ",
                                       WireTypeName(*sixteen),
                                       "; one call carries one type: step them in separate "
                                       "calls, or pass wire_dtype=",
                                       WireTypeName(*sixteen), " to narrow the float32 ones")
                              .c_str());
  }
  if (wire && *wire != *sixteen) {
    throw nb::value_error(absl::StrCat("step: ", what, " buffers of ", WireTypeName(*sixteen),
                                       " travel as they are; wire_dtype must be unset or ",
                                       WireTypeName(*sixteen))
                              .c_str());
  }
  return *sixteen;
}

GroupStep ToGroupStep(const StepEntry& e) {
  GroupStep g;
  g.group = e.name;
  g.lr = e.lr;
  g.beta1 = e.beta1;
  g.beta2 = e.beta2;
  g.eps = e.eps;
  g.weight_decay = e.weight_decay;
  g.maximize = e.maximize;
  g.gradient = e.gradient.type == WireType::kFloat32
                   ? ConstBufferView(e.gradient.floats())
                   : ConstBufferView::Of16Bit(e.gradient.halves(), e.gradient.type);
  if (e.params_out) {
    const HostBuffer& out = *e.params_out;
    g.params_out = out.type == WireType::kFloat32
                       ? BufferView(out.mutable_floats())
                       : BufferView::Of16Bit(out.mutable_halves(), out.type);
  }
  return g;
}

}  // namespace optstate::python
