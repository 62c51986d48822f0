// Lease admission: who may touch a held group, and the refusal that says who holds it.
#include "server/state/group_lease.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace optstate {
namespace {

std::string Seconds(absl::Duration d) { return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(d)); }

std::string Describe(const LeaseHolder& h) {
  std::string out = absl::StrCat("job '", h.job.empty() ? "(unnamed)" : h.job, "' (holder ", h.id);
  if (!h.host.empty()) absl::StrAppend(&out, ", host ", h.host);
  if (h.pid != 0) absl::StrAppend(&out, ", pid ", h.pid);
  absl::StrAppend(&out, ")");
  return out;
}

}  // namespace

absl::Status GroupLease::Refusal(const LeaseClaim& claim, absl::string_view group,
                                 absl::Time now) const {
  if (!holder_.has_value() || holder_->id == claim.holder.id) return absl::OkStatus();
  const bool expired = now >= expires_;
  // A call naming no holder (an operator's tool) may touch a group whose
  // lease has lapsed; a job must take it over by name.
  if (claim.holder.id.empty() && expired) return absl::OkStatus();
  for (const LeaseTakeover& takeover : claim.takeovers) {
    if (takeover.of != holder_->id) continue;
    if (takeover.kind == TakeoverKind::kDead) return absl::OkStatus();
    if (takeover.kind == TakeoverKind::kExpired && expired) return absl::OkStatus();
  }
  std::string when =
      expired ? absl::StrCat("its lease expired ", Seconds(now - expires_), " ago")
              : absl::StrCat("its lease expires in ", Seconds(expires_ - now));
  return absl::FailedPreconditionError(absl::StrCat(
      "group '", group, "' is leased by ", Describe(*holder_), ", whose last call was ",
      Seconds(now - last_call_), " ago; ", when,
      ". Only the holder may step, import over or delete it. If this is another job, give it "
      "its own name prefix; if that job is gone, take the lease over",
      expired ? "" : " once it has expired",
      " (RemoteAdamW(takeover=True); metadata 'optstate-lease-takeover: expired=", holder_->id,
      "'), or at once when its process is known dead ('dead=", holder_->id, "')"));
}

absl::Status GroupLease::Admit(const LeaseClaim& claim, absl::string_view group, absl::Time now,
                               absl::Duration term) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Refusal(claim, group, now); !s.ok()) return s;
  if (claim.holder.id.empty()) return absl::OkStatus();
  holder_ = claim.holder;
  last_call_ = now;
  expires_ = now + term;
  return absl::OkStatus();
}

absl::Status GroupLease::Check(const LeaseClaim& claim, absl::string_view group,
                               absl::Time now) const {
  absl::MutexLock lock(&mu_);
  return Refusal(claim, group, now);
}

std::optional<LeaseView> GroupLease::View(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  if (!holder_.has_value()) return std::nullopt;
  return LeaseView{*holder_, last_call_, expires_, now >= expires_};
}

}  // namespace optstate
