// Same-run baselines for the CPU AdamW kernel: a pure memory pass with
// AdamW's traffic, and the textbook AdamW loop left to the compiler.
#ifndef OPTSTATE_BENCH_KERNEL_BASELINES_H_
#define OPTSTATE_BENCH_KERNEL_BASELINES_H_

#include <cstddef>
#include <cstdint>

namespace optstate::bench {

// Reads p, m, v and g and writes p, m and v in place: 16 bytes read and 12
// written per element, AdamW's traffic with almost no arithmetic.
void MemoryPass(float* p, float* m, float* v, const float* g, size_t count);

// torch.optim.AdamW's formula written plainly, one element per iteration,
// with bias corrections as divisions (built with -O3 -march=native
// -fno-math-errno).
struct PlainAdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  uint64_t step;
};
void PlainAdamW(const PlainAdamWParams& h, float* p, float* m, float* v, const float* g,
                size_t count);

}  // namespace optstate::bench

#endif  // OPTSTATE_BENCH_KERNEL_BASELINES_H_
