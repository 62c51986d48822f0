// AVX2 path of the AdamW kernel: eight elements per iteration, the same
// separately rounded operations as AdamWElement, and the tail through it.
#include <immintrin.h>

#include "server/adamw_kernel_scalar.h"

#if defined(__x86_64__)

namespace optstate::kernel_internal {
namespace {

#define OPTSTATE_AVX2 __attribute__((target("avx2,f16c")))

OPTSTATE_AVX2 inline __m256 LoadGradient8(const unsigned char* grad, WireType type, size_t i) {
  switch (type) {
    case WireType::kFloat32:
      return _mm256_loadu_ps(reinterpret_cast<const float*>(grad + 4 * i));
    case WireType::kBFloat16: {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(grad + 2 * i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case WireType::kFloat16: {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(grad + 2 * i));
      return _mm256_cvtph_ps(h);
    }
  }
  return _mm256_setzero_ps();
}

template <WireType kType>
OPTSTATE_AVX2 void UpdateLoop(const AdamWConstants& c, float* p, float* m, float* v,
                              const unsigned char* grad, size_t vector_end) {
  const __m256 grad_scale = _mm256_set1_ps(c.grad_scale);
  const __m256 decay = _mm256_set1_ps(c.decay);
  const __m256 beta1 = _mm256_set1_ps(c.beta1);
  const __m256 one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2);
  const __m256 one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 step_size = _mm256_set1_ps(c.step_size);
  const __m256 bias_correction2_sqrt = _mm256_set1_ps(c.bias_correction2_sqrt);
  const __m256 eps = _mm256_set1_ps(c.eps);
  for (size_t i = 0; i < vector_end; i += 8) {
    __m256 g = _mm256_mul_ps(LoadGradient8(grad, kType, i), grad_scale);
    __m256 pv = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
    __m256 mv = _mm256_add_ps(_mm256_mul_ps(beta1, _mm256_loadu_ps(m + i)),
                              _mm256_mul_ps(one_minus_beta1, g));
    __m256 vv = _mm256_add_ps(_mm256_mul_ps(beta2, _mm256_loadu_ps(v + i)),
                              _mm256_mul_ps(one_minus_beta2, _mm256_mul_ps(g, g)));
    __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), bias_correction2_sqrt), eps);
    pv = _mm256_sub_ps(pv, _mm256_mul_ps(step_size, _mm256_div_ps(mv, denom)));
    _mm256_storeu_ps(m + i, mv);
    _mm256_storeu_ps(v + i, vv);
    _mm256_storeu_ps(p + i, pv);
  }
}

}  // namespace

OPTSTATE_AVX2 void AdamWUpdateAvx2(const AdamWConstants& c, float* p, float* m, float* v,
                                   const void* grad, WireType grad_type, size_t count) {
  const auto* bytes = static_cast<const unsigned char*>(grad);
  const size_t vector_end = count - count % 8;
  switch (grad_type) {
    case WireType::kFloat32:
      UpdateLoop<WireType::kFloat32>(c, p, m, v, bytes, vector_end);
      break;
    case WireType::kBFloat16:
      UpdateLoop<WireType::kBFloat16>(c, p, m, v, bytes, vector_end);
      break;
    case WireType::kFloat16:
      UpdateLoop<WireType::kFloat16>(c, p, m, v, bytes, vector_end);
      break;
  }
  AdamWRangeScalar(c, p, m, v, grad, grad_type, vector_end, count);
}

}  // namespace optstate::kernel_internal

#endif  // defined(__x86_64__)
