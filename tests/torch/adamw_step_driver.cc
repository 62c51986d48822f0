// Applies one AdamW step with the CPU kernel to arrays read from a file and
// writes the results back, so tests/torch/adamw_torch_parity_test.py can hold
// the kernel against torch.optim.AdamW itself.
//
// Input (little-endian): u64 n, u64 step, f64 lr, beta1, beta2, eps,
// weight_decay, f32 grad_scale, u32 path (0: the dispatching AdamWUpdate,
// 1: AdamWUpdateScalar), u32 grad_type (0 float32, 1 bfloat16, 2 float16),
// then float32 p[n], m[n], v[n] and grad[n] in grad_type.
// Output: float32 p[n], m[n], v[n] after the step.
// `adamw_step_driver --path` prints the path AdamWUpdate takes here.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "server/kernels/adamw_kernel.h"

namespace {

bool ReadAll(std::FILE* f, void* data, size_t bytes) {
  return std::fread(data, 1, bytes, f) == bytes;
}

int Fail(const char* what) {
  std::fprintf(stderr, "adamw_step_driver: %s\n", what);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--path") {
    std::printf("%s\n", optstate::KernelIsaName(optstate::AdamWKernelIsa()));
    return 0;
  }
  if (argc != 3) return Fail("usage: adamw_step_driver IN OUT, or adamw_step_driver --path");
  std::FILE* in = std::fopen(argv[1], "rb");
  if (in == nullptr) return Fail("cannot open the input");
  uint64_t n = 0;
  optstate::AdamWStepInputs inputs;
  uint32_t path = 0, grad_type = 0;
  if (!ReadAll(in, &n, 8) || !ReadAll(in, &inputs.step, 8) ||
      !ReadAll(in, &inputs.hyperparameters.lr, 8) ||
      !ReadAll(in, &inputs.hyperparameters.beta1, 8) ||
      !ReadAll(in, &inputs.hyperparameters.beta2, 8) ||
      !ReadAll(in, &inputs.hyperparameters.eps, 8) ||
      !ReadAll(in, &inputs.hyperparameters.weight_decay, 8) ||
      !ReadAll(in, &inputs.grad_scale, 4) || !ReadAll(in, &path, 4) ||
      !ReadAll(in, &grad_type, 4)) {
    return Fail("short header");
  }
  if (grad_type > 2) return Fail("grad_type must be 0, 1 or 2");
  const optstate::WireType type = grad_type == 0   ? optstate::WireType::kFloat32
                                  : grad_type == 1 ? optstate::WireType::kBFloat16
                                                   : optstate::WireType::kFloat16;
  std::vector<float> p(n), m(n), v(n);
  std::vector<unsigned char> grad(n * optstate::WireTypeSize(type));
  for (std::vector<float>* array : {&p, &m, &v}) {
    if (!ReadAll(in, array->data(), n * sizeof(float))) return Fail("short arrays");
  }
  if (!ReadAll(in, grad.data(), grad.size())) return Fail("short gradient");
  std::fclose(in);

  const optstate::AdamWConstants c = optstate::ComputeAdamWConstants(inputs);
  if (path == 0) {
    optstate::AdamWUpdate(c, p.data(), m.data(), v.data(), grad.data(), type, n);
  } else {
    optstate::AdamWUpdateScalar(c, p.data(), m.data(), v.data(), grad.data(), type, n);
  }

  std::FILE* out = std::fopen(argv[2], "wb");
  if (out == nullptr) return Fail("cannot open the output");
  for (const std::vector<float>* array : {&p, &m, &v}) {
    if (std::fwrite(array->data(), sizeof(float), n, out) != n) return Fail("cannot write");
  }
  return std::fclose(out) == 0 ? 0 : Fail("cannot write");
}
