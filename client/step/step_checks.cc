// Each check names what is wrong and what to give instead.
#include "client/step/step_checks.h"

#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/step/buffer_parts.h"

namespace optstate::client_internal {

absl::Status CheckStep(absl::Span<const GroupStep> groups, uint64_t step,
                       const StepOptions& options) {
  if (step == 0) return absl::InvalidArgumentError("step must be at least 1 (the first step is 1)");
  if (options.grad_scale && !std::isfinite(*options.grad_scale)) {
    return absl::InvalidArgumentError("grad_scale must be finite");
  }
  if (options.lr && !(std::isfinite(*options.lr) && *options.lr >= 0 &&
                      std::isfinite(static_cast<float>(*options.lr)))) {
    return absl::InvalidArgumentError("lr must be finite and >= 0 (and within float32's range)");
  }
  absl::flat_hash_set<absl::string_view> names;
  // The daemon checks each message's hyperparameters as it takes it; a step
  // of several messages refused at a later one would have applied the
  // earlier ones. So the per-step values are checked here, as the daemon
  // checks them (ValidateHyperparameters), before anything is sent.
  auto fits_float = [](double x) { return std::isfinite(static_cast<float>(x)); };
  for (const GroupStep& group : groups) {
    if (group.lr && !(std::isfinite(*group.lr) && *group.lr >= 0 && fits_float(*group.lr))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lr of group '", group.group,
          "' must be finite and >= 0 (and within float32's range)"));
    }
    for (const auto& [name, beta] : {std::pair{"beta1", group.beta1}, {"beta2", group.beta2}}) {
      if (beta && !(*beta >= 0 && *beta < 1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "group '", group.group, "': this step's ", name, " must be in [0, 1), got ", *beta));
      }
    }
    if (group.eps && !(std::isfinite(*group.eps) && fits_float(*group.eps) &&
                       static_cast<float>(*group.eps) > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group '", group.group,
          "': this step's eps must be finite and > 0, and at least float32's smallest value "
          "1.4e-45, got ",
          *group.eps));
    }
    if (group.weight_decay && !(std::isfinite(*group.weight_decay) && *group.weight_decay >= 0 &&
                                fits_float(*group.weight_decay))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group '", group.group,
          "': this step's weight_decay must be finite and >= 0 (and within float32's range), "
          "got ",
          *group.weight_decay));
    }
    if (!names.insert(group.group).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("group '", group.group,
                       "' is named twice in one step; a group takes one gradient "
                       "per step"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBufferForms(const GroupStep& group, const StepOptions& options) {
  auto is_16_bit_type = [](WireType type) {
    return type == WireType::kBFloat16 || type == WireType::kFloat16;
  };
  if ((Is16Bit(group.gradient) && !is_16_bit_type(group.gradient.dtype())) ||
      (Is16Bit(group.params_out) && !is_16_bit_type(group.params_out.dtype()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group '", group.group, "' gives a ",
        Is16Bit(group.gradient) && !is_16_bit_type(group.gradient.dtype()) ? "gradient"
                                                                           : "params_out",
        " made by Of16Bit with a dtype that is not bfloat16 or float16; a float32 buffer "
        "is a span of floats"));
  }
  if (Is16Bit(group.gradient) && !group.gradient.empty() &&
      group.gradient.dtype() != options.gradient_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group '", group.group, "' gives a ", WireTypeName(group.gradient.dtype()),
        " gradient, which is sent as it is and needs StepOptions.gradient_dtype ",
        WireTypeName(group.gradient.dtype()), " (it is ", WireTypeName(options.gradient_dtype),
        "); set it, or give float32 values to have them narrowed"));
  }
  if (Is16Bit(group.params_out) && !group.params_out.empty() &&
      group.params_out.dtype() != options.param_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group '", group.group, "' gives a ", WireTypeName(group.params_out.dtype()),
        " params_out, which receives the params as they arrive and needs "
        "StepOptions.param_dtype ",
        WireTypeName(group.params_out.dtype()), " (it is ", WireTypeName(options.param_dtype),
        "); set it, or give a float32 params_out to have them widened"));
  }
  return absl::OkStatus();
}

absl::Status CheckLengths(const GroupStep& group, uint64_t num_elements) {
  if (group.gradient.size() != num_elements) {
    return absl::InvalidArgumentError(absl::StrCat("gradient of group '", group.group, "' has ",
                                                   group.gradient.size(),
                                                   " elements; the group has ", num_elements));
  }
  if (!group.params_out.empty() && group.params_out.size() != num_elements) {
    return absl::InvalidArgumentError(
        absl::StrCat("params_out of group '", group.group, "' has ", group.params_out.size(),
                     " elements; the group has ", num_elements, " (or pass an empty one)"));
  }
  return absl::OkStatus();
}

}  // namespace optstate::client_internal
