// VramBudget arithmetic: clamping and saturating subtraction.
#include "server/cuda/vram_budget.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace optstate {

double VramBudget::ClampTargetUtilization(double target) {
  if (!(target >= kMinTargetUtilization)) return kMinTargetUtilization;  // NaN too.
  if (target > kMaxTargetUtilization) return kMaxTargetUtilization;
  return target;
}

VramBudget::VramBudget(uint64_t total_bytes, uint64_t reserved_bytes, double target_utilization)
    : total_bytes_(total_bytes),
      reserved_bytes_(reserved_bytes),
      target_utilization_(ClampTargetUtilization(target_utilization)) {
  // long double keeps 64 bits of mantissa on x86-64, so the product is exact
  // enough that floor() never rounds a byte count up past the true value by
  // more than the representation error of the target itself. The product is
  // below total (target < 1), so the conversion cannot overflow.
  const long double share =
      std::floor(static_cast<long double>(total_bytes_) * target_utilization_);
  uint64_t usable = static_cast<uint64_t>(share);
  if (usable > total_bytes_) usable = total_bytes_;
  available_bytes_ = usable > reserved_bytes_ ? usable - reserved_bytes_ : 0;
}

std::string VramBudget::ToString() const {
  return absl::StrCat("total=", total_bytes_, " reserved=", reserved_bytes_,
                      " target=", target_utilization_, " available=", available_bytes_);
}

}  // namespace optstate
