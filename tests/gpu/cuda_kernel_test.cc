// The CUDA AdamW kernel against the float64 reference (one step from random
// states, and 100 steps) and against the CPU kernel, for every gradient type,
// on the vector path, the scalar path and short tails.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "server/kernels/adamw_cuda.h"
#include "server/kernels/adamw_kernel.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/testing/reference_adamw.h"

namespace optstate {
namespace {

using ::optstate::testing::CountBitDifferences;
using ::optstate::testing::MaxAbsError;
using ::optstate::testing::ReferenceAdamWStep;
using ::optstate::testing::ReferenceHyperparameters;
using ::optstate::testing::ReferenceState;
using ::optstate::testing::RelativeL2Error;
using ::optstate::testing::UniformSigned;

struct HostState {
  std::vector<float> p, m, v;
};

// Gradients in a wire type plus their exact fp32 widening.
struct Gradient {
  WireType type = WireType::kFloat32;
  std::vector<unsigned char> bytes;
  std::vector<float> widened;
};

Gradient MakeGradient(WireType type, size_t n, uint64_t seed, float scale) {
  Gradient g;
  g.type = type;
  g.bytes.resize(n * WireTypeSize(type));
  g.widened.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float x = UniformSigned(seed, i) * scale;
    if (type == WireType::kFloat32) {
      std::memcpy(g.bytes.data() + 4 * i, &x, 4);
      g.widened[i] = x;
    } else {
      const uint16_t h = type == WireType::kBFloat16 ? FloatToBFloat16(x) : FloatToHalf(x);
      std::memcpy(g.bytes.data() + 2 * i, &h, 2);
      g.widened[i] = type == WireType::kBFloat16 ? BFloat16ToFloat(h) : HalfToFloat(h);
    }
  }
  return g;
}

// Copies the state and gradient to the device (at `offset` elements past a
// fresh allocation, to reach the scalar path), runs the kernel, copies back.
void RunOnDevice(const AdamWConstants& c, HostState* s, const Gradient& g, size_t offset = 0) {
  const size_t n = s->p.size();
  const size_t gs = WireTypeSize(g.type);
  float *p = nullptr, *m = nullptr, *v = nullptr;
  unsigned char* grad = nullptr;
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&p), (n + offset) * 4));
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&m), (n + offset) * 4));
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&v), (n + offset) * 4));
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&grad), (n + offset) * gs));
  ASSERT_CUDA(cudaMemcpy(p + offset, s->p.data(), n * 4, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(m + offset, s->m.data(), n * 4, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(v + offset, s->v.data(), n * 4, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(grad + offset * gs, g.bytes.data(), n * gs, cudaMemcpyHostToDevice));
  ASSERT_CUDA(LaunchAdamWUpdate(c, p + offset, m + offset, v + offset, grad + offset * gs, g.type,
                                n, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_CUDA(cudaMemcpy(s->p.data(), p + offset, n * 4, cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(s->m.data(), m + offset, n * 4, cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(s->v.data(), v + offset, n * 4, cudaMemcpyDeviceToHost));
  cudaFree(p);
  cudaFree(m);
  cudaFree(v);
  cudaFree(grad);
}

HostState RandomState(size_t n, uint64_t seed) {
  HostState s;
  s.p.resize(n);
  s.m.resize(n);
  s.v.resize(n);
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = UniformSigned(seed, i);
    s.m[i] = UniformSigned(seed + 1, i) * 0.05f;
    const float r = UniformSigned(seed + 2, i) * 0.05f;
    s.v[i] = r * r;
  }
  return s;
}

ReferenceState ToReference(const HostState& s) {
  ReferenceState r;
  r.params.assign(s.p.begin(), s.p.end());
  r.exp_avg.assign(s.m.begin(), s.m.end());
  r.exp_avg_sq.assign(s.v.begin(), s.v.end());
  return r;
}

struct Draw {
  AdamWStepInputs inputs;
  ReferenceHyperparameters reference;
};

Draw RandomHyperparameters(std::mt19937_64& rng, uint64_t step) {
  std::uniform_real_distribution<float> lr(1e-4f, 1e-2f), wd(0.0f, 0.1f), scale(0.25f, 2.0f);
  Draw d;
  d.inputs.hyperparameters.lr = lr(rng);
  d.inputs.hyperparameters.weight_decay = wd(rng);
  // One draw in four takes beta1 0.3: torch's lerp in its second form.
  d.inputs.hyperparameters.beta1 = rng() % 4 == 0 ? 0.3 : 0.9;
  d.inputs.hyperparameters.beta2 = 0.999;
  d.inputs.hyperparameters.eps = 1e-8;
  // One draw in three maximizes (torch's grad = -grad, folded into grad_scale).
  d.inputs.hyperparameters.maximize = rng() % 3 == 0;
  d.inputs.step = step;
  d.inputs.grad_scale = scale(rng);
  d.reference.maximize = d.inputs.hyperparameters.maximize;
  d.reference.lr = d.inputs.hyperparameters.lr;
  d.reference.weight_decay = d.inputs.hyperparameters.weight_decay;
  d.reference.beta1 = d.inputs.hyperparameters.beta1;
  d.reference.beta2 = d.inputs.hyperparameters.beta2;
  d.reference.eps = d.inputs.hyperparameters.eps;
  return d;
}

std::vector<double> Scaled(const std::vector<float>& g, float scale) {
  std::vector<double> out(g.size());
  for (size_t i = 0; i < g.size(); ++i) out[i] = static_cast<double>(g[i]) * scale;
  return out;
}

class CudaKernelTest : public ::testing::TestWithParam<WireType> {
 protected:
  void SetUp() override { OPTSTATE_REQUIRE_DEVICE(); }
};

TEST_P(CudaKernelTest, OneStepFromRandomStatesMeetsFloat64Reference) {
  std::mt19937_64 rng(11 + static_cast<int>(GetParam()));
  std::uniform_int_distribution<uint64_t> step(1, 10000);
  for (int trial = 0; trial < 8; ++trial) {
    const size_t n = (1 << 20) + 3;  // Vector body and a three-element tail.
    const Draw d = RandomHyperparameters(rng, step(rng));
    HostState s = RandomState(n, 100 + trial);
    const Gradient g = MakeGradient(GetParam(), n, 200 + trial, 0.1f);
    ReferenceState ref = ToReference(s);
    ReferenceAdamWStep(d.reference, d.inputs.step, Scaled(g.widened, d.inputs.grad_scale), &ref);
    RunOnDevice(ComputeAdamWConstants(d.inputs), &s, g);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " t=" << d.inputs.step);
    EXPECT_LE(RelativeL2Error(s.p, ref.params), 1e-6);
    EXPECT_LE(RelativeL2Error(s.m, ref.exp_avg), 1e-6);
    EXPECT_LE(RelativeL2Error(s.v, ref.exp_avg_sq), 1e-6);
  }
}

TEST_P(CudaKernelTest, HundredStepsStayWithinReferenceBounds) {
  std::mt19937_64 rng(5);
  const size_t n = 1 << 18;
  HostState s = RandomState(n, 7);
  std::fill(s.m.begin(), s.m.end(), 0.0f);
  std::fill(s.v.begin(), s.v.end(), 0.0f);
  ReferenceState ref = ToReference(s);
  for (uint64_t t = 1; t <= 100; ++t) {
    const Draw d = RandomHyperparameters(rng, t);
    const Gradient g = MakeGradient(GetParam(), n, 1000 + t, 0.1f);
    ReferenceAdamWStep(d.reference, t, Scaled(g.widened, d.inputs.grad_scale), &ref);
    RunOnDevice(ComputeAdamWConstants(d.inputs), &s, g);
  }
  EXPECT_LE(RelativeL2Error(s.p, ref.params), 1e-5);
  EXPECT_LE(MaxAbsError(s.p, ref.params), 1e-4);
}

TEST_P(CudaKernelTest, AgreesWithTheCpuKernel) {
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<uint64_t> step(1, 10000);
  const size_t n = (1 << 20) + 1;
  const Draw d = RandomHyperparameters(rng, step(rng));
  const AdamWConstants c = ComputeAdamWConstants(d.inputs);
  HostState gpu = RandomState(n, 31);
  HostState cpu = gpu;
  const Gradient g = MakeGradient(GetParam(), n, 32, 0.1f);
  RunOnDevice(c, &gpu, g);
  AdamWUpdate(c, cpu.p.data(), cpu.m.data(), cpu.v.data(), g.bytes.data(), g.type, n);
  EXPECT_LE(RelativeL2Error(gpu.p, cpu.p), 1e-6);
  EXPECT_LE(RelativeL2Error(gpu.m, cpu.m), 1e-6);
  EXPECT_LE(RelativeL2Error(gpu.v, cpu.v), 1e-6);
}

// The stronger claim of adamw_cuda.h: the same rounded operations in the same
// order give the same bits, on the vector path, the scalar path (misaligned
// pointers) and every tail length.
TEST_P(CudaKernelTest, BitIdenticalToTheCpuKernel) {
  std::mt19937_64 rng(9);
  std::uniform_int_distribution<uint64_t> step(1, 10000);
  for (size_t n :
       {size_t{1}, size_t{2}, size_t{3}, size_t{5}, size_t{63}, size_t{4099}, size_t{300001}}) {
    for (size_t offset : {size_t{0}, size_t{1}}) {
      const Draw d = RandomHyperparameters(rng, step(rng));
      const AdamWConstants c = ComputeAdamWConstants(d.inputs);
      HostState gpu = RandomState(n, 40 + n);
      HostState cpu = gpu;
      const Gradient g = MakeGradient(GetParam(), n, 50 + n, 0.1f);
      RunOnDevice(c, &gpu, g, offset);
      AdamWUpdate(c, cpu.p.data(), cpu.m.data(), cpu.v.data(), g.bytes.data(), g.type, n);
      SCOPED_TRACE(::testing::Message() << "n=" << n << " offset=" << offset);
      EXPECT_EQ(CountBitDifferences(gpu.p.data(), cpu.p.data(), n), 0u);
      EXPECT_EQ(CountBitDifferences(gpu.m.data(), cpu.m.data(), n), 0u);
      EXPECT_EQ(CountBitDifferences(gpu.v.data(), cpu.v.data(), n), 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GradientTypes, CudaKernelTest,
                         ::testing::Values(WireType::kFloat32, WireType::kBFloat16,
                                           WireType::kFloat16),
                         [](const ::testing::TestParamInfo<WireType>& info) {
                           return std::string(WireTypeName(info.param));
                         });

}  // namespace
}  // namespace optstate
