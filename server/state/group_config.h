// What a registration fixes for a group's whole life (size, hyperparameters,
// whether initial values follow), its checks, and the bytes its state takes.
#ifndef OPTSTATE_SERVER_STATE_GROUP_CONFIG_H_
#define OPTSTATE_SERVER_STATE_GROUP_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "server/kernels/adamw_hyperparameters.h"

namespace optstate {

struct GroupConfig {
  uint64_t num_elements = 0;
  AdamWHyperparameters hyperparameters;
  bool has_initial_values = false;

  bool operator==(const GroupConfig& o) const {
    return num_elements == o.num_elements && hyperparameters == o.hyperparameters &&
           has_initial_values == o.has_initial_values;
  }
};

// The shortest decimal text that reads back as exactly `x`: messages that
// name hyperparameters tell 1e-3 from the double nearest 1e-3f.
std::string ExactText(double x);

// "lr=0.001 beta1=0.9 beta2=0.999 eps=1e-08 weight_decay=0.01 maximize=false
// amsgrad=false": every field, exactly (ExactText), for messages.
std::string DescribeHyperparameters(const AdamWHyperparameters& h);

// INVALID_ARGUMENT naming the first field out of range: lr and weight_decay
// must be finite and >= 0, beta1 and beta2 in [0, 1), eps finite and > 0;
// lr, eps and weight_decay also finite as float32, and eps > 0 there.
absl::Status ValidateHyperparameters(const AdamWHyperparameters& h);

// Bytes each element of a group's state takes: params, exp_avg (m) and
// exp_avg_sq (v), one fp32 each. The one owner of "12 bytes per element":
// host arrays, a resident group's device arrays and a page's copies all take
// this much; an amsgrad group's host arrays and copies take one fp32 more
// (max_exp_avg_sq), StateBytesPerElement.
inline constexpr uint64_t kStateBytesPerElement = 3 * sizeof(float);

// The state's fp32 arrays per element: 3, or 4 with amsgrad.
inline uint64_t StateArrays(const GroupConfig& c) { return c.hyperparameters.amsgrad ? 4 : 3; }
inline uint64_t StateBytesPerElement(const GroupConfig& c) {
  return StateArrays(c) * sizeof(float);
}

// Bytes of host memory a group takes (params, m and v, and max_exp_avg_sq
// with amsgrad).
inline uint64_t HostBytesFor(const GroupConfig& c) {
  return c.num_elements * StateBytesPerElement(c);
}

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STATE_GROUP_CONFIG_H_
