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
// lr, eps and weight_decay also finite as float32, and eps > 0 there. Also
// for amsgrad=true, which this daemon does not offer yet (it keeps no
// max_exp_avg_sq): the message names the option.
absl::Status ValidateHyperparameters(const AdamWHyperparameters& h);

// Bytes each element of a group's state takes: params, exp_avg (m) and
// exp_avg_sq (v), one fp32 each. The one owner of "12 bytes per element":
// host arrays, a resident group's device arrays and a page's copies all take
// this much.
inline constexpr uint64_t kStateBytesPerElement = 3 * sizeof(float);

// Bytes of host memory a group of `num_elements` takes (params, m and v).
inline uint64_t HostBytesFor(uint64_t num_elements) { return num_elements * kStateBytesPerElement; }

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STATE_GROUP_CONFIG_H_
