// Which daemon holds a group when a client spreads its groups over several:
// weighted rendezvous (highest random weight) hashing of (tenant, group name,
// member identity). Each group goes to the member with the highest score, so
// adding a member moves only the groups that now rank it first (about 1/N of
// them, weighted), and removing one moves only the groups it held. No gRPC;
// not API.
//
// The hash is part of the contract between clients of different versions:
// two clients that place the same group on different members would split its
// state. RendezvousHash's values are pinned by tests and never change.
#ifndef OPTSTATE_CLIENT_PLACEMENT_RENDEZVOUS_H_
#define OPTSTATE_CLIENT_PLACEMENT_RENDEZVOUS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace optstate::client_internal {

struct PlacementMember {
  // Stable across restarts and address changes where possible: the target
  // string as configured, or a StatefulSet pod's DNS name.
  std::string identity;
  // Relative capacity; a member of weight 2 gets twice the share of one of
  // weight 1. Finite and > 0.
  double weight = 1.0;
};

// 64 bits of SplitMix64-finished FNV-1a over each field's length (8 bytes,
// little-endian) and bytes, in the order tenant, group, member: no two
// different triples share an encoding.
uint64_t RendezvousHash(absl::string_view tenant, absl::string_view group,
                        absl::string_view member);

// weight / -ln(u), with u in (0, 1) the hash's top 53 bits (the weighted
// rendezvous score: the chance a member wins is its share of the weights).
double RendezvousScore(const PlacementMember& member, absl::string_view tenant,
                       absl::string_view group);

// INVALID_ARGUMENT naming the fault: no members, an empty or repeated
// identity, a weight that is not finite and > 0.
absl::Status CheckMembers(absl::Span<const PlacementMember> members);

// The index in `members` (CheckMembers-valid) of the group's owner: the
// highest score; on an exact tie, the smaller identity.
size_t OwnerOf(absl::Span<const PlacementMember> members, absl::string_view tenant,
               absl::string_view group);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_PLACEMENT_RENDEZVOUS_H_
