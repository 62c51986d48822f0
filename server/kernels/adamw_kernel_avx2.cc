// AVX2 + FMA path of the AdamW kernel: eight elements per iteration, the same
// operations as AdamWElement (FMAs where it has them), and the tail through it.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "common/bfloat16_avx2.h"
#include "server/kernels/adamw_kernel_scalar.h"

#if defined(__x86_64__)

namespace optstate::kernel_internal {
namespace {

#define OPTSTATE_AVX2 __attribute__((target("avx2,f16c,fma")))

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

// Where UpdateLoop also writes each updated param: nowhere, or narrowed.
enum class ParamsOut { kNone, kFloat32, kBFloat16 };

// The lanes in which UpdateLoop checks a gradient it reads ahead (AheadBits):
// none read, float32 lanes, or 16-bit ones.
enum class AheadLanes { kNone, k32, k16 };

// kAmsgrad: vmax (max_exp_avg_sq) is kept and the denominator takes it.
// kPlain: grad_scale is 1 and m's lerp starts from m (lerp_from_gradient
// false; AdamW's default betas), so the loop leaves out the multiply by 1,
// which changes no bit (a NaN gradient's payload included: each operation
// that reads g returns g's NaN, quieted, with or without it), and the
// blend that would pick m anyway. Two operations of the 8 elements'
// twenty-odd, which a step bound by its operations (bf16 on a Zen 1 EPYC:
// BENCHMARKS.md) feels.
// kAhead: `ahead` (else null) is read as AheadBits says, a vector an
// iteration, its loads independent of the update's, so they overlap the
// update's arithmetic instead of taking a pass of their own.
template <WireType kType, ParamsOut kOut, bool kStream, bool kAmsgrad, bool kPlain,
          AheadLanes kAhead = AheadLanes::kNone>
OPTSTATE_AVX2 void UpdateLoop(const AdamWConstants& c, float* p, float* m, float* v, float* vmax,
                              const unsigned char* grad, size_t vector_end,
                              unsigned char* params_out, AheadBits* ahead = nullptr) {
  const unsigned char* const ahead_data = kAhead == AheadLanes::kNone ? nullptr : ahead->data;
  const size_t ahead_vectors_end =
      kAhead == AheadLanes::kNone ? 0 : ahead->bytes / 32 * 32;  // Whole vectors only.
  size_t ahead_read = 0;
  const __m256i magnitude =
      kAhead == AheadLanes::k32 ? _mm256_set1_epi32(0x7fffffff) : _mm256_set1_epi16(0x7fff);
  __m256i most = _mm256_setzero_si256();
  const __m256 grad_scale = _mm256_set1_ps(c.grad_scale);
  const __m256 decay = _mm256_set1_ps(c.decay);
  const __m256 lerp_coefficient = _mm256_set1_ps(c.lerp_coefficient);
  const __m256 lerp_from_gradient =
      _mm256_castsi256_ps(_mm256_set1_epi32(c.lerp_from_gradient ? -1 : 0));
  const __m256 beta2 = _mm256_set1_ps(c.beta2);
  const __m256 one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 neg_step_size = _mm256_set1_ps(c.neg_step_size);
  const __m256 bias_correction2_sqrt = _mm256_set1_ps(c.bias_correction2_sqrt);
  const __m256 eps = _mm256_set1_ps(c.eps);
  for (size_t i = 0; i < vector_end; i += 8) {
    if constexpr (kAhead != AheadLanes::kNone) {
      if (ahead_read < ahead_vectors_end) {
        const __m256i bits =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ahead_data + ahead_read));
        most = kAhead == AheadLanes::k32
                   ? _mm256_max_epu32(most, _mm256_and_si256(bits, magnitude))
                   : _mm256_max_epu16(most, _mm256_and_si256(bits, magnitude));
        ahead_read += 32;
      }
    }
    __m256 g = LoadGradient8(grad, kType, i);
    if constexpr (!kPlain) g = _mm256_mul_ps(g, grad_scale);
    __m256 pv = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
    const __m256 m_old = _mm256_loadu_ps(m + i);
    __m256 lerp_start = m_old;
    if constexpr (!kPlain) lerp_start = _mm256_blendv_ps(m_old, g, lerp_from_gradient);
    const __m256 mv = _mm256_fmadd_ps(lerp_coefficient, _mm256_sub_ps(g, m_old), lerp_start);
    const __m256 vv = _mm256_fmadd_ps(_mm256_mul_ps(one_minus_beta2, g), g,
                                      _mm256_mul_ps(_mm256_loadu_ps(v + i), beta2));
    __m256 second = vv;
    if constexpr (kAmsgrad) {
      // max(a, b) is a > b ? a : b: AdamWElement's `v > vmax`.
      second = _mm256_max_ps(vv, _mm256_loadu_ps(vmax + i));
      _mm256_storeu_ps(vmax + i, second);
    }
    const __m256 denom =
        _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(second), bias_correction2_sqrt), eps);
    pv = _mm256_add_ps(pv, _mm256_div_ps(_mm256_mul_ps(neg_step_size, mv), denom));
    _mm256_storeu_ps(m + i, mv);
    _mm256_storeu_ps(v + i, vv);
    _mm256_storeu_ps(p + i, pv);
    // Streaming stores need params_out + 4i (float32) or + 2i (bfloat16)
    // aligned to the store's width; the caller sees to it. pv is the result
    // of an addition, so a NaN in it is quiet: QuietFloatToBFloat16x8's
    // condition.
    if constexpr (kOut == ParamsOut::kFloat32 && kStream) {
      _mm256_stream_ps(reinterpret_cast<float*>(params_out + 4 * i), pv);
    } else if constexpr (kOut == ParamsOut::kFloat32) {
      _mm256_storeu_ps(reinterpret_cast<float*>(params_out + 4 * i), pv);
    } else if constexpr (kOut == ParamsOut::kBFloat16 && kStream) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(params_out + 2 * i),
                       dtype_internal::QuietFloatToBFloat16x8(pv));
    } else if constexpr (kOut == ParamsOut::kBFloat16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(params_out + 2 * i),
                       dtype_internal::QuietFloatToBFloat16x8(pv));
    }
  }
  if constexpr (kAhead != AheadLanes::kNone) {
    // Not finite where the largest magnitude reaches the type's infinity.
    const __m256i infinity =
        kAhead == AheadLanes::k32
            ? _mm256_set1_epi32(0x7f800000)
            : _mm256_set1_epi16(ahead->type == WireType::kBFloat16 ? 0x7f80 : 0x7c00);
    const __m256i reached = kAhead == AheadLanes::k32 ? _mm256_max_epu32(most, infinity)
                                                      : _mm256_max_epu16(most, infinity);
    const __m256i bad = kAhead == AheadLanes::k32 ? _mm256_cmpeq_epi32(reached, most)
                                                  : _mm256_cmpeq_epi16(reached, most);
    ahead->read = ahead_read;
    ahead->bad = !_mm256_testz_si256(bad, bad);
  }
}

