// AdamW constants, the scalar path, the finite check and the choice of path.
#include "server/kernels/adamw_kernel.h"

#include <unistd.h>

#include <atomic>
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
  // maximize is torch's `grad = -grad`, folded into the scale: negation is
  // exact, so g * -scale is -(g * scale) bit for bit.
  c.grad_scale = h.maximize ? -inputs.grad_scale : inputs.grad_scale;
  return c;
}

namespace kernel_internal {

void AdamWRangeScalar(const AdamWConstants& c, float* p, float* m, float* v, float* vmax,
                      const void* grad, WireType grad_type, size_t begin, size_t end) {
  if (vmax == nullptr) {
    for (size_t i = begin; i < end; ++i) {
      AdamWElement(c, p[i], m[i], v[i], nullptr, LoadGradient(grad, grad_type, i));
    }
    return;
  }
  for (size_t i = begin; i < end; ++i) {
    AdamWElement(c, p[i], m[i], v[i], vmax + i, LoadGradient(grad, grad_type, i));
  }
}

void UpdateAndEncodeOutside(const VectorSpan& span, const AdamWConstants& c, float* p, float* m,
                            float* v, float* vmax, const void* grad, WireType grad_type,
                            size_t count, void* params_out, WireType params_type) {
  AdamWRangeScalar(c, p, m, v, vmax, grad, grad_type, 0, span.begin);
  AdamWRangeScalar(c, p, m, v, vmax, grad, grad_type, span.end, count);
  if (params_out == nullptr) return;
  auto* out = static_cast<unsigned char*>(params_out);
  const size_t size = WireTypeSize(params_type);
  EncodeFromFloat(params_type, p, out, span.begin);
  EncodeFromFloat(params_type, p + span.end, out + span.end * size, count - span.end);
}

// Branch-free accumulation per block keeps this a pure streaming read; the
// exact index is only searched for in a block that holds a bad value.
size_t FindNonFiniteScalarFrom(const void* grad, WireType grad_type, size_t begin, size_t count,
                               float grad_scale) {
  constexpr size_t kBlock = 1024;
  for (; begin < count; begin += kBlock) {
    const size_t end = begin + kBlock < count ? begin + kBlock : count;
    bool all_finite = true;
    for (size_t i = begin; i < end; ++i) {
      float g = LoadGradient(grad, grad_type, i) * grad_scale;
      all_finite &= std::isfinite(g);
    }
    if (all_finite) continue;
    for (size_t i = begin; i < end; ++i) {
      if (!std::isfinite(LoadGradient(grad, grad_type, i) * grad_scale)) return i;
    }
  }
  return count;
}

}  // namespace kernel_internal

void AdamWUpdateScalar(const AdamWConstants& c, float* p, float* m, float* v, const void* grad,
                       WireType grad_type, size_t count, float* max_exp_avg_sq) {
  kernel_internal::AdamWRangeScalar(c, p, m, v, max_exp_avg_sq, grad, grad_type, 0, count);
}

namespace {

KernelIsa WidestKernelIsa() {
#if defined(__x86_64__)
  if (!CpuHasAvx2F16c() || !CpuHasFma()) return KernelIsa::kScalar;
  return CpuHasAvx512f() ? KernelIsa::kAvx512 : KernelIsa::kAvx2;
#else
  return KernelIsa::kScalar;
#endif
}

#if defined(__x86_64__)
// The AVX-512 path: its vector span, the rest (and their params) scalar;
// `ahead` as AdamWUpdateVectorsAvx512 reads it.
void AdamWUpdateAndEncodeAvx512(const AdamWConstants& c, float* p, float* m, float* v,
                                float* vmax, const void* grad, WireType grad_type, size_t count,
                                void* params_out, WireType params_type, ParamsStore store,
                                kernel_internal::AheadBits* ahead = nullptr) {
  const kernel_internal::VectorSpan span = kernel_internal::AdamWUpdateVectorsAvx512(
      c, p, m, v, vmax, grad, grad_type, count, params_out, params_type, store, ahead);
  kernel_internal::UpdateAndEncodeOutside(span, c, p, m, v, vmax, grad, grad_type, count,
                                          params_out, params_type);
}
#endif

}  // namespace

