// Per-tenant limits the state store enforces at registration and import,
// and where they come from (the tokens file, through the auth layer).
#ifndef OPTSTATE_SERVER_ENGINE_TENANT_QUOTAS_H_
#define OPTSTATE_SERVER_ENGINE_TENANT_QUOTAS_H_

#include <cstdint>
#include <limits>
#include <string>

namespace optstate {

// A tenant's limits; the maximum means none.
struct TenantQuota {
  uint64_t max_host_bytes = std::numeric_limits<uint64_t>::max();  // Host state, 12 B/element.
  uint64_t max_groups = std::numeric_limits<uint64_t>::max();      // Groups held at once.
};

// Thread-safe; QuotaOf may be called under the store's lock, so it must not
// call back into the store.
class TenantQuotas {
 public:
  virtual ~TenantQuotas() = default;
  // The limits of `tenant` now (they may change when the tokens file is
  // reloaded; groups already held are kept).
  virtual TenantQuota QuotaOf(const std::string& tenant) const = 0;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_ENGINE_TENANT_QUOTAS_H_
