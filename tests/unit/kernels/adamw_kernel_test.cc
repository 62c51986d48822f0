// Specification of the CPU AdamW kernel (server/kernels/adamw_kernel.h): every result
// is compared with the float64 reference (tests/testing/reference_adamw.h) or, for the
// exactness promises, with another kernel path bit for bit.
#include "server/kernels/adamw_kernel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "optstate/dtype.h"
#include "server/kernels/adamw_kernel_scalar.h"
#include "tests/testing/reference_adamw.h"
#include "tests/testing/test_seed.h"

namespace optstate {
namespace {

namespace ref = ::optstate::testing;

// 1 and 7 never reach the eight-wide loop; 1031 = 128*8 + 7 ends in a tail.
constexpr size_t kSizes[] = {1, 7, 1031, size_t{1} << 20};

// ---------------------------------------------------------------------------
// Buffers with poisoned guard zones.

// A float array between two guard zones of 0xFF bytes (a NaN pattern). The
// data starts 68 bytes into a 16-byte aligned allocation, so the vector path
// sees addresses that are not 32-byte aligned.
class GuardedFloats {
 public:
  explicit GuardedFloats(const std::vector<float>& values)
      : storage_(values.size() + 2 * kGuard), count_(values.size()) {
    std::memset(storage_.data(), 0xFF, storage_.size() * sizeof(float));
    std::memcpy(data(), values.data(), count_ * sizeof(float));
  }

  float* data() { return storage_.data() + kGuard; }
  std::vector<float> ToVector() const {
    return std::vector<float>(storage_.begin() + kGuard, storage_.begin() + kGuard + count_);
  }
  // True when nothing outside [data(), data() + count) was written.
  bool GuardsIntact() const {
    const auto* bytes = reinterpret_cast<const unsigned char*>(storage_.data());
    const size_t head = kGuard * sizeof(float);
    const size_t tail_begin = (kGuard + count_) * sizeof(float);
    const size_t total = storage_.size() * sizeof(float);
    for (size_t i = 0; i < head; ++i) {
      if (bytes[i] != 0xFF) return false;
    }
    for (size_t i = tail_begin; i < total; ++i) {
      if (bytes[i] != 0xFF) return false;
    }
    return true;
  }

 private:
  static constexpr size_t kGuard = 17;
  std::vector<float> storage_;
  size_t count_;
};

// Gradient bytes at an odd address (the kernel promises any alignment),
// between guard zones the kernel must not touch.
class GuardedGradient {
 public:
  explicit GuardedGradient(const std::vector<unsigned char>& bytes)
      : storage_(bytes.size() + 2 * kGuard, 0xFF), count_(bytes.size()) {
    std::memcpy(storage_.data() + kGuard, bytes.data(), count_);
  }
  const void* data() const { return storage_.data() + kGuard; }
  bool GuardsIntact() const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (storage_[i] != 0xFF || storage_[kGuard + count_ + i] != 0xFF) return false;
    }
    return true;
  }

 private:
  static constexpr size_t kGuard = 33;
  std::vector<unsigned char> storage_;
  size_t count_;
};

// ---------------------------------------------------------------------------
// Inputs.

struct HyperparameterSet {
  const char* name;
  double lr, beta1, beta2, eps, weight_decay;
  bool maximize = false;
};
constexpr HyperparameterSet kTorchDefaults{"TorchDefaults", 1e-3, 0.9, 0.999, 1e-8, 1e-2};
constexpr HyperparameterSet kNonDefault{"NonDefault", 3e-3, 0.8, 0.95, 1e-6, 0.1};
// beta1 <= 0.5: torch's lerp takes its second form, fma(w - 1, g - m, g).
constexpr HyperparameterSet kSmallBeta1{"SmallBeta1", 1e-3, 0.3, 0.99, 1e-8, 1e-2};
// torch's maximize=True: the step climbs the gradient.
constexpr HyperparameterSet kMaximize{"Maximize", 3e-3, 0.8, 0.95, 1e-6, 0.1, true};

AdamWStepInputs Inputs(const HyperparameterSet& h, uint64_t step, float grad_scale = 1.0f) {
  AdamWStepInputs in;
  in.hyperparameters.lr = h.lr;
  in.hyperparameters.beta1 = h.beta1;
  in.hyperparameters.beta2 = h.beta2;
  in.hyperparameters.eps = h.eps;
  in.hyperparameters.weight_decay = h.weight_decay;
  in.hyperparameters.maximize = h.maximize;
  in.step = step;
  in.grad_scale = grad_scale;
  return in;
}

// The reference gets exactly the hyperparameters the kernel gets.
ref::ReferenceHyperparameters Reference(const HyperparameterSet& h) {
  ref::ReferenceHyperparameters r;
  r.lr = h.lr;
  r.beta1 = h.beta1;
  r.beta2 = h.beta2;
  r.eps = h.eps;
  r.weight_decay = h.weight_decay;
  r.maximize = h.maximize;
  return r;
}

struct FloatState {
  std::vector<float> p, m, v;
};

// p ~ N(0,1), m ~ N(0,1e-2), v = |N(0,1e-4)| (standard deviations).
FloatState RandomState(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> param(0.0f, 1.0f), first(0.0f, 1e-2f), second(0.0f, 1e-4f);
  FloatState s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = param(rng);
    s.m[i] = first(rng);
    s.v[i] = std::fabs(second(rng));
  }
  return s;
}

std::vector<float> RandomGradient(size_t n, std::mt19937_64& rng, float stddev = 1e-2f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> g(n);
  for (float& x : g) x = dist(rng);
  return g;
}

// Gradients for long runs: each step draws a fresh random offset into a pool
// of N(0, stddev) values and fresh random signs, which keeps every element
// normally distributed and each step different at a fraction of the cost of
// drawing a million normals per step.
class GradientStream {
 public:
  GradientStream(size_t n, std::mt19937_64& rng, float stddev = 1e-2f)
      : pool_(RandomGradient(n + 4099, rng, stddev)), rng_(rng) {}

  std::vector<float> Next(size_t n) {
    const size_t offset = std::uniform_int_distribution<size_t>(0, pool_.size() - 1)(rng_);
    std::vector<float> g(n);
    uint64_t signs = 0;
    for (size_t i = 0; i < n; ++i) {
      if (i % 64 == 0) signs = rng_();
      const float x = pool_[(offset + i) % pool_.size()];
      g[i] = (signs >> (i % 64)) & 1 ? -x : x;
    }
    return g;
  }

 private:
  std::vector<float> pool_;
  std::mt19937_64& rng_;
};

uint64_t RandomStep(std::mt19937_64& rng) {
  return std::uniform_int_distribution<uint64_t>(1, 10000)(rng);
}

