// The reference the emulated AVX-512 kernel is held against: reads update
// cases from a file, applies each with the scalar path (AdamWUpdateScalar)
// and narrows the updated params one element at a time (FloatToBFloat16,
// FloatToHalf), and writes the results, for avx512_kernel_emulated_test.py.
//
// Input, little-endian, cases until the end of the file; each: float32
// decay, lerp_coefficient, beta2, one_minus_beta2, neg_step_size,
// bias_correction2_sqrt, eps, grad_scale; u32 lerp_from_gradient,
// grad_type, params_type (a WireType, or 255 for none), store (unused);
// u64 n; float32 p[n], m[n], v[n]; grad[n] in grad_type.
// Output, per case: float32 p[n], m[n], v[n]; then, unless params_type is
// 255, the n params narrowed to params_type.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "optstate/dtype.h"
#include "server/kernels/adamw_kernel.h"

namespace {

constexpr uint32_t kNoParams = 255;

struct CaseHeader {
  float decay, lerp_coefficient, beta2, one_minus_beta2, neg_step_size, bias_correction2_sqrt, eps,
      grad_scale;
  uint32_t lerp_from_gradient, grad_type, params_type, store;
  uint64_t n;
  uint64_t amsgrad;  // 1: max_exp_avg_sq follows v in the input and in the output.
};
static_assert(sizeof(CaseHeader) == 64);

// Zero bytes are read and written without a call: the buffer of an empty
// vector may be null, which fread and fwrite must not be given.
bool Read(std::FILE* f, void* data, size_t bytes) {
  return bytes == 0 || std::fread(data, 1, bytes, f) == bytes;
}

bool Write(std::FILE* f, const void* data, size_t bytes) {
  return bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes;
}

int Fail(const char* what) {
  std::fprintf(stderr, "kernel_reference_driver: %s\n", what);
  return 2;
}

std::vector<unsigned char> Narrow(const std::vector<float>& p, optstate::WireType type) {
  std::vector<unsigned char> out(p.size() * optstate::WireTypeSize(type));
  for (size_t i = 0; i < p.size(); ++i) {
    if (type == optstate::WireType::kFloat32) {
      std::memcpy(&out[4 * i], &p[i], 4);
      continue;
    }
    const uint16_t bits = type == optstate::WireType::kBFloat16 ? optstate::FloatToBFloat16(p[i])
                                                                : optstate::FloatToHalf(p[i]);
    std::memcpy(&out[2 * i], &bits, 2);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return Fail("usage: kernel_reference_driver IN OUT");
  std::FILE* in = std::fopen(argv[1], "rb");
  if (in == nullptr) return Fail("cannot open the input");
  std::FILE* out = std::fopen(argv[2], "wb");
  if (out == nullptr) return Fail("cannot open the output");
  CaseHeader h;
  for (;;) {
    const size_t header_bytes = std::fread(&h, 1, sizeof(h), in);
    if (header_bytes == 0 && std::feof(in)) break;
    if (header_bytes != sizeof(h)) return Fail("a case's header ends early");
    if (h.grad_type > 2 || (h.params_type > 2 && h.params_type != kNoParams)) {
      return Fail("a case names an unknown type");
    }
    optstate::AdamWConstants c;
    c.decay = h.decay;
    c.lerp_coefficient = h.lerp_coefficient;
    c.lerp_from_gradient = h.lerp_from_gradient != 0;
    c.beta2 = h.beta2;
    c.one_minus_beta2 = h.one_minus_beta2;
    c.neg_step_size = h.neg_step_size;
    c.bias_correction2_sqrt = h.bias_correction2_sqrt;
    c.eps = h.eps;
    c.grad_scale = h.grad_scale;
    const auto grad_type = static_cast<optstate::WireType>(h.grad_type);
    std::vector<float> p(h.n), m(h.n), v(h.n), vmax(h.amsgrad ? h.n : 0);
    std::vector<unsigned char> grad(h.n * optstate::WireTypeSize(grad_type));
    if (!Read(in, p.data(), 4 * h.n) || !Read(in, m.data(), 4 * h.n) ||
        !Read(in, v.data(), 4 * h.n) || !Read(in, vmax.data(), 4 * vmax.size()) ||
        !Read(in, grad.data(), grad.size())) {
      return Fail("a case ends early");
    }
    optstate::AdamWUpdateScalar(c, p.data(), m.data(), v.data(), grad.data(), grad_type, h.n,
                                h.amsgrad ? vmax.data() : nullptr);
    if (!Write(out, p.data(), 4 * h.n) || !Write(out, m.data(), 4 * h.n) ||
        !Write(out, v.data(), 4 * h.n) || !Write(out, vmax.data(), 4 * vmax.size())) {
      return Fail("cannot write the output");
    }
    if (h.params_type != kNoParams) {
      const std::vector<unsigned char> narrowed =
          Narrow(p, static_cast<optstate::WireType>(h.params_type));
      if (!Write(out, narrowed.data(), narrowed.size())) return Fail("cannot write the output");
    }
  }
  std::fclose(in);
  return std::fclose(out) == 0 ? 0 : Fail("cannot close the output");
}
