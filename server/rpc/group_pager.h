// Pages of a tenant's groups for GetStats and ListGroups, as List methods
// page in the Google API design guide: page_size, and opaque page tokens.
#ifndef OPTSTATE_SERVER_RPC_GROUP_PAGER_H_
#define OPTSTATE_SERVER_RPC_GROUP_PAGER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/state/group.h"

namespace optstate {

inline constexpr int32_t kDefaultGroupPageSize = 1000;  // page_size 0.
inline constexpr int32_t kMaxGroupPageSize = 1000;      // Larger ones are read as this.

// Where a page starts and how many groups it may hold.
struct GroupPageStart {
  size_t begin = 0;  // Index into the sorted groups.
  size_t limit = 0;  // Groups at most.
};

// `sorted`: `tenant`'s groups by name (StateStore::List), or with
// `all_tenants` (an admin's listing) every tenant's by (tenant, name)
// (StateStore::ListAll). A token names the last group of the previous page,
// so the next page starts after it even if that group has been deleted
// meanwhile: no group is skipped or repeated. INVALID_ARGUMENT for a
// negative page_size, or a token this daemon did not issue (or issued to
// another tenant, or for the other kind of listing).
absl::StatusOr<GroupPageStart> StartGroupPage(const std::vector<std::shared_ptr<Group>>& sorted,
                                              const std::string& tenant, bool all_tenants,
                                              int32_t page_size, const std::string& page_token);

// The token for the page after the one ending just before `sorted[end]`;
// empty when `end` is past the last group.
std::string NextGroupPageToken(const std::vector<std::shared_ptr<Group>>& sorted, size_t end,
                               bool all_tenants);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_GROUP_PAGER_H_
