// AVX-512F path of the AdamW kernel: sixteen elements per iteration, the same
// operations as AdamWElement (FMAs where it has them). Every function here is
// a leaf (it calls nothing, not even the scalar path: its callers in
// adamw_kernel.cc do the elements outside the span it returns), so the
// emulator test (tests/emulated) can run this file's machine code on a CPU
// without AVX-512.
// GCC 12's AVX-512 intrinsics initialise their "undefined" vectors from
// themselves, which -Wmaybe-uninitialized reports where they are inlined (GCC
// bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "server/kernels/adamw_kernel_scalar.h"

#if defined(__x86_64__)

namespace optstate::kernel_internal {
namespace {

#define OPTSTATE_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

OPTSTATE_AVX512 inline __m512 LoadGradient16(const unsigned char* grad, WireType type, size_t i) {
  switch (type) {
    case WireType::kFloat32:
      return _mm512_loadu_ps(reinterpret_cast<const float*>(grad + 4 * i));
    case WireType::kBFloat16: {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grad + 2 * i));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case WireType::kFloat16: {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grad + 2 * i));
      return _mm512_cvtph_ps(h);
    }
  }
  return _mm512_setzero_ps();
}

// float32 to bfloat16 for sixteen lanes whose NaNs are quiet, exactly as
// FloatToBFloat16 rounds each one (round to nearest, ties to even), as
// dtype_internal::QuietFloatToBFloat16x8 does for eight: the kernel narrows
// results of an addition, whose NaNs are quiet, so a NaN needs only its high
// half (FloatToBFloat16's truncation; its quiet bit is set already). The
// rounding bias is added where the lane is a number (a masked add), so no
// second candidate and no blend: seven operations, not ten.
OPTSTATE_AVX512 inline __m256i QuietFloatToBFloat16x16(__m512 values) {
  const __m512i bits = _mm512_castps_si512(values);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __mmask16 number = _mm512_cmp_ps_mask(values, values, _CMP_ORD_Q);
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_mask_add_epi32(bits, number, bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
      16);
  // Every lane is below 2^16, so the truncating narrowing keeps it whole.
  return _mm512_cvtepi32_epi16(rounded);
}

// Where UpdateLoop also writes each updated param: nowhere, or narrowed.
enum class ParamsOut { kNone, kFloat32, kBFloat16 };

// For a 32-bit lane of elements of `type` (one float32, or two 16-bit
// elements): the bits AnyNonFiniteBits keeps (each element's magnitude, its
// sign cleared), and what it adds to them (for each element, the distance
// from its type's infinity to its sign bit).
constexpr uint32_t MagnitudeMask(WireType type) {
  return type == WireType::kFloat32 ? 0x7fffffffu : 0x7fff7fffu;
}
constexpr uint32_t DistanceToSign(WireType type) {
  switch (type) {
    case WireType::kFloat32:
      return 0x00800000u;  // 0x80000000 - 0x7f800000
    case WireType::kBFloat16:
      return 0x00800080u;  // 0x8000 - 0x7f80, twice
    case WireType::kFloat16:
      return 0x04000400u;  // 0x8000 - 0x7c00, twice
  }
  return 0;
}

// kAmsgrad: vmax (max_exp_avg_sq) is kept and the denominator takes it.
// kPlain: grad_scale is 1 and m's lerp starts from m (AdamW's default
// betas), so the loop leaves out the multiply by 1 and the blend that would
// pick m anyway, as the AVX2 path's kPlain does; no bit changes, a NaN
// gradient's payload included.
// kAhead: `ahead` is read as AheadBits says, one 64-byte vector an
// iteration, each checked as AnyNonFiniteBits checks (its magnitude plus
// the distance to the sign bit, or-ed into a running vector): loads
// independent of the update's, which overlap its arithmetic instead of
// taking a pass of their own.
template <WireType kType, ParamsOut kOut, bool kStream, bool kAmsgrad, bool kPlain,
          bool kAhead = false>
