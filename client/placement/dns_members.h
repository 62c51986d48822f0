// The members behind one DNS name (a Kubernetes headless Service resolves to
// one address per pod): ClientOptions::members_from_dns. Not API.
#ifndef OPTSTATE_CLIENT_PLACEMENT_DNS_MEMBERS_H_
#define OPTSTATE_CLIENT_PLACEMENT_DNS_MEMBERS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace optstate::client_internal {

struct ResolvedMember {
  std::string target;    // "IP:PORT" or "[IPv6]:PORT".
  std::string identity;  // "NAME:PORT" from reverse DNS, else the target.
};

// One member per distinct address `target` ("host:port", or with gRPC's
// dns:/// prefix) resolves to, sorted by target. INVALID_ARGUMENT for a
// target that is not host:port; UNAVAILABLE naming it when it does not
// resolve.
absl::StatusOr<std::vector<ResolvedMember>> ResolveMembers(const std::string& target);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_PLACEMENT_DNS_MEMBERS_H_
