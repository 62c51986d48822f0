// Admission, removal and first-fit promotion of groups under the budget.
#include "server/backends/cuda/paging/paging_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace optstate {

PagingPolicy::PagingPolicy(PagingStrategy strategy, VramBudget budget, uint64_t staging_pool_bytes)
    : strategy_(strategy),
      budget_(budget),
      staging_pool_bytes_(staging_pool_bytes),
      capacity_bytes_(budget.available_bytes() > staging_pool_bytes
                          ? budget.available_bytes() - staging_pool_bytes
                          : 0) {}

uint64_t PagingPolicy::resident_bytes() const {
  absl::MutexLock lock(&mu_);
  return resident_bytes_;
}

size_t PagingPolicy::num_groups() const {
  absl::MutexLock lock(&mu_);
  return groups_.size();
}

absl::StatusOr<Placement> PagingPolicy::Admit(uint64_t id, absl::string_view name,
                                              uint64_t device_bytes) {
  absl::MutexLock lock(&mu_);
  if (groups_.contains(id)) {
    return absl::InvalidArgumentError(absl::StrCat("group id ", id, " is already placed"));
  }
  const uint64_t free_bytes = capacity_bytes_ - resident_bytes_;
  const bool fits = device_bytes <= free_bytes;
  Placement placement = Placement::kDevicePaged;
  switch (strategy_) {
    case PagingStrategy::kNone:
      if (!fits) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "group '", name, "' needs ", device_bytes, " bytes of VRAM (", kStateBytesPerElement,
            " per element) but only ", free_bytes, " of ", capacity_bytes_,
            " bytes are available (budget ", budget_.ToString(), ", staging pool ",
            staging_pool_bytes_,
            "); with --paging=none every group must fit. Delete groups, raise "
            "--vram_target_utilization, lower --vram_reserved_bytes, or use --paging=adaptive"));
      }
      placement = Placement::kDeviceResident;
      break;
    case PagingStrategy::kAdaptive:
      placement = fits ? Placement::kDeviceResident : Placement::kDevicePaged;
      break;
    case PagingStrategy::kFullyPaged:
      placement = Placement::kDevicePaged;
      break;
  }
  if (placement == Placement::kDeviceResident) resident_bytes_ += device_bytes;
  groups_.emplace(id, Entry{next_order_++, device_bytes, placement});
  return placement;
}

std::vector<uint64_t> PagingPolicy::Remove(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(id);
  if (it == groups_.end()) return {};
  const bool was_resident = it->second.placement == Placement::kDeviceResident;
  if (was_resident) resident_bytes_ -= it->second.device_bytes;
  groups_.erase(it);
  if (!was_resident || strategy_ != PagingStrategy::kAdaptive) return {};

  std::vector<std::pair<uint64_t, uint64_t>> paged;  // (order, id)
  for (const auto& [other, entry] : groups_) {
    if (entry.placement == Placement::kDevicePaged) paged.emplace_back(entry.order, other);
  }
  std::sort(paged.begin(), paged.end());
  std::vector<uint64_t> promoted;
  for (const auto& [order, other] : paged) {
    Entry& entry = groups_[other];
    if (entry.device_bytes <= capacity_bytes_ - resident_bytes_) {
      entry.placement = Placement::kDeviceResident;
      resident_bytes_ += entry.device_bytes;
      promoted.push_back(other);
    }
  }
  return promoted;
}

void PagingPolicy::FallBackToPaged(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(id);
  if (it == groups_.end() || it->second.placement != Placement::kDeviceResident) return;
  resident_bytes_ -= it->second.device_bytes;
  it->second.placement = Placement::kDevicePaged;
}

Placement PagingPolicy::placement(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(id);
  return it == groups_.end() ? Placement::kHost : it->second.placement;
}

}  // namespace optstate