std::vector<double> Widen(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

ref::ReferenceState WidenState(const FloatState& s) {
  return ref::ReferenceState{Widen(s.p), Widen(s.m), Widen(s.v)};
}

// ---------------------------------------------------------------------------
// Gradient encodings, built and widened without optstate's dtype code.

std::vector<unsigned char> Float32Bytes(const std::vector<float>& g) {
  std::vector<unsigned char> bytes(g.size() * 4);
  std::memcpy(bytes.data(), g.data(), bytes.size());
  return bytes;
}

// bfloat16 by truncation: any bf16 bits will do as kernel input.
std::vector<unsigned char> BFloat16Bytes(const std::vector<float>& g) {
  std::vector<unsigned char> bytes(g.size() * 2);
  for (size_t i = 0; i < g.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &g[i], 4);
    const uint16_t h = static_cast<uint16_t>(bits >> 16);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
  return bytes;
}

// float16 bits for values of g's magnitude. Exponent and mantissa are cut
// from the float (values under 2^-14 become subnormal halves), so any finite
// half pattern is a legitimate kernel input; no optstate code is involved.
uint16_t TruncateToHalf(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65504.0) return sign | 0x7bff;
  if (a < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(a * std::ldexp(1.0, 24));
  int e;
  const double f = std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  const uint16_t mantissa = static_cast<uint16_t>((f * 2.0 - 1.0) * 1024.0);
  return sign | static_cast<uint16_t>((e - 1 + 15) << 10) | mantissa;
}

std::vector<unsigned char> Float16Bytes(const std::vector<float>& g) {
  std::vector<unsigned char> bytes(g.size() * 2);
  for (size_t i = 0; i < g.size(); ++i) {
    const uint16_t h = TruncateToHalf(g[i]);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
  return bytes;
}

std::vector<unsigned char> EncodeGradient(const std::vector<float>& g, WireType type) {
  switch (type) {
    case WireType::kFloat32:
      return Float32Bytes(g);
    case WireType::kBFloat16:
      return BFloat16Bytes(g);
    case WireType::kFloat16:
      return Float16Bytes(g);
  }
  return {};
}

// IEEE binary16 value of `h`, by its definition.
float WidenHalfByDefinition(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0x1f && mantissa != 0) return std::numeric_limits<float>::quiet_NaN();
  const double magnitude = exponent == 0x1f ? std::numeric_limits<double>::infinity()
                           : exponent == 0  ? std::ldexp(mantissa, -24)
                                            : std::ldexp(1024 + mantissa, exponent - 25);
  return static_cast<float>((h & 0x8000) ? -magnitude : magnitude);
}

// The float32 values the narrow gradient bytes stand for (exact widening).
std::vector<float> WidenGradient(const std::vector<unsigned char>& bytes, WireType type) {
  if (type == WireType::kFloat32) {
    std::vector<float> g(bytes.size() / 4);
    std::memcpy(g.data(), bytes.data(), bytes.size());
    return g;
  }
  std::vector<float> g(bytes.size() / 2);
  for (size_t i = 0; i < g.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    if (type == WireType::kBFloat16) {
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      std::memcpy(&g[i], &bits, 4);
    } else {
      g[i] = WidenHalfByDefinition(h);
    }
  }
  return g;
}

// ---------------------------------------------------------------------------
// Running the kernel.

enum class Path { kDispatch, kScalar };

// p, m and v in guarded buffers, stepped in place by one kernel path.
class KernelState {
 public:
  explicit KernelState(const FloatState& s) : p_(s.p), m_(s.m), v_(s.v), count_(s.p.size()) {}

  void Step(Path path, const AdamWConstants& c, const std::vector<unsigned char>& grad,
            WireType type) {
    GuardedGradient guarded(grad);
    if (path == Path::kDispatch) {
      AdamWUpdate(c, p_.data(), m_.data(), v_.data(), guarded.data(), type, count_);
    } else {
      AdamWUpdateScalar(c, p_.data(), m_.data(), v_.data(), guarded.data(), type, count_);
    }
    gradient_guards_intact_ &= guarded.GuardsIntact();
  }

  void StepOn(KernelIsa isa, const AdamWConstants& c, const std::vector<unsigned char>& grad,
              WireType type) {
    GuardedGradient guarded(grad);
    AdamWUpdateOn(isa, c, p_.data(), m_.data(), v_.data(), guarded.data(), type, count_);
    gradient_guards_intact_ &= guarded.GuardsIntact();
  }

  std::vector<float> p() const { return p_.ToVector(); }
  std::vector<float> m() const { return m_.ToVector(); }
  std::vector<float> v() const { return v_.ToVector(); }
  bool GuardsIntact() const {
    return p_.GuardsIntact() && m_.GuardsIntact() && v_.GuardsIntact() && gradient_guards_intact_;
  }

 private:
  GuardedFloats p_, m_, v_;
  size_t count_;
  bool gradient_guards_intact_ = true;
};

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Index of the first element whose bits differ, or a.size().
size_t FirstBitDifference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  }
  return a.size();
}

void ExpectBitwiseEqualState(const KernelState& got, const KernelState& want) {
  for (auto [name, a, b] :
       {std::make_tuple("p", got.p(), want.p()), std::make_tuple("m", got.m(), want.m()),
        std::make_tuple("v", got.v(), want.v())}) {
    const size_t i = FirstBitDifference(a, b);
    EXPECT_EQ(i, a.size()) << name << " differs first at element " << i << ": "
                           << (i < a.size() ? a[i] : 0.0f) << " vs "
                           << (i < b.size() ? b[i] : 0.0f);
  }
}

// The kernel works in place, so an element it skipped still holds its input
// (the guards catch writes outside the array). Counts the elements that the
// reference moved by more than four float ulps but the kernel left unchanged.
size_t CountUnwritten(const std::vector<float>& before, const std::vector<float>& after,
                      const std::vector<double>& reference) {
  size_t unwritten = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    const float magnitude = std::fabs(before[i]);
    const double ulp =
        std::nextafter(magnitude, std::numeric_limits<float>::infinity()) - magnitude;
    const bool must_move = std::fabs(reference[i] - before[i]) > 4 * ulp;
    if (must_move && std::memcmp(&before[i], &after[i], sizeof(float)) == 0) ++unwritten;
  }
  return unwritten;
}

// Prints a measured error ("rel p 5.1e-08") and records it in the XML output.
void Report(const std::string& what, double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2g", value);
  std::cout << "    " << what << " " << text << "\n";
  std::string key = what;
  std::replace(key.begin(), key.end(), ' ', '_');
  ::testing::Test::RecordProperty(key, text);
}

// How large the operands of each update are, element by element:
// |p*decay| + |update|, |beta1*m| + |(1-beta1)*g| and beta2*v + (1-beta2)*g^2.
// A correctly rounded kernel's error is a few ulps of these, however much
// the operands cancel in the result.
ref::ReferenceState OperandMagnitudes(const ref::ReferenceHyperparameters& h, uint64_t t,
                                      const std::vector<double>& grad, const FloatState& before) {
  const double step_size = h.lr / (1.0 - std::pow(h.beta1, static_cast<double>(t)));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, static_cast<double>(t)));
  ref::ReferenceState out{std::vector<double>(grad.size()), std::vector<double>(grad.size()),
                          std::vector<double>(grad.size())};
  for (size_t i = 0; i < grad.size(); ++i) {
    const double m = h.beta1 * before.m[i] + (1.0 - h.beta1) * grad[i];
    const double v = h.beta2 * before.v[i] + (1.0 - h.beta2) * grad[i] * grad[i];
    const double update = step_size * m / (std::sqrt(v) / bias_correction2_sqrt + h.eps);
    out.params[i] = std::fabs(before.p[i] * (1.0 - h.lr * h.weight_decay)) + std::fabs(update);
    out.exp_avg[i] = std::fabs(h.beta1 * before.m[i]) + std::fabs((1.0 - h.beta1) * grad[i]);
    out.exp_avg_sq[i] = v;
  }
  return out;
}

// ||out - ref|| / ||operand magnitudes||.
double OperandRelativeError(const std::vector<float>& out, const std::vector<double>& reference,
                            const std::vector<double>& magnitudes) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double d = static_cast<double>(out[i]) - reference[i];
    diff += d * d;
    norm += magnitudes[i] * magnitudes[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

// The one-step contract, against the reference step from `before` with
// gradient `grad`: every element written, nothing written outside the
// arrays, and for p, m and v
//  - ||out - ref|| / ||ref|| <= 1e-6 when there are several elements. With a
//    single element this is a per-element relative bound, which m's update
//    defeats: beta1*m and (1-beta1)*g cancel to near zero in about 1% of
//    random draws, and a kernel exact to the last ulp then measures ~2e-6;
//  - ||out - ref|| / ||operand magnitudes|| <= 1e-6 at every size.
void ExpectOneStepMatchesReference(const KernelState& kernel, const FloatState& before,
                                   const ref::ReferenceHyperparameters& h, uint64_t t,
                                   const std::vector<double>& grad) {
  ref::ReferenceState reference = WidenState(before);
  ref::ReferenceAdamWStep(h, t, grad, &reference);
  const ref::ReferenceState magnitudes = OperandMagnitudes(h, t, grad, before);
  const std::vector<float> p = kernel.p(), m = kernel.m(), v = kernel.v();
  for (auto [name, out, want, size] :
       {std::make_tuple("p", &p, &reference.params, &magnitudes.params),
        std::make_tuple("m", &m, &reference.exp_avg, &magnitudes.exp_avg),
        std::make_tuple("v", &v, &reference.exp_avg_sq, &magnitudes.exp_avg_sq)}) {
    const double rel = ref::RelativeL2Error(*out, *want);
    const double operand_rel = OperandRelativeError(*out, *want, *size);
    Report(std::string("rel ") + name, rel);
    Report(std::string("operand rel ") + name, operand_rel);
    if (out->size() > 1) {
      EXPECT_LE(rel, 1e-6) << name;
    }
    EXPECT_LE(operand_rel, 1e-6) << name;
  }
  EXPECT_EQ(CountUnwritten(before.p, p, reference.params), 0u) << "p elements left unwritten";
  EXPECT_EQ(CountUnwritten(before.m, m, reference.exp_avg), 0u) << "m elements left unwritten";
  EXPECT_EQ(CountUnwritten(before.v, v, reference.exp_avg_sq), 0u) << "v elements left unwritten";
  EXPECT_TRUE(kernel.GuardsIntact()) << "the kernel wrote outside its arrays";
}

}  // namespace

// Readable parameter values in test listings.
static void PrintTo(WireType type, std::ostream* os) { *os << WireTypeName(type); }

