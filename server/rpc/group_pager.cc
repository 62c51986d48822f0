// Page tokens: web-safe base64 of a version tag, the tenant and the name of
// the previous page's last group. Opaque to clients; checked on the way in.
#include "server/rpc/group_pager.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/engine/state_store.h"

namespace optstate {
namespace {

constexpr absl::string_view kTokenTag = "optstate.groups.v1";
constexpr absl::string_view kAllTenantsTag = "optstate.groups.all.v1";

std::string EncodeToken(const GroupKey& key, bool all_tenants) {
  return absl::WebSafeBase64Escape(absl::StrCat(all_tenants ? kAllTenantsTag : kTokenTag, "\n",
                                                key.tenant, "\n", key.name));
}

absl::Status BadToken() {
  return absl::InvalidArgumentError(
      "page_token is not a page token of this daemon for your tenant: pass next_page_token of "
      "the previous response unchanged, or leave it empty for the first page");
}

}  // namespace

absl::StatusOr<GroupPageStart> StartGroupPage(const std::vector<std::shared_ptr<Group>>& sorted,
                                              const std::string& tenant, bool all_tenants,
                                              int32_t page_size, const std::string& page_token) {
  if (page_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("page_size must be >= 0 (0 means ",
                                                   kDefaultGroupPageSize, "), got ", page_size));
  }
  GroupPageStart start;
  start.limit = page_size == 0 ? kDefaultGroupPageSize : std::min(page_size, kMaxGroupPageSize);
  if (page_token.empty()) return start;
  std::string decoded;
  if (page_token.size() > 4096 || !absl::WebSafeBase64Unescape(page_token, &decoded)) {
    return BadToken();
  }
  const size_t first = decoded.find('\n');
  const size_t second = first == std::string::npos ? first : decoded.find('\n', first + 1);
  if (second == std::string::npos ||
      decoded.substr(0, first) != (all_tenants ? kAllTenantsTag : kTokenTag)) {
    return BadToken();
  }
  const std::string after_tenant = decoded.substr(first + 1, second - first - 1);
  if (!all_tenants && after_tenant != tenant) return BadToken();
  const std::string after = decoded.substr(second + 1);
  if (!ValidateGroupName(after).ok()) return BadToken();
  if (all_tenants) {
    start.begin = std::upper_bound(sorted.begin(), sorted.end(), std::tie(after_tenant, after),
                                   [](const auto& key, const std::shared_ptr<Group>& g) {
                                     return key < std::tie(g->key().tenant, g->key().name);
                                   }) -
                  sorted.begin();
    return start;
  }
  start.begin = std::upper_bound(sorted.begin(), sorted.end(), after,
                                 [](const std::string& name, const std::shared_ptr<Group>& g) {
                                   return name < g->key().name;
                                 }) -
                sorted.begin();
  return start;
}

std::string NextGroupPageToken(const std::vector<std::shared_ptr<Group>>& sorted, size_t end,
                               bool all_tenants) {
  if (end == 0 || end >= sorted.size()) return "";
  return EncodeToken(sorted[end - 1]->key(), all_tenants);
}

}  // namespace optstate