// UpdateLoop for these types; `ahead` read as AheadBits says with streaming
// stores and without amsgrad, else left unread.
template <ParamsOut kOut, bool kStream = false>
OPTSTATE_AVX2 void UpdateLoopFor(WireType grad_type, const AdamWConstants& c, float* p, float* m,
                                 float* v, float* vmax, const unsigned char* grad,
                                 size_t vector_end, unsigned char* params_out,
                                 AheadBits* ahead = nullptr) {
  WithGradientType(grad_type, [&](auto type) {
    WithUpdateVariant(c, vmax, [&](auto amsgrad, auto plain) {
      constexpr WireType kType = decltype(type)::value;
      constexpr bool kAmsgrad = decltype(amsgrad)::value;
      constexpr bool kPlain = decltype(plain)::value;
      if constexpr (kStream && !kAmsgrad) {
        if (ahead != nullptr) {
          if (ahead->type == WireType::kFloat32) {
            UpdateLoop<kType, kOut, kStream, kAmsgrad, kPlain, AheadLanes::k32>(
                c, p, m, v, vmax, grad, vector_end, params_out, ahead);
          } else {
            UpdateLoop<kType, kOut, kStream, kAmsgrad, kPlain, AheadLanes::k16>(
                c, p, m, v, vmax, grad, vector_end, params_out, ahead);
          }
          return;
        }
      }
      UpdateLoop<kType, kOut, kStream, kAmsgrad, kPlain>(c, p, m, v, vmax, grad, vector_end,
                                                         params_out);
    });
  });
}

