// Random tensors and a local fp32/float64 model of a group for integration
// tests: fresh data each run, with the seed printed for reproduction.
#ifndef OPTSTATE_TESTS_TESTING_RANDOM_TENSORS_H_
#define OPTSTATE_TESTS_TESTING_RANDOM_TENSORS_H_

#include <cstdint>
#include <random>
#include <vector>

#include "optstate/client.h"
#include "server/kernels/adamw_kernel.h"
#include "tests/testing/reference_adamw.h"

namespace optstate::testing {

inline uint32_t FreshSeed() { return std::random_device()(); }

inline std::vector<float> RandomNormal(std::mt19937& rng, size_t n, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

// What the server should hold for one group, computed two independent ways:
// float64 (torch's formula) and the project's scalar fp32 kernel.
class GroupModel {
 public:
  GroupModel(const std::vector<float>& initial, const Hyperparameters& h)
      : h_(h), p32_(initial), m32_(initial.size(), 0.0f), v32_(initial.size(), 0.0f) {
    ref_.params.assign(initial.begin(), initial.end());
    ref_.exp_avg.assign(initial.size(), 0.0);
    ref_.exp_avg_sq.assign(initial.size(), 0.0);
  }

  // `grad` as the server sees it (already narrowed); lr overrides h.lr.
  void Step(uint64_t t, const std::vector<float>& grad, float grad_scale = 1.0f, double lr = -1.0) {
    const double step_lr = lr >= 0 ? lr : h_.lr;
    AdamWStepInputs in{{step_lr, h_.beta1, h_.beta2, h_.eps, h_.weight_decay}, t, grad_scale};
    AdamWUpdateScalar(ComputeAdamWConstants(in), p32_.data(), m32_.data(), v32_.data(), grad.data(),
                      WireType::kFloat32, grad.size());
    std::vector<double> g(grad.size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<double>(grad[i]) * grad_scale;
    ReferenceHyperparameters rh{step_lr, h_.beta1, h_.beta2, h_.eps, h_.weight_decay};
    ReferenceAdamWStep(rh, t, g, &ref_);
  }

  const std::vector<float>& params_fp32() const { return p32_; }
  const std::vector<double>& params_f64() const { return ref_.params; }

 private:
  Hyperparameters h_;
  std::vector<float> p32_, m32_, v32_;
  ReferenceState ref_;
};

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_RANDOM_TENSORS_H_
