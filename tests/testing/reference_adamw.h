// The independent reference for every exactness test: AdamW as
// torch.optim.AdamW defines it, computed in float64, one element at a time.
#ifndef OPTSTATE_TESTS_TESTING_REFERENCE_ADAMW_H_
#define OPTSTATE_TESTS_TESTING_REFERENCE_ADAMW_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace optstate::testing {

struct ReferenceHyperparameters {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool maximize = false;  // torch's maximize: the step follows -grad.
  bool amsgrad = false;   // torch's amsgrad: the denominator takes max_exp_avg_sq.
};

struct ReferenceState {
  std::vector<double> params, exp_avg, exp_avg_sq;
  std::vector<double> max_exp_avg_sq = {};  // With amsgrad: as long as params.
};

// One step t >= 1 with gradient `grad` (already scaled; negated here for
// maximize, as torch negates it).
inline void ReferenceAdamWStep(const ReferenceHyperparameters& h, uint64_t t,
                               const std::vector<double>& grad, ReferenceState* s) {
  const double bias_correction1 = 1.0 - std::pow(h.beta1, static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(h.beta2, static_cast<double>(t));
  const double step_size = h.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  for (size_t i = 0; i < grad.size(); ++i) {
    double& p = s->params[i];
    double& m = s->exp_avg[i];
    double& v = s->exp_avg_sq[i];
    p *= 1.0 - h.lr * h.weight_decay;
    const double g = h.maximize ? -grad[i] : grad[i];
    m = h.beta1 * m + (1.0 - h.beta1) * g;
    v = h.beta2 * v + (1.0 - h.beta2) * g * g;
    double second = v;
    if (h.amsgrad) {
      s->max_exp_avg_sq[i] = std::max(s->max_exp_avg_sq[i], v);
      second = s->max_exp_avg_sq[i];
    }
    p -= step_size * m / (std::sqrt(second) / bias_correction2_sqrt + h.eps);
  }
}

// ||a - b|| / ||b|| over two equally long arrays.
template <typename A, typename B>
double RelativeL2Error(const A& a, const B& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    diff += d * d;
    norm += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

template <typename A, typename B>
double MaxAbsError(const A& a, const B& b) {
  double max = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    max = std::max(max, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  }
  return max;
}

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_REFERENCE_ADAMW_H_