// All-ones where the lane is infinite or NaN (exponent bits all set).
OPTSTATE_AVX2 inline __m256i NonFiniteMask(__m256 x) {
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), exponent), exponent);
}

// Whether any element of [0, vector_end) (a multiple of 8) has a scaled
// gradient that is not finite. The range is read as kCheckStreams stretches
// side by side, so that many streams' loads are in flight at once: one read
// stream per core reaches only part of what the core can read
// (BENCHMARKS.md, "The finite check as chunks are applied").
template <WireType kType>
OPTSTATE_AVX2 bool AnyNonFinite(const unsigned char* grad, size_t vector_end, __m256 scale) {
  const size_t stretch = vector_end / kCheckStreams / 8 * 8;
  const size_t grad_size = WireTypeSize(kType);
  const unsigned char* starts[kCheckStreams];
  for (size_t s = 0; s < kCheckStreams; ++s) starts[s] = grad + s * stretch * grad_size;
  __m256i bad = _mm256_setzero_si256();
  for (size_t i = 0; i < stretch; i += 8) {
    for (size_t s = 0; s < kCheckStreams; ++s) {
      bad = _mm256_or_si256(bad, NonFiniteMask(_mm256_mul_ps(LoadGradient8(starts[s], kType, i),
                                                             scale)));
    }
  }
  for (size_t i = kCheckStreams * stretch; i < vector_end; i += 8) {
    bad = _mm256_or_si256(bad, NonFiniteMask(_mm256_mul_ps(LoadGradient8(grad, kType, i), scale)));
  }
  return !_mm256_testz_si256(bad, bad);
}

// Lane-wise unsigned max, over 32-bit lanes for float32 and 16-bit lanes
// for the 16-bit types.
template <WireType kType>
OPTSTATE_AVX2 inline __m256i LargestBits(__m256i a, __m256i b) {
  if constexpr (kType == WireType::kFloat32) return _mm256_max_epu32(a, b);
  return _mm256_max_epu16(a, b);
}

