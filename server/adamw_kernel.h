// The AdamW update over plain arrays, exactly as torch.optim.AdamW computes it
// in fp32. Knows nothing of groups, pages or RPCs.
#ifndef OPTSTATE_SERVER_ADAMW_KERNEL_H_
#define OPTSTATE_SERVER_ADAMW_KERNEL_H_

#include <cstddef>
#include <cstdint>

#include "optstate/dtype.h"

namespace optstate {

// Per-step inputs of AdamW. `step` is t >= 1 (the step being applied).
struct AdamWStepInputs {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
  uint64_t step = 1;
  float grad_scale = 1.0f;
};

// Scalars derived once per step (in double, then rounded to float) so every
// element, every path and every backend uses the same values:
//   g  = grad * grad_scale
//   p *= decay                              (decay = 1 - lr*wd)
//   m  = beta1*m + (1-beta1)*g
//   v  = beta2*v + (1-beta2)*g*g
//   p -= step_size * m / (sqrt(v)/bias_correction2_sqrt + eps)
// with step_size = lr / (1 - beta1^t), bias_correction2_sqrt = sqrt(1 - beta2^t).
struct AdamWConstants {
  float decay;
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float step_size;
  float bias_correction2_sqrt;
  float eps;
  float grad_scale;
};

AdamWConstants ComputeAdamWConstants(const AdamWStepInputs& inputs);

// Applies one AdamW step to `count` elements. `grad` points at `count`
// elements of `grad_type`, at any alignment. p, m and v are updated in place.
// Uses the widest vector path the CPU supports; the result is bit-identical to
// AdamWUpdateScalar for every input.
void AdamWUpdate(const AdamWConstants& c, float* p, float* m, float* v, const void* grad,
                 WireType grad_type, size_t count);

// AdamWUpdate that also writes every updated param, narrowed to
// `params_type`, to `params_out` (`count` elements, any alignment): the bytes
// EncodeFromFloat would write from the updated params, without reading them
// again.
void AdamWUpdateAndEncode(const AdamWConstants& c, float* p, float* m, float* v, const void* grad,
                          WireType grad_type, size_t count, void* params_out,
                          WireType params_type);

// The portable path: the same formula, one element at a time.
void AdamWUpdateScalar(const AdamWConstants& c, float* p, float* m, float* v, const void* grad,
                       WireType grad_type, size_t count);

// Index of the first element whose scaled gradient (grad * grad_scale) is
// not finite, or `count` when all are finite.
size_t FindNonFiniteGradient(const void* grad, WireType grad_type, size_t count, float grad_scale);

// True when AdamWUpdate takes the AVX2 path on this CPU.
bool AdamWUsesAvx2();

}  // namespace optstate

#endif  // OPTSTATE_SERVER_ADAMW_KERNEL_H_