KernelIsa CpuKernelIsa() {
  static const KernelIsa isa = WidestKernelIsa();
  return isa;
}

namespace {

// The path in use, once UseKernelIsa named one; -1 until then.
std::atomic<int> chosen_isa{-1};

}  // namespace

KernelIsa AdamWKernelIsa() {
  const int chosen = chosen_isa.load(std::memory_order_relaxed);
  return chosen < 0 ? CpuKernelIsa() : static_cast<KernelIsa>(chosen);
}

bool UseKernelIsa(KernelIsa isa) {
  if (isa > CpuKernelIsa()) return false;
  chosen_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}

std::vector<KernelIsa> SupportedKernelIsas() {
  std::vector<KernelIsa> isas;
  for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (isa <= CpuKernelIsa()) isas.push_back(isa);
  }
  return isas;
}

bool ParseKernelIsa(absl::string_view name, KernelIsa* isa) {
  for (KernelIsa candidate : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (name == KernelIsaName(candidate)) {
      *isa = candidate;
      return true;
    }
  }
  return false;
}

const char* KernelIsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kScalar:
      return "scalar";
    case KernelIsa::kAvx2:
      return "avx2";
    case KernelIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

void AdamWUpdateOn(KernelIsa isa, const AdamWConstants& c, float* p, float* m, float* v,
                   const void* grad, WireType grad_type, size_t count, float* max_exp_avg_sq) {
  switch (isa) {
#if defined(__x86_64__)
    case KernelIsa::kAvx512:
      AdamWUpdateAndEncodeAvx512(c, p, m, v, max_exp_avg_sq, grad, grad_type, count, nullptr,
                                 WireType::kFloat32, ParamsStore::kCached);
      return;
    case KernelIsa::kAvx2:
      kernel_internal::AdamWUpdateAvx2(c, p, m, v, max_exp_avg_sq, grad, grad_type, count);
      return;
#endif
    default:
      AdamWUpdateScalar(c, p, m, v, grad, grad_type, count, max_exp_avg_sq);
      return;
  }
}

void AdamWUpdateAndEncodeOn(KernelIsa isa, const AdamWConstants& c, float* p, float* m, float* v,
                            const void* grad, WireType grad_type, size_t count, void* params_out,
                            WireType params_type, ParamsStore store, float* max_exp_avg_sq) {
  // Float16 params are narrowed by EncodeFromFloat (its NaN rule is not
  // F16C's), after the update, on every path.
#if defined(__x86_64__)
  if (params_type != WireType::kFloat16) {
    if (isa == KernelIsa::kAvx512) {
      AdamWUpdateAndEncodeAvx512(c, p, m, v, max_exp_avg_sq, grad, grad_type, count, params_out,
                                 params_type, store);
      return;
    }
    if (isa == KernelIsa::kAvx2 &&
        kernel_internal::AdamWUpdateAndEncodeAvx2(c, p, m, v, max_exp_avg_sq, grad, grad_type,
                                                  count, params_out, params_type, store)) {
      return;
    }
  }
#endif
  (void)store;  // The scalar path has plain stores only.
  AdamWUpdateOn(isa, c, p, m, v, grad, grad_type, count, max_exp_avg_sq);
  EncodeFromFloat(params_type, p, params_out, count);
}

size_t FindNonFiniteGradientOn(KernelIsa isa, const void* grad, WireType grad_type, size_t count,
                               float grad_scale) {
  switch (isa) {
#if defined(__x86_64__)
    case KernelIsa::kAvx512: {
      const size_t vector_count = count - count % 16;
      const size_t bad =
          kernel_internal::FindNonFiniteVectorsAvx512(grad, grad_type, vector_count, grad_scale);
      if (bad != vector_count) return bad;
      return kernel_internal::FindNonFiniteScalarFrom(grad, grad_type, vector_count, count,
                                                      grad_scale);
    }
    case KernelIsa::kAvx2:
      return kernel_internal::FindNonFiniteGradientAvx2(grad, grad_type, count, grad_scale);
#endif
    default:
      return kernel_internal::FindNonFiniteScalarFrom(grad, grad_type, 0, count, grad_scale);
  }
}

