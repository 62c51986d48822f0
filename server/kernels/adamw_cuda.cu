// Fused AdamW on the device: grid-stride float4 loop, tail in the same launch,
// fp32 math with explicit round-to-nearest intrinsics in the CPU's order.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "server/kernels/adamw_cuda.h"

namespace optstate {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = size_t{1} << 20;

// The CPU kernel's AdamWElement, op for op; see server/kernels/adamw_kernel_scalar.h.
__device__ __forceinline__ void Element(const AdamWConstants& c, float& p, float& m, float& v,
                                        float g) {
  g = __fmul_rn(g, c.grad_scale);
  p = __fmul_rn(p, c.decay);
  m = __fmaf_rn(c.lerp_coefficient, __fsub_rn(g, m), c.lerp_from_gradient ? g : m);
  v = __fmaf_rn(__fmul_rn(c.one_minus_beta2, g), g, __fmul_rn(v, c.beta2));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bias_correction2_sqrt), c.eps);
  p = __fadd_rn(p, __fdiv_rn(__fmul_rn(c.neg_step_size, m), denom));
}

// Gradient element types: the raw storage and the exact widening to fp32.
struct F32Grad {
  using Scalar = float;
  using Vec4 = float4;
  __device__ static float Widen(float g) { return g; }
  __device__ static void Widen4(const float4& g, float out[4]) {
    out[0] = g.x;
    out[1] = g.y;
    out[2] = g.z;
    out[3] = g.w;
  }
};

struct BF16Grad {
  using Scalar = uint16_t;
  using Vec4 = uint2;  // Four bf16 in 8 bytes.
  __device__ static float Widen(uint16_t g) { return __uint_as_float(uint32_t{g} << 16); }
  __device__ static void Widen4(const uint2& g, float out[4]) {
    out[0] = __uint_as_float(g.x << 16);
    out[1] = __uint_as_float(g.x & 0xffff0000u);
    out[2] = __uint_as_float(g.y << 16);
    out[3] = __uint_as_float(g.y & 0xffff0000u);
  }
};

struct F16Grad {
  using Scalar = uint16_t;
  using Vec4 = uint2;  // Four binary16 in 8 bytes.
  __device__ static float Widen(uint16_t g) { return __half2float(__ushort_as_half(g)); }
  __device__ static void Widen4(const uint2& g, float out[4]) {
    out[0] = Widen(static_cast<uint16_t>(g.x & 0xffffu));
    out[1] = Widen(static_cast<uint16_t>(g.x >> 16));
    out[2] = Widen(static_cast<uint16_t>(g.y & 0xffffu));
    out[3] = Widen(static_cast<uint16_t>(g.y >> 16));
  }
};

// Elements [0, 4*n4) as float4 groups; elements [4*n4, count) (fewer than
// four) by the first threads of the grid, through the same Element().
template <typename G>
__global__ void AdamWVectorKernel(AdamWConstants c, float* __restrict__ p, float* __restrict__ m,
                                  float* __restrict__ v, const typename G::Scalar* __restrict__ g,
                                  size_t count) {
  const size_t n4 = count / 4;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  auto* p4 = reinterpret_cast<float4*>(p);
  auto* m4 = reinterpret_cast<float4*>(m);
  auto* v4 = reinterpret_cast<float4*>(v);
  const auto* g4 = reinterpret_cast<const typename G::Vec4*>(g);
  for (size_t i = first; i < n4; i += stride) {
    float4 pv = p4[i];
    float4 mv = m4[i];
    float4 vv = v4[i];
    float gv[4];
    G::Widen4(g4[i], gv);
    Element(c, pv.x, mv.x, vv.x, gv[0]);
    Element(c, pv.y, mv.y, vv.y, gv[1]);
    Element(c, pv.z, mv.z, vv.z, gv[2]);
    Element(c, pv.w, mv.w, vv.w, gv[3]);
    p4[i] = pv;
    m4[i] = mv;
    v4[i] = vv;
  }
  const size_t tail = 4 * n4 + first;
  if (tail < count) Element(c, p[tail], m[tail], v[tail], G::Widen(g[tail]));
}

template <typename G>
__global__ void AdamWScalarKernel(AdamWConstants c, float* __restrict__ p, float* __restrict__ m,
                                  float* __restrict__ v, const typename G::Scalar* __restrict__ g,
                                  size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    Element(c, p[i], m[i], v[i], G::Widen(g[i]));
  }
}

unsigned Blocks(size_t work_items) {
  size_t blocks = (work_items + kThreads - 1) / kThreads;
  if (blocks == 0) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned>(blocks);
}

bool Aligned(const void* ptr, size_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

template <typename G>
cudaError_t Launch(const AdamWConstants& c, float* p, float* m, float* v, const void* grad,
                   size_t count, cudaStream_t stream) {
  const auto* g = static_cast<const typename G::Scalar*>(grad);
  // Clear an error left pending by an earlier call on this thread, so the
  // status returned is this launch's own (a stale one would fail a launch
  // that ran).
  (void)cudaGetLastError();
  const bool vector =
      Aligned(p, 16) && Aligned(m, 16) && Aligned(v, 16) && Aligned(grad, sizeof(typename G::Vec4));
  if (vector) {
    AdamWVectorKernel<G><<<Blocks(count / 4), kThreads, 0, stream>>>(c, p, m, v, g, count);
  } else {
    AdamWScalarKernel<G><<<Blocks(count), kThreads, 0, stream>>>(c, p, m, v, g, count);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAdamWUpdate(const AdamWConstants& c, float* p, float* m, float* v,
                              const void* grad, WireType grad_type, size_t count,
                              cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  switch (grad_type) {
    case WireType::kFloat32:
      return Launch<F32Grad>(c, p, m, v, grad, count, stream);
    case WireType::kBFloat16:
      return Launch<BF16Grad>(c, p, m, v, grad, count, stream);
    case WireType::kFloat16:
      return Launch<F16Grad>(c, p, m, v, grad, count, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t CheckAdamWKernelImage() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, AdamWVectorKernel<F32Grad>);
}

}  // namespace optstate
