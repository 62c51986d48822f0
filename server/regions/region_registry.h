// The shared-memory regions clients registered (same-host data plane): each
// a sealed memfd mapped once, owned by one session (a region socket
// connection) of one tenant, bounds-checked on every reference.
#ifndef OPTSTATE_SERVER_REGIONS_REGION_REGISTRY_H_
#define OPTSTATE_SERVER_REGIONS_REGION_REGISTRY_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace optstate {

struct RegionLimits {
  uint32_t max_regions_per_client = 16;
  uint64_t max_region_bytes = 64ull << 30;  // All regions mapped, together.
  // Regions of all clients together: each is a mapping, and the kernel's
  // per-process limit on mappings (vm.max_map_count, 65530 by default) is
  // shared with the daemon's own allocations.
  uint32_t max_regions = 4096;
  // One tenant's regions (all its connections) and their bytes, registered
  // at once; 0: no limit but the daemon's.
  uint32_t max_regions_per_tenant = 0;
  uint64_t max_region_bytes_per_tenant = 0;
  // Bytes of the objects all sessions keep together (Keep: step plans);
  // past it the least recently used anywhere is forgotten.
  uint64_t max_kept_bytes = 256ull << 20;
};

// One mapped region. Unmapped when the last reference goes: the registry's
// (until unregistered) or that of a step using it. Its size never changes:
// the file is sealed against shrinking, so no access within it can fault.
class MappedRegion {
 public:
  MappedRegion(uint64_t id, std::string tenant, char* base, uint64_t bytes,
               std::shared_ptr<std::atomic<uint64_t>> mapped_bytes)
      : id_(id),
        tenant_(std::move(tenant)),
        base_(base),
        bytes_(bytes),
        mapped_bytes_(std::move(mapped_bytes)) {}
  ~MappedRegion();
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  uint64_t id() const { return id_; }
  const std::string& tenant() const { return tenant_; }
  uint64_t bytes() const { return bytes_; }

  // Bytes [offset, offset + length) of the region, or OUT_OF_RANGE (saying
  // the region's size) when they are not all inside it. `what` names the
  // reference in the message.
  absl::StatusOr<char*> Slice(uint64_t offset, uint64_t length, absl::string_view what) const;

 private:
  const uint64_t id_;
  const std::string tenant_;
  char* const base_;
  const uint64_t bytes_;
  const std::shared_ptr<std::atomic<uint64_t>> mapped_bytes_;
};

// What GetStats reports of the registry.
struct RegionRegistryStats {
  uint64_t sessions = 0;
  uint64_t regions = 0;           // Registered now.
  uint64_t registered_bytes = 0;  // Of the registered regions.
  uint64_t mapped_bytes = 0;      // Registered, or unregistered and still used by a step.
  uint64_t registrations = 0;     // Since the registry was made.
  uint64_t kept = 0;              // Objects the sessions keep (Keep).
  uint64_t kept_bytes = 0;        // Their bytes, as kept.
  uint64_t kept_found = 0;        // Kept objects found by Kept, since the registry was made.
  // Region socket requests refused, by status code (CountRefusal), since the
  // registry was made.
  std::array<uint64_t, 17> refusals{};
};

// Thread-safe.
class RegionRegistry {
 public:
  explicit RegionRegistry(const RegionLimits& limits);
  ~RegionRegistry();
  RegionRegistry(const RegionRegistry&) = delete;
  RegionRegistry& operator=(const RegionRegistry&) = delete;

  const RegionLimits& limits() const { return limits_; }