OPTSTATE_AVX512 void UpdateLoop(const AdamWConstants& c, float* p, float* m, float* v, float* vmax,
                                const unsigned char* grad, size_t vector_end,
                                unsigned char* params_out, AheadBits* ahead = nullptr) {
  const unsigned char* const ahead_data = kAhead ? ahead->data : nullptr;
  const size_t ahead_vectors_end = kAhead ? ahead->bytes / 64 * 64 : 0;  // Whole vectors only.
  const WireType ahead_type = kAhead ? ahead->type : WireType::kFloat32;
  const __m512i ahead_magnitude = _mm512_set1_epi32(static_cast<int>(MagnitudeMask(ahead_type)));
  const __m512i ahead_to_sign = _mm512_set1_epi32(static_cast<int>(DistanceToSign(ahead_type)));
  size_t ahead_read = 0;
  __m512i reached = _mm512_setzero_si512();
  const __m512 grad_scale = _mm512_set1_ps(c.grad_scale);
  const __m512 decay = _mm512_set1_ps(c.decay);
  const __m512 lerp_coefficient = _mm512_set1_ps(c.lerp_coefficient);
  const __mmask16 lerp_from_gradient = c.lerp_from_gradient ? 0xffff : 0;
  const __m512 beta2 = _mm512_set1_ps(c.beta2);
  const __m512 one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 neg_step_size = _mm512_set1_ps(c.neg_step_size);
  const __m512 bias_correction2_sqrt = _mm512_set1_ps(c.bias_correction2_sqrt);
  const __m512 eps = _mm512_set1_ps(c.eps);
  for (size_t i = 0; i < vector_end; i += 16) {
    if constexpr (kAhead) {
      if (ahead_read < ahead_vectors_end) {
        const __m512i bits = _mm512_loadu_si512(ahead_data + ahead_read);
        reached = _mm512_or_si512(
            reached, _mm512_add_epi32(_mm512_and_si512(bits, ahead_magnitude), ahead_to_sign));
        ahead_read += 64;
      }
    }
    __m512 g = LoadGradient16(grad, kType, i);
    if constexpr (!kPlain) g = _mm512_mul_ps(g, grad_scale);
    __m512 pv = _mm512_mul_ps(_mm512_loadu_ps(p + i), decay);
    const __m512 m_old = _mm512_loadu_ps(m + i);
    __m512 lerp_start = m_old;
    if constexpr (!kPlain) lerp_start = _mm512_mask_blend_ps(lerp_from_gradient, m_old, g);
    const __m512 mv = _mm512_fmadd_ps(lerp_coefficient, _mm512_sub_ps(g, m_old), lerp_start);
    const __m512 vv = _mm512_fmadd_ps(_mm512_mul_ps(one_minus_beta2, g), g,
                                      _mm512_mul_ps(_mm512_loadu_ps(v + i), beta2));
    __m512 second = vv;
    if constexpr (kAmsgrad) {
      // max(a, b) is a > b ? a : b: AdamWElement's `v > vmax`.
      second = _mm512_max_ps(vv, _mm512_loadu_ps(vmax + i));
      _mm512_storeu_ps(vmax + i, second);
    }
    const __m512 denom =
        _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(second), bias_correction2_sqrt), eps);
    pv = _mm512_add_ps(pv, _mm512_div_ps(_mm512_mul_ps(neg_step_size, mv), denom));
    _mm512_storeu_ps(m + i, mv);
    _mm512_storeu_ps(v + i, vv);
    _mm512_storeu_ps(p + i, pv);
    // Streaming stores need params_out + 4i (float32) aligned to 64 bytes,
    // or + 2i (bfloat16) to 32; the caller sees to it.
    if constexpr (kOut == ParamsOut::kFloat32 && kStream) {
      _mm512_stream_ps(reinterpret_cast<float*>(params_out + 4 * i), pv);
    } else if constexpr (kOut == ParamsOut::kFloat32) {
      _mm512_storeu_ps(reinterpret_cast<float*>(params_out + 4 * i), pv);
    } else if constexpr (kOut == ParamsOut::kBFloat16 && kStream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(params_out + 2 * i),
                          QuietFloatToBFloat16x16(pv));
    } else if constexpr (kOut == ParamsOut::kBFloat16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(params_out + 2 * i),
                          QuietFloatToBFloat16x16(pv));
    }
  }
  if constexpr (kAhead) {
    ahead->read = ahead_read;
    // Any element's sign bit (the bits the magnitude mask clears): a
    // magnitude that reached the type's infinity.
    ahead->bad = _mm512_test_epi32_mask(reached, _mm512_set1_epi32(static_cast<int>(
                                                     ~MagnitudeMask(ahead_type)))) != 0;
  }
}

// UpdateLoop for these types; `ahead` (else null) read as AheadBits says
// with streaming stores and without amsgrad, else left unread.
template <ParamsOut kOut, bool kStream>
OPTSTATE_AVX512 void UpdateLoopFor(WireType grad_type, const AdamWConstants& c, float* p, float* m,
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
          UpdateLoop<kType, kOut, kStream, kAmsgrad, kPlain, /*kAhead=*/true>(
              c, p, m, v, vmax, grad, vector_end, params_out, ahead);
          return;
        }
      }
      UpdateLoop<kType, kOut, kStream, kAmsgrad, kPlain>(c, p, m, v, vmax, grad, vector_end,
                                                         params_out);
    });
  });
}

// The lanes whose value is infinite or NaN (exponent bits all set).
OPTSTATE_AVX512 inline __mmask16 NonFiniteLanes(__m512 x) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), exponent), exponent);
}

