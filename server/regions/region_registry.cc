// Region registration: the checks that make a mapping safe to read and write
// for as long as it is mapped.
//
// 1. Only a file that carries F_SEAL_SHRINK is mapped. The seal can never be
//    removed, so the file never becomes shorter than the size read after the
//    check: no page of the mapping can lose its backing, which is what turns
//    an access into SIGBUS (a file in /dev/shm could be truncated by anyone
//    who can open it; a memfd reached us only through the fd its owner sent).
// 2. The size is read once, after the seal check, and every reference is
//    checked against it (MappedRegion::Slice): growth (if not sealed) is
//    harmless and ignored.
// 3. A region belongs to the session that registered it (a random key given
//    only over that socket connection) and its tenant; lookups from anyone
//    else get NOT_FOUND, the same answer as for an id that never existed.
// 4. The bytes mapped are reserved against the limit before mmap and given
//    back by munmap, which runs when the last reference goes (a step in
//    flight keeps the region mapped until it is done).
#include "server/regions/region_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/region_protocol.h"

namespace optstate {

MappedRegion::~MappedRegion() {
  munmap(base_, bytes_);
  mapped_bytes_->fetch_sub(bytes_);
}

absl::StatusOr<char*> MappedRegion::Slice(uint64_t offset, uint64_t length,
                                          absl::string_view what) const {
  if (offset > bytes_ || length > bytes_ - offset) {
    return absl::OutOfRangeError(absl::StrCat(what, " names ", length, " bytes at offset ", offset,
                                              " of region ", id_, ", which has ", bytes_,
                                              " bytes"));
  }
  return base_ + offset;
}

RegionRegistry::RegionRegistry(const RegionLimits& limits)
    : limits_(limits), mapped_bytes_(std::make_shared<std::atomic<uint64_t>>(0)) {}

RegionRegistry::~RegionRegistry() = default;

std::string RegionRegistry::OpenSession(const std::string& tenant) {
  std::string key(region_protocol::kKeyBytes, '\0');
  absl::MutexLock lock(&mu_);
  do {
    size_t got = 0;
    while (got < key.size()) {
      const ssize_t n = getrandom(key.data() + got, key.size() - got, 0);
      if (n > 0) got += static_cast<size_t>(n);
    }
  } while (sessions_.contains(key));
  sessions_[key].tenant = tenant;
  return key;
}

absl::Status RegionRegistry::SetSessionTenant(const std::string& key, const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return absl::NotFoundError("no such region session");
  if (!it->second.regions.empty()) {
    return absl::FailedPreconditionError(
        "authenticate a region socket connection before registering regions on it");
  }
  it->second.tenant = tenant;
  return absl::OkStatus();
}

void RegionRegistry::CloseSession(const std::string& key) {
  Session gone;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(key);
    if (it == sessions_.end()) return;
    gone = std::move(it->second);
    for (const auto& [id, region] : gone.regions) Forget(gone.tenant, *region);
    for (const KeptObject& k : gone.kept) kept_bytes_ -= k.bytes;
    sessions_.erase(it);
  }
  // `gone` unmaps its regions here, outside the lock (unless a step still uses one).
}

