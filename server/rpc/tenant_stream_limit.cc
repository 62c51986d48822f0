// Counts per tenant; the entry goes when its last stream ends.
#include "server/rpc/tenant_stream_limit.h"

#include "absl/strings/str_cat.h"

namespace optstate {

void StreamSlot::GiveBack() {
  if (limit_ != nullptr) limit_->Release(tenant_);
  limit_ = nullptr;
}

absl::StatusOr<StreamSlot> TenantStreamLimit::Acquire(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  int& open = open_[tenant];
  if (max_ > 0 && open >= max_) {
    const int held = open;
    return absl::ResourceExhaustedError(absl::StrCat("tenant '", tenant, "' has ", held, " ", kind_,
                                                     " streams open, its limit "
                                                     "--tenant_max_streams=",
                                                     max_, "; ", advice_));
  }
  ++open;
  return StreamSlot(this, tenant);
}

int TenantStreamLimit::OpenOf(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  const auto it = open_.find(tenant);
  return it == open_.end() ? 0 : it->second;
}

void TenantStreamLimit::Release(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(tenant);
  if (it != open_.end() && --it->second == 0) open_.erase(it);
}

}  // namespace optstate