namespace {

void PrintTo(const HyperparameterSet& h, std::ostream* os) { *os << h.name; }

std::string SizeName(size_t n) { return "Size" + std::to_string(n); }

std::string TypeName(WireType type) {
  switch (type) {
    case WireType::kFloat32:
      return "Float32";
    case WireType::kBFloat16:
      return "BFloat16";
    case WireType::kFloat16:
      return "Float16";
  }
  return "Unknown";
}

// ---------------------------------------------------------------------------
// Against the float64 reference, per size and hyperparameter set.

class AdamWKernelVsReference
    : public ::testing::TestWithParam<std::tuple<size_t, HyperparameterSet>> {};

TEST_P(AdamWKernelVsReference, OneStepFromRandomStateIsWithinRelativeL2Of1e6) {
  const auto [n, hyper] = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const FloatState before = RandomState(n, rng);
  const std::vector<float> grad = RandomGradient(n, rng);
  const uint64_t t = RandomStep(rng);
  SCOPED_TRACE("t " + std::to_string(t));

  KernelState kernel(before);
  kernel.Step(Path::kDispatch, ComputeAdamWConstants(Inputs(hyper, t)), Float32Bytes(grad),
              WireType::kFloat32);
  ExpectOneStepMatchesReference(kernel, before, Reference(hyper), t, Widen(grad));
}

// The error after 100 steps is dominated by decay = 1 - lr*wd rounded to
// float, the rounding an fp32 `p.mul_(1 - lr*wd)` makes too: 1.4e-8 relative
// per step with torch's defaults, so rel p ~ 1.4e-6 after 100 steps.
TEST_P(AdamWKernelVsReference, HundredStepsFromZeroMomentsStayWithinL2AndMaxBounds) {
  const auto [n, hyper] = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  FloatState before = RandomState(n, rng);
  std::fill(before.m.begin(), before.m.end(), 0.0f);  // As torch initialises them.
  std::fill(before.v.begin(), before.v.end(), 0.0f);

  KernelState kernel(before);
  ref::ReferenceState reference = WidenState(before);
  GradientStream gradients(n, rng);
  for (uint64_t t = 1; t <= 100; ++t) {
    const std::vector<float> grad = gradients.Next(n);
    kernel.Step(Path::kDispatch, ComputeAdamWConstants(Inputs(hyper, t)), Float32Bytes(grad),
                WireType::kFloat32);
    ref::ReferenceAdamWStep(Reference(hyper), t, Widen(grad), &reference);
  }

  const std::vector<float> p = kernel.p();
  const double rel_p = ref::RelativeL2Error(p, reference.params);
  const double max_p = ref::MaxAbsError(p, reference.params);
  Report("rel p", rel_p);
  Report("max abs p", max_p);
  Report("rel m", ref::RelativeL2Error(kernel.m(), reference.exp_avg));
  Report("rel v", ref::RelativeL2Error(kernel.v(), reference.exp_avg_sq));
  // A single parameter can end the run near zero (one run in about two
  // thousand does), where ||p - ref|| / ||ref|| becomes a per-element
  // relative bound; there the absolute bound is the meaningful one.
  if (n > 1) {
    EXPECT_LE(rel_p, 1e-5);
  }
  EXPECT_LE(max_p, 1e-4);
  EXPECT_TRUE(kernel.GuardsIntact()) << "the kernel wrote outside its arrays";
}

INSTANTIATE_TEST_SUITE_P(SizesAndHyperparameters, AdamWKernelVsReference,
                         ::testing::Combine(::testing::ValuesIn(kSizes),
                                            ::testing::Values(kTorchDefaults, kNonDefault,
                                                              kMaximize)),
                         [](const auto& info) {
                           return SizeName(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param).name;
                         });

// ---------------------------------------------------------------------------
// grad_scale, per size.

class AdamWKernelGradScale : public ::testing::TestWithParam<size_t> {};

// Loss-scale unscaling: gradients carry a factor 3000 that grad_scale removes.
TEST_P(AdamWKernelGradScale, GradScaleIsMultipliedIntoTheGradient) {
  const size_t n = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const FloatState before = RandomState(n, rng);
  const std::vector<float> scaled_grad = RandomGradient(n, rng, 1e-2f * 3000.0f);
  const float grad_scale = 1.0f / 3000.0f;
  const uint64_t t = RandomStep(rng);

  KernelState kernel(before);
  kernel.Step(Path::kDispatch, ComputeAdamWConstants(Inputs(kNonDefault, t, grad_scale)),
              Float32Bytes(scaled_grad), WireType::kFloat32);
  std::vector<double> unscaled(n);
  for (size_t i = 0; i < n; ++i) unscaled[i] = static_cast<double>(scaled_grad[i]) * grad_scale;
  ExpectOneStepMatchesReference(kernel, before, Reference(kNonDefault), t, unscaled);
}

// The header's first formula, g = grad * grad_scale, taken literally: scaling
// first in float and passing grad_scale = 1 gives the same bits.
TEST_P(AdamWKernelGradScale, ScaledGradientEqualsPrescaledGradientWithScaleOneBitwise) {
  const size_t n = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const FloatState before = RandomState(n, rng);
  const std::vector<float> grad = RandomGradient(n, rng);
  const float grad_scale = 0.37f;
  std::vector<float> prescaled(n);
  for (size_t i = 0; i < n; ++i) prescaled[i] = grad[i] * grad_scale;
  const uint64_t t = RandomStep(rng);

  KernelState scaled(before), unscaled(before);
  scaled.Step(Path::kDispatch, ComputeAdamWConstants(Inputs(kTorchDefaults, t, grad_scale)),
              Float32Bytes(grad), WireType::kFloat32);
  unscaled.Step(Path::kDispatch, ComputeAdamWConstants(Inputs(kTorchDefaults, t, 1.0f)),
                Float32Bytes(prescaled), WireType::kFloat32);

  ExpectBitwiseEqualState(scaled, unscaled);
}

INSTANTIATE_TEST_SUITE_P(Sizes, AdamWKernelGradScale, ::testing::ValuesIn(kSizes),
                         [](const auto& info) { return SizeName(info.param); });

// ---------------------------------------------------------------------------
// amsgrad: max_exp_avg_sq kept, and the denominator takes it, on every path.

// A gradient that shrinks by half every 10 steps, so v falls below its
// running maximum and amsgrad's denominator differs from plain AdamW's.
std::vector<float> ShrinkingGradient(size_t n, uint64_t t, std::mt19937_64& rng) {
  std::vector<float> g = RandomGradient(n, rng);
  const float scale = static_cast<float>(std::pow(0.5, static_cast<double>(t) / 10.0));
  for (float& x : g) x *= scale;
  return g;
}

class AdamWKernelAmsgrad : public ::testing::TestWithParam<size_t> {};

TEST_P(AdamWKernelAmsgrad, HundredStepsStayWithinL2AndMaxBoundsOfTheFloat64Reference) {
  const size_t n = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  FloatState before = RandomState(n, rng);
  std::fill(before.m.begin(), before.m.end(), 0.0f);
  std::fill(before.v.begin(), before.v.end(), 0.0f);
  std::vector<float> p = before.p, m = before.m, v = before.v, vmax(n, 0.0f);
  std::vector<float> plain_p = before.p, plain_m = before.m, plain_v = before.v;
  ref::ReferenceState reference = WidenState(before);
  reference.max_exp_avg_sq.assign(n, 0.0);
  ref::ReferenceHyperparameters h = Reference(kNonDefault);
  h.amsgrad = true;
  for (uint64_t t = 1; t <= 100; ++t) {
    const std::vector<float> grad = ShrinkingGradient(n, t, rng);
    const AdamWConstants c = ComputeAdamWConstants(Inputs(kNonDefault, t));
    AdamWUpdate(c, p.data(), m.data(), v.data(), grad.data(), WireType::kFloat32, n, vmax.data());
    AdamWUpdate(c, plain_p.data(), plain_m.data(), plain_v.data(), grad.data(),
                WireType::kFloat32, n);
    ref::ReferenceAdamWStep(h, t, Widen(grad), &reference);
  }
  const double rel_p = ref::RelativeL2Error(p, reference.params);
  Report("amsgrad rel p", rel_p);
  if (n > 1) {
    EXPECT_LE(rel_p, 1e-5);
    EXPECT_LE(ref::RelativeL2Error(vmax, reference.max_exp_avg_sq), 1e-5);
  }
  EXPECT_LE(ref::MaxAbsError(p, reference.params), 1e-4);
  EXPECT_TRUE(BitwiseEqual(m, plain_m)) << "amsgrad changes m";
  EXPECT_TRUE(BitwiseEqual(v, plain_v)) << "amsgrad changes v";
  size_t above = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_GE(vmax[i], v[i]) << i;
    above += vmax[i] > v[i];
  }
  EXPECT_GT(above, 0u) << "the gradients never let v fall below its maximum";
  EXPECT_FALSE(BitwiseEqual(p, plain_p)) << "amsgrad changed nothing";
}

