// AdamW constants, the scalar path, the finite check and path dispatch.
#include "server/kernels/adamw_kernel.h"

#include <cmath>

#include "common/cpu_features.h"
#include "server/kernels/adamw_kernel_scalar.h"

namespace optstate {

AdamWConstants ComputeAdamWConstants(const AdamWStepInputs& inputs) {
  const AdamWHyperparameters& h = inputs.hyperparameters;
  // Python evaluates these in double: `1 - beta1**step`, `lr / bc1`,
  // `bc2**0.5` (pow, not sqrt), `1 - lr * weight_decay`, `1 - beta2`.
  const double t = static_cast<double>(inputs.step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
  const float lerp_weight = static_cast<float>(1.0 - h.beta1);
  AdamWConstants c;
  c.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  c.lerp_from_gradient = !(std::fabs(lerp_weight) < 0.5f);
  c.lerp_coefficient = c.lerp_from_gradient ? lerp_weight - 1.0f : lerp_weight;
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.neg_step_size = static_cast<float>(-(h.lr / bias_correction1));
  c.bias_correction2_sqrt = static_cast<float>(std::pow(bias_correction2, 0.5));
  c.eps = static_cast<float>(h.eps);
  c.grad_scale = inputs.grad_scale;
  return c;
}

namespace kernel_internal {

void AdamWRangeScalar(const AdamWConstants& c, float* p, float* m, float* v, const void* grad,
                      WireType grad_type, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    AdamWElement(c, p[i], m[i], v[i], LoadGradient(grad, grad_type, i));
  }
}

}  // namespace kernel_internal

void AdamWUpdateScalar(const AdamWConstants& c, float* p, float* m, float* v, const void* grad,
                       WireType grad_type, size_t count) {
  kernel_internal::AdamWRangeScalar(c, p, m, v, grad, grad_type, 0, count);
}

bool AdamWUsesAvx2() {
#if defined(__x86_64__)
  return CpuHasAvx2F16c() && CpuHasFma();
#else
  return false;
#endif
}

void AdamWUpdate(const AdamWConstants& c, float* p, float* m, float* v, const void* grad,
                 WireType grad_type, size_t count) {
#if defined(__x86_64__)
  if (AdamWUsesAvx2()) {
    kernel_internal::AdamWUpdateAvx2(c, p, m, v, grad, grad_type, count);
    return;
  }
#endif
  AdamWUpdateScalar(c, p, m, v, grad, grad_type, count);
}

void AdamWUpdateAndEncode(const AdamWConstants& c, float* p, float* m, float* v, const void* grad,
                          WireType grad_type, size_t count, void* params_out, WireType params_type,
                          ParamsStore store) {
#if defined(__x86_64__)
  if (AdamWUsesAvx2() && kernel_internal::AdamWUpdateAndEncodeAvx2(
                             c, p, m, v, grad, grad_type, count, params_out, params_type, store)) {
    return;
  }
#endif
  (void)store;  // The scalar path has plain stores only.
  AdamWUpdate(c, p, m, v, grad, grad_type, count);
  EncodeFromFloat(params_type, p, params_out, count);
}

size_t FindNonFiniteGradient(const void* grad, WireType grad_type, size_t count, float grad_scale) {
#if defined(__x86_64__)
  if (AdamWUsesAvx2()) {
    return kernel_internal::FindNonFiniteGradientAvx2(grad, grad_type, count, grad_scale);
  }
#endif
  // Branch-free accumulation per block keeps this a pure streaming read; the
  // exact index is only searched for in a block that holds a bad value.
  constexpr size_t kBlock = 1024;
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t end = begin + kBlock < count ? begin + kBlock : count;
    bool all_finite = true;
    for (size_t i = begin; i < end; ++i) {
      float g = kernel_internal::LoadGradient(grad, grad_type, i) * grad_scale;
      all_finite &= std::isfinite(g);
    }
    if (all_finite) continue;
    for (size_t i = begin; i < end; ++i) {
      if (!std::isfinite(kernel_internal::LoadGradient(grad, grad_type, i) * grad_scale)) return i;
    }
  }
  return count;
}

}  // namespace optstate
