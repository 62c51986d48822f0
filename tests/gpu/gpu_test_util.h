// Helpers shared by the GPU tests: skip (or fail, under run.sh) without a
// device, CUDA error checks, fast reproducible random arrays.
#ifndef OPTSTATE_TESTS_GPU_GPU_TEST_UTIL_H_
#define OPTSTATE_TESTS_GPU_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "server/backends/cuda/cuda_device.h"

namespace optstate::testing {

// Skips the test when no CUDA device is usable, unless OPTSTATE_REQUIRE_GPU
// is set (tests/gpu/run.sh sets it), in which case it fails.
#define OPTSTATE_REQUIRE_DEVICE()                                                       \
  do {                                                                                  \
    absl::StatusOr<::optstate::CudaDeviceInfo> device = ::optstate::ProbeCudaDevice(0); \
    if (!device.ok()) {                                                                 \
      if (std::getenv("OPTSTATE_REQUIRE_GPU") != nullptr) {                             \
        FAIL() << device.status();                                                      \
      }                                                                                 \
      GTEST_SKIP() << device.status();                                                  \
    }                                                                                   \
  } while (0)

#define ASSERT_CUDA(expr)                                                                    \
  do {                                                                                       \
    cudaError_t cuda_error_ = (expr);                                                        \
    ASSERT_EQ(cuda_error_, cudaSuccess) << #expr << ": " << cudaGetErrorString(cuda_error_); \
  } while (0)

// splitmix64: a counter-based generator, so big arrays fill in parallel and
// every run draws the same values for the same seed.
inline uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1).
inline float UniformSigned(uint64_t seed, uint64_t i) {
  return static_cast<float>(static_cast<double>(SplitMix(seed * 0x100000001b3ull + i) >> 11) *
                                (1.0 / 9007199254740992.0) * 2.0 -
                            1.0);
}

// Uniform in [0, 1).
inline float Uniform01(uint64_t seed, uint64_t i) {
  return static_cast<float>(static_cast<double>(SplitMix(seed * 0x100000001b3ull + i) >> 11) *
                            (1.0 / 9007199254740992.0));
}

// How many elements of two float arrays differ in their bits.
inline uint64_t CountBitDifferences(const float* a, const float* b, uint64_t n) {
  uint64_t differ = 0;
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t x, y;
    std::memcpy(&x, a + i, 4);
    std::memcpy(&y, b + i, 4);
    differ += x != y ? 1 : 0;
  }
  return differ;
}

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_GPU_GPU_TEST_UTIL_H_