// Whether any element of [0, vector_end) (a multiple of 16) has a scaled
// gradient that is not finite, read as kCheckStreams stretches side by side
// (as the AVX2 path's AnyNonFinite).
template <WireType kType>
OPTSTATE_AVX512 bool AnyNonFinite(const unsigned char* grad, size_t vector_end, __m512 scale) {
  const size_t stretch = vector_end / kCheckStreams / 16 * 16;
  const size_t grad_size = kType == WireType::kFloat32 ? 4 : 2;
  const unsigned char* starts[kCheckStreams];
  for (size_t s = 0; s < kCheckStreams; ++s) starts[s] = grad + s * stretch * grad_size;
  __mmask16 bad = 0;
  for (size_t i = 0; i < stretch; i += 16) {
    for (size_t s = 0; s < kCheckStreams; ++s) {
      bad |= NonFiniteLanes(_mm512_mul_ps(LoadGradient16(starts[s], kType, i), scale));
    }
  }
  for (size_t i = kCheckStreams * stretch; i < vector_end; i += 16) {
    bad |= NonFiniteLanes(_mm512_mul_ps(LoadGradient16(grad, kType, i), scale));
  }
  return bad != 0;
}

// AnyNonFinite's answer when |grad_scale| <= 1, from the bits alone, as the
// AVX2 path's AnyNonFiniteBits: such a scale keeps a finite gradient finite
// and a non-finite one non-finite. AVX-512F has no 16-bit compare or max, so
// each element's magnitude (its sign cleared) is added to the distance from
// the type's infinity to its sign bit: the sum reaches the sign bit exactly
// where the magnitude reaches infinity, and no sum carries out of its
// element (0x7fff + 0x0400 < 0x10000), so two 16-bit elements share a
// 32-bit lane safely. Three operations per 64 bytes, no widening and no
// multiply. `bytes` is a multiple of 32; the range is read as kCheckStreams
// stretches side by side, as AnyNonFinite reads it.
template <WireType kType>
OPTSTATE_AVX512 bool AnyNonFiniteBits(const unsigned char* grad, size_t bytes) {
  constexpr uint32_t kMagnitude = MagnitudeMask(kType);
  constexpr uint32_t kToSign = DistanceToSign(kType);
  const __m512i magnitude = _mm512_set1_epi32(static_cast<int>(kMagnitude));
  const __m512i to_sign = _mm512_set1_epi32(static_cast<int>(kToSign));
  const size_t stretch = bytes / kCheckStreams / 64 * 64;
  __m512i reached[kCheckStreams];
  for (size_t s = 0; s < kCheckStreams; ++s) reached[s] = _mm512_setzero_si512();
  for (size_t i = 0; i < stretch; i += 64) {
    for (size_t s = 0; s < kCheckStreams; ++s) {
      const __m512i bits = _mm512_loadu_si512(grad + s * stretch + i);
      reached[s] =
          _mm512_or_si512(reached[s], _mm512_add_epi32(_mm512_and_si512(bits, magnitude), to_sign));
    }
  }
  size_t i = kCheckStreams * stretch;
  for (; i + 64 <= bytes; i += 64) {
    const __m512i bits = _mm512_loadu_si512(grad + i);
    reached[0] =
        _mm512_or_si512(reached[0], _mm512_add_epi32(_mm512_and_si512(bits, magnitude), to_sign));
  }
  if (i < bytes) {  // The last 32 bytes, in the low half of a vector.
    const __m512i bits = _mm512_inserti64x4(
        _mm512_setzero_si512(), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grad + i)), 0);
    reached[0] =
        _mm512_or_si512(reached[0], _mm512_add_epi32(_mm512_and_si512(bits, magnitude), to_sign));
  }
  for (size_t s = 1; s < kCheckStreams; ++s) reached[0] = _mm512_or_si512(reached[0], reached[s]);
  // Any element's sign bit: the bits the magnitude mask clears.
  return _mm512_test_epi32_mask(reached[0], _mm512_set1_epi32(static_cast<int>(~kMagnitude))) != 0;
}

