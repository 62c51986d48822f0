// VramBudget arithmetic: clamping and saturating subtraction.
#include "server/backends/cuda/paging/vram_budget.h"

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
  // The target is read to nine decimal places (parts per billion) and the
  // share computed in 128-bit integers: exact, and what a person expects
  // (0.95 of 1000 is 950, where the double nearest 0.95 would give 949).
  const auto ppb = static_cast<uint64_t>(std::llround(target_utilization_ * 1e9));
  const unsigned __int128 product = static_cast<unsigned __int128>(total_bytes_) * ppb;
  const auto usable = static_cast<uint64_t>(product / 1000000000u);
  available_bytes_ = usable > reserved_bytes_ ? usable - reserved_bytes_ : 0;
}

std::string VramBudget::ToString() const {
  return absl::StrCat("total=", total_bytes_, " reserved=", reserved_bytes_,
                      " target=", target_utilization_, " available=", available_bytes_);
}

}  // namespace optstate