// Every path (and AdamWUpdateAndEncode's, with plain and streaming stores)
// against the scalar one, bit for bit, max_exp_avg_sq included; a
// max_exp_avg_sq above and below the new v by turns.
TEST_P(AdamWKernelAmsgrad, EveryPathEqualsTheScalarPathBitwise) {
  const size_t n = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const FloatState before = RandomState(n, rng);
  std::vector<float> vmax_before(n);
  for (size_t i = 0; i < n; ++i) vmax_before[i] = i % 2 ? before.v[i] * 2.0f : before.v[i] * 0.5f;
  for (WireType type : {WireType::kFloat32, WireType::kBFloat16}) {
    SCOPED_TRACE(TypeName(type));
    const std::vector<unsigned char> grad = EncodeGradient(RandomGradient(n, rng), type);
    const AdamWConstants c = ComputeAdamWConstants(Inputs(kMaximize, RandomStep(rng), 0.37f));
    std::vector<float> p = before.p, m = before.m, v = before.v, vmax = vmax_before;
    AdamWUpdateScalar(c, p.data(), m.data(), v.data(), grad.data(), type, n, vmax.data());
    for (KernelIsa isa : SupportedKernelIsas()) {
      for (int store = -1; store <= 1; ++store) {  // -1: AdamWUpdateOn, else ...AndEncodeOn
        SCOPED_TRACE(absl::StrCat(KernelIsaName(isa), " store ", store));
        GuardedFloats gp(before.p), gm(before.m), gv(before.v), gvmax(vmax_before);
        std::vector<float> out(n);
        if (store < 0) {
          AdamWUpdateOn(isa, c, gp.data(), gm.data(), gv.data(), grad.data(), type, n,
                        gvmax.data());
        } else {
          AdamWUpdateAndEncodeOn(isa, c, gp.data(), gm.data(), gv.data(), grad.data(), type, n,
                                 out.data(), WireType::kFloat32,
                                 store == 0 ? ParamsStore::kCached : ParamsStore::kStreaming,
                                 gvmax.data());
          EXPECT_TRUE(BitwiseEqual(out, p));
        }
        EXPECT_TRUE(BitwiseEqual(gp.ToVector(), p));
        EXPECT_TRUE(BitwiseEqual(gm.ToVector(), m));
        EXPECT_TRUE(BitwiseEqual(gv.ToVector(), v));
        EXPECT_TRUE(BitwiseEqual(gvmax.ToVector(), vmax));
        EXPECT_TRUE(gp.GuardsIntact() && gm.GuardsIntact() && gv.GuardsIntact() &&
                    gvmax.GuardsIntact());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, AdamWKernelAmsgrad, ::testing::ValuesIn(kSizes),
                         [](const auto& info) { return SizeName(info.param); });

// ---------------------------------------------------------------------------
// maximize, per size: torch's `grad = -grad`, on every path.

class AdamWKernelMaximize : public ::testing::TestWithParam<size_t> {};

TEST_P(AdamWKernelMaximize, MaximizeEqualsTheStepOnTheNegatedGradientBitwiseOnEveryPath) {
  const size_t n = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const FloatState before = RandomState(n, rng);
  const std::vector<float> grad = RandomGradient(n, rng);
  std::vector<float> negated(grad);
  for (float& g : negated) g = -g;
  const uint64_t t = RandomStep(rng);
  HyperparameterSet minimize = kMaximize;
  minimize.maximize = false;
  KernelState want(before);
  want.Step(Path::kScalar, ComputeAdamWConstants(Inputs(minimize, t, 0.37f)),
            Float32Bytes(negated), WireType::kFloat32);
  for (KernelIsa isa : SupportedKernelIsas()) {
    SCOPED_TRACE(KernelIsaName(isa));
    KernelState got(before);
    got.StepOn(isa, ComputeAdamWConstants(Inputs(kMaximize, t, 0.37f)), Float32Bytes(grad),
               WireType::kFloat32);
    ExpectBitwiseEqualState(got, want);
    EXPECT_TRUE(got.GuardsIntact());
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, AdamWKernelMaximize, ::testing::ValuesIn(kSizes),
                         [](const auto& info) { return SizeName(info.param); });

// ---------------------------------------------------------------------------
// Vector and scalar paths, per size, gradient type and grad_scale.

class AdamWKernelPaths : public ::testing::TestWithParam<std::tuple<size_t, WireType, float>> {};

// Every vector path this CPU runs (AVX2, AVX-512), each against the scalar one.
TEST_P(AdamWKernelPaths, VectorPathEqualsScalarPathBitwise) {
  if (CpuKernelIsa() == KernelIsa::kScalar) {
    GTEST_SKIP() << "no AVX2+F16C+FMA here: AdamWUpdate is the scalar path";
  }
  const auto [n, type, grad_scale] = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  for (const HyperparameterSet& h : {kNonDefault, kSmallBeta1, kMaximize}) {
    SCOPED_TRACE(h.name);
    const FloatState before = RandomState(n, rng);
    const std::vector<unsigned char> grad = EncodeGradient(RandomGradient(n, rng), type);
    const AdamWConstants c = ComputeAdamWConstants(Inputs(h, RandomStep(rng), grad_scale));

    KernelState scalar_path(before);
    scalar_path.Step(Path::kScalar, c, grad, type);
    EXPECT_TRUE(scalar_path.GuardsIntact()) << "the scalar path wrote outside its arrays";
    for (KernelIsa isa : SupportedKernelIsas()) {
      if (isa == KernelIsa::kScalar) continue;
      SCOPED_TRACE(KernelIsaName(isa));
      KernelState vector_path(before);
      vector_path.StepOn(isa, c, grad, type);
      ExpectBitwiseEqualState(vector_path, scalar_path);
      EXPECT_TRUE(vector_path.GuardsIntact()) << "the vector path wrote outside its arrays";
    }
  }
}

// Gradients the daemon's check would refuse, and NaN state, through the
// vector loops: NaN of every kind (signaling, quiet, payloads, either sign)
// and infinities, where m and v are NaN too or not, bit for bit as the
// scalar path. At grad_scale 1 with m's lerp from m the vector loops leave
// out the multiply and the blend; the NaNs they return must not change.
TEST(AdamWKernelPathsNonFinite, NaNAndInfiniteGradientsAndStateEqualTheScalarPathBitwise) {
  if (CpuKernelIsa() == KernelIsa::kScalar) {
    GTEST_SKIP() << "no AVX2+F16C+FMA here: AdamWUpdate is the scalar path";
  }
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  constexpr size_t kCount = 1031;
  const uint32_t specials[] = {0x7f800001u, 0x7fa00000u, 0x7fc00000u, 0x7fc12345u, 0xffc00001u,
                               0xff800001u, 0x7f800000u, 0xff800000u};
  for (const HyperparameterSet& h : {kTorchDefaults, kSmallBeta1}) {
    for (float grad_scale : {1.0f, 0.37f}) {
      SCOPED_TRACE(std::string(h.name) + (grad_scale == 1.0f ? ", scale 1" : ", scale 0.37"));
      FloatState before = RandomState(kCount, rng);
      std::vector<float> g = RandomGradient(kCount, rng);
      for (size_t i = 0; i < kCount; i += 3) {
        const uint32_t bits = specials[(i / 3) % std::size(specials)];
        std::memcpy(&g[i], &bits, 4);
        // Every fifth of them meets NaN state too: m's, or v's.
        if (i % 5 == 0) std::memcpy(i % 2 ? &before.m[i] : &before.v[i], &specials[i % 6], 4);
      }
      std::vector<unsigned char> grad(kCount * 4);
      std::memcpy(grad.data(), g.data(), grad.size());
      const AdamWConstants c = ComputeAdamWConstants(Inputs(h, 7, grad_scale));
      KernelState scalar_path(before);
      scalar_path.Step(Path::kScalar, c, grad, WireType::kFloat32);
      for (KernelIsa isa : SupportedKernelIsas()) {
        if (isa == KernelIsa::kScalar) continue;
        SCOPED_TRACE(KernelIsaName(isa));
        KernelState vector_path(before);
        vector_path.StepOn(isa, c, grad, WireType::kFloat32);
        ExpectBitwiseEqualState(vector_path, scalar_path);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(SizesTypesAndScales, AdamWKernelPaths,
                         ::testing::Combine(::testing::ValuesIn(kSizes),
                                            ::testing::Values(WireType::kFloat32,
                                                              WireType::kBFloat16,
                                                              WireType::kFloat16),
                                            ::testing::Values(1.0f, 0.37f)),
                         [](const auto& info) {
                           return SizeName(std::get<0>(info.param)) + "_" +
                                  TypeName(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) == 1.0f ? "_ScaleOne" : "_Scaled");
                         });

// ---------------------------------------------------------------------------
// AdamWUpdateAndEncode: the update plus the params narrowed into a reply.

class AdamWKernelEncode : public ::testing::TestWithParam<std::tuple<size_t, WireType, WireType>> {
};

// The same state as the plain update and, in `params_out`, exactly the bytes
// EncodeFromFloat writes from the updated params; nothing written around it.
// Some params start non-finite so the NaN rule of the narrowing is covered.
TEST_P(AdamWKernelEncode, EqualsTheScalarUpdateThenEncodeFromFloatBitwise) {
  const auto [n, grad_type, params_type] = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  FloatState before = RandomState(n, rng);
  for (size_t i = 3; i < n; i += 97) {
    before.p[i] =
        i % 2 ? std::numeric_limits<float>::quiet_NaN() : -std::numeric_limits<float>::infinity();
  }
  const std::vector<unsigned char> grad = EncodeGradient(RandomGradient(n, rng), grad_type);
  // Either form of torch's lerp, by the seed.
  const HyperparameterSet& h = rng() % 2 ? kNonDefault : kSmallBeta1;
  SCOPED_TRACE(h.name);
  const AdamWConstants c = ComputeAdamWConstants(Inputs(h, RandomStep(rng), 0.5f));

  KernelState want(before);
  want.Step(Path::kScalar, c, grad, grad_type);
  const size_t size = WireTypeSize(params_type);
  std::vector<unsigned char> want_bytes(n * size);
  EncodeFromFloat(params_type, want.p().data(), want_bytes.data(), n);

  // Both stores, the output at every offset from a 64-byte boundary that
  // matters to them: aligned to the element or not, before the streaming
  // stores' boundary (a scalar head), on it, past it.
  constexpr size_t kGuard = 64;
  for (KernelIsa isa : SupportedKernelIsas()) {
    for (ParamsStore store : {ParamsStore::kCached, ParamsStore::kStreaming}) {
      for (size_t shift : {0, 1, 2, 4, 6, 12, 16, 28, 31, 32, 36, 60}) {
        SCOPED_TRACE(absl::StrCat(KernelIsaName(isa), " path, ",
                                  store == ParamsStore::kCached ? "cached" : "streaming",
                                  " stores, output ", shift, " bytes past a 64-byte boundary"));
        std::vector<unsigned char> buffer(n * size + 3 * kGuard, 0xA5);
        const uintptr_t base = reinterpret_cast<uintptr_t>(buffer.data()) + kGuard;
        unsigned char* const out = buffer.data() + (kGuard - base % 64) + shift;
        GuardedFloats p(before.p), m(before.m), v(before.v);
        GuardedGradient guarded(grad);
        AdamWUpdateAndEncodeOn(isa, c, p.data(), m.data(), v.data(), guarded.data(), grad_type, n,
                               out, params_type, store);

        EXPECT_TRUE(BitwiseEqual(p.ToVector(), want.p()));
        EXPECT_TRUE(BitwiseEqual(m.ToVector(), want.m()));
        EXPECT_TRUE(BitwiseEqual(v.ToVector(), want.v()));
        EXPECT_EQ(std::memcmp(out, want_bytes.data(), want_bytes.size()), 0);
        for (unsigned char* b = buffer.data(); b < out; ++b) ASSERT_EQ(*b, 0xA5) << "before";
        for (unsigned char* b = out + n * size; b < buffer.data() + buffer.size(); ++b) {
          ASSERT_EQ(*b, 0xA5) << "after the output";
        }
        EXPECT_TRUE(p.GuardsIntact() && m.GuardsIntact() && v.GuardsIntact() &&
                    guarded.GuardsIntact());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    SizesAndTypes, AdamWKernelEncode,
    ::testing::Combine(
        ::testing::ValuesIn(kSizes),
        ::testing::Values(WireType::kFloat32, WireType::kBFloat16, WireType::kFloat16),
        ::testing::Values(WireType::kFloat32, WireType::kBFloat16, WireType::kFloat16)),
    [](const auto& info) {
      return SizeName(std::get<0>(info.param)) + "_grad" + TypeName(std::get<1>(info.param)) +
             "_params" + TypeName(std::get<2>(info.param));
    });

// ---------------------------------------------------------------------------
// bfloat16 and float16 gradients, per size and type.

class AdamWKernelNarrowGradient : public ::testing::TestWithParam<std::tuple<size_t, WireType>> {};

TEST_P(AdamWKernelNarrowGradient, EqualsTheKernelFedTheExactlyWidenedFloat32GradientBitwise) {
  const auto [n, type] = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const FloatState before = RandomState(n, rng);
  const std::vector<unsigned char> narrow = EncodeGradient(RandomGradient(n, rng), type);
  const std::vector<float> widened = WidenGradient(narrow, type);
  const AdamWConstants c = ComputeAdamWConstants(Inputs(kNonDefault, RandomStep(rng)));

  for (Path path : {Path::kDispatch, Path::kScalar}) {
    SCOPED_TRACE(path == Path::kDispatch ? "AdamWUpdate" : "AdamWUpdateScalar");
    KernelState from_narrow(before), from_float32(before);
    from_narrow.Step(path, c, narrow, type);
    from_float32.Step(path, c, Float32Bytes(widened), WireType::kFloat32);
    ExpectBitwiseEqualState(from_narrow, from_float32);
  }
}

TEST_P(AdamWKernelNarrowGradient, OneStepIsWithinRelativeL2Of1e6OfReferenceOnWidenedValues) {
  const auto [n, type] = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const FloatState before = RandomState(n, rng);
  const std::vector<unsigned char> narrow = EncodeGradient(RandomGradient(n, rng), type);
  const uint64_t t = RandomStep(rng);
  SCOPED_TRACE("t " + std::to_string(t));

  KernelState kernel(before);
  kernel.Step(Path::kDispatch, ComputeAdamWConstants(Inputs(kTorchDefaults, t)), narrow, type);
  ExpectOneStepMatchesReference(kernel, before, Reference(kTorchDefaults), t,
                                Widen(WidenGradient(narrow, type)));
}

INSTANTIATE_TEST_SUITE_P(SizesAndTypes, AdamWKernelNarrowGradient,
                         ::testing::Combine(::testing::ValuesIn(kSizes),
                                            ::testing::Values(WireType::kBFloat16,
                                                              WireType::kFloat16)),
                         [](const auto& info) {
                           return SizeName(std::get<0>(info.param)) + "_" +
                                  TypeName(std::get<1>(info.param));
                         });

// The half encoder above must itself be right for the tests to mean anything.
TEST(AdamWKernelTestInputs, TruncatedHalvesWidenToWithinOneHalfPrecisionUlp) {
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  for (float x : RandomGradient(100000, rng)) {
    const double widened = WidenHalfByDefinition(TruncateToHalf(x));
    const double ulp = std::max(std::ldexp(1.0, -24), std::ldexp(std::fabs(widened), -10));
    ASSERT_LE(std::fabs(widened - x), ulp) << "x " << x;
    ASSERT_EQ(std::signbit(widened), std::signbit(x)) << "x " << x;
  }
}

// ---------------------------------------------------------------------------
// FindNonFiniteGradient, per gradient type.

// Writes a raw element (32 bits for float32, the low 16 otherwise).
void PutRaw(std::vector<unsigned char>& bytes, WireType type, size_t i, uint32_t raw) {
  if (type == WireType::kFloat32) {
    std::memcpy(bytes.data() + 4 * i, &raw, 4);
  } else {
    const uint16_t h = static_cast<uint16_t>(raw);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
}

struct SpecialValues {
  std::vector<uint32_t> nans;
  uint32_t plus_infinity, minus_infinity;
  uint32_t largest_finite;  // Overflows once multiplied by `overflow_scale`.
  float overflow_scale;
};

SpecialValues Specials(WireType type) {
  switch (type) {
    case WireType::kFloat32:
      return {{0x7fc00000u, 0x7f800001u, 0xffc00000u, 0xffffffffu},
              0x7f800000u,
              0xff800000u,
              0x7f7fffffu,
              2.0f};
    case WireType::kBFloat16:
      return {{0x7fc0u, 0x7f81u, 0xffc0u, 0xffffu}, 0x7f80u, 0xff80u, 0x7f7fu, 2.0f};
    case WireType::kFloat16:
      return {{0x7e00u, 0x7c01u, 0xfe00u, 0xffffu}, 0x7c00u, 0xfc00u, 0x7bffu, 1e34f};
  }
  return {};
}

// Element indices worth poisoning in a 3003-element gradient: the ends, both
// sides of 8-, 16-, 256- and 1024-element boundaries, and the tails behind
// the last whole vector of 8 (3 elements) and of 16 (11 elements).
constexpr size_t kCheckCount = 3003;
constexpr size_t kCheckPositions[] = {0,    1,    7,    8,    15,   16,   255,  256,  1023, 1024,
                                      1025, 2047, 2048, 2991, 2992, 2999, 3000, 3001, 3002};

// FindNonFiniteGradient's answer, the same on every path this CPU runs (a
// path that disagrees with the scalar one fails the test).
size_t FirstNonFiniteOnEveryPath(const void* grad, WireType type, size_t count, float grad_scale) {
  const size_t scalar = FindNonFiniteGradientOn(KernelIsa::kScalar, grad, type, count, grad_scale);
  for (KernelIsa isa : SupportedKernelIsas()) {
    EXPECT_EQ(FindNonFiniteGradientOn(isa, grad, type, count, grad_scale), scalar)
        << KernelIsaName(isa) << " path, " << count << " elements";
  }
  EXPECT_EQ(FindNonFiniteGradient(grad, type, count, grad_scale), scalar) << "the chosen path";
  return scalar;
}

class FindNonFiniteGradientTest : public ::testing::TestWithParam<WireType> {
 protected:
  std::vector<unsigned char> FiniteGradient(std::mt19937_64& rng) {
    return EncodeGradient(RandomGradient(kCheckCount, rng, 1.0f), GetParam());
  }
};

TEST_P(FindNonFiniteGradientTest, ReturnsCountWhenEveryElementIsFinite) {
  const WireType type = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> grad = FiniteGradient(rng);
  PutRaw(grad, type, 5, Specials(type).largest_finite);  // Finite at scale 1.
  GuardedGradient guarded(grad);
  EXPECT_EQ(FirstNonFiniteOnEveryPath(guarded.data(), type, kCheckCount, 1.0f), kCheckCount);
  EXPECT_EQ(FirstNonFiniteOnEveryPath(guarded.data(), type, 0, 1.0f), 0u);
}

TEST_P(FindNonFiniteGradientTest, FindsTheFirstNaN) {
  const WireType type = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const SpecialValues specials = Specials(type);
  for (size_t first : kCheckPositions) {
    for (uint32_t nan : specials.nans) {
      std::vector<unsigned char> grad = FiniteGradient(rng);
      PutRaw(grad, type, first, nan);
      if (first + 1 < kCheckCount) PutRaw(grad, type, kCheckCount - 1, specials.plus_infinity);
      GuardedGradient guarded(grad);
      EXPECT_EQ(FirstNonFiniteOnEveryPath(guarded.data(), type, kCheckCount, 1.0f), first)
          << "NaN bits 0x" << std::hex << nan;
    }
  }
}

TEST_P(FindNonFiniteGradientTest, FindsTheFirstInfinityOfEitherSign) {
  const WireType type = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const SpecialValues specials = Specials(type);
  for (size_t first : kCheckPositions) {
    for (uint32_t infinity : {specials.plus_infinity, specials.minus_infinity}) {
      std::vector<unsigned char> grad = FiniteGradient(rng);
      PutRaw(grad, type, first, infinity);
      if (first + 1 < kCheckCount) PutRaw(grad, type, kCheckCount - 1, specials.nans[0]);
      GuardedGradient guarded(grad);
      EXPECT_EQ(FirstNonFiniteOnEveryPath(guarded.data(), type, kCheckCount, 1.0f), first)
          << "infinity bits 0x" << std::hex << infinity;
    }
  }
}

TEST_P(FindNonFiniteGradientTest, CatchesAFiniteGradientThatOverflowsAfterGradScale) {
  const WireType type = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const SpecialValues specials = Specials(type);
  for (size_t first : kCheckPositions) {
    std::vector<unsigned char> grad = FiniteGradient(rng);
    PutRaw(grad, type, first, specials.largest_finite);
    GuardedGradient guarded(grad);
    EXPECT_EQ(FirstNonFiniteOnEveryPath(guarded.data(), type, kCheckCount, 1.0f), kCheckCount)
        << "finite before scaling";
    EXPECT_EQ(FirstNonFiniteOnEveryPath(guarded.data(), type, kCheckCount, specials.overflow_scale),
              first)
        << "largest finite value times " << specials.overflow_scale;
  }
}

// Independent answer: widen each element, scale it, test it.
size_t FirstNonFiniteByDefinition(const std::vector<unsigned char>& grad, WireType type,
                                  float grad_scale) {
  const std::vector<float> widened = WidenGradient(grad, type);
  for (size_t i = 0; i < widened.size(); ++i) {
    if (!std::isfinite(widened[i] * grad_scale)) return i;
  }
  return widened.size();
}

// Every size (tails included), random sparse NaN, infinity or overflow-prone
// values, gradient at an odd address.
TEST_P(FindNonFiniteGradientTest, MatchesTheElementwiseDefinitionOnRandomGradientsOfEverySize) {
  const WireType type = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const SpecialValues specials = Specials(type);
  const std::vector<uint32_t> bad = {specials.nans[0], specials.nans[1], specials.plus_infinity,
                                     specials.minus_infinity, specials.largest_finite};
  for (size_t n :
       {size_t{1}, size_t{7}, size_t{8}, size_t{16}, size_t{23}, size_t{1031}, size_t{4099}}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<unsigned char> grad = EncodeGradient(RandomGradient(n, rng, 1.0f), type);
      const int planted = std::uniform_int_distribution<int>(0, 3)(rng);
      for (int k = 0; k < planted; ++k) {
        PutRaw(grad, type, std::uniform_int_distribution<size_t>(0, n - 1)(rng),
               bad[std::uniform_int_distribution<size_t>(0, bad.size() - 1)(rng)]);
      }
      // Scales at most 1 in magnitude take the vector paths' bits-only check,
      // larger ones the multiply; 0 turns an infinity into NaN.
      const float scales[] = {1.0f, specials.overflow_scale, -1.0f, 0.5f, 0.0f,
                              -specials.overflow_scale};
      const float grad_scale = scales[trial % 6];
      GuardedGradient guarded(grad);
      ASSERT_EQ(FirstNonFiniteOnEveryPath(guarded.data(), type, n, grad_scale),
                FirstNonFiniteByDefinition(grad, type, grad_scale))
          << n << " elements, trial " << trial << ", grad_scale " << grad_scale;
    }
  }
}

// A 16-bit gradient whose whole vectors of 8 end half-way through a 32-byte
// load (24 and 1064 elements: 48 and 2128 bytes) is read to its last element,
// at scales that read bits alone and at one that multiplies.
TEST_P(FindNonFiniteGradientTest, FindsABadValueInTheLastHalfVector) {
  const WireType type = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const SpecialValues specials = Specials(type);
  for (size_t n : {size_t{24}, size_t{1064}}) {
    const std::vector<unsigned char> finite = EncodeGradient(RandomGradient(n, rng, 1.0f), type);
    for (float grad_scale : {1.0f, -0.5f, 1.5f}) {
      GuardedGradient clean(finite);
      EXPECT_EQ(FirstNonFiniteOnEveryPath(clean.data(), type, n, grad_scale), n);
      for (size_t at = n - 16; at < n; ++at) {
        for (uint32_t bad : {specials.nans[1], specials.minus_infinity}) {
          std::vector<unsigned char> grad = finite;
          PutRaw(grad, type, at, bad);
          GuardedGradient guarded(grad);
          EXPECT_EQ(FirstNonFiniteOnEveryPath(guarded.data(), type, n, grad_scale), at)
              << n << " elements, at " << at << ", grad_scale " << grad_scale;
        }
      }
    }
  }
}

// The vector paths read a range as 8 stretches side by side before they
// search it in order: a bad value at either end of any stretch (for the
// stretch lengths of 8- and 16-lane vectors), or in what follows the last
// stretch, is found, and an earlier one in another stretch comes first.
TEST_P(FindNonFiniteGradientTest, FindsABadValueAtEveryEdgeOfTheStretchesReadSideBySide) {
  const WireType type = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const SpecialValues specials = Specials(type);
  constexpr size_t kCount = 16411;
  std::vector<size_t> edges = {kCount - 1};
  for (size_t lanes : {size_t{8}, size_t{16}}) {
    const size_t stretch = kCount / lanes * lanes / 8 / lanes * lanes;
    for (size_t s = 0; s <= 8; ++s) {
      if (s > 0) edges.push_back(s * stretch - 1);
      if (s < 8 || s * stretch < kCount) edges.push_back(s * stretch);
    }
  }
  const std::vector<unsigned char> finite =
      EncodeGradient(RandomGradient(kCount, rng, 1.0f), type);
  // 1 and 0.25 read bits alone, 1.5 multiplies first: two loops, one layout.
  for (float grad_scale : {1.0f, 0.25f, 1.5f}) {
    for (size_t at : edges) {
      std::vector<unsigned char> grad = finite;
      PutRaw(grad, type, at, specials.nans[0]);
      GuardedGradient guarded(grad);
      EXPECT_EQ(FirstNonFiniteOnEveryPath(guarded.data(), type, kCount, grad_scale), at)
          << "at " << at << ", grad_scale " << grad_scale;
      if (at + 1 < kCount) {
        PutRaw(grad, type, kCount - 1 - (kCount - 1 - at) / 2, specials.plus_infinity);
        GuardedGradient two(grad);
        EXPECT_EQ(FirstNonFiniteOnEveryPath(two.data(), type, kCount, grad_scale), at)
            << "at " << at << ", another bad value after it, grad_scale " << grad_scale;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, FindNonFiniteGradientTest,
                         ::testing::Values(WireType::kFloat32, WireType::kBFloat16,
                                           WireType::kFloat16),
                         [](const auto& info) { return TypeName(info.param); });

// ---------------------------------------------------------------------------
// AdamWUpdateAndEncodeCheckingAhead: the update of one range, and the finite
// check of another read among its loads.

class CheckingAheadTest : public ::testing::TestWithParam<WireType> {};

// On every path, with either store and any scale: the state and params are
// AdamWUpdateAndEncode's, bit for bit, and the answer is FindNonFiniteGradient's
// on the ahead range, for a bad value anywhere in it: inside the part read
// with the update's loads, past it (an ahead range longer than the update
// reads), in its tail of fewer than a vector's bytes.
TEST_P(CheckingAheadTest, UpdatesAsAdamWUpdateAndEncodeAndAnswersAsFindNonFiniteGradient) {
  const WireType ahead_type = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const SpecialValues specials = Specials(ahead_type);
  // Update lengths: shorter than the ahead range (the rest checked after),
  // as long, and too short for a vector.
  for (size_t n : {size_t{7}, size_t{1031}, kCheckCount}) {
    for (WireType grad_type : {WireType::kFloat32, WireType::kBFloat16}) {
      for (WireType params_type : {WireType::kFloat32, WireType::kBFloat16, WireType::kFloat16}) {
        const FloatState before = RandomState(n, rng);
        const std::vector<unsigned char> grad = EncodeGradient(RandomGradient(n, rng), grad_type);
        const AdamWConstants c = ComputeAdamWConstants(Inputs(kNonDefault, RandomStep(rng), 1.0f));
        const size_t size = WireTypeSize(params_type);
        for (float scale : {1.0f, -0.5f, specials.overflow_scale}) {
          // kCheckCount: none bad.
          std::vector<size_t> bad_positions(std::begin(kCheckPositions), std::end(kCheckPositions));
          bad_positions.push_back(kCheckCount);
          for (size_t bad : bad_positions) {
            std::vector<unsigned char> ahead =
                EncodeGradient(RandomGradient(kCheckCount, rng, 1.0f), ahead_type);
            if (bad < kCheckCount) {
              PutRaw(ahead, ahead_type, bad,
                     bad % 3 == 0   ? specials.nans[bad % specials.nans.size()]
                     : bad % 3 == 1 ? specials.minus_infinity
                                    : specials.plus_infinity);
            }
            if (scale > 1.0f) PutRaw(ahead, ahead_type, kCheckCount / 2, specials.largest_finite);
            GuardedGradient guarded_ahead(ahead);
            const size_t want_first = FindNonFiniteGradientOn(
                KernelIsa::kScalar, guarded_ahead.data(), ahead_type, kCheckCount, scale);
            for (KernelIsa isa : SupportedKernelIsas()) {
              for (ParamsStore store : {ParamsStore::kCached, ParamsStore::kStreaming}) {
                SCOPED_TRACE(
                    absl::StrCat(KernelIsaName(isa), " path, n ", n, ", grad ", TypeName(grad_type),
                                 ", params ", TypeName(params_type), ", scale ", scale, ", bad at ",
                                 bad, store == ParamsStore::kCached ? ", cached" : ", streaming"));
                GuardedFloats wp(before.p), wm(before.m), wv(before.v);
                std::vector<unsigned char> want_out(n * size + 64);
                AdamWUpdateAndEncodeOn(isa, c, wp.data(), wm.data(), wv.data(), grad.data(),
                                       grad_type, n, want_out.data() + 4, params_type, store);
                GuardedFloats p(before.p), m(before.m), v(before.v);
                GuardedGradient guarded(grad);
                std::vector<unsigned char> out(n * size + 64);
                const bool finite = AdamWUpdateAndEncodeCheckingAheadOn(
                    isa, c, p.data(), m.data(), v.data(), guarded.data(), grad_type, n,
                    out.data() + 4, params_type, store, nullptr,
                    {guarded_ahead.data(), ahead_type, kCheckCount, scale});
                EXPECT_EQ(finite, want_first == kCheckCount);
                EXPECT_TRUE(BitwiseEqual(p.ToVector(), wp.ToVector()));
                EXPECT_TRUE(BitwiseEqual(m.ToVector(), wm.ToVector()));
                EXPECT_TRUE(BitwiseEqual(v.ToVector(), wv.ToVector()));
                EXPECT_EQ(std::memcmp(out.data(), want_out.data(), out.size()), 0);
                EXPECT_TRUE(p.GuardsIntact() && m.GuardsIntact() && v.GuardsIntact() &&
                            guarded.GuardsIntact() && guarded_ahead.GuardsIntact());
              }
            }
          }
        }
      }
    }
  }
}

// An empty ahead range is finite, and an update of nothing still checks it.
TEST_P(CheckingAheadTest, ChecksTheWholeRangeBesideAnEmptyUpdate) {
  const WireType ahead_type = GetParam();
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> ahead =
      EncodeGradient(RandomGradient(kCheckCount, rng, 1.0f), ahead_type);
  const AdamWConstants c = ComputeAdamWConstants(Inputs(kNonDefault, 1, 1.0f));
  float state = 0;
  unsigned char out[4] = {};
  for (KernelIsa isa : SupportedKernelIsas()) {
    EXPECT_TRUE(AdamWUpdateAndEncodeCheckingAheadOn(
        isa, c, &state, &state, &state, ahead.data(), WireType::kFloat32, 0, out,
        WireType::kFloat32, ParamsStore::kStreaming, nullptr, {ahead.data(), ahead_type, 0, 1.0f}));
    PutRaw(ahead, ahead_type, kCheckCount - 1, Specials(ahead_type).plus_infinity);
    EXPECT_FALSE(AdamWUpdateAndEncodeCheckingAheadOn(isa, c, &state, &state, &state, ahead.data(),
                                                     WireType::kFloat32, 0, out, WireType::kFloat32,
                                                     ParamsStore::kStreaming, nullptr,
                                                     {ahead.data(), ahead_type, kCheckCount, 1.0f}))
        << KernelIsaName(isa);
  }
}

INSTANTIATE_TEST_SUITE_P(AheadTypes, CheckingAheadTest,
                         ::testing::Values(WireType::kFloat32, WireType::kBFloat16,
                                           WireType::kFloat16),
                         [](const auto& info) { return TypeName(info.param); });

// ---------------------------------------------------------------------------
// The scalar edges around a vector span (the AVX-512 path's, which only an
// AVX-512 CPU runs; here with spans of any placement).

// With the span's elements already stepped (as the vector part leaves
// them), the edges complete the update and its params exactly as the
// scalar path does, and leave the span's elements alone.
TEST(VectorSpanEdges, CompleteTheUpdateAndItsParamsAroundAnySpan) {
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  constexpr size_t n = 1031;
  const FloatState before = RandomState(n, rng);
  const std::vector<unsigned char> grad =
      EncodeGradient(RandomGradient(n, rng), WireType::kBFloat16);
  const AdamWConstants c = ComputeAdamWConstants(Inputs(kNonDefault, RandomStep(rng)));
  KernelState want(before);
  want.Step(Path::kScalar, c, grad, WireType::kBFloat16);
  using kernel_internal::VectorSpan;
  for (const VectorSpan span : {VectorSpan{0, 0}, VectorSpan{0, 1024}, VectorSpan{7, 1031},
                                VectorSpan{15, 1023}, VectorSpan{1031, 1031}}) {
    for (int params = -1; params <= 2; ++params) {
      SCOPED_TRACE(absl::StrCat("span [", span.begin, ", ", span.end, "), params ", params));
      const WireType params_type = static_cast<WireType>(params < 0 ? 0 : params);
      const size_t size = WireTypeSize(params_type);
      std::vector<unsigned char> want_bytes(n * size), out(n * size, 0xA5);
      EncodeFromFloat(params_type, want.p().data(), want_bytes.data(), n);
      GuardedFloats p(before.p), m(before.m), v(before.v);
      // The vector part's work, done here by the scalar path.
      kernel_internal::AdamWRangeScalar(c, p.data(), m.data(), v.data(), nullptr, grad.data(),
                                        WireType::kBFloat16, span.begin, span.end);
      if (params >= 0) {
        std::memcpy(out.data() + span.begin * size, want_bytes.data() + span.begin * size,
                    (span.end - span.begin) * size);
      }
      kernel_internal::UpdateAndEncodeOutside(span, c, p.data(), m.data(), v.data(), nullptr,
                                              grad.data(), WireType::kBFloat16, n,
                                              params < 0 ? nullptr : out.data(), params_type);
      EXPECT_TRUE(BitwiseEqual(p.ToVector(), want.p()));
      EXPECT_TRUE(BitwiseEqual(m.ToVector(), want.m()));
      EXPECT_TRUE(BitwiseEqual(v.ToVector(), want.v()));
      if (params >= 0) {
        EXPECT_EQ(std::memcmp(out.data(), want_bytes.data(), out.size()), 0);
      } else {
        EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](unsigned char b) { return b == 0xA5; }))
            << "params written with no params_out";
      }
      EXPECT_TRUE(p.GuardsIntact() && m.GuardsIntact() && v.GuardsIntact());
    }
  }
}

// The scalar finite check from `begin` (the AVX-512 path's tail) sees what
// is at or after begin, and nothing before it.
TEST(VectorSpanEdges, TheFiniteCheckFromBeginIgnoresWhatComesBefore) {
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> grad =
      EncodeGradient(RandomGradient(kCheckCount, rng, 1.0f), WireType::kFloat32);
  const uint32_t nan = Specials(WireType::kFloat32).nans[0];
  PutRaw(grad, WireType::kFloat32, 100, nan);
  PutRaw(grad, WireType::kFloat32, 2995, nan);
  using kernel_internal::FindNonFiniteScalarFrom;
  EXPECT_EQ(FindNonFiniteScalarFrom(grad.data(), WireType::kFloat32, 0, kCheckCount, 1.0f), 100u);
  EXPECT_EQ(FindNonFiniteScalarFrom(grad.data(), WireType::kFloat32, 100, kCheckCount, 1.0f), 100u);
  EXPECT_EQ(FindNonFiniteScalarFrom(grad.data(), WireType::kFloat32, 101, kCheckCount, 1.0f),
            2995u);
  EXPECT_EQ(FindNonFiniteScalarFrom(grad.data(), WireType::kFloat32, 2996, kCheckCount, 1.0f),
            kCheckCount);
  EXPECT_EQ(
      FindNonFiniteScalarFrom(grad.data(), WireType::kFloat32, kCheckCount, kCheckCount, 1.0f),
      kCheckCount);
}

// ---------------------------------------------------------------------------
// Choosing the path.

TEST(KernelIsaChoice, EveryNameParsesBackAndOtherTextIsRefused) {
  for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    KernelIsa parsed = KernelIsa::kScalar;
    ASSERT_TRUE(ParseKernelIsa(KernelIsaName(isa), &parsed)) << KernelIsaName(isa);
    EXPECT_EQ(parsed, isa);
  }
  KernelIsa untouched = KernelIsa::kAvx2;
  for (const char* text : {"", "auto", "AVX2", "avx", "avx512f", "sse"}) {
    EXPECT_FALSE(ParseKernelIsa(text, &untouched)) << text;
  }
  EXPECT_EQ(untouched, KernelIsa::kAvx2);
}

// Each path the CPU runs can be chosen, and the chosen one gives the scalar
// path's bits; a path wider than the CPU's is refused and changes nothing.
TEST(KernelIsaChoice, UseKernelIsaTakesThePathsTheCpuRunsAndRefusesWiderOnes) {
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const FloatState before = RandomState(1031, rng);
  const std::vector<unsigned char> grad =
      EncodeGradient(RandomGradient(1031, rng), WireType::kFloat32);
  const AdamWConstants c = ComputeAdamWConstants(Inputs(kNonDefault, RandomStep(rng)));
  KernelState scalar_path(before);
  scalar_path.Step(Path::kScalar, c, grad, WireType::kFloat32);
  ASSERT_EQ(AdamWKernelIsa(), CpuKernelIsa());
  for (KernelIsa isa : SupportedKernelIsas()) {
    SCOPED_TRACE(KernelIsaName(isa));
    ASSERT_TRUE(UseKernelIsa(isa));
    EXPECT_EQ(AdamWKernelIsa(), isa);
    KernelState chosen(before);
    chosen.Step(Path::kDispatch, c, grad, WireType::kFloat32);
    ExpectBitwiseEqualState(chosen, scalar_path);
  }
  ASSERT_TRUE(UseKernelIsa(KernelIsa::kScalar));
  for (KernelIsa wider : {KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (wider <= CpuKernelIsa()) continue;
    EXPECT_FALSE(UseKernelIsa(wider)) << KernelIsaName(wider);
    EXPECT_EQ(AdamWKernelIsa(), KernelIsa::kScalar);
  }
  ASSERT_TRUE(UseKernelIsa(CpuKernelIsa()));  // As the other tests expect.
}

// ---------------------------------------------------------------------------
// ComputeAdamWConstants and hyperparameter edge cases.

TEST(AdamWConstants, AreTheDoubleFormulasRoundedOnceToFloat) {
  const AdamWStepInputs in = Inputs(kNonDefault, 37, 0.25f);
  const AdamWConstants c = ComputeAdamWConstants(in);
  const double lr = in.hyperparameters.lr, b1 = in.hyperparameters.beta1,
               b2 = in.hyperparameters.beta2;
  EXPECT_EQ(c.decay, static_cast<float>(1.0 - lr * in.hyperparameters.weight_decay));
  EXPECT_FALSE(c.lerp_from_gradient);
  EXPECT_EQ(c.lerp_coefficient, static_cast<float>(1.0 - b1));
  EXPECT_EQ(c.beta2, static_cast<float>(b2));
  EXPECT_EQ(c.one_minus_beta2, static_cast<float>(1.0 - b2));
  EXPECT_EQ(c.neg_step_size, static_cast<float>(-(lr / (1.0 - std::pow(b1, 37.0)))));
  EXPECT_EQ(c.bias_correction2_sqrt, static_cast<float>(std::pow(1.0 - std::pow(b2, 37.0), 0.5)));
  EXPECT_EQ(c.eps, static_cast<float>(in.hyperparameters.eps));
  EXPECT_EQ(c.grad_scale, 0.25f);
}

// torch's lerp takes its second form for a weight of 0.5 or more: beta1 <= 0.5.
TEST(AdamWConstants, SmallBeta1TakesLerpsSecondForm) {
  AdamWStepInputs in;
  in.hyperparameters.beta1 = 0.25;
  const AdamWConstants c = ComputeAdamWConstants(in);
  EXPECT_TRUE(c.lerp_from_gradient);
  EXPECT_EQ(c.lerp_coefficient, 0.75f - 1.0f);
  in.hyperparameters.beta1 = 0.5;
  EXPECT_TRUE(ComputeAdamWConstants(in).lerp_from_gradient);
  in.hyperparameters.beta1 = 0.500001;
  EXPECT_FALSE(ComputeAdamWConstants(in).lerp_from_gradient);
}

TEST(AdamWConstants, FirstStepFromZeroMomentsMatchesReference) {
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  FloatState before = RandomState(1031, rng);
  std::fill(before.m.begin(), before.m.end(), 0.0f);
  std::fill(before.v.begin(), before.v.end(), 0.0f);
  const std::vector<float> grad = RandomGradient(1031, rng);

  KernelState kernel(before);
  kernel.Step(Path::kDispatch, ComputeAdamWConstants(Inputs(kTorchDefaults, 1)), Float32Bytes(grad),
              WireType::kFloat32);
  ExpectOneStepMatchesReference(kernel, before, Reference(kTorchDefaults), 1, Widen(grad));
}

TEST(AdamWConstants, ZeroWeightDecayGivesDecayOfExactlyOneAndMatchesReference) {
  HyperparameterSet no_decay = kNonDefault;
  no_decay.weight_decay = 0.0f;
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const FloatState before = RandomState(1031, rng);
  const std::vector<float> grad = RandomGradient(1031, rng);
  const uint64_t t = RandomStep(rng);
  const AdamWConstants c = ComputeAdamWConstants(Inputs(no_decay, t));
  EXPECT_EQ(c.decay, 1.0f);

  KernelState kernel(before);
  kernel.Step(Path::kDispatch, c, Float32Bytes(grad), WireType::kFloat32);
  ExpectOneStepMatchesReference(kernel, before, Reference(no_decay), t, Widen(grad));
}

// Decoupled weight decay: with no gradient and no momentum the only change to
// p is p *= 1 - lr*wd.
TEST(AdamWConstants, WeightDecayAloneScalesParamsByOneMinusLrTimesWd) {
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  FloatState before = RandomState(1031, rng);
  std::fill(before.m.begin(), before.m.end(), 0.0f);
  const AdamWConstants c = ComputeAdamWConstants(Inputs(kNonDefault, 5));

  KernelState kernel(before);
  kernel.Step(Path::kDispatch, c, Float32Bytes(std::vector<float>(1031, 0.0f)), WireType::kFloat32);

  const std::vector<float> p = kernel.p(), m = kernel.m();
  const double factor = 1.0 - static_cast<double>(kNonDefault.lr) * kNonDefault.weight_decay;
  for (size_t i = 0; i < p.size(); ++i) {
    ASSERT_EQ(p[i], before.p[i] * c.decay) << "element " << i;
    ASSERT_NEAR(p[i], before.p[i] * factor, 1e-7 * std::fabs(before.p[i])) << "element " << i;
    ASSERT_EQ(m[i], 0.0f) << "element " << i;
  }
}

TEST(AdamWConstants, ZeroLearningRateLeavesParamsUnchangedButUpdatesMoments) {
  HyperparameterSet frozen = kNonDefault;
  frozen.lr = 0.0f;
  const uint64_t seed = ref::TestSeed();
  SCOPED_TRACE(ref::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const FloatState before = RandomState(1031, rng);
  const std::vector<float> grad = RandomGradient(1031, rng);
  const uint64_t t = RandomStep(rng);

  KernelState kernel(before);
  kernel.Step(Path::kDispatch, ComputeAdamWConstants(Inputs(frozen, t)), Float32Bytes(grad),
              WireType::kFloat32);
  ref::ReferenceState reference = WidenState(before);
  ref::ReferenceAdamWStep(Reference(frozen), t, Widen(grad), &reference);

  EXPECT_TRUE(BitwiseEqual(kernel.p(), before.p)) << "p moved with lr = 0";
  const double rel_m = ref::RelativeL2Error(kernel.m(), reference.exp_avg);
  const double rel_v = ref::RelativeL2Error(kernel.v(), reference.exp_avg_sq);
  Report("rel m", rel_m);
  Report("rel v", rel_v);
  EXPECT_LE(rel_m, 1e-6);
  EXPECT_LE(rel_v, 1e-6);
  EXPECT_EQ(CountUnwritten(before.m, kernel.m(), reference.exp_avg), 0u);
  EXPECT_EQ(CountUnwritten(before.v, kernel.v(), reference.exp_avg_sq), 0u);
}

}  // namespace
}  // namespace optstate