// AnyNonFinite's answer when |grad_scale| <= 1, from the bits alone: such a
// scale keeps a finite gradient finite (|g * s| <= |g|) and a non-finite one
// non-finite (infinity times 0 is NaN). A value is not finite where its
// magnitude bits (the sign cleared) reach the all-ones exponent, so the
// largest magnitude of the range answers for all of it: two operations per
// vector of 8 float32 or 16 bfloat16 / float16 elements, with no widening
// and no multiply (a bf16 step on a Zen 1 EPYC was bound by its operations:
// BENCHMARKS.md). `bytes` is a multiple of 16; the range is read as
// kCheckStreams stretches side by side, as AnyNonFinite reads it.
template <WireType kType>
OPTSTATE_AVX2 bool AnyNonFiniteBits(const unsigned char* grad, size_t bytes) {
  constexpr bool kWide = kType == WireType::kFloat32;
  const __m256i magnitude = kWide ? _mm256_set1_epi32(0x7fffffff) : _mm256_set1_epi16(0x7fff);
  const __m256i infinity =
      kWide ? _mm256_set1_epi32(0x7f800000)
            : _mm256_set1_epi16(kType == WireType::kBFloat16 ? 0x7f80 : 0x7c00);
  const size_t stretch = bytes / kCheckStreams / 32 * 32;
  __m256i most[kCheckStreams];
  for (size_t s = 0; s < kCheckStreams; ++s) most[s] = _mm256_setzero_si256();
  for (size_t i = 0; i < stretch; i += 32) {
    for (size_t s = 0; s < kCheckStreams; ++s) {
      const __m256i bits =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grad + s * stretch + i));
      most[s] = LargestBits<kType>(most[s], _mm256_and_si256(bits, magnitude));
    }
  }
  size_t i = kCheckStreams * stretch;
  for (; i + 32 <= bytes; i += 32) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grad + i));
    most[0] = LargestBits<kType>(most[0], _mm256_and_si256(bits, magnitude));
  }
  if (i < bytes) {  // The last 16 bytes, in the low half of a vector.
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(grad + i));
    most[0] = LargestBits<kType>(
        most[0], _mm256_and_si256(_mm256_inserti128_si256(_mm256_setzero_si256(), bits, 0),
                                  magnitude));
  }
  for (size_t s = 1; s < kCheckStreams; ++s) most[0] = LargestBits<kType>(most[0], most[s]);
  // All-ones in the lanes whose largest magnitude is at least infinity's.
  const __m256i reached = LargestBits<kType>(most[0], infinity);
  const __m256i bad =
      kWide ? _mm256_cmpeq_epi32(reached, most[0]) : _mm256_cmpeq_epi16(reached, most[0]);
  return !_mm256_testz_si256(bad, bad);
}

// Index of the first element of [0, vector_end) whose scaled gradient is not
// finite, or vector_end. The whole range is checked at once (AnyNonFiniteBits
// where |grad_scale| <= 1, else AnyNonFinite);
// only when it holds a bad value is it searched in order: blocks branch-free,
// and the block with the first bad value element by element.
template <WireType kType>
OPTSTATE_AVX2 size_t FindNonFiniteLoop(const unsigned char* grad, size_t vector_end,
                                       float grad_scale) {
  constexpr size_t kBlock = 256;
  const __m256 scale = _mm256_set1_ps(grad_scale);
  const bool any = std::fabs(grad_scale) <= 1.0f
                       ? AnyNonFiniteBits<kType>(grad, vector_end * WireTypeSize(kType))
                       : AnyNonFinite<kType>(grad, vector_end, scale);
  if (!any) return vector_end;
  for (size_t begin = 0; begin < vector_end; begin += kBlock) {
    const size_t end = begin + kBlock < vector_end ? begin + kBlock : vector_end;
    __m256i bad = _mm256_setzero_si256();
    for (size_t i = begin; i < end; i += 8) {
      bad =
          _mm256_or_si256(bad, NonFiniteMask(_mm256_mul_ps(LoadGradient8(grad, kType, i), scale)));
    }
    if (_mm256_testz_si256(bad, bad)) continue;
    for (size_t i = begin; i < end; ++i) {
      if (!std::isfinite(LoadGradient(grad, kType, i) * grad_scale)) return i;
    }
  }
  return vector_end;
}

}  // namespace

OPTSTATE_AVX2 size_t FindNonFiniteGradientAvx2(const void* grad, WireType grad_type, size_t count,
                                               float grad_scale) {
  const auto* bytes = static_cast<const unsigned char*>(grad);
  const size_t vector_end = count - count % 8;
  const size_t bad = WithGradientType(grad_type, [&](auto type) {
    return FindNonFiniteLoop<decltype(type)::value>(bytes, vector_end, grad_scale);
  });
  if (bad != vector_end) return bad;
  for (size_t i = vector_end; i < count; ++i) {
    if (!std::isfinite(LoadGradient(grad, grad_type, i) * grad_scale)) return i;
  }
  return count;
}

