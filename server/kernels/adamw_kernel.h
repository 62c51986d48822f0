// The AdamW update over plain arrays, exactly as torch.optim.AdamW computes it
// in fp32. Knows nothing of groups, pages or RPCs.
#ifndef OPTSTATE_SERVER_KERNELS_ADAMW_KERNEL_H_
#define OPTSTATE_SERVER_KERNELS_ADAMW_KERNEL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "optstate/dtype.h"
#include "server/kernels/adamw_hyperparameters.h"

namespace optstate {

// Per-step inputs of AdamW: the hyperparameters (lr possibly the step's own),
// `step` t >= 1 (the step being applied) and the gradient's scale.
struct AdamWStepInputs {
  AdamWHyperparameters hyperparameters;
  uint64_t step = 1;
  float grad_scale = 1.0f;
};

// The update is torch.optim.AdamW's default CPU step (torch >= 2.0,
// single-tensor path), operation for operation, each op rounded to fp32 as
// torch's fp32 kernels round it:
//   g  = grad * grad_scale                           (grad = -grad with maximize)
//   p  = p * decay                                   param.mul_(1 - lr*wd)
//   m  = fma(lerp_coefficient, g - m, small ? m : g)  exp_avg.lerp_(grad, 1-beta1)
//   v  = fma(one_minus_beta2 * g, g, v * beta2)      exp_avg_sq.mul_(beta2)
//                                                      .addcmul_(grad, grad, 1-beta2)
//   u  = amsgrad ? (vmax = max(vmax, v)) : v         torch.maximum(max_exp_avg_sq, exp_avg_sq)
//   d  = sqrt(u) / bias_correction2_sqrt + eps       (u.sqrt() / bc2_sqrt).add_(eps)
//   p  = p + (neg_step_size * m) / d                 param.addcdiv_(exp_avg, d, -step_size)
// (lerp: fma(w, end - start, start) for |w| < 0.5, fma(w - 1, end - start,
// end) otherwise, as torch's vectorized lerp.) The scalars are computed in
// double and rounded to float once, as torch passes them to its kernels:
// decay = 1 - lr*wd, step_size = lr / (1 - beta1^t),
// bias_correction2_sqrt = (1 - beta2^t) ** 0.5. m and v then equal torch's bit
// for bit; p does wherever torch's sqrt is correctly rounded (x86 builds of
// torch take sqrt from MKL, which is not always: see docs/exactness.md).
struct AdamWConstants {
  float decay;
  float lerp_coefficient;   // 1 - beta1, or (1 - beta1) - 1 when lerp_from_gradient.
  bool lerp_from_gradient;  // 1 - beta1 >= 0.5 (beta1 <= 0.5): lerp's second form.
  float beta2;
  float one_minus_beta2;
  float neg_step_size;
  float bias_correction2_sqrt;
  float eps;
  float grad_scale;  // The step's grad_scale, negated for maximize.
};

AdamWConstants ComputeAdamWConstants(const AdamWStepInputs& inputs);

// The instruction sets the kernel has a path for, narrowest first. Every path
// gives the same bits for every input.
enum class KernelIsa { kScalar, kAvx2, kAvx512 };

// The widest path this CPU and its OS run, asked once (CPUID, and XGETBV for
// AVX-512): AVX-512F (with AVX2, FMA and F16C), else AVX2 + FMA + F16C, else
// scalar.
KernelIsa CpuKernelIsa();

// The path AdamWUpdate, AdamWUpdateAndEncode and FindNonFiniteGradient take:
// CpuKernelIsa(), unless UseKernelIsa named another.
KernelIsa AdamWKernelIsa();

// Makes those calls take `isa` from now on (optstated's --cpu_kernel: a
// narrower path where the wide one runs slower, or to compare them). False,
// and nothing changed, when this CPU does not run `isa`. Meant for start-up;
// a call already running keeps the path it took (every path gives the same
// bits).
bool UseKernelIsa(KernelIsa isa);

// Every path this CPU runs, narrowest first: the exactness tests run each.
std::vector<KernelIsa> SupportedKernelIsas();

// "scalar", "avx2" or "avx512".
const char* KernelIsaName(KernelIsa isa);

// The KernelIsa KernelIsaName names; false for any other text.
bool ParseKernelIsa(absl::string_view name, KernelIsa* isa);

// Applies one AdamW step to `count` elements. `grad` points at `count`
// elements of `grad_type`, at any alignment. p, m and v are updated in place.
// With amsgrad, `max_exp_avg_sq` (count elements, else null) is updated to
// max(max_exp_avg_sq, v) and the denominator takes it instead of v, as
// torch's `amsgrad=True`. Uses AdamWKernelIsa(); the result is bit-identical
// to AdamWUpdateScalar for every input.
void AdamWUpdate(const AdamWConstants& c, float* p, float* m, float* v, const void* grad,
                 WireType grad_type, size_t count, float* max_exp_avg_sq = nullptr);

// How AdamWUpdateAndEncode stores the params it writes. The bytes are the
// same either way.
enum class ParamsStore {
  // Plain stores: for a destination this process reads next, while it is
  // still in cache (a reply gRPC sends from).
  kCached,
  // Non-temporal stores where the CPU has them (the AVX2 and AVX-512 paths,
  // float32 and bfloat16 params at their natural alignment; others fall back
  // to plain stores): the destination's lines are not read before they are written
  // and do not push the state out of cache; for a destination another
  // process reads later (a shared-memory region; BENCHMARKS.md has the
  // figures). The call ends with a store fence, so whoever synchronizes
  // with the caller afterwards (a mutex, a reply over a socket) sees every
  // byte.
  kStreaming,
};

// AdamWUpdate that also writes every updated param, narrowed to
// `params_type`, to `params_out` (`count` elements, any alignment): the bytes
// EncodeFromFloat would write from the updated params, without reading them
// again.
void AdamWUpdateAndEncode(const AdamWConstants& c, float* p, float* m, float* v, const void* grad,
                          WireType grad_type, size_t count, void* params_out, WireType params_type,
                          ParamsStore store = ParamsStore::kCached,
                          float* max_exp_avg_sq = nullptr);

// A gradient's elements for a finite check: `count` elements of `type` at
// `data`, scaled by `grad_scale`.
struct GradientRange {
  const void* data = nullptr;
  WireType type = WireType::kFloat32;
  size_t count = 0;
  float grad_scale = 1.0f;
};

// AdamWUpdateAndEncode (the same bits) that also reads `ahead`, another
// range's gradient (the chunk the calling thread applies next), and returns
// whether every element of it, scaled, is finite: FindNonFiniteGradient's
// answer of `ahead.count`. The AVX2 and AVX-512 paths read it among the
// update's own loads when the params are streamed (bfloat16 or float32,
// aligned to their element), the step has no amsgrad, |ahead.grad_scale| <=
// 1 and `ahead` is no larger than this core's L2, where a check costs
// little beside an update bound by its arithmetic (BENCHMARKS.md, "The next
// chunk checked inside the update"); they check the rest, and the scalar
// path all of it, after the update. `ahead` must not overlap what the
// update writes.
bool AdamWUpdateAndEncodeCheckingAhead(const AdamWConstants& c, float* p, float* m, float* v,
                                       const void* grad, WireType grad_type, size_t count,
                                       void* params_out, WireType params_type, ParamsStore store,
                                       float* max_exp_avg_sq, const GradientRange& ahead);

// The portable path: the same formula, one element at a time.
void AdamWUpdateScalar(const AdamWConstants& c, float* p, float* m, float* v, const void* grad,
                       WireType grad_type, size_t count, float* max_exp_avg_sq = nullptr);

// Index of the first element whose scaled gradient (grad * grad_scale) is
// not finite, or `count` when all are finite.
size_t FindNonFiniteGradient(const void* grad, WireType grad_type, size_t count, float grad_scale);

// The calls above on a path the caller names, which must be one of
// SupportedKernelIsas(): for the tests and benchmarks that compare paths.
void AdamWUpdateOn(KernelIsa isa, const AdamWConstants& c, float* p, float* m, float* v,
                   const void* grad, WireType grad_type, size_t count,
                   float* max_exp_avg_sq = nullptr);
void AdamWUpdateAndEncodeOn(KernelIsa isa, const AdamWConstants& c, float* p, float* m, float* v,
                            const void* grad, WireType grad_type, size_t count, void* params_out,
                            WireType params_type, ParamsStore store,
                            float* max_exp_avg_sq = nullptr);
size_t FindNonFiniteGradientOn(KernelIsa isa, const void* grad, WireType grad_type, size_t count,
                               float grad_scale);
bool AdamWUpdateAndEncodeCheckingAheadOn(KernelIsa isa, const AdamWConstants& c, float* p, float* m,
                                         float* v, const void* grad, WireType grad_type,
                                         size_t count, void* params_out, WireType params_type,
                                         ParamsStore store, float* max_exp_avg_sq,
                                         const GradientRange& ahead);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_KERNELS_ADAMW_KERNEL_H_
