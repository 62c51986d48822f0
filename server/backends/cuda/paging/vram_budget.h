// How much device memory optstate may plan to use: a share of the device's
// total, less what is kept free for others. Pure arithmetic, no CUDA calls.
#ifndef OPTSTATE_SERVER_BACKENDS_CUDA_PAGING_VRAM_BUDGET_H_
#define OPTSTATE_SERVER_BACKENDS_CUDA_PAGING_VRAM_BUDGET_H_

#include <cstdint>
#include <string>

namespace optstate {

// available_bytes() = floor(total * target) - reserved, in exact integer
// arithmetic with the target read to nine decimal places, and 0 when that
// would be negative. The target utilization is
// clamped to [0.5, 0.95] (NaN reads as 0.5, the cautious end). Immutable, so
// safe to share between threads.
class VramBudget {
 public:
  static constexpr double kMinTargetUtilization = 0.5;
  static constexpr double kMaxTargetUtilization = 0.95;

  VramBudget() : VramBudget(0, 0, kMinTargetUtilization) {}
  VramBudget(uint64_t total_bytes, uint64_t reserved_bytes, double target_utilization);

  // `target` clamped to [0.5, 0.95]; NaN gives 0.5.
  static double ClampTargetUtilization(double target);

  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t reserved_bytes() const { return reserved_bytes_; }
  // Already clamped.
  double target_utilization() const { return target_utilization_; }
  uint64_t available_bytes() const { return available_bytes_; }

  // True when `bytes` fit in available_bytes() (the boundary fits).
  bool fits(uint64_t bytes) const { return bytes <= available_bytes_; }

  // "total=... reserved=... target=... available=..." for logs.
  std::string ToString() const;

 private:
  uint64_t total_bytes_;
  uint64_t reserved_bytes_;
  double target_utilization_;
  uint64_t available_bytes_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKENDS_CUDA_PAGING_VRAM_BUDGET_H_
