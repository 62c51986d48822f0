// getaddrinfo for the addresses, getnameinfo(NI_NAMEREQD) for each name.
#include "client/placement/dns_members.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace optstate::client_internal {

absl::StatusOr<std::vector<ResolvedMember>> ResolveMembers(const std::string& target) {
  absl::string_view rest(target);
  absl::ConsumePrefix(&rest, "dns:///");
  const size_t colon = rest.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 || absl::StartsWith(rest, "[") ||
      absl::StartsWith(rest, "unix:")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "members_from_dns needs a target 'name:port' (a DNS name), not '", target, "'"));
  }
  const std::string host(rest.substr(0, colon)), port(rest.substr(colon + 1));
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); e != 0) {
    return absl::UnavailableError(
        absl::StrCat("'", host, "' does not resolve (", gai_strerror(e), ")"));
  }
  std::set<std::string> seen;
  std::vector<ResolvedMember> members;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char ip[NI_MAXHOST], name[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, ip, sizeof(ip), nullptr, 0, NI_NUMERICHOST) != 0) {
      continue;
    }
    const std::string address = a->ai_family == AF_INET6 ? absl::StrCat("[", ip, "]") : ip;
    ResolvedMember m{absl::StrCat(address, ":", port), ""};
    if (!seen.insert(m.target).second) continue;
    const bool named =
        getnameinfo(a->ai_addr, a->ai_addrlen, name, sizeof(name), nullptr, 0, NI_NAMEREQD) == 0;
    m.identity = named ? absl::StrCat(name, ":", port) : m.target;
    members.push_back(std::move(m));
  }
  freeaddrinfo(found);
  std::sort(members.begin(), members.end(),
            [](const ResolvedMember& a, const ResolvedMember& b) { return a.target < b.target; });
  if (members.empty()) {
    return absl::UnavailableError(absl::StrCat("'", host, "' resolves to no address"));
  }
  return members;
}

}  // namespace optstate::client_internal