absl::StatusOr<std::shared_ptr<const MappedRegion>> RegionRegistry::Register(const std::string& key,
                                                                             int fd) {
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(
        "the fd is not a memfd that allows sealing; create the region with "
        "memfd_create(MFD_ALLOW_SEALING) and seal it with F_SEAL_SHRINK");
  }
  if ((seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) == F_SEAL_SEAL) {
    // Sealed against sealing: a memfd made without MFD_ALLOW_SEALING.
    return absl::InvalidArgumentError(
        "the memfd does not allow sealing (made without MFD_ALLOW_SEALING), so it cannot carry "
        "F_SEAL_SHRINK; create the region with memfd_create(MFD_ALLOW_SEALING) and seal it");
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(
        "the memfd lacks F_SEAL_SHRINK; seal it (fcntl F_ADD_SEALS) before registering it, so "
        "it cannot be truncated while the daemon maps it");
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError("the fd is not a regular memory file");
  }
  const uint64_t bytes = static_cast<uint64_t>(st.st_size);
  if (bytes == 0) return absl::InvalidArgumentError("the region is empty; size it before sealing");

  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return absl::NotFoundError("unknown region session");
  Session& session = it->second;
  if (session.regions.size() >= limits_.max_regions_per_client) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this client has ", session.regions.size(), " regions, the most --max_regions_per_client=",
        limits_.max_regions_per_client, " allows; unregister one first"));
  }
  if (regions_ >= limits_.max_regions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the daemon holds ", regions_, " regions, the most --max_regions=", limits_.max_regions,
        " allows; use the wire or try again later"));
  }
  const uint64_t mapped = mapped_bytes_->load();
  if (bytes > limits_.max_region_bytes || mapped > limits_.max_region_bytes - bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a region of ", bytes, " bytes does not fit: ", mapped, " of --max_region_bytes=",
        limits_.max_region_bytes, " are mapped already; use a smaller region or the wire"));
  }
  // A tenant's regions, over all its connections: pages of them the daemon
  // touches first (the params it writes) count as the daemon's memory.
  const TenantRegions held =
      by_tenant_.contains(session.tenant) ? by_tenant_.at(session.tenant) : TenantRegions();
  if (limits_.max_regions_per_tenant != 0 && held.regions >= limits_.max_regions_per_tenant) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant '", session.tenant, "' has ", held.regions,
        " regions registered, the most --tenant_max_regions=", limits_.max_regions_per_tenant,
        " allows; unregister one (or close a client)"));
  }
  if (limits_.max_region_bytes_per_tenant != 0 &&
      (bytes > limits_.max_region_bytes_per_tenant ||
       held.bytes > limits_.max_region_bytes_per_tenant - bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a region of ", bytes, " bytes does not fit tenant '", session.tenant, "': it has ",
        held.bytes, " of --tenant_max_region_bytes=", limits_.max_region_bytes_per_tenant,
        " registered; use a smaller region, close a client, or the wire"));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int error = errno;
    if (error == ENOMEM) {  // A hugetlb memfd without huge pages to back it, say.
      return absl::ResourceExhaustedError(absl::StrCat(
          "the memfd cannot be mapped (", std::strerror(error), "): no memory for a mapping of ",
          bytes, " bytes (a hugetlb memfd needs free huge pages); use a plain memfd or the wire"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("the memfd cannot be mapped read-write (", std::strerror(error),
                     "); a region may not carry F_SEAL_WRITE or F_SEAL_FUTURE_WRITE"));
  }
  mapped_bytes_->fetch_add(bytes);
  const uint64_t id = next_id_++;
  auto region = std::make_shared<const MappedRegion>(id, session.tenant, static_cast<char*>(base),
                                                     bytes, mapped_bytes_);
  session.regions[id] = region;
  ++regions_;
  ++registrations_;
  registered_bytes_ += bytes;
  TenantRegions& tenant = by_tenant_[session.tenant];
  ++tenant.regions;
  tenant.bytes += bytes;
  return region;
}

void RegionRegistry::Forget(const std::string& tenant, const MappedRegion& region) {
  --regions_;
  registered_bytes_ -= region.bytes();
  auto it = by_tenant_.find(tenant);
  if (it == by_tenant_.end()) return;
  --it->second.regions;
  it->second.bytes -= region.bytes();
  if (it->second.regions == 0) by_tenant_.erase(it);
}