  // A new session for `tenant`: a random key of region_protocol::kKeyBytes
  // bytes, which Step chunks present to name the session's regions.
  std::string OpenSession(const std::string& tenant) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets the session and every region of it (each unmapped once no step
  // uses it). Unknown keys are ignored.
  void CloseSession(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives the session `key` to `tenant` (the region socket's
  // authentication). FAILED_PRECONDITION once it holds a region, NOT_FOUND
  // for an unknown session.
  absl::Status SetSessionTenant(const std::string& key, const std::string& tenant)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Maps memfd `fd` (always closed, whatever the outcome) as a region of the
  // session `key`. INVALID_ARGUMENT when the fd is not a sealable memfd or
  // lacks F_SEAL_SHRINK, is empty, or cannot be mapped read-write (a write
  // seal); RESOURCE_EXHAUSTED past --max_regions_per_client, --max_regions,
  // --max_region_bytes, --tenant_max_regions or --tenant_max_region_bytes;
  // NOT_FOUND for an unknown session.
  absl::StatusOr<std::shared_ptr<const MappedRegion>> Register(const std::string& key, int fd)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets region `id` of session `key`; NOT_FOUND when it has none such.
  absl::Status Unregister(const std::string& key, uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  // Region `id` of session `key`, for a caller of `tenant`. NOT_FOUND, the
  // same for every case so nothing about other sessions shows, when the
  // session does not exist, has no such region, or belongs to another
  // tenant.
  absl::StatusOr<std::shared_ptr<const MappedRegion>> Find(const std::string& tenant,
                                                           absl::string_view key, uint64_t id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Objects a session keeps for its client until it ends (the rpc layer's
  // step plans, StepRequest.plan), by the client's number for them: opaque
  // here, the registry never looks into them but for their `bytes` (the
  // memory each holds, as its keeper counts it). Keep replaces the object
  // of that number; past kMaxKeptPerSession objects it forgets the session's
  // least recently kept or looked up, and past limits().max_kept_bytes the
  // least recently used of all sessions. NOT_FOUND (as Find's) for a session
  // that does not exist or is another tenant's; RESOURCE_EXHAUSTED, nothing
  // kept, for an object of more than max_kept_bytes. An object goes with its
  // session (CloseSession), or when kept over or pushed out.
  static constexpr size_t kMaxKeptPerSession = 8;
  absl::Status Keep(const std::string& tenant, absl::string_view key, uint64_t number,
                    std::shared_ptr<const void> object, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The object of `number`, or null when the session keeps none of that
  // number; NOT_FOUND as for Keep.
  absl::StatusOr<std::shared_ptr<const void>> Kept(const std::string& tenant, absl::string_view key,
                                                   uint64_t number) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets the object of `number`, if the session keeps one.
  void Unkeep(const std::string& tenant, absl::string_view key, uint64_t number)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Bytes mapped now (regions unregistered but still used by a step included).
  uint64_t mapped_bytes() const { return mapped_bytes_->load(); }
  size_t num_sessions() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t num_regions() const ABSL_LOCKS_EXCLUDED(mu_);
  RegionRegistryStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // Counts a region socket request answered with `code` (not OK).
  void CountRefusal(absl::StatusCode code) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct KeptObject {
    uint64_t number = 0;
    uint64_t last_use = 0;  // Of the registry's use_clock_.
    uint64_t bytes = 0;
    std::shared_ptr<const void> object;
  };
  struct Session {
    std::string tenant;
    absl::flat_hash_map<uint64_t, std::shared_ptr<const MappedRegion>> regions;
    std::vector<KeptObject> kept;  // At most kMaxKeptPerSession.
  };
  // The session `key` of `tenant`, or null.
  Session* SessionOf(const std::string& tenant, absl::string_view key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RegionLimits limits_;
  const std::shared_ptr<std::atomic<uint64_t>> mapped_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  size_t regions_ ABSL_GUARDED_BY(mu_) = 0;  // Registered, all sessions.
  uint64_t registered_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Registered regions and their bytes per tenant (entries of tenants with
  // none are removed).
  struct TenantRegions {
    uint64_t regions = 0;
    uint64_t bytes = 0;
  };
  absl::flat_hash_map<std::string, TenantRegions> by_tenant_ ABSL_GUARDED_BY(mu_);
  // Counts `region` of `tenant` out of registered_bytes_, regions_ and by_tenant_.
  void Forget(const std::string& tenant, const MappedRegion& region)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t use_clock_ ABSL_GUARDED_BY(mu_) = 0;  // Orders kept objects' uses.
  uint64_t kept_found_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // Of the kept objects, all sessions.
  std::array<uint64_t, 17> refusals_ ABSL_GUARDED_BY(mu_){};
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_REGIONS_REGION_REGISTRY_H_
