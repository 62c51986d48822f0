// Hyperparameter checks and the exact text messages quote them in.
#include "server/state/group_config.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace optstate {

std::string ExactText(double x) {
  char text[32];
  const std::to_chars_result result = std::to_chars(text, text + sizeof(text), x);
  return std::string(text, result.ptr);
}

std::string DescribeHyperparameters(const AdamWHyperparameters& h) {
  return absl::StrCat("lr=", ExactText(h.lr), " beta1=", ExactText(h.beta1),
                      " beta2=", ExactText(h.beta2), " eps=", ExactText(h.eps),
                      " weight_decay=", ExactText(h.weight_decay),
                      " maximize=", h.maximize ? "true" : "false",
                      " amsgrad=", h.amsgrad ? "true" : "false");
}

absl::Status ValidateHyperparameters(const AdamWHyperparameters& h) {
  // The step runs in fp32, so each value must also be in range as a float.
  auto fits_float = [](double x) { return std::isfinite(static_cast<float>(x)); };
  if (!std::isfinite(h.lr) || h.lr < 0 || !fits_float(h.lr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lr must be finite and >= 0 (and within float32's range), got ", ExactText(h.lr)));
  }
  if (!(h.beta1 >= 0 && h.beta1 < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("beta1 must be in [0, 1), got ", ExactText(h.beta1)));
  }
  if (!(h.beta2 >= 0 && h.beta2 < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("beta2 must be in [0, 1), got ", ExactText(h.beta2)));
  }
  if (!std::isfinite(h.eps) || !fits_float(h.eps) || !(static_cast<float>(h.eps) > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eps must be finite and > 0, and at least float32's smallest value 1.4e-45 (the step "
        "runs in fp32), got ",
        ExactText(h.eps)));
  }
  if (!std::isfinite(h.weight_decay) || h.weight_decay < 0 || !fits_float(h.weight_decay)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_decay must be finite and >= 0 (and within float32's range), got ",
                     ExactText(h.weight_decay)));
  }
  return absl::OkStatus();
}

}  // namespace optstate
