#include "client/placement/rendezvous.h"

#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace optstate::client_internal {

namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
constexpr uint64_t kFnvPrime = 0x100000001b3ULL;

uint64_t FnvByte(uint64_t h, uint8_t byte) { return (h ^ byte) * kFnvPrime; }

uint64_t FnvField(uint64_t h, absl::string_view field) {
  uint64_t length = field.size();
  for (int i = 0; i < 8; ++i) h = FnvByte(h, static_cast<uint8_t>(length >> (8 * i)));
  for (char c : field) h = FnvByte(h, static_cast<uint8_t>(c));
  return h;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t RendezvousHash(absl::string_view tenant, absl::string_view group,
                        absl::string_view member) {
  uint64_t h = kFnvOffset;
  h = FnvField(h, tenant);
  h = FnvField(h, group);
  h = FnvField(h, member);
  return SplitMix64(h);
}

double RendezvousScore(const PlacementMember& member, absl::string_view tenant,
                       absl::string_view group) {
  // (k + 0.5) / 2^53 for the top 53 bits k: never 0, never 1.
  const double u =
      (static_cast<double>(RendezvousHash(tenant, group, member.identity) >> 11) + 0.5) /
      9007199254740992.0;
  return member.weight / -std::log(u);
}

absl::Status CheckMembers(absl::Span<const PlacementMember> members) {
  if (members.empty()) return absl::InvalidArgumentError("no daemons given: name at least one");
  absl::flat_hash_set<absl::string_view> seen;
  for (size_t i = 0; i < members.size(); ++i) {
    const PlacementMember& m = members[i];
    if (m.identity.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("daemon ", i, " has an empty identity"));
    }
    if (!seen.insert(m.identity).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("daemon '", m.identity, "' is named twice; each member once"));
    }
    if (!std::isfinite(m.weight) || !(m.weight > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "daemon '", m.identity, "' has weight ", m.weight, "; a weight must be finite and > 0"));
    }
  }
  return absl::OkStatus();
}

size_t OwnerOf(absl::Span<const PlacementMember> members, absl::string_view tenant,
               absl::string_view group) {
  size_t best = 0;
  double best_score = RendezvousScore(members[0], tenant, group);
  for (size_t i = 1; i < members.size(); ++i) {
    const double score = RendezvousScore(members[i], tenant, group);
    if (score > best_score ||
        (score == best_score && members[i].identity < members[best].identity)) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

}  // namespace optstate::client_internal