OPTSTATE_AVX2 void AdamWUpdateAvx2(const AdamWConstants& c, float* p, float* m, float* v,
                                   float* vmax, const void* grad, WireType grad_type,
                                   size_t count) {
  const auto* bytes = static_cast<const unsigned char*>(grad);
  const size_t vector_end = count - count % 8;
  UpdateLoopFor<ParamsOut::kNone>(grad_type, c, p, m, v, vmax, bytes, vector_end, nullptr);
  AdamWRangeScalar(c, p, m, v, vmax, grad, grad_type, vector_end, count);
}

namespace {

// AdamWUpdateAndEncodeAvx2 with streaming stores: the elements before
// params_out's first 32-byte (float32) or 16-byte (bfloat16) boundary, and
// the tail, take the scalar path (the same bits), the rest the vector loop.
// False when params_out is not aligned to its element.
template <ParamsOut kOut>
OPTSTATE_AVX2 bool StreamingUpdateAndEncode(const AdamWConstants& c, float* p, float* m, float* v,
                                            float* vmax, const unsigned char* grad,
                                            WireType grad_type, size_t count, unsigned char* out,
                                            WireType params_type, AheadBits* ahead) {
  const size_t size = WireTypeSize(params_type);
  const size_t width = 8 * size;  // The bytes one vector store writes.
  const uintptr_t address = reinterpret_cast<uintptr_t>(out);
  if (address % size != 0) return false;
  const size_t head = std::min(count, (width - address % width) % width / size);
  const size_t grad_size = WireTypeSize(grad_type);
  AdamWRangeScalar(c, p, m, v, vmax, grad, grad_type, 0, head);
  EncodeFromFloat(params_type, p, out, head);
  const size_t vector_end = head + (count - head) / 8 * 8;
  UpdateLoopFor<kOut, /*kStream=*/true>(
      grad_type, c, p + head, m + head, v + head, vmax == nullptr ? nullptr : vmax + head,
      grad + head * grad_size, vector_end - head, out + head * size, ahead);
  _mm_sfence();
  AdamWRangeScalar(c, p, m, v, vmax, grad, grad_type, vector_end, count);
  EncodeFromFloat(params_type, p + vector_end, out + vector_end * size, count - vector_end);
  return true;
}

}  // namespace

OPTSTATE_AVX2 bool AdamWUpdateAndEncodeAvx2(const AdamWConstants& c, float* p, float* m, float* v,
                                            float* vmax, const void* grad, WireType grad_type,
                                            size_t count, void* params_out, WireType params_type,
                                            ParamsStore store, AheadBits* ahead) {
  const auto* bytes = static_cast<const unsigned char*>(grad);
  auto* out = static_cast<unsigned char*>(params_out);
  if (store == ParamsStore::kStreaming) {
    if (params_type == WireType::kFloat32 &&
        StreamingUpdateAndEncode<ParamsOut::kFloat32>(c, p, m, v, vmax, bytes, grad_type, count,
                                                      out, params_type, ahead)) {
      return true;
    }
    if (params_type == WireType::kBFloat16 &&
        StreamingUpdateAndEncode<ParamsOut::kBFloat16>(c, p, m, v, vmax, bytes, grad_type, count,
                                                       out, params_type, ahead)) {
      return true;
    }
  }
  const size_t vector_end = count - count % 8;
  switch (params_type) {
    case WireType::kFloat32:
      UpdateLoopFor<ParamsOut::kFloat32>(grad_type, c, p, m, v, vmax, bytes, vector_end, out);
      break;
    case WireType::kBFloat16:
      UpdateLoopFor<ParamsOut::kBFloat16>(grad_type, c, p, m, v, vmax, bytes, vector_end, out);
      break;
    case WireType::kFloat16:
      return false;  // Narrowed by EncodeFromFloat (its NaN rule is not F16C's).
  }
  AdamWRangeScalar(c, p, m, v, vmax, grad, grad_type, vector_end, count);
  EncodeFromFloat(params_type, p + vector_end, out + vector_end * WireTypeSize(params_type),
                  count - vector_end);
  return true;
}

}  // namespace optstate::kernel_internal

#endif  // defined(__x86_64__)
