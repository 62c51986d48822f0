// The baselines of bench/kernel, built with -O3 -march=native -fno-math-errno
// so the compiler vectorizes them as well as it can.
#include "bench/kernel_baselines.h"

#include <cmath>

namespace optstate::bench {

void MemoryPass(float* __restrict p, float* __restrict m, float* __restrict v,
                const float* __restrict g, size_t count) {
  // g - x keeps values bounded without adding arithmetic that could matter.
  for (size_t i = 0; i < count; ++i) {
    const float gi = g[i];
    p[i] = gi - p[i];
    m[i] = gi - m[i];
    v[i] = gi - v[i];
  }
}

void PlainAdamW(const PlainAdamWParams& h, float* p, float* m, float* v, const float* g,
                size_t count) {
  // Plain, but not a strawman: scalars in locals (so stores to p cannot alias
  // them) and pointers without __restrict (the compiler checks overlap once).
  const float lr = h.lr, beta1 = h.beta1, beta2 = h.beta2, eps = h.eps, wd = h.weight_decay;
  const float bias_correction1 = 1.0f - std::pow(beta1, static_cast<float>(h.step));
  const float bias_correction2 = 1.0f - std::pow(beta2, static_cast<float>(h.step));
  for (size_t i = 0; i < count; ++i) {
    p[i] = p[i] * (1.0f - lr * wd);
    m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
    v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
    const float m_hat = m[i] / bias_correction1;
    const float v_hat = v[i] / bias_correction2;
    p[i] = p[i] - lr * m_hat / (std::sqrt(v_hat) + eps);
  }
}

}  // namespace optstate::bench