// The first bad element's index, or vector_end: the whole range checked at
// once (AnyNonFiniteBits where |grad_scale| <= 1, else AnyNonFinite), and
// searched in order only when it holds a bad value.
template <WireType kType>
OPTSTATE_AVX512 size_t FindNonFiniteLoop(const unsigned char* grad, size_t vector_end,
                                         float grad_scale) {
  constexpr size_t kBlock = 256;
  const __m512 scale = _mm512_set1_ps(grad_scale);
  // __builtin_fabsf is inlined: this file calls nothing (see the top).
  const bool any = __builtin_fabsf(grad_scale) <= 1.0f
                       ? AnyNonFiniteBits<kType>(grad, vector_end * WireTypeSize(kType))
                       : AnyNonFinite<kType>(grad, vector_end, scale);
  if (!any) return vector_end;
  for (size_t begin = 0; begin < vector_end; begin += kBlock) {
    const size_t end = begin + kBlock < vector_end ? begin + kBlock : vector_end;
    __mmask16 bad = 0;
    for (size_t i = begin; i < end; i += 16) {
      bad |= NonFiniteLanes(_mm512_mul_ps(LoadGradient16(grad, kType, i), scale));
    }
    if (bad == 0) continue;
    // The lanes are the scalar path's own values (an exact widening and the
    // same rounded product), so the first bad lane is its answer.
    for (size_t i = begin; i < end; i += 16) {
      const unsigned lanes = NonFiniteLanes(_mm512_mul_ps(LoadGradient16(grad, kType, i), scale));
      if (lanes != 0) return i + static_cast<size_t>(__builtin_ctz(lanes));
    }
  }
  return vector_end;
}

// The elements before the first address of `out` a streaming store of
// `width` bytes may write, for elements of `size` bytes; `out` is aligned to
// its element.
inline size_t StreamingHead(uintptr_t out, size_t size, size_t width, size_t count) {
  const size_t head = (width - out % width) % width / size;
  return head < count ? head : count;
}

template <ParamsOut kOut>
OPTSTATE_AVX512 VectorSpan UpdateSpan(const AdamWConstants& c, float* p, float* m, float* v,
                                      float* vmax, const unsigned char* grad,
                                      WireType grad_type, size_t count,
                                      unsigned char* out, size_t out_size, bool stream,
                                      AheadBits* ahead) {
  size_t begin = 0;
  if (stream) {
    // A 16-lane store writes 64 bytes of float32 or 32 of bfloat16.
    begin = StreamingHead(reinterpret_cast<uintptr_t>(out), out_size, 16 * out_size, count);
  }
  const size_t end = begin + (count - begin) / 16 * 16;
  const size_t grad_size = WireTypeSize(grad_type);
  float* const ps = p + begin;
  float* const ms = m + begin;
  float* const vs = v + begin;
  float* const vmaxs = vmax == nullptr ? nullptr : vmax + begin;
  const unsigned char* const gs = grad + begin * grad_size;
  unsigned char* const os = out == nullptr ? nullptr : out + begin * out_size;
  if constexpr (kOut != ParamsOut::kNone) {  // Without params out, nothing to stream.
    if (stream) {
      UpdateLoopFor<kOut, true>(grad_type, c, ps, ms, vs, vmaxs, gs, end - begin, os, ahead);
      _mm_sfence();
      return {begin, end};
    }
  }
  UpdateLoopFor<kOut, false>(grad_type, c, ps, ms, vs, vmaxs, gs, end - begin, os);
  return {begin, end};
}

}  // namespace

OPTSTATE_AVX512 VectorSpan AdamWUpdateVectorsAvx512(const AdamWConstants& c, float* p, float* m,
                                                    float* v, float* vmax, const void* grad,
                                                    WireType grad_type, size_t count,
                                                    void* params_out, WireType params_type,
                                                    ParamsStore store, AheadBits* ahead) {
  const auto* bytes = static_cast<const unsigned char*>(grad);
  auto* out = static_cast<unsigned char*>(params_out);
  if (out == nullptr) {
    return UpdateSpan<ParamsOut::kNone>(c, p, m, v, vmax, bytes, grad_type, count, nullptr, 0,
                                        false, nullptr);
  }
  const size_t size = WireTypeSize(params_type);
  // Streaming stores only where `out` is aligned to its element (else no
  // offset of it reaches a store boundary).
  const bool stream =
      store == ParamsStore::kStreaming && reinterpret_cast<uintptr_t>(out) % size == 0;
  switch (params_type) {
    case WireType::kFloat32:
      return UpdateSpan<ParamsOut::kFloat32>(c, p, m, v, vmax, bytes, grad_type, count, out, size,
                                             stream, ahead);
    case WireType::kBFloat16:
      return UpdateSpan<ParamsOut::kBFloat16>(c, p, m, v, vmax, bytes, grad_type, count, out,
                                              size, stream, ahead);
    case WireType::kFloat16:
      break;  // Narrowed by EncodeFromFloat (its NaN rule is not F16C's).
  }
  return {0, 0};
}

OPTSTATE_AVX512 size_t FindNonFiniteVectorsAvx512(const void* grad, WireType grad_type,
                                                  size_t vector_count, float grad_scale) {
  const auto* bytes = static_cast<const unsigned char*>(grad);
  return WithGradientType(grad_type, [&](auto type) {
    return FindNonFiniteLoop<decltype(type)::value>(bytes, vector_count, grad_scale);
  });
}

}  // namespace optstate::kernel_internal

#endif  // defined(__x86_64__)