absl::Status RegionRegistry::Unregister(const std::string& key, uint64_t id) {
  std::shared_ptr<const MappedRegion> gone;
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(key);
  if (it != sessions_.end()) {
    auto region = it->second.regions.find(id);
    if (region != it->second.regions.end()) {
      gone = std::move(region->second);
      it->second.regions.erase(region);
      Forget(it->second.tenant, *gone);
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("this client has no region ", id));
}

absl::StatusOr<std::shared_ptr<const MappedRegion>> RegionRegistry::Find(const std::string& tenant,
                                                                         absl::string_view key,
                                                                         uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(key);
  if (it != sessions_.end() && it->second.tenant == tenant) {
    auto region = it->second.regions.find(id);
    if (region != it->second.regions.end()) return region->second;
  }
  return absl::NotFoundError(absl::StrCat(
      "region ", id,
      " is not registered by this client (unknown, unregistered, its client gone, or another "
      "client's); register it on the region socket and name its session key"));
}

RegionRegistry::Session* RegionRegistry::SessionOf(const std::string& tenant,
                                                   absl::string_view key) {
  auto it = sessions_.find(key);
  if (it == sessions_.end() || it->second.tenant != tenant) return nullptr;
  return &it->second;
}

namespace {

absl::Status UnknownSession() {
  return absl::NotFoundError(
      "the region session is not this client's (unknown, its client gone, or another "
      "client's); name the session key the region socket gave this client");
}

}  // namespace

absl::Status RegionRegistry::Keep(const std::string& tenant, absl::string_view key, uint64_t number,
                                  std::shared_ptr<const void> object, uint64_t bytes) {
  std::vector<std::shared_ptr<const void>> gone;  // Destroyed outside the lock.
  absl::MutexLock lock(&mu_);
  Session* session = SessionOf(tenant, key);
  if (session == nullptr) return UnknownSession();
  if (bytes > limits_.max_kept_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("an object of ", bytes, " bytes is more than the ", limits_.max_kept_bytes,
                     " the sessions may keep together"));
  }
  std::vector<KeptObject>& kept = session->kept;
  auto slot = std::find_if(kept.begin(), kept.end(),
                           [&](const KeptObject& k) { return k.number == number; });
  if (slot == kept.end() && kept.size() >= kMaxKeptPerSession) {
    slot = std::min_element(kept.begin(), kept.end(), [](const KeptObject& a, const KeptObject& b) {
      return a.last_use < b.last_use;
    });
  }
  if (slot == kept.end()) slot = kept.insert(kept.end(), KeptObject{});
  kept_bytes_ -= slot->bytes;
  gone.push_back(std::move(slot->object));
  *slot = KeptObject{number, ++use_clock_, bytes, std::move(object)};
  kept_bytes_ += bytes;
  // Past the limit: the least recently used of every session's goes (never
  // the one just kept, the most recent).
  while (kept_bytes_ > limits_.max_kept_bytes) {
    Session* oldest_session = nullptr;
    size_t oldest = 0;
    for (auto& [k, s] : sessions_) {
      for (size_t i = 0; i < s.kept.size(); ++i) {
        if (oldest_session == nullptr ||
            s.kept[i].last_use < oldest_session->kept[oldest].last_use) {
          oldest_session = &s;
          oldest = i;
        }
      }
    }
    KeptObject& victim = oldest_session->kept[oldest];
    kept_bytes_ -= victim.bytes;
    gone.push_back(std::move(victim.object));
    oldest_session->kept.erase(oldest_session->kept.begin() + static_cast<ptrdiff_t>(oldest));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const void>> RegionRegistry::Kept(const std::string& tenant,
                                                                 absl::string_view key,
                                                                 uint64_t number) {
  absl::MutexLock lock(&mu_);
  Session* session = SessionOf(tenant, key);
  if (session == nullptr) return UnknownSession();
  for (KeptObject& k : session->kept) {
    if (k.number != number) continue;
    k.last_use = ++use_clock_;
    ++kept_found_;
    return k.object;
  }
  return std::shared_ptr<const void>();
}

void RegionRegistry::Unkeep(const std::string& tenant, absl::string_view key, uint64_t number) {
  std::shared_ptr<const void> gone;  // Destroyed outside the lock.
  absl::MutexLock lock(&mu_);
  Session* session = SessionOf(tenant, key);
  if (session == nullptr) return;
  std::vector<KeptObject>& kept = session->kept;
  for (auto it = kept.begin(); it != kept.end(); ++it) {
    if (it->number != number) continue;
    gone = std::move(it->object);
    kept_bytes_ -= it->bytes;
    kept.erase(it);
    return;
  }
}

size_t RegionRegistry::num_sessions() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

size_t RegionRegistry::num_regions() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [key, session] : sessions_) n += session.regions.size();
  return n;
}

RegionRegistryStats RegionRegistry::Stats() const {
  absl::MutexLock lock(&mu_);
  RegionRegistryStats stats;
  stats.sessions = sessions_.size();
  stats.regions = regions_;
  stats.registered_bytes = registered_bytes_;
  stats.mapped_bytes = mapped_bytes_->load();
  stats.registrations = registrations_;
  for (const auto& [key, session] : sessions_) stats.kept += session.kept.size();
  stats.kept_found = kept_found_;
  stats.kept_bytes = kept_bytes_;
  stats.refusals = refusals_;
  return stats;
}

void RegionRegistry::CountRefusal(absl::StatusCode code) {
  const size_t index = static_cast<size_t>(code);
  if (code == absl::StatusCode::kOk || index >= refusals_.size()) return;
  absl::MutexLock lock(&mu_);
  ++refusals_[index];
}

}  // namespace optstate