namespace {

// The most gradient bytes AdamWUpdateAndEncodeCheckingAhead reads among the
// update's own loads: this core's L2 (asked once; 512 KiB where the OS does
// not say). A larger range read there cost more than the separate check on
// a Zen 1 EPYC with 512 KiB of L2: 1 MiB of it made the step 1-10% slower,
// 512 KiB and less 4-7% faster (BENCHMARKS.md, "The next chunk checked
// inside the update").
size_t AheadInUpdateMaxBytes() {
  static const size_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<size_t>(l2) : size_t{512} << 10;
  }();
  return bytes;
}

}  // namespace

bool AdamWUpdateAndEncodeCheckingAheadOn(KernelIsa isa, const AdamWConstants& c, float* p, float* m,
                                         float* v, const void* grad, WireType grad_type,
                                         size_t count, void* params_out, WireType params_type,
                                         ParamsStore store, float* max_exp_avg_sq,
                                         const GradientRange& ahead) {
  const size_t ahead_size = WireTypeSize(ahead.type);
  size_t checked = 0;  // Elements of `ahead` the update read, all finite.
  bool updated = false;
#if defined(__x86_64__)
  if ((isa == KernelIsa::kAvx2 || isa == KernelIsa::kAvx512) &&
      params_type != WireType::kFloat16 && std::fabs(ahead.grad_scale) <= 1.0f &&
      ahead.count * ahead_size <= AheadInUpdateMaxBytes()) {
    kernel_internal::AheadBits bits;
    bits.data = static_cast<const unsigned char*>(ahead.data);
    bits.bytes = ahead.count * ahead_size;
    bits.type = ahead.type;
    if (isa == KernelIsa::kAvx512) {
      AdamWUpdateAndEncodeAvx512(c, p, m, v, max_exp_avg_sq, grad, grad_type, count, params_out,
                                 params_type, store, &bits);
    } else {
      kernel_internal::AdamWUpdateAndEncodeAvx2(c, p, m, v, max_exp_avg_sq, grad, grad_type,
                                                count, params_out, params_type, store, &bits);
    }
    if (bits.bad) return false;
    checked = bits.read / ahead_size;
    updated = true;
  }
#endif
  if (!updated) {
    AdamWUpdateAndEncodeOn(isa, c, p, m, v, grad, grad_type, count, params_out, params_type, store,
                           max_exp_avg_sq);
  }
  const size_t rest = ahead.count - checked;
  return FindNonFiniteGradientOn(
             isa, static_cast<const unsigned char*>(ahead.data) + checked * ahead_size, ahead.type,
             rest, ahead.grad_scale) == rest;
}

void AdamWUpdate(const AdamWConstants& c, float* p, float* m, float* v, const void* grad,
                 WireType grad_type, size_t count, float* max_exp_avg_sq) {
  AdamWUpdateOn(AdamWKernelIsa(), c, p, m, v, grad, grad_type, count, max_exp_avg_sq);
}

void AdamWUpdateAndEncode(const AdamWConstants& c, float* p, float* m, float* v, const void* grad,
                          WireType grad_type, size_t count, void* params_out, WireType params_type,
                          ParamsStore store, float* max_exp_avg_sq) {
  AdamWUpdateAndEncodeOn(AdamWKernelIsa(), c, p, m, v, grad, grad_type, count, params_out,
                         params_type, store, max_exp_avg_sq);
}

bool AdamWUpdateAndEncodeCheckingAhead(const AdamWConstants& c, float* p, float* m, float* v,
                                       const void* grad, WireType grad_type, size_t count,
                                       void* params_out, WireType params_type, ParamsStore store,
                                       float* max_exp_avg_sq, const GradientRange& ahead) {
  return AdamWUpdateAndEncodeCheckingAheadOn(AdamWKernelIsa(), c, p, m, v, grad, grad_type, count,
                                             params_out, params_type, store, max_exp_avg_sq, ahead);
}

size_t FindNonFiniteGradient(const void* grad, WireType grad_type, size_t count, float grad_scale) {
  return FindNonFiniteGradientOn(AdamWKernelIsa(), grad, grad_type, count, grad_scale);
}

}  // namespace optstate
