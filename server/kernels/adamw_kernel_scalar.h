// The per-element AdamW formula shared by the scalar path and the vector
// paths' tails, so an array's tail is computed by the same code.
#ifndef OPTSTATE_SERVER_KERNELS_ADAMW_KERNEL_SCALAR_H_
#define OPTSTATE_SERVER_KERNELS_ADAMW_KERNEL_SCALAR_H_

#include <cmath>
#include <cstring>
#include <type_traits>

#include "optstate/dtype.h"
#include "server/kernels/adamw_kernel.h"

namespace optstate::kernel_internal {

// The vector paths' finite check reads its range as this many stretches side
// by side (kernel bench BM_FiniteCheck: 8 ran faster than 1, 2 or 4).
constexpr size_t kCheckStreams = 8;

inline float LoadGradient(const void* grad, WireType type, size_t i) {
  const auto* bytes = static_cast<const unsigned char*>(grad);
  if (type == WireType::kFloat32) {
    float g;
    std::memcpy(&g, bytes + 4 * i, 4);
    return g;
  }
  uint16_t h;
  std::memcpy(&h, bytes + 2 * i, 2);
  return type == WireType::kBFloat16 ? BFloat16ToFloat(h) : HalfToFloat(h);
}

// Every operation is a separately rounded IEEE op or an explicit fused
// multiply-add (the kernel files are built with -ffp-contract=off), in the
// order of AdamWConstants' contract, which the vector paths follow too.
// With amsgrad (`vmax` not null), *vmax = max(*vmax, v) and the
// denominator takes it: torch's torch.maximum(max_exp_avg_sq, exp_avg_sq,
// out=max_exp_avg_sq) before max_exp_avg_sq.sqrt().
inline void AdamWElement(const AdamWConstants& c, float& p, float& m, float& v, float* vmax,
                         float g) {
  g = g * c.grad_scale;
  p = p * c.decay;
  m = std::fma(c.lerp_coefficient, g - m, c.lerp_from_gradient ? g : m);
  v = std::fma(c.one_minus_beta2 * g, g, v * c.beta2);
  float second = v;
  if (vmax != nullptr) {
    if (v > *vmax) *vmax = v;
    second = *vmax;
  }
  const float denom = std::sqrt(second) / c.bias_correction2_sqrt + c.eps;
  p = p + (c.neg_step_size * m) / denom;
}

// `vmax`: max_exp_avg_sq, indexed as p (amsgrad), or null.
void AdamWRangeScalar(const AdamWConstants& c, float* p, float* m, float* v, float* vmax,
                      const void* grad, WireType grad_type, size_t begin, size_t end);

// Calls fn(std::integral_constant<WireType, type>()) for the run-time `type`
// and returns what it returns: how a vector path turns a gradient's type
// into its loop's template argument.
template <typename Fn>
inline auto WithGradientType(WireType type, Fn&& fn) {
  switch (type) {
    case WireType::kBFloat16:
      return fn(std::integral_constant<WireType, WireType::kBFloat16>());
    case WireType::kFloat16:
      return fn(std::integral_constant<WireType, WireType::kFloat16>());
    case WireType::kFloat32:
      break;
  }
  return fn(std::integral_constant<WireType, WireType::kFloat32>());
}

// Calls fn(amsgrad, plain), each a std::bool_constant: how a vector path
// picks its update loop's variant. amsgrad: max_exp_avg_sq is kept (`vmax`
// is not null). plain: grad_scale is 1 and m's lerp starts from m (AdamW's
// default betas), so the loop may leave out the multiply by grad_scale and
// the blend that would pick m, which change no bit there.
template <typename Fn>
inline void WithUpdateVariant(const AdamWConstants& c, const float* vmax, Fn&& fn) {
  const bool amsgrad = vmax != nullptr;
  const bool plain = c.grad_scale == 1.0f && !c.lerp_from_gradient;
  if (amsgrad && plain) {
    fn(std::true_type(), std::true_type());
  } else if (amsgrad) {
    fn(std::true_type(), std::false_type());
  } else if (plain) {
    fn(std::false_type(), std::true_type());
  } else {
    fn(std::false_type(), std::false_type());
  }
}

// AVX2 + F16C + FMA path; defined only on x86-64.
void AdamWUpdateAvx2(const AdamWConstants& c, float* p, float* m, float* v, float* vmax,
                     const void* grad, WireType grad_type, size_t count);

// A gradient a vector update loop reads ahead, among its own loads, for
// AdamWUpdateAndEncodeCheckingAhead: one vector of `data` an iteration (32
// bytes on the AVX2 path, 64 on the AVX-512 path) while whole vectors remain
// of its `bytes`, each checked from its bits alone, as elements of `type`
// (each path's AnyNonFiniteBits check, right only for a scale of at most 1
// in magnitude). The loop leaves in `read` the bytes it checked (whole
// vectors, from the start) and in `bad` whether any of them is not finite.
struct AheadBits {
  const unsigned char* data = nullptr;
  size_t bytes = 0;
  WireType type = WireType::kFloat32;
  size_t read = 0;
  bool bad = false;
};

// AdamWUpdateAndEncode's AVX2 path; false (nothing done) for a params type
// it does not narrow itself (float16). With `ahead`, the streaming vector
// loop of a step without amsgrad also reads it (AheadBits); other stores
// (plain ones, or params not aligned to their element) and amsgrad leave it
// unread (`read` 0).
bool AdamWUpdateAndEncodeAvx2(const AdamWConstants& c, float* p, float* m, float* v, float* vmax,
                              const void* grad, WireType grad_type, size_t count, void* params_out,
                              WireType params_type, ParamsStore store, AheadBits* ahead = nullptr);

// FindNonFiniteGradient's AVX2 path, with the same answer for every input.
size_t FindNonFiniteGradientAvx2(const void* grad, WireType grad_type, size_t count,
                                 float grad_scale);

// The elements [begin, end) a vector path updated (and narrowed into
// params_out); the caller does the others with the scalar path.
struct VectorSpan {
  size_t begin = 0;
  size_t end = 0;
};

// What a vector path leaves to the scalar one: the elements before and after
// `span` updated (AdamWRangeScalar) and, unless params_out is null, their
// params narrowed into params_out (EncodeFromFloat); the span's are not
// touched.
void UpdateAndEncodeOutside(const VectorSpan& span, const AdamWConstants& c, float* p, float* m,
                            float* v, float* vmax, const void* grad, WireType grad_type, size_t count,
                            void* params_out, WireType params_type);

// FindNonFiniteGradient's scalar path over [begin, count): the index of the
// first element there whose scaled gradient is not finite, or count.
size_t FindNonFiniteScalarFrom(const void* grad, WireType grad_type, size_t begin, size_t count,
                               float grad_scale);

// The AVX-512F path: AdamWUpdateAndEncode's vector part, on whole 16-element
// vectors from `begin` (0, or with streaming stores the first element whose
// params go to a 64-byte (float32) or 32-byte (bfloat16) boundary of
// params_out). params_out null: no params written. Float16 params: nothing
// done ({0, 0}), as AVX2's path. Ends with a store fence after streaming
// stores. With `ahead`, the streaming loop of a step without amsgrad also
// reads it (AheadBits); plain stores, no params, params not aligned to
// their element and amsgrad leave it unread (`read` 0). Defined only on
// x86-64; a leaf function (it calls nothing).
VectorSpan AdamWUpdateVectorsAvx512(const AdamWConstants& c, float* p, float* m, float* v,
                                    float* vmax,
                                    const void* grad, WireType grad_type, size_t count,
                                    void* params_out, WireType params_type, ParamsStore store,
                                    AheadBits* ahead = nullptr);

// FindNonFiniteGradient's AVX-512F path over `vector_count` elements, a
// multiple of 16: the index of the first whose scaled gradient is not finite,
// or vector_count. A leaf function.
size_t FindNonFiniteVectorsAvx512(const void* grad, WireType grad_type, size_t vector_count,
                                  float grad_scale);

}  // namespace optstate::kernel_internal

#endif  // OPTSTATE_SERVER_KERNELS_ADAMW_KERNEL_SCALAR_H_
