// The lease metadata's syntax: space-separated key=value fields.
#include "server/rpc/call_lease.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace optstate {
namespace {

constexpr size_t kMaxHolderBytes = 128;
constexpr size_t kMaxFieldBytes = 256;
constexpr size_t kMaxTakeovers = 16;  // Holders one call may take over.

bool Printable(absl::string_view s) {
  for (char c : s) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "metadata 'optstate-lease' ", what,
      "; send 'holder=ID job=NAME host=HOST pid=PID' (holder required: 1 to 128 printable "
      "characters without spaces; the others optional)"));
}

absl::Status ParseHolder(absl::string_view value, LeaseHolder* holder) {
  bool seen[4] = {false, false, false, false};
  for (absl::string_view field : absl::StrSplit(value, ' ', absl::SkipEmpty())) {
    const size_t eq = field.find('=');
    if (eq == absl::string_view::npos) return Bad("has a field without '='");
    const absl::string_view key = field.substr(0, eq);
    const absl::string_view v = field.substr(eq + 1);
    int index;
    if (key == "holder") {
      index = 0;
    } else if (key == "job") {
      index = 1;
    } else if (key == "host") {
      index = 2;
    } else if (key == "pid") {
      index = 3;
    } else {
      return Bad("has a field other than holder, job, host and pid");
    }
    if (seen[index]) return Bad(absl::StrCat("names ", key, " twice"));
    seen[index] = true;
    if (!Printable(v)) return Bad(absl::StrCat("has a ", key, " that is not printable ASCII"));
    switch (index) {
      case 0:
        if (v.empty() || v.size() > kMaxHolderBytes) {
          return Bad("has a holder that is empty or over 128 characters");
        }
        holder->id = std::string(v);
        break;
      case 1:
      case 2:
        if (v.size() > kMaxFieldBytes) return Bad(absl::StrCat("has a ", key, " over 256 characters"));
        (index == 1 ? holder->job : holder->host) = std::string(v);
        break;
      default:
        if (v.empty() || !absl::SimpleAtoi(v, &holder->pid) ||
            v.find_first_not_of("0123456789") != absl::string_view::npos) {
          return Bad("has a pid that is not a decimal number");
        }
    }
  }
  if (!seen[0]) return Bad("names no holder");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LeaseClaim> ParseLeaseClaim(std::optional<absl::string_view> lease,
                                           std::optional<absl::string_view> takeover) {
  LeaseClaim claim;
  if (lease.has_value()) {
    if (absl::Status s = ParseHolder(*lease, &claim.holder); !s.ok()) return s;
  }
  if (takeover.has_value()) {
    // Space-separated: a holder id has no spaces.
    for (absl::string_view entry : absl::StrSplit(*takeover, ' ', absl::SkipEmpty())) {
      const size_t eq = entry.find('=');
      const absl::string_view kind = entry.substr(0, eq == absl::string_view::npos ? 0 : eq);
      const absl::string_view id =
          eq == absl::string_view::npos ? absl::string_view() : entry.substr(eq + 1);
      if ((kind != "expired" && kind != "dead") || id.empty() || id.size() > kMaxHolderBytes ||
          !Printable(id) || claim.takeovers.size() == kMaxTakeovers) {
        return absl::InvalidArgumentError(absl::StrCat(
            "metadata 'optstate-lease-takeover' must be 'expired=ID' (break ID's lease once it "
            "has expired) or 'dead=ID' (break it now: ID's process is gone), ID being the "
            "holder that GroupInfo.lease names; up to ",
            kMaxTakeovers, " of them, separated by spaces"));
      }
      claim.takeovers.push_back(
          {kind == "dead" ? TakeoverKind::kDead : TakeoverKind::kExpired, std::string(id)});
    }
    if (claim.takeovers.empty()) {
      return absl::InvalidArgumentError(
          "metadata 'optstate-lease-takeover' is empty; send 'expired=ID' or 'dead=ID' (or "
          "leave it out)");
    }
    if (claim.holder.id.empty()) {
      // A takeover moves the lease to the caller; without a holder of its own
      // it would step a group another holds, and leave that holder's lease.
      return absl::InvalidArgumentError(
          "metadata 'optstate-lease-takeover' needs 'optstate-lease' naming the caller as "
          "the new holder (holder=ID job=NAME ...): a takeover moves the lease to it");
    }
  }
  return claim;
}

absl::StatusOr<LeaseClaim> LeaseClaimOf(const grpc::CallbackServerContext* context) {
  const auto& metadata = context->client_metadata();
  for (const char* key : {"optstate-lease", "optstate-lease-takeover"}) {
    if (metadata.count(key) > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata '", key, "' was sent ", metadata.count(key), " times; send it once"));
    }
  }
  auto value = [&](const char* key) -> std::optional<absl::string_view> {
    auto it = metadata.find(key);
    if (it == metadata.end()) return std::nullopt;
    return absl::string_view(it->second.data(), it->second.size());
  };
  return ParseLeaseClaim(value("optstate-lease"), value("optstate-lease-takeover"));
}

}  // namespace optstate
